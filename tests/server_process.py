"""Servers under test: the world they serve (users, knowledge bases, the service role), running a `pgkb`
server command (`mcp`, `mcp --transport http`, `serve`) as a subprocess of this checkout, and reading a
server's /metrics.

World: users alice and bob (mapped to their login roles); svc is granted pgkb_service (revoked after) and
is the role the server connects as. Knowledge bases: team-docs (public, the hand-checked fixture docs, their
sources recorded as paths on the server, as `pgkb ingest` does without --base-url: no response may show them,
tests/served_bodies.py), alice-notes (private to alice, marker zebramarker), bob-notes (private to bob, marker
bobmarker), empty-kb (alice). alice-notes also holds guide/login.md, so that doc_id is ambiguous for alice but
not for bob; its first heading repeats its title (shown once)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import fixture_docs
import pytest
from prometheus_client.parser import text_string_to_metric_families

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


def local_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (the one traffic to TEST-NET-1 would leave
    from; nothing is sent), or None when there is none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(args: list[str], env: dict[str, str], port: int, timeout: float = 30):
    """``python -m pgkb.cli *args`` until the block ends; yields once ``port`` accepts connections, raises
    with the server's stderr if it exits first. Afterwards its stderr must hold no traceback; the process's
    ``stderr_text`` holds it."""
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
    proc.stderr_text = proc.stderr.read().decode(errors="replace")
    assert "Traceback" not in proc.stderr_text


def http_request(
    url: str, body=None, headers: dict | None = None, method: str | None = None
) -> tuple[int, bytes, dict]:
    """(status, raw body, headers) of one request to a test server; ``body`` bytes are sent as they are,
    anything else as JSON; POST when there is a body."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method or ("POST" if data is not None else "GET"),
        headers={"Content-Type": "application/json", **(headers or {})},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def api_key(conn, name: str = "test", expires: str = "1 hour") -> tuple[str, str]:
    """(key_id, key) of a new API key of the pgkb user ``conn`` logs in as (kb.create_api_key)."""
    return conn.execute("select * from kb.create_api_key(null, %s, now() + %s::interval)", [name, expires]).fetchone()


def seconds_until(refused, limit: float = 10.0) -> float:
    """Seconds until ``refused()`` (asked every 50 ms) first returns true; fails after ``limit``."""
    started = time.monotonic()
    while not refused():
        assert time.monotonic() - started < limit, f"still accepted after {limit} s"
        time.sleep(0.05)
    return time.monotonic() - started


Samples = dict[tuple[str, frozenset], float]


def scrape(base_url: str, headers: dict[str, str] | None = None) -> Samples:
    """GET <base_url>/metrics, parsed by prometheus_client's parser: {(sample name, labels): value}."""
    request = urllib.request.Request(base_url + "/metrics", headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200 and response.headers["content-type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the server has not reported it (a counter nothing has counted yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def answered(embed_server, route: str = "/v1/embeddings", status: str = "200") -> float:
    """Requests a running embed server (pgkb.embed_server.start_in_thread) answered on ``route`` with
    ``status``, as its /metrics counts them."""
    return sample(scrape(embed_server.url), "pgkb_http_requests_total", route=route, status=status)
