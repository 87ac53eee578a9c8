"""A migration added to a copy of db/ under the next free number: pgkb db migrate refuses gaps in the
numbering, so a test's extra migration takes the number after the last one, whatever that is today."""

from __future__ import annotations

from pathlib import Path


def add_migration(db_dir: Path, slug: str, sql: str) -> str:
    """Write ``sql`` as db_dir/migrations/NNN_<slug>.sql, NNN the number after the highest there; its
    file name."""
    last = max(int(path.name[:3]) for path in (db_dir / "migrations").glob("*.sql"))
    name = f"{last + 1:03d}_{slug}.sql"
    (db_dir / "migrations" / name).write_text(sql)
    return name
