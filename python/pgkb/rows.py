"""The one row of a query that always returns one (a function call, an aggregate): psycopg types
``fetchone()`` as a row or None, and this is the one place where that None becomes an error."""

from __future__ import annotations

from typing import TypeVar

import psycopg

Row = TypeVar("Row")


def one(cursor: psycopg.Cursor[Row]) -> Row:
    """The cursor's next row; RuntimeError when the query returned none (it always returns one)."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("a query that always returns a row returned none")
    return row
