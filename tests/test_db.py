"""pgkb.db.database_url, the one place that makes sure a command's database is migrated: a database at
PGKB_DATABASE_URL that is not (fully) migrated is refused with the command to run and left unchanged;
the embedded cluster is migrated on the spot."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from migration_files import add_migration
from pgkb.cli import main
from pgkb.migrate import pending_migrations

REPO = Path(__file__).resolve().parents[1]


def kb_schema_exists(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("select 1 from pg_namespace where nspname = 'kb'").fetchone() is not None


def write_beir(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "退款", "text": "退款三天到账"}) + "\n")
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "退款多久到账"}) + "\n")
    (folder / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return folder


def test_unmigrated_database_at_a_url_is_refused_with_the_command_to_run(empty_database, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PGKB_DATABASE_URL", empty_database)
    monkeypatch.delenv("PGKB_DB_DIR", raising=False)
    for name in ("PGKB_RERANK_MODEL", "PGKB_RERANK_URL"):
        monkeypatch.delenv(name, raising=False)
    beir = write_beir(tmp_path / "set")
    for argv in (["model", "list"], ["search", "退款"], ["eval", "--beir", str(beir)], ["worker", "--once"]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "the database at PGKB_DATABASE_URL has no pgkb schema yet: run `pgkb db migrate`" in err, (argv, err)
        assert 'schema "kb" does not exist' not in err
    from pgkb.config import Settings
    from pgkb.migrate import NotMigratedError
    from pgkb.serving.config import ServiceConfig

    with pytest.raises(NotMigratedError, match="run `pgkb db migrate`"):
        ServiceConfig.from_env(Settings.from_env(), {})  # pgkb mcp, before it serves anything
    assert not kb_schema_exists(empty_database)  # refused before anything was changed

    assert main(["db", "migrate"]) == 0
    assert "applied migration 001_foundation.sql" in capsys.readouterr().out
    assert main(["model", "list"]) == 0
    assert "multilingual-e5-small" in capsys.readouterr().out


def test_database_lacking_a_new_migration_is_refused_until_migrated(empty_database, tmp_path, monkeypatch, capsys):
    db_dir = tmp_path / "db"
    shutil.copytree(REPO / "db", db_dir)
    monkeypatch.setenv("PGKB_DATABASE_URL", empty_database)
    monkeypatch.setenv("PGKB_DB_DIR", str(db_dir))
    assert main(["db", "migrate"]) == 0
    capsys.readouterr()
    name = add_migration(db_dir, "arrived_later", "create table kb.arrived_later (id int);\n")

    assert main(["model", "list"]) == 1
    assert f"lacks 1 migration ({name}): run `pgkb db migrate`" in capsys.readouterr().err
    with psycopg.connect(empty_database) as conn:
        assert conn.execute("select to_regclass('kb.arrived_later')").fetchone() == (None,)
        assert pending_migrations(conn, db_dir) == [name]

    assert main(["db", "migrate"]) == 0
    assert f"applied migration {name}" in capsys.readouterr().out
    assert main(["model", "list"]) == 0


def test_a_role_that_may_not_read_the_migrations_is_not_refused(empty_database, db):
    with psycopg.connect(empty_database, autocommit=True) as admin:
        from pgkb.config import Settings
        from pgkb.migrate import migrate

        migrate(admin, Settings.from_env().db_dir)
    role = f"pgkb_t_{uuid.uuid4().hex[:8]}"
    db.execute(f"create role {role} login")
    try:
        url = empty_database.replace(f"user={db.info.user}", f"user={role}")
        with psycopg.connect(url) as conn:
            assert pending_migrations(conn, REPO / "db") is None  # cannot tell: trust the administrator
    finally:
        db.execute(f"drop role {role}")


def _free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not any(Path("/tmp").glob(f"pgkb-*-{port}")):
            return port


@pytest.mark.slow
def test_embedded_cluster_is_migrated_by_the_first_command_after_db_start():
    root = Path(tempfile.mkdtemp(prefix="pgkb-db-", dir="/tmp"))
    root.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGKB_", "PG")) or k == "PGKB_PG_BINDIR"}
    env.update(PGKB_DATA_DIR=str(root / "data"), PGKB_PORT=str(_free_port()), PYTHONPATH=str(REPO / "python"))

    def pgkb(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pgkb.cli", *args], env=env, capture_output=True, text=True, timeout=300
        )

    try:
        started = pgkb("db", "start")
        assert started.returncode == 0, started.stderr
        first = pgkb("model", "list")
        assert first.returncode == 0, first.stderr
        assert "pgkb: migrated the embedded database: applied migration 001_foundation.sql" in first.stderr
        assert "multilingual-e5-small" in first.stdout
        again = pgkb("model", "list")
        assert again.returncode == 0 and "migrated" not in again.stderr, again.stderr
    finally:
        pgkb("db", "stop")
        shutil.rmtree(root, ignore_errors=True)
