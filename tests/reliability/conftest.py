"""Fixtures of the reliability suite; the figures each test publishes are printed at the end of the run."""

from __future__ import annotations

import json

import pytest
import relhelpers as rh


@pytest.fixture
def fake():
    """A fake OpenAI-compatible embedding endpoint on 127.0.0.1 (healthy until told otherwise)."""
    with rh.fake_embedder() as f:
        yield f


@pytest.fixture
def rdb(db, fake):
    """The test database with users alice and bob (mapped to their login roles), svc in pgkb_service (the
    role MCP servers connect as) and the database's own query embedding pointed at ``fake`` (never at a
    default port some other process may own)."""
    db.execute("update kb.settings set value = %s where key = 'embedding_url'", [fake.url])
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("grant pgkb_service to svc")  # cluster-wide: revoked below
    yield db
    db.execute("revoke pgkb_service from svc")


def dsn(conn, user: str) -> str:
    info = conn.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user={user}"


@pytest.fixture
def dsn_of(rdb):
    """dsn_of('svc') -> a libpq connection string for the test database as that login role."""
    return lambda user: dsn(rdb, user)


def pytest_terminal_summary(terminalreporter) -> None:
    if not rh.FIGURES:
        return
    terminalreporter.section(f"pgkb reliability figures (load average now {rh.load_average()})")
    for record in rh.FIGURES:
        terminalreporter.write_line(json.dumps(record, ensure_ascii=False, default=str))
