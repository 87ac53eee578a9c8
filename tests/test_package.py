"""The wheel is a complete install: built with `python -m build` (an sdist, then the wheel from it), installed
with --no-deps into a new venv in a temporary folder, it runs `pgkb --version`, `pgkb db migrate` from the SQL
it carries, `pgkb ingest` and `pgkb search` against a new database -- from a temporary working folder, with no
PGKB_DB_DIR, no PYTHONPATH and nothing of the checkout on its path.

Installing every dependency from PyPI into the new venv would take minutes and gigabytes, so its third-party
packages come from the venv running the tests, through a .pth file that names that venv's site-packages
folders. Python takes a .pth file's lines as paths only and does not process the .pth files inside them (the
checkout's editable install of pgkb among them): the one pgkb the new venv can import is the wheel's, which
test_the_installed_pgkb_is_the_wheel checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from pgkb.migrate import SCHEMAS

pytestmark = pytest.mark.slow  # builds the wheel and installs it into a new venv

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def clean_environment() -> dict[str, str]:
    """This process's environment without PYTHONPATH (the checkout's python/ in a worktree) and the like, and
    without PGKB_* (PGKB_DB_DIR among them)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PGKB_", "PYTHON"))}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A new venv holding only the wheel built from the checkout, plus the test venv's third-party packages."""
    root = tmp_path_factory.mktemp("package")
    # from a copy of what the build reads: a pgkb.egg-info left in the checkout (by an editable install or an
    # earlier build) would feed its list of files to the sdist
    source = root / "source"
    for name in ("python", "db"):
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(root / "dist"), str(source)],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (root / "dist").glob("pgkb-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    purelib = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=clean_environment(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    installed = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    # after the install, so that pip cannot take the test venv's pgkb for this venv's
    dependencies = [p for p in sys.path if Path(p).name == "site-packages"]
    (Path(purelib) / "test_venv_dependencies.pth").write_text("\n".join(dependencies) + "\n")
    return venv


def run(venv: Path, cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """Run a program of the venv in ``cwd`` with none of the caller's PGKB_* and PYTHON* variables."""
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        cwd=cwd,
        env={**clean_environment(), "PGKB_EMBED_PROVIDER": "offline", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_installed_pgkb_is_the_wheel(venv, tmp_path):
    found = run(venv, tmp_path, "python", "-c", "import pgkb.config as c; print(c.__file__, c.packaged_db_dir())")
    assert found.returncode == 0, found.stderr
    module, db_dir = (Path(p) for p in found.stdout.split())
    assert module.is_relative_to(venv) and db_dir.is_relative_to(venv)
    assert (module.parent / "py.typed").is_file()  # type checkers read the installed pgkb's annotations
    assert not db_dir.is_symlink() and sorted(p.name for p in (db_dir / "migrations").glob("*.sql")) == sorted(
        p.name for p in (REPO / "db" / "migrations").glob("*.sql")
    )
    version = run(venv, tmp_path, "pgkb", "--version")
    assert (version.returncode, version.stdout) == (0, f"pgkb {VERSION}\n")


def test_the_wheel_migrates_ingests_and_searches(venv, empty_database, db, tmp_path):
    env = {"PGKB_DATABASE_URL": empty_database}
    migrated = run(venv, tmp_path, "pgkb", "db", "migrate", **env)
    assert migrated.returncode == 0, migrated.stderr
    assert "pgkb: applied migration 001_foundation.sql" in migrated.stdout
    assert "pgkb: applied db/functions" in migrated.stdout
    assert "+ software terms " in migrated.stdout  # the lexicon's data files are in the wheel
    functions = "select p.oid::regprocedure::text from pg_proc as p where p.pronamespace::regnamespace::text = any(%s)"
    with psycopg.connect(empty_database) as conn:
        wheel_functions = {r[0] for r in conn.execute(functions, [list(SCHEMAS)])}
    assert wheel_functions == {r[0] for r in db.execute(functions, [list(SCHEMAS)])}  # the template, from db/
    assert "kb_internal.search" in {f.split("(")[0] for f in wheel_functions}
    assert "kb.hybrid_search" in {f.split("(")[0] for f in wheel_functions}

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "refund.md").write_text("# 退款\n\n退款在审核通过后三个工作日内原路退回。\n", encoding="utf-8")
    (docs / "deploy.md").write_text("# Deploy\n\nRoll back a release with `deploy rollback`.\n", encoding="utf-8")
    ingested = run(venv, tmp_path, "pgkb", "ingest", str(docs), "--kb", "wheel", "--json", **env)
    assert ingested.returncode == 0, ingested.stderr
    assert json.loads(ingested.stdout)["added"] == 2

    found = run(venv, tmp_path, "pgkb", "search", "退款多久到账", "--kb", "wheel", "--json", **env)
    assert found.returncode == 0, found.stderr
    response = json.loads(found.stdout)
    assert response["vector_used"] and response["results"][0]["doc_key"] == "refund.md"


def test_up_without_docs_outside_a_checkout_asks_for_them_before_starting_anything(venv, tmp_path):
    up = run(venv, tmp_path, "pgkb", "up", PGKB_DATABASE_URL="host=/nonexistent dbname=none")
    assert up.returncode == 1
    assert "examples/kb is not a directory: pass the folder to ingest with --docs" in up.stderr
    assert "database ready" not in up.stdout  # and it never connected (the URL leads nowhere)
