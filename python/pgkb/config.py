"""Configuration, read once from the environment with the same names in every entry point.

PGKB_DATABASE_URL   an existing PostgreSQL (else pgkb runs its embedded cluster, see pgkb.cluster)
PGKB_DATA_DIR, PGKB_PORT, PGKB_PG_BINDIR   the embedded cluster (see pgkb.cluster)
PGKB_DB_DIR         where db/migrations and db/functions live (default: the repository's db/)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    db_dir: Path

    @classmethod
    def from_env(cls) -> Settings:
        url = os.environ.get("PGKB_DATABASE_URL", "").strip() or None
        db_dir = Path(os.environ.get("PGKB_DB_DIR") or Path(__file__).resolve().parents[2] / "db")
        return cls(database_url=url, db_dir=db_dir)
