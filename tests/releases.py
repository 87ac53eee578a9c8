"""Databases as earlier releases of pgkb made them, for upgrade tests: the db/ folder and the migrator
(python/pgkb/migrate.py) of a recorded commit are taken from this repository's history with `git archive`,
and that release's own `migrate` builds the database, so its ledger, schema and functions are exactly what a
user of that release has. Data then goes in through that release's SQL API, and the test migrates to HEAD.

The commits need the repository's history: in a shallow clone (or a copy without .git) the tests say so and
skip; in a full clone a recorded commit that is missing, or a git that cannot read the repository, is a
failure."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg.conninfo import make_conninfo

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Release:
    commit: str
    why: str


# The one list of the releases the upgrade tests start from: the last commit of a landed stop (`issues stops`),
# each with the migrations it shipped and why it was chosen.
RELEASES = {
    "issues-2-4": Release(
        "d6bdf51a8a1077b1cf092c8616470792fafc2550",
        "the first release (issues 2-4 landed): migrations 001-007, before score fusion and the terms array",
    ),
    "issue-5": Release(
        "c4d181aa123d4da719e20bcced7eca2a617dc276",
        "issue 5 landed: 001-009, the last release before input hardening (010) and its data repair",
    ),
    "issues-10-11-13": Release(
        "b1013f80e96d92acd77f37491d1c8e980bcac5cc",
        "issues 10, 11 and 13 landed: 001-015, the last release before posting blocks (016)",
    ),
    "issue-19-fuzzy": Release(
        "19926f6195c95d9ed401f76e088642327a3fd6b2",
        "issue 19's term dictionary landed: 001-023, before API keys (024), image caption RLS and duplicates",
    ),
    "issue-22": Release(
        "60c1bae3120e58775be4d77e5d4840f72adf3d3c",
        "issue 22 landed: 001-027, the last release before the schema split (028: kb_internal, kb_service, kb_admin)",
    ),
    "issues-21-23": Release(
        "1f9dbbedec5c33023fd728645000cd8bd862fd95",
        "issues 21 and 23 and issue 19's hybrid costs landed: 001-030, posting ids as offsets (postings_format 2), "
        "the last release before gap-coded ids (031)",
    ),
    "issue-32-part": Release(
        "837e724e7b273fe3d5788e9fb1c2a6d8683142bf",
        "issue 31's cross-language search and most of issue 32 landed: 001-032, the last release with one HNSW "
        "index per model, before one per model and knowledge base (033)",
    ),
}


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def require_commit(commit: str) -> None:
    """Skip, saying why, when this checkout has no history to take the commit from; fail when a full
    clone lacks it (a rewritten history: the recorded releases need updating)."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
        return
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is no git checkout: upgrade tests build old releases from its history")
    shallow = _git("rev-parse", "--is-shallow-repository")
    assert shallow.returncode == 0, f"git cannot read {REPO}: {shallow.stderr.decode().strip()}"
    if shallow.stdout.strip() == b"true":
        pytest.skip(
            f"this clone is shallow and lacks commit {commit[:12]}: upgrade tests build old releases from the "
            "history (git fetch --unshallow)"
        )
    pytest.fail(f"commit {commit[:12]} is not in this repository's history: update tests/releases.py RELEASES")


def checkout(commit: str, dest: Path) -> Path:
    """db/ and python/pgkb/migrate.py of ``commit`` extracted under ``dest``; returns dest/db."""
    require_commit(commit)
    archive = _git("archive", "--format=tar", commit, "db", "python/pgkb/migrate.py")
    assert archive.returncode == 0, archive.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        # this repository's own files; the "data" filter where the Python has it (Debian 12's 3.11.2 has not)
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest / "db"


def old_migrate(dest: Path) -> Callable[[psycopg.Connection, Path], object]:
    """The ``migrate`` function of the migrate.py that :func:`checkout` extracted under ``dest`` (it needs
    psycopg and the standard library only, in every release)."""
    name = f"pgkb_release_migrate_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, dest / "python/pgkb/migrate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while they are made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module.migrate


@contextmanager
def release_database(admin: psycopg.Connection, key: str, workdir: Path) -> Iterator[psycopg.Connection]:
    """A new database on the test server migrated by release ``key`` of RELEASES (its own migrate code and
    db/): an autocommit superuser connection to it, pgvector registered. Dropped afterwards."""
    release = RELEASES[key]
    dest = workdir / key
    db_dir = checkout(release.commit, dest)
    name = f"pgkb_release_{uuid.uuid4().hex[:8]}"
    admin.execute(f"create database {name} template template0 encoding 'UTF8' locale 'C.UTF-8'")
    try:
        with psycopg.connect(make_conninfo(admin.info.dsn, dbname=name), autocommit=True) as conn:
            old_migrate(dest)(conn, db_dir)
            register_vector(conn)
            yield conn
    finally:
        admin.execute(f"drop database {name} with (force)")
