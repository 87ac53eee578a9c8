"""Servers under test: the world they serve (users, knowledge bases, the service role) and running a `pgkb`
server command (`mcp`, `mcp --transport http`, `serve`) as a subprocess of this checkout.

World: users alice and bob (mapped to their login roles); svc is granted pgkb_service (revoked after) and
is the role the server connects as. Knowledge bases: team-docs (public, the hand-checked fixture docs, their
sources recorded as paths on the server, as `pgkb ingest` does without --base-url: no response may show them,
tests/served_bodies.py), alice-notes (private to alice, marker zebramarker), bob-notes (private to bob, marker
bobmarker), empty-kb (alice). alice-notes also holds guide/login.md, so that doc_id is ambiguous for alice but
not for bob; its first heading repeats its title (shown once)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import fixture_docs
import pytest

PYTHON_DIR = str(Path(__file__).resolve().parents[1] / "python")


@pytest.fixture
def world(db, embedder, tmp_path):
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("grant pgkb_service to svc")  # cluster-wide: revoked below
    db.execute("select kb.create_knowledge_base('team-docs', 'public', owner => 'alice', description => 'fixture')")
    db.execute("select kb.create_knowledge_base('alice-notes', 'private', owner => 'alice')")
    db.execute("select kb.create_knowledge_base('bob-notes', 'private', owner => 'bob')")
    db.execute("select kb.create_knowledge_base('empty-kb', 'private', owner => 'alice')")
    fixture_docs.load(db, embedder, "team-docs", source_root=tmp_path / "team-docs")
    for kb, marker in (("alice-notes", "zebramarker"), ("bob-notes", "bobmarker")):
        db.execute(
            "select * from kb.replace_document(%s, %s, %s, %s::jsonb)",
            [kb, f"{marker}.md", f"{marker} 笔记", json.dumps([{"content": f"{marker} 私人笔记 secret plans"}])],
        )
    db.execute(
        "select * from kb.replace_document('alice-notes', 'guide/login.md', 'alice 的登录笔记', %s::jsonb)",
        [json.dumps([{"content": "alice 自己记录的登录问题", "heading_path": ["alice 的登录笔记", "问题"]}])],
    )
    yield db
    db.execute("revoke pgkb_service from svc")


def svc_dsn(db) -> str:
    info = db.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user=svc"


def server_env(db, **extra: str) -> dict[str, str]:
    env = {
        "PYTHONPATH": PYTHON_DIR,  # the server under test is this checkout's, not an installed pgkb
        "PGKB_DATABASE_URL": svc_dsn(db),
        "PGKB_EMBED_PROVIDER": "offline",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "2",
    }
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(args: list[str], env: dict[str, str], port: int, timeout: float = 30):
    """``python -m pgkb.cli *args`` until the block ends; yields once ``port`` accepts connections, raises
    with the server's stderr if it exits first. Afterwards its stderr must hold no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgkb.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                stderr = proc.communicate()[1].decode()[-2000:]
                raise RuntimeError(f"{args[0]} server did not start: {stderr}") from None
            time.sleep(0.1)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert b"Traceback" not in proc.stderr.read()
