"""Smoke test of `pgkb mcp` with the official MCP Inspector CLI (`@modelcontextprotocol/inspector --cli`):
a client we did not write, spawning the server over stdio against the real test database.

The inspector is installed once per session into a temporary npm prefix (faster than `npx -y` per call).
Skips only when npm/npx is not on PATH or the npm registry is unreachable; any other failure fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import fixture_docs
import pytest

pytestmark = pytest.mark.slow  # npm: runs the MCP Inspector

PACKAGE = "@modelcontextprotocol/inspector"
NETWORK_ERROR = re.compile(
    r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
    r"network|request to https?://\S+ failed|getaddrinfo|socket hang up",
    re.IGNORECASE,
)


@pytest.fixture(scope="session")
def inspector_bin(tmp_path_factory) -> str:
    """Path of the inspector's `mcp-inspector` bin, installed once into a session temp prefix."""
    npm = shutil.which("npm")
    if shutil.which("npx") is None or npm is None:
        pytest.skip("npx/npm not on PATH: the MCP Inspector CLI needs Node.js")
    prefix = tmp_path_factory.mktemp("mcp-inspector")
    started = time.monotonic()
    proc = subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", PACKAGE],
        capture_output=True,
        text=True,
        timeout=600,
    )
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        network = [line.strip() for line in output.splitlines() if NETWORK_ERROR.search(line)]
        if network:
            pytest.skip(f"npm registry unreachable, cannot install {PACKAGE}: {network[0][:300]}")
        pytest.fail(f"npm install {PACKAGE} failed (exit {proc.returncode}):\n{output}")
    version = json.loads((prefix / "node_modules" / PACKAGE / "package.json").read_text())["version"]
    print(f"\n{PACKAGE}@{version} installed in {elapsed:.1f}s", file=sys.stderr)
    binary = prefix / "node_modules" / ".bin" / "mcp-inspector"
    assert binary.exists(), f"no mcp-inspector bin in {prefix}: {output}"
    return str(binary)


@pytest.fixture
def service_dsn(db, embedder):
    """A fresh database with the fixture docs in a public KB; the server connects as svc, a member of
    pgkb_service (it refuses to serve as the administrator)."""
    db.execute("select kb.create_knowledge_base('team-docs', 'public')")
    fixture_docs.load(db, embedder, "team-docs")
    db.execute("grant pgkb_service to svc")  # cluster-wide: revoked below
    info = db.info
    yield f"host={info.host} port={info.port} dbname={info.dbname} user=svc"
    db.execute("revoke pgkb_service from svc")


def inspect(inspector_bin: str, dsn: str, *method_args: str) -> tuple[dict, str]:
    """Run the inspector CLI against `<venv python> -m pgkb.cli mcp` over stdio; return (parsed JSON, stdout)."""
    # The inspector's stdio transport passes its whole environment on to the server: keep ours out of it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGKB_")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2")
    cmd = [
        inspector_bin,
        "--cli",
        "-e",
        f"PGKB_DATABASE_URL={dsn}",
        sys.executable,
        "-m",
        "pgkb.cli",
        "mcp",
        *method_args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"inspector exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    stdout = proc.stdout
    return json.loads(stdout[stdout.index("{") :]), stdout


def test_inspector_lists_tools_and_searches(inspector_bin, service_dsn):
    started = time.monotonic()
    listed, _ = inspect(inspector_bin, service_dsn, "--method", "tools/list")
    names = {tool["name"] for tool in listed["tools"]}
    assert {"search_knowledge", "get_document", "list_knowledge_bases"} <= names, names
    list_s = time.monotonic() - started

    started = time.monotonic()
    called, stdout = inspect(
        inspector_bin,
        service_dsn,
        "--method",
        "tools/call",
        "--tool-name",
        "search_knowledge",
        "--tool-arg",
        "query=退款",
        "--tool-arg",
        "top_k=3",
    )
    assert not called.get("isError"), stdout
    assert "policy/refund.md" in stdout
    structured = called["structuredContent"]  # --tool-arg values are strings; the server coerces top_k
    assert structured["results"][0]["doc_id"] == "policy/refund.md", structured
    assert structured["top_k"] == 3 and structured["result_count"] <= 3
    print(f"\ntools/list {list_s:.1f}s, tools/call {time.monotonic() - started:.1f}s", file=sys.stderr)


def test_inspector_sees_the_knowledge_language_and_passes_also(inspector_bin, service_dsn):
    """Issue 31: the tool descriptions tell an agent which language the knowledge is in and what `also` takes;
    list_knowledge_bases gives each knowledge base's languages; a search with a translation in `also` works."""
    listed, _ = inspect(inspector_bin, service_dsn, "--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    for name in ("search_knowledge", "ask_knowledge"):
        description = tools[name]["description"]
        assert "The knowledge is mostly Chinese" in description and "`also`" in description, description
        assert "also" in tools[name]["inputSchema"]["properties"], tools[name]["inputSchema"]
    called, stdout = inspect(
        inspector_bin, service_dsn, "--method", "tools/call", "--tool-name", "list_knowledge_bases"
    )
    assert not called.get("isError"), stdout
    kb = called["structuredContent"]["knowledge_bases"][0]
    assert kb["languages"]["main"] == "zh" and kb["languages"]["zh"] > 0.5, kb
    assert "mostly Chinese" in stdout
    called, stdout = inspect(
        inspector_bin, service_dsn, "--method", "tools/call", "--tool-name", "search_knowledge",
        "--tool-arg", "query=refund policy", "--tool-arg", 'also=["退款"]', "--tool-arg", "top_k=3",
    )  # fmt: skip
    assert not called.get("isError"), stdout
    assert called["structuredContent"]["results"][0]["doc_id"] == "policy/refund.md", stdout
    # without `also`, the English query is searched with its offline translation too, and the agent is told
    called, stdout = inspect(
        inspector_bin, service_dsn, "--method", "tools/call", "--tool-name", "search_knowledge",
        "--tool-arg", "query=What is the refund policy?", "--tool-arg", "top_k=3",
    )  # fmt: skip
    assert not called.get("isError"), stdout
    notes = called["structuredContent"]["notes"]
    assert any("offline translation (退款" in n and "`also`" in n for n in notes), notes
    assert called["structuredContent"]["results"][0]["doc_id"] == "policy/refund.md", stdout
