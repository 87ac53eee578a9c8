"""MCP end-to-end overhead for ``pgkb bench``: ``search_knowledge`` calls through a real MCP client session.

The server is ``pgkb mcp`` over stdio (what an IDE starts), connected as the login role
BENCH_ROLE (a member of pgkb_service, like ``pgkb_mcp`` of ``make run``) with no acting user, so it
searches the public bench knowledge base. The client is the ``mcp`` SDK's ``Client``. For every call the
client-observed wall time of ``call_tool`` is compared with the stages the server reports in
``timings_ms``: ``embed`` (query embedding) and ``search`` (the SQL: identity/timeout settings, the
``kb.hybrid_search`` call and fetching its rows). overhead = client time - embed - search: the MCP
protocol, JSON, taking a connection from the server's pool (with its liveness check), result shaping and
rendering. It is split into the part inside pgkb.search's own ``total`` (building the hits) and the part
outside it (the pooled connection, the MCP round trip, structured output and text rendering, the client's
validation).

A few warm-up calls run first (the first one loads the embedding model).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import numpy as np
import psycopg

from pgkb.bench.data import log
from pgkb.service_role import ensure_service_role, login_url

__all__ = ["BENCH_ROLE", "McpResult", "measure_mcp_overhead"]

BENCH_ROLE = "pgkb_bench_mcp"
WARMUP_CALLS = 3
TOP_K = 5  # search_knowledge's default


@dataclass
class McpResult:
    """Per-call milliseconds of `calls` timed search_knowledge calls."""

    calls: int
    transport: str
    client_ms: list[float]
    embed_ms: list[float]
    search_ms: list[float]
    overhead_ms: list[float]
    outside_search_ms: list[float]  # client time - the server's timings_ms.total

    @staticmethod
    def pct(values: list[float], p: float) -> float:
        return float(np.percentile(values, p))


def _service_url(conn: psycopg.Connection, url: str) -> str:
    """Create BENCH_ROLE (login, member of pgkb_service) if needed; its connection URL."""
    ensure_service_role(conn, BENCH_ROLE)
    return login_url(url, BENCH_ROLE)


async def _calls(env: dict[str, str], kb_name: str, queries: Sequence[str], calls: int) -> McpResult:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "pgkb.cli", "mcp"], env=env)
    result = McpResult(calls, "stdio", [], [], [], [], [])
    async with Client(params, read_timeout_seconds=120) as client:
        for k in range(WARMUP_CALLS + calls):
            args = {"query": queries[k % len(queries)], "top_k": TOP_K, "kb": kb_name}
            t0 = time.perf_counter()
            out = await client.call_tool("search_knowledge", args)
            client_ms = (time.perf_counter() - t0) * 1000.0
            if out.is_error:
                raise RuntimeError(f"search_knowledge failed: {''.join(getattr(c, 'text', '') for c in out.content)}")
            timings = out.structured_content["timings_ms"]
            if out.structured_content["degraded"]:
                raise RuntimeError(f"search_knowledge degraded: {out.structured_content['degraded_reason']}")
            if k < WARMUP_CALLS:
                continue
            result.client_ms.append(client_ms)
            result.embed_ms.append(timings["embed"])
            result.search_ms.append(timings["search"])
            result.overhead_ms.append(client_ms - timings["embed"] - timings["search"])
            result.outside_search_ms.append(client_ms - timings["total"])
            if (k - WARMUP_CALLS + 1) % 50 == 0:
                log(f"mcp: {k - WARMUP_CALLS + 1}/{calls} calls")
    return result


def measure_mcp_overhead(
    conn: psycopg.Connection,
    url: str,
    kb_name: str,
    queries: Sequence[str],
    calls: int,
    query_log: str | None = None,
) -> McpResult:
    """Time `calls` search_knowledge calls (after WARMUP_CALLS) against the public knowledge base kb_name.

    The server inherits this process's PGKB_* settings (embedding provider, model), with
    PGKB_DATABASE_URL set to BENCH_ROLE's URL and PGKB_USER removed; its PGKB_QUERY_LOG is `query_log`
    (None: no query log), one line per call, warm-up calls included."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGKB_USER", "PGKB_QUERY_LOG", "PGKB_MCP_TOKENS")}
    if query_log:
        env["PGKB_QUERY_LOG"] = query_log
    env["PGKB_DATABASE_URL"] = _service_url(conn, url)
    env.setdefault("PGKB_EMBED_PROVIDER", "offline")
    env["PYTHONUNBUFFERED"] = "1"
    log(f"mcp: {calls} search_knowledge calls over stdio")
    return anyio.run(_calls, env, kb_name, list(queries), calls)
