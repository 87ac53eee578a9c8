"""The last release before the schema split (migration 029: kb_service, kb_admin, kb_internal), for the tests
that build a database of that release: its db/ and its migrator (python/pgkb/migrate.py, which needs psycopg
and the standard library only), taken from this repository's history with `git archive`. Without that
history (no .git, a shallow clone) the tests say so and skip; a full clone that lacks the commit fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[1]
PRE_SPLIT = "60c1bae3120e58775be4d77e5d4840f72adf3d3c"  # main before issue 23's schema split: migrations 001-027


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def pre_split_release(dest: Path) -> tuple[Path, Callable[[psycopg.Connection, Path], object]]:
    """db/ and migrate.py of PRE_SPLIT extracted under ``dest``: dest/db and that release's ``migrate``."""
    if _git("cat-file", "-e", f"{PRE_SPLIT}^{{commit}}").returncode != 0:
        if not (REPO / ".git").exists() or _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true":
            pytest.skip(f"commit {PRE_SPLIT[:12]} needs the repository's history (git fetch --unshallow)")
        pytest.fail(f"commit {PRE_SPLIT[:12]} is not in this repository's history: update tests/pre_split.py")
    archive = _git("archive", "--format=tar", PRE_SPLIT, "db", "python/pgkb/migrate.py")
    assert archive.returncode == 0, archive.stderr.decode()
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    name = f"pgkb_pre_split_migrate_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, dest / "python/pgkb/migrate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while they are made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return dest / "db", module.migrate
