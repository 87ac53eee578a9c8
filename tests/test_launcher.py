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
