"""pgkb.rows.one: the row of a query that always returns one, or a clear error when none came."""

from __future__ import annotations

import pytest
from pgkb.rows import one


def test_one_returns_the_first_row(db):
    assert one(db.execute("select 1, 'a'")) == (1, "a")
    assert one(db.execute("select count(*) from kb.knowledge_bases where false")) == (0,)


def test_one_refuses_a_query_that_returned_no_row(db):
    with pytest.raises(RuntimeError, match="returned none"):
        one(db.execute("select 1 where false"))
