"""Reliability 5b: hostile input to the MCP tools over stdio and streamable HTTP (hypothesis-generated
arguments through the SDK's real client), raw garbage on the stdio stream, and fuzzed HTTP requests to the
MCP HTTP endpoint and to the embed-server. 0 crashes (the servers keep answering), 0 5xx for bad input,
tool errors that read as messages (no tracebacks), every answer within a bounded time.

Fast: 80 tool calls per transport and 80 HTTP requests per server; long (PGKB_SOAK=1): thousands.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time

import pytest
import relhelpers as rh
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.reliability

FUZZ = settings(
    max_examples=rh.scale(80, 2500),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not rh.SOAK,
    database=None,
)
CALL_SECONDS = 30.0  # the slowest acceptable answer to one call

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.text(max_size=30),
        st.sampled_from(["", "x" * 20000, "退款" * 3000, "\u0000", "../../etc/passwd", "kb://fz/a.md"]),
    ),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
VALID = {
    "query": st.one_of(st.sampled_from(["fuzzword", "退款", "refund policy"]), st.text(min_size=1, max_size=50)),
    "top_k": st.integers(1, 20),
    "kb": st.sampled_from(["", "fz", "public-kb"]),
    "doc_id": st.sampled_from(["a.md", "b.md", "missing.md"]),
    "chunk_index": st.integers(-1, 3),
    "window": st.integers(0, 20),
}
HOSTILE = {
    "query": json_values,
    "top_k": st.one_of(st.integers(-(2**63), 2**63), json_values),
    "kb": json_values,
    "doc_id": json_values,
    "chunk_index": st.one_of(st.integers(-(2**63), 2**63), json_values),
    "window": st.one_of(st.integers(-(2**63), 2**63), json_values),
}
TOOL_ARGS = {
    "search_knowledge": ["query", "top_k", "kb"],
    "get_document": ["doc_id", "kb", "chunk_index", "window"],
    "list_knowledge_bases": [],
}


@st.composite
def tool_calls(draw):
    """(tool name, arguments): mostly real tools with 0-all arguments hostile, some missing or extra."""
    name = draw(st.sampled_from([*TOOL_ARGS, "search_knowledge", "get_document", "no_such_tool"]))
    keys = TOOL_ARGS.get(name, ["query"])
    bad = set(draw(st.permutations(keys))[: draw(st.integers(0, len(keys)))]) if keys else set()
    args = {k: draw(HOSTILE[k] if k in bad else VALID[k]) for k in keys if draw(st.integers(0, 9)) != 0}
    if draw(st.integers(0, 5)) == 0:
        args[draw(st.text(max_size=10))] = draw(json_values)
    return name, args


@pytest.fixture
def world(rdb):
    rdb.execute("select kb.create_knowledge_base('fz', 'private', owner => 'alice')")
    rdb.execute("select kb.create_knowledge_base('public-kb', 'public', owner => 'bob')")
    for kb, key in (("fz", "a.md"), ("public-kb", "b.md")):
        content = f"fuzzword 退款 refund policy {kb}"
        rdb.execute(
            "select * from kb.replace_document(%s, %s, 'T', %s)",
            [kb, key, json.dumps([{"content": content, "embedding": rh.fake_vector(content)}] * 1)],
        )
    return rdb


def fuzz_session(client_cm, portal, label: str, server_alive) -> dict:
    """Run the hypothesis-generated calls through one MCP session; return figures."""
    counts = {"calls": 0, "ok": 0, "tool_errors": 0, "protocol_errors": 0, "max_call_s": 0.0}
    with portal.wrap_async_context_manager(client_cm) as client:

        @FUZZ
        @given(call=tool_calls())
        def fuzz(call):
            from mcp import MCPError

            name, args = call
            t0 = time.monotonic()
            try:
                result = portal.call(client.call_tool, name, args)
            except MCPError as e:  # a JSON-RPC error answer (e.g. unknown tool): the session goes on
                counts["protocol_errors"] += 1
                assert "Traceback" not in str(e), e
            else:
                text = rh.text_of(result)
                assert "Traceback" not in text, text
                if result.is_error:
                    counts["tool_errors"] += 1
                    assert text.strip(), "a tool error without a message"
                else:
                    counts["ok"] += 1
            seconds = time.monotonic() - t0
            counts["calls"] += 1
            counts["max_call_s"] = round(max(counts["max_call_s"], seconds), 2)
            assert seconds < CALL_SECONDS
            assert server_alive(), f"the {label} server died"

        fuzz()
        # still serving normally afterwards
        result = portal.call(client.call_tool, "search_knowledge", {"query": "fuzzword"})
        assert not result.is_error and result.structured_content["result_count"] >= 1
    return counts


def test_fuzz_mcp_tool_arguments_over_stdio(world, dsn_of, fake):
    with start_blocking_portal() as portal:
        counts = fuzz_session(rh.stdio_client(dsn_of("svc"), fake.url, PGKB_USER="alice"), portal, "stdio", lambda: 1)
    rh.publish("fuzz-mcp-stdio", **counts)
    assert counts["ok"] and counts["tool_errors"]


def test_fuzz_mcp_tool_arguments_over_http(world, dsn_of, fake, tmp_path):
    server, base = rh.mcp_http_server(dsn_of("svc"), fake.url, tmp_path, {"tok": "alice"})
    try:
        with start_blocking_portal() as portal:
            alive = lambda: server.proc.poll() is None  # noqa: E731
            counts = fuzz_session(rh.http_client(base, "tok", read_timeout_seconds=60), portal, "HTTP", alive)
    finally:
        server.stop()
    assert "Traceback" not in server.stderr(), server.stderr()[-3000:]
    rh.publish("fuzz-mcp-http", **counts)
    assert counts["ok"] and counts["tool_errors"]


# ------------------------------------------------------------------------------------ raw stdio garbage

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}},
}
GARBAGE = [
    b"not json at all\n",
    b"{\n",
    b'{"jsonrpc": "2.0"}\n',
    b"[]\n",
    b"null\n",
    b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": "x"}\n',
    b'{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "search_knowledge", "arguments": 5}}\n',
    b'{"jsonrpc": "2.0", "id": 9, "method": "no/such/method"}\n',
    b"\xff\xfe\xfd invalid utf-8\n",
    b'{"jsonrpc": "2.0", "id": 10, "method": "tools/list", "params": {"cursor": ' + b"1" * 5000 + b"}}\n",
    b"\n",
    b'{"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "search_knowledge", "arguments": '
    b'{"query": "\xff\xfe"}}}\n',
    b'{"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {"name": "search_knowledge", "arguments": '
    b'{"query": "' + b"\xe9\x80\x80" * 400000 + b'"}}}\n',
    b"x" * (4 << 20) + b"\n",
]


def read_responses(proc, found: dict, stop: threading.Event) -> None:
    for line in proc.stdout:
        try:
            message = json.loads(line)
        except ValueError:
            found.setdefault("non_json_output", []).append(line[:200])
            continue
        if isinstance(message, dict) and "id" in message:
            found[message["id"]] = message
        if stop.is_set():
            return


def test_stdio_server_survives_garbage_lines(world, dsn_of, fake):
    env = rh.child_env(dsn_of("svc"), fake.url, PGKB_USER="alice")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgkb.cli", "mcp"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    found: dict = {}
    stop = threading.Event()
    reader = threading.Thread(target=read_responses, args=(proc, found, stop), daemon=True)
    reader.start()
    try:
        proc.stdin.write(json.dumps(INIT).encode() + b"\n")
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        proc.stdin.flush()
        assert rh.wait_for(lambda: 1 in found, 60), proc.stderr.read1(5000) if proc.poll() is not None else "no answer"
        for line in GARBAGE:
            proc.stdin.write(line)
        proc.stdin.write(b'{"jsonrpc": "2.0", "id": 99, "method": "tools/list"}\n')
        proc.stdin.flush()
        answered = rh.wait_for(lambda: 99 in found, 20)
        alive = proc.poll() is None
    finally:
        stop.set()
        proc.kill()
        proc.wait(10)
    assert alive and answered, found
    assert "non_json_output" not in found, found["non_json_output"]  # stdout carries the protocol only
    assert {t["name"] for t in found[99]["result"]["tools"]} >= {"search_knowledge"}


# ------------------------------------------------------------------------------------- HTTP endpoints


def raw_request(port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> int:
    """The status of one request (an event stream's body is not waited for: the status line is the answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_SECONDS)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        if "text/event-stream" not in (response.getheader("content-type") or ""):
            response.read()
        return response.status
    finally:
        conn.close()


bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"jsonrpc": st.sampled_from(["2.0", "1.0", 2]), "method": st.one_of(st.text(max_size=20), json_values)},
        optional={"id": json_values, "params": json_values},
    ).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"input": json_values},
        optional={"model": json_values, "encoding_format": json_values, "dimensions": json_values},
    ).map(lambda v: json.dumps(v).encode()),
)


def request_parts(paths: list[str]):
    return st.tuples(
        st.sampled_from(["POST", "POST", "POST", "POST", "GET", "PUT", "DELETE", "OPTIONS"]),
        st.sampled_from(paths),
        bodies,
        st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1"]),
        st.sampled_from(["application/json, text/event-stream", "text/event-stream", "*/*", ""]),
    )


MCP_PATHS = ["/mcp", "/mcp", "/mcp", "/mcp/", "/sse", "/messages/", "/messages/?session_id=x", "/x"]
EMBED_PATHS = ["/v1/embeddings", "/v1/embeddings", "/v1/embeddings", "/v1/rerank", "/rerank", "/health", "/x"]


def fuzz_http(port: int, token: str | None, label: str, alive, paths: list[str]) -> dict:
    statuses: dict[int, int] = {}

    @FUZZ
    @given(parts=request_parts(paths))
    def fuzz(parts):
        method, path, body, content_type, accept = parts
        headers = {"Content-Type": content_type, "Accept": accept}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        status = raw_request(port, method, path, body if method in ("POST", "PUT") else None, headers)
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, f"{label}: {method} {path} {body[:200]!r} -> {status}"
        assert alive()

    fuzz()
    return dict(sorted(statuses.items()))


def test_fuzz_mcp_http_endpoint(world, dsn_of, fake, tmp_path):
    server, base = rh.mcp_http_server(dsn_of("svc"), fake.url, tmp_path, {"tok": "alice"})
    port = int(base.rsplit(":", 1)[1])
    try:
        statuses = fuzz_http(port, "tok", "MCP HTTP", lambda: server.proc.poll() is None, MCP_PATHS)
        assert raw_request(port, "POST", "/mcp", b"{}", {}) == 401  # and without a token: refused
    finally:
        server.stop()
    rh.publish("fuzz-http-mcp", statuses=statuses)


class HashEmbedder:
    """A cheap embedder to serve (the fuzzing is about the HTTP layer, not the model)."""

    name, dimension = rh.MODEL, rh.DIM

    def embed(self, texts):
        import numpy as np

        return np.asarray([rh.fake_vector(t) for t in texts], dtype=np.float32)


def test_fuzz_embed_server_endpoint():
    from pgkb.embed_server import start_in_thread

    running = start_in_thread(HashEmbedder())
    try:
        port = int(running.server.url.rsplit(":", 1)[1])
        statuses = fuzz_http(port, None, "embed-server", lambda: running.thread.is_alive(), EMBED_PATHS)
        good = raw_request(port, "POST", "/v1/embeddings", b'{"input": "x"}', {"Content-Type": "application/json"})
        assert good == 200  # and a good request after all that is still served
    finally:
        running.stop()
    rh.publish("fuzz-http-embed-server", statuses=statuses)


def send_huge(port: int, path: str, size: int, headers: dict[str, str]) -> tuple[int, float, int]:
    """POST ``size`` bytes (announced with Content-Length); returns (status, seconds, bytes sent before the
    answer came back or the connection was closed)."""
    import socket

    t0 = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=CALL_SECONDS)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {size}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    sock.sendall(head.encode())
    piece, sent = b'{"input": ["' + b"x" * (1 << 20), 0
    sock.setblocking(False)
    answer = b""
    while sent < size:
        try:
            answer += sock.recv(65536)
            if answer:
                break
        except BlockingIOError:
            pass
        try:
            sent += sock.send(piece[: min(len(piece), size - sent)])
        except BlockingIOError:
            time.sleep(0.001)
        except (BrokenPipeError, ConnectionResetError):
            break
    sock.setblocking(True)
    try:
        while b"\r\n" not in answer:
            more = sock.recv(65536)
            if not more:
                break
            answer += more
    except (ConnectionResetError, TimeoutError):
        pass
    sock.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, time.monotonic() - t0, sent


def test_ten_megabyte_bodies_are_refused_without_being_buffered(world, dsn_of, fake, tmp_path):
    from pgkb.embed_server import start_in_thread

    size = 10 * 1024 * 1024
    running = start_in_thread(HashEmbedder())
    try:
        port = int(running.server.url.rsplit(":", 1)[1])
        status, seconds, sent = send_huge(port, "/v1/embeddings", size, {"Content-Type": "application/json"})
        assert status == 413 and seconds < 10, (status, seconds)
    finally:
        running.stop()
    rh.publish("huge-body-embed-server", status=status, seconds=round(seconds, 2), bytes_sent_before_answer=sent)

    server, base = rh.mcp_http_server(dsn_of("svc"), fake.url, tmp_path, {"tok": "alice"})
    port = int(base.rsplit(":", 1)[1])
    try:
        before = rh.hwm_kb(server.proc.pid)
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        statuses = []
        for _ in range(3):
            status, seconds, sent = send_huge(port, "/mcp", size, {**headers, "Authorization": "Bearer tok"})
            statuses.append(status)
        grown_mb = (rh.hwm_kb(server.proc.pid) - before) / 1024
        assert server.proc.poll() is None
        assert all(0 < s < 500 for s in statuses), statuses
    finally:
        server.stop()
    rh.publish("huge-body-mcp-http", statuses=statuses, peak_rss_growth_mb=round(grown_mb, 1))
    assert grown_mb < 200, f"three 10 MB requests grew the MCP server's peak memory by {grown_mb:.0f} MB"
