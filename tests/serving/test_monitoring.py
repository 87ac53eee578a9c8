"""/healthz, /readyz and /metrics of `pgkb serve` and `pgkb mcp --transport http`, as subprocesses against
the real database (server_process's world; tokens alice-token, bob-token): the numbers move with the
requests served (routes and statuses, the stages' histograms, degraded answers with the embedding endpoint
down, busy rejections with a stalled database), nothing a caller sent shows up in them, readiness follows the
database (unreachable, unmigrated), the Origin / Host checks apply, and who may read /metrics
(PGKB_METRICS_ACCESS: loopback by default -- checked with a non-loopback client in the ASGI scope and over
the network when this machine has an address that is not loopback --, token, open)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import anyio
import psycopg
import pytest
from pgkb.cli import version
from server_process import (  # noqa: F401 (world is a fixture)
    free_port,
    http_request,
    local_address,
    running,
    sample,
    scrape,
    server_env,
    svc_dsn,
    world,
)

pytestmark = pytest.mark.slow  # starts pgkb's HTTP servers

TOKENS = "alice-token:alice,bob-token:bob"
ALICE = {"Authorization": "Bearer alice-token"}
SECRET = "qzxwvmarker"  # a query term that must not reach any metric
MODEL = "multilingual-e5-small"


call = http_request


def answer(url: str, body=None, headers: dict | None = None) -> tuple[int, dict]:
    status, raw, _ = call(url, body, headers)
    return status, json.loads(raw)


def env_for(db, **extra: str) -> dict[str, str]:
    # no deadline on query embeddings: the first one (model load) must not degrade a request to lexical-only
    env = {**os.environ, **server_env(db, PGKB_MCP_TOKENS=TOKENS, PGKB_MCP_EMBED_TIMEOUT_MS="0", **extra)}
    for name in ("PGKB_USER", "PGKB_METRICS_ACCESS", "PGKB_RERANK_MODEL", "PGKB_RERANK_URL"):
        if name not in extra:
            env.pop(name, None)
    return env


@pytest.fixture
def serve(world):
    world.execute("update kb.settings set value = '' where key = 'embedding_url'")  # kb.ask searches lexically
    port = free_port()
    with running(["serve", "--port", str(port)], env_for(world), port):
        yield f"http://127.0.0.1:{port}"


def delta(before, after, name: str, **labels: str) -> float:
    return sample(after, name, **labels) - sample(before, name, **labels)


def stage_counts(samples) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["operation"], dict(labels)["stage"]): value
        for (name, labels), value in samples.items()
        if name == "pgkb_stage_duration_seconds_count"
    }


def test_serve_counts_requests_and_stages_and_reports_the_pool_and_backlog(serve, world):
    before = scrape(serve)
    assert answer(serve + "/api/search", {"query": f"登录态失效 {SECRET}", "kb": "team-docs"}, ALICE)[0] == 200
    dify = {"knowledge_id": "team-docs", "query": "退款", "retrieval_setting": {"top_k": 2, "score_threshold": 0}}
    assert answer(serve + "/retrieval", dify, ALICE)[0] == 200
    assert answer(serve + "/api/kbs", None, ALICE)[0] == 200
    assert answer(serve + "/api/document", {"kb": "team-docs", "doc_id": "guide/login.md"}, ALICE)[0] == 200
    assert answer(serve + "/api/ask", {"question": "无理由退款", "kb": "team-docs"}, ALICE)[0] == 200
    assert answer(serve + "/api/kbs", None, {"Authorization": "Bearer wrong"})[0] == 401
    assert call(serve + f"/{SECRET}/guide/login.md")[0] == 404
    status, raw, headers = call(serve + "/metrics")
    after = scrape(serve)

    counted = {
        ("/api/search", "200"): 1, ("/retrieval", "200"): 1, ("/api/kbs", "200"): 1, ("/api/kbs", "401"): 1,
        ("/api/document", "200"): 1, ("/api/ask", "200"): 1, ("other", "404"): 1, ("/metrics", "200"): 2,
    }  # fmt: skip
    for (route, code), n in counted.items():
        assert delta(before, after, "pgkb_http_requests_total", route=route, status=code) == n, (route, code)
        assert delta(before, after, "pgkb_http_request_duration_seconds_count", route=route) >= n
    stages = {op_stage: n - stage_counts(before).get(op_stage, 0) for op_stage, n in stage_counts(after).items()}
    assert stages == {
        ("search", "embed"): 1, ("search", "sql"): 1, ("snippet", "sql"): 1,  # the page's search: one each
        ("retrieve", "embed"): 1, ("retrieve", "sql"): 1,  # Dify's
        ("list_knowledge_bases", "sql"): 1, ("document", "sql"): 1,
        ("ask", "sql"): 1, ("ask", "answer"): 1,  # kb.ask's retrieval and answer
    }  # fmt: skip
    assert sample(after, "pgkb_stage_duration_seconds_sum", operation="search", stage="sql") > 0
    assert sample(after, "pgkb_degraded_answers_total", operation="search") == 0

    assert sample(after, "pgkb_server_info", server="serve", version=version()) == 1
    assert sample(after, "pgkb_calls_limit") == 16 and sample(after, "pgkb_calls_in_progress") == 0
    assert sample(after, "pgkb_db_pool_max_connections") == 8
    in_use, idle = (sample(after, "pgkb_db_pool_connections", state=s) for s in ("in_use", "idle"))
    assert in_use == 0 and idle >= 1  # the pool was opened by the first call; nothing holds a connection now
    # the database's embedding queue: the world's private notes were written without embeddings
    queued = world.execute("select count(*) from kb.embedding_queue where not parked").fetchone()[0]
    assert queued >= 3
    assert sample(after, "pgkb_embedding_backlog_chunks", model=MODEL, state="queued") == queued
    assert sample(after, "pgkb_embedding_backlog_chunks", model=MODEL, state="parked") == 0
    assert sample(after, "pgkb_embedding_backlog_oldest_seconds", model=MODEL) > 0
    assert sample(after, "process_resident_memory_bytes") > 0

    # nothing a caller sent or may see: no query, path, user, token, knowledge base or document
    text = raw.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain") and "pgkb_http_requests_total" in text
    for private in (SECRET, "登录", "alice", "alice-token", "wrong", "team-docs", "guide/login.md", "refund"):
        assert private not in text, private


def test_health_and_readiness(serve):
    assert answer(serve + "/healthz") == (200, {"status": "ok"})
    assert answer(serve + "/readyz") == (200, {"status": "ready"})
    status, raw, headers = call(serve + "/healthz", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"


def test_readyz_says_not_ready_while_the_database_lacks_a_migration(serve, world):
    assert answer(serve + "/readyz")[0] == 200
    version, name, checksum = world.execute(
        "delete from kb.schema_migrations where version = (select max(version) from kb.schema_migrations"
        " where version <> 'functions') returning version, name, checksum"
    ).fetchone()  # what a database looks like when pgkb is upgraded before `pgkb db migrate` runs
    try:
        assert poll(
            lambda: answer(serve + "/readyz"), (503, {"status": "not ready", "reason": "database not migrated"})
        )
        assert answer(serve + "/healthz") == (200, {"status": "ok"})  # alive all the same: no database touched
    finally:
        world.execute(
            "insert into kb.schema_migrations (version, name, checksum) values (%s, %s, %s)", [version, name, checksum]
        )
    assert poll(lambda: answer(serve + "/readyz"), (200, {"status": "ready"}))


def poll(get, expected, seconds: float = 10) -> bool:
    """Whether ``get()`` returns ``expected`` within ``seconds`` (/readyz answers from a 1 s cache)."""
    deadline = time.monotonic() + seconds
    while (got := get()) != expected:
        if time.monotonic() > deadline:
            print("last answer:", got)
            return False
        time.sleep(0.2)
    return True


@pytest.mark.parametrize("command", [["serve"], ["mcp", "--transport", "http"]])
def test_readyz_says_not_ready_while_the_database_is_unreachable(db, command):
    port = free_port()
    nowhere = f"host=127.0.0.1 port={free_port()} dbname=pgkb user=svc"  # nothing listens there
    with running([*command, "--port", str(port)], env_for(db, PGKB_DATABASE_URL=nowhere), port):
        base = f"http://127.0.0.1:{port}"
        assert answer(base + "/healthz") == (200, {"status": "ok"})
        assert answer(base + "/readyz") == (503, {"status": "not ready", "reason": "database unavailable"})
        samples = scrape(base)  # still served; the embedding backlog is left out
        assert sample(samples, "pgkb_http_requests_total", route="/readyz", status="503") == 1
        assert not [name for name, _ in samples if name.startswith("pgkb_embedding_backlog")]


def test_degraded_answers_and_busy_rejections_are_counted(world, dead_embedding_url):
    """The embedding endpoint is down: searches and Dify's retrievals are answered lexical-only and counted as
    degraded. One call at a time (PGKB_MCP_MAX_CONCURRENT=1): while one waits on a locked table, the next is
    turned away as busy, and counted."""
    port = free_port()
    env = env_for(
        world, PGKB_EMBED_PROVIDER="http", PGKB_EMBED_URL=dead_embedding_url, PGKB_MCP_MAX_CONCURRENT="1",
        PGKB_MCP_POOL_SIZE="1",
    )  # fmt: skip
    with running(["serve", "--port", str(port)], env, port):
        base = f"http://127.0.0.1:{port}"
        status, out = answer(base + "/api/search", {"query": "退款"}, ALICE)
        assert status == 200 and out["degraded"] is True
        dify = {"knowledge_id": "team-docs", "query": "退款", "retrieval_setting": {"top_k": 2, "score_threshold": 0}}
        assert answer(base + "/retrieval", dify, ALICE)[0] == 200
        samples = scrape(base)
        assert sample(samples, "pgkb_degraded_answers_total", operation="search") == 1
        assert sample(samples, "pgkb_degraded_answers_total", operation="retrieve") == 1
        assert sample(samples, "pgkb_busy_rejections_total", limit="max_concurrent") == 0

        info = world.info
        with psycopg.connect(host=info.host, port=info.port, dbname=info.dbname, user=info.user) as locker:
            locker.execute("lock table kb.knowledge_bases in access exclusive mode")
            with ThreadPoolExecutor(1) as pool:
                first = pool.submit(answer, base + "/api/kbs", None, ALICE)  # waits for the lock, holding the slot
                assert poll(lambda: sample(scrape(base), "pgkb_calls_in_progress"), 1)
                status, out = answer(base + "/api/kbs", None, ALICE)
                assert status == 503 and "busy" in out["error"]
                samples = scrape(base)
                locker.rollback()
                assert first.result()[0] == 200
        assert sample(samples, "pgkb_busy_rejections_total", limit="max_concurrent") == 1
        assert sample(samples, "pgkb_db_pool_connections", state="in_use") == 1  # the waiting call's
        assert sample(samples, "pgkb_http_requests_total", route="/api/kbs", status="503") == 1


@pytest.fixture
def mcp(world):
    port = free_port()
    with running(["mcp", "--transport", "http", "--port", str(port)], env_for(world), port):
        yield f"http://127.0.0.1:{port}"


def test_mcp_counts_tool_calls_and_keeps_monitoring_out_of_the_tokens(mcp):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    before = scrape(mcp)  # no token: the MCP routes need one, /metrics (loopback) does not

    async def main():
        http = httpx2.AsyncClient(headers=ALICE, timeout=60)
        async with Client(streamable_http_client(mcp + "/mcp", http_client=http)) as client:
            result = await client.call_tool("search_knowledge", {"query": f"退款 {SECRET}"})
            assert not result.is_error

    anyio.run(main)
    refused = call(mcp + "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    after = scrape(mcp)
    assert refused[0] == 401
    assert delta(before, after, "pgkb_http_requests_total", route="/mcp", status="200") >= 2  # handshake, call
    assert delta(before, after, "pgkb_http_requests_total", route="/mcp", status="401") == 1
    for stage in ("embed", "sql"):
        assert delta(before, after, "pgkb_stage_duration_seconds_count", operation="search", stage=stage) == 1
    assert sample(after, "pgkb_server_info", server="mcp", version=version()) == 1
    assert not [key for key in after if SECRET in repr(key) or "alice" in repr(key)]
    assert answer(mcp + "/healthz") == (200, {"status": "ok"})
    assert answer(mcp + "/readyz") == (200, {"status": "ready"})


@pytest.mark.parametrize("base", ["serve", "mcp"])
def test_origin_and_host_checks_apply(base, request):
    url = request.getfixturevalue(base)
    port = url.rsplit(":", 1)[1]
    for path in ("/metrics", "/healthz", "/readyz"):
        assert call(url + path, headers={"Origin": "https://evil.example.com"})[0] == 403, path
        assert call(url + path, headers={"Host": f"rebound.example:{port}"})[0] == 421, path  # DNS rebinding
        assert call(url + path, headers={"Origin": f"http://localhost:{port}"})[0] == 200, path


@pytest.mark.parametrize("command", [["serve"], ["mcp", "--transport", "http"]])
def test_token_mode_needs_a_key_the_server_accepts(world, command):
    port = free_port()
    with running([*command, "--port", str(port)], env_for(world, PGKB_METRICS_ACCESS="token"), port):
        base = f"http://127.0.0.1:{port}"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "alice-token"}):
            status, raw, got = call(base + "/metrics", headers=headers)
            assert status == 401 and got["www-authenticate"] == "Bearer", headers
            assert json.loads(raw) == {"error": "a valid bearer token is required for /metrics"}
        assert sample(scrape(base, ALICE), "pgkb_http_requests_total", route="/metrics", status="401") == 3
        assert answer(base + "/healthz") == (200, {"status": "ok"})  # the probes need none


def test_a_bad_access_setting_is_refused_at_start(db):
    env = env_for(db, PGKB_METRICS_ACCESS="everyone")
    done = subprocess.run(
        [sys.executable, "-m", "pgkb.cli", "serve", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "PGKB_METRICS_ACCESS must be one of loopback, token, open, got 'everyone'" in done.stderr, done.stderr


# ------------------------------------------------------------------------------- who may read /metrics


def asgi_get(app, path: str, client: tuple[str, int] | None) -> tuple[int, bytes]:
    """One GET through an ASGI app as it comes from ``client`` (what uvicorn puts in the scope)."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"kb.example.com:8767")], "client": client, "server": ("192.0.2.2", 8767),
    }  # fmt: skip
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    anyio.run(app, scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def backend_for(db, access: str):
    from pgkb.config import Settings
    from pgkb.serving.backend import Backend
    from pgkb.serving.config import ServiceConfig

    config = ServiceConfig(
        settings=Settings.from_env(), database_url=svc_dsn(db), tokens={"alice-token": "alice"}, metrics_access=access
    )
    return Backend(config, server="serve")


def apps(backend):
    """`pgkb serve`'s and `pgkb mcp`'s ASGI apps as bound to a non-loopback address."""
    from pgkb.mcp.http_guard import http_app
    from pgkb.mcp.server import build_server
    from pgkb.web.app import build_app

    return {"serve": build_app(backend, "0.0.0.0"), "mcp": http_app(build_server(backend), backend, "0.0.0.0")}


NON_LOOPBACK = [("192.0.2.10", 40000), ("10.1.2.3", 40000), ("::ffff:192.0.2.10", 40000), ("fe80::1", 1), None]
LOOPBACK = [("127.0.0.1", 40000), ("127.8.9.10", 40000), ("::1", 40000), ("::ffff:127.0.0.1", 40000)]


def test_metrics_are_refused_to_non_loopback_clients_by_default(world):
    backend = backend_for(world, "loopback")
    try:
        for name, app in apps(backend).items():
            for client in NON_LOOPBACK:
                status, body = asgi_get(app, "/metrics", client)
                assert status == 403, (name, client)
                assert json.loads(body) == {
                    "error": "/metrics is served to loopback clients only (PGKB_METRICS_ACCESS)"
                }
                assert asgi_get(app, "/healthz", client)[0] == 200  # the probes are for everyone who reaches it
            for client in LOOPBACK:
                status, body = asgi_get(app, "/metrics", client)
                assert status == 200 and b"pgkb_http_requests_total" in body, (name, client)
    finally:
        backend.close()
    counted = backend.metrics.registry.get_sample_value
    assert counted("pgkb_http_requests_total", {"route": "/metrics", "status": "403"}) == 2 * len(NON_LOOPBACK)


def test_open_mode_serves_metrics_to_anyone(world):
    backend = backend_for(world, "open")
    try:
        for app in apps(backend).values():
            assert asgi_get(app, "/metrics", NON_LOOPBACK[0])[0] == 200
    finally:
        backend.close()


def test_non_loopback_clients_over_the_network(world):
    """The same over real HTTP: `pgkb serve` bound to every address, asked from this machine's own
    non-loopback address."""
    address = local_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address (the ASGI-scope test above covers the decision)")
    port = free_port()
    with running(["serve", "--host", "0.0.0.0", "--port", str(port)], env_for(world), port):
        assert call(f"http://{address}:{port}/metrics")[0] == 403
        assert answer(f"http://{address}:{port}/healthz") == (200, {"status": "ok"})
        assert scrape(f"http://127.0.0.1:{port}")  # loopback clients are served


def test_readiness_is_checked_once_for_many_probes(world):
    """Probes hammering /readyz share one check (and its database connection) per second."""
    from pgkb.serving.monitoring import Readiness

    checks = []
    backend = backend_for(world, "loopback")
    ready = Readiness(lambda: checks.append(1) or backend.readiness())
    try:
        with ThreadPoolExecutor(16) as pool:
            assert set(pool.map(lambda _: ready(), range(64))) == {None}
        assert len(checks) == 1
        time.sleep(1.1)
        assert ready() is None and len(checks) == 2
    finally:
        backend.close()
