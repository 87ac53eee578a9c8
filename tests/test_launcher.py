"""`make run` end to end (pgkb up / pgkb down): database, embed-server, MCP over HTTP, sample search, stop."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import psycopg
import pytest
from mcp import Client

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pgkb(env: dict[str, str], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pgkb.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def sandbox():
    """A private embedded cluster, state dir and ports (data dir reachable by the postgres OS user)."""
    root = Path(tempfile.mkdtemp(prefix="pgkb-up-", dir="/tmp"))
    root.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGKB_", "PG")) or k == "PGKB_PG_BINDIR"}
    env.update(
        PGKB_DATA_DIR=str(root / "data"),
        PGKB_PORT=str(free_port()),
        PGKB_STATE_DIR=str(root / "state"),
    )
    yield root, env
    pgkb(env, "down", timeout=120)
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_up_serves_psql_and_mcp_then_down_stops_everything(sandbox):
    root, env = sandbox
    docs = root / "docs"
    (docs / "runbooks").mkdir(parents=True)
    (docs / "runbooks" / "login.md").write_text(
        "# 登录态失效排查手册\n\n## 排查步骤\n\n用户登录后 token 过期会导致登录态失效。先检查 Redis 缓存击穿，"
        "再确认 session 的过期时间配置。\n",
        encoding="utf-8",
    )
    (docs / "faq.md").write_text("# 常见问题\n\n## 退款多久到账\n\n退款会在 3 个工作日内原路退回。\n", encoding="utf-8")
    embed_port, mcp_port = free_port(), free_port()
    ports = ["--embed-port", str(embed_port), "--mcp-port", str(mcp_port)]
    up = pgkb(env, "up", "--docs", str(docs), *ports)
    assert up.returncode == 0, up.stdout + up.stderr
    out = up.stdout
    first = next(line for line in out.splitlines() if line.strip().startswith("1. "))
    # the sample search found the runbook first and used the vector leg too (not "lexical only")
    assert first.strip().startswith("1. runbooks/login.md") and first.rstrip().endswith("hybrid"), first
    assert 'psql "' in out and '"mcpServers"' in out and "claude mcp add" in out and '"servers"' in out
    assert port_open(embed_port) and port_open(mcp_port)

    async def ask():
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        transport = streamable_http_client(
            f"http://127.0.0.1:{mcp_port}/mcp", http_client=httpx2.AsyncClient(timeout=60)
        )
        async with Client(transport, read_timeout_seconds=60) as client:
            result = await client.call_tool("search_knowledge", {"query": "退款多久到账", "top_k": 3})
            assert not result.is_error
            hits = result.structured_content["results"]
            assert hits[0]["doc_id"] == "faq.md" and hits[0]["vector_rank"] is not None

    anyio.run(ask)

    async def default_stdio_server_is_least_privileged():
        """`pgkb mcp` as an IDE starts it with no PGKB_DATABASE_URL and no PGKB_USER: the embedded cluster as
        pgkb_mcp, acting for nobody -- a private knowledge base of the administrator stays invisible."""
        from mcp import StdioServerParameters

        admin_url = pgkb(env, "db", "url", timeout=60).stdout.strip()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute("select kb.create_knowledge_base('admin-secret', 'private')")
        server_env = {
            **env,
            "PGKB_EMBED_PROVIDER": "http",
            "PGKB_EMBED_URL": f"http://127.0.0.1:{embed_port}/v1/embeddings",
        }
        params = StdioServerParameters(command=sys.executable, args=["-m", "pgkb.cli", "mcp"], env=server_env)
        async with Client(params, read_timeout_seconds=60) as client:
            result = await client.call_tool("list_knowledge_bases", {})
            assert not result.is_error
            assert {k["name"] for k in result.structured_content["knowledge_bases"]} == {"team-docs"}
            with psycopg.connect(admin_url, autocommit=True) as admin:
                roles = {r[0] for r in admin.execute(
                    "select usename from pg_stat_activity"
                    " where backend_type = 'client backend' and pid <> pg_backend_pid()"
                )}  # fmt: skip
            assert roles == {"pgkb_mcp"}  # the HTTP server of `up` and this stdio server

    anyio.run(default_stdio_server_is_least_privileged)

    again = pgkb(env, "up", "--docs", str(docs), *ports)
    assert again.returncode == 0 and "already running" in again.stdout and "2 unchanged" in again.stdout

    down = pgkb(env, "down", timeout=120)
    assert down.returncode == 0, down.stderr
    assert not port_open(embed_port) and not port_open(mcp_port)
    status = pgkb(env, "db", "status", timeout=60)
    assert "state: stopped" in status.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("health", "found"),
    [
        ({"status": "ok", "model": "other-model", "dimension": 8}, "pgkb embed-server serving 'other-model' (8"),
        ({"status": "ok"}, "a server that is not pgkb embed-server"),
    ],
)
def test_up_refuses_a_server_on_the_embed_port_that_serves_another_model(sandbox, health, found):
    """Issue 35: `pgkb up` took anything answering 200 on the embed port for its own embed-server. Now it
    reuses one only when it serves the registry's default model with its dimension, else says what it found."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Other(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            body = json.dumps(health).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    root, env = sandbox
    server = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        embed_port = server.server_address[1]
        up = pgkb(env, "up", "--docs", str(REPO / "examples" / "kb"), "--embed-port", str(embed_port),
                  "--mcp-port", str(free_port()))  # fmt: skip
    finally:
        server.shutdown()
    assert up.returncode == 1, up.stdout + up.stderr
    error = up.stderr.strip().splitlines()[-1]
    assert error.startswith("pgkb: error: ") and "Traceback" not in up.stderr, up.stderr
    assert found in error and "'multilingual-e5-small' (384 dimensions)" in error and "--embed-port" in error
    assert "ingested" not in up.stdout


def test_the_sample_search_prints_no_empty_heading_path():
    """Issue 35: a hit without headings printed `[]`."""
    from pgkb.launcher import sample_line

    assert sample_line(1, "faq.md", "", 0.5, True) == "  1. faq.md  score 0.5  hybrid"
    assert sample_line(2, "a.md", None, 0.25, False) == "  2. a.md  score 0.25  lexical only"
    assert sample_line(3, "b.md", "登录 > 排查", 0.1, True) == "  3. b.md  [登录 > 排查]  score 0.1  hybrid"
