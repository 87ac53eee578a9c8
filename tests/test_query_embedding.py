"""pgkb.search.embed_query is the one query embedding of every path: `pgkb search`, `pgkb ask`, the MCP tools
(search_knowledge, ask_knowledge) and prompt (answer_with_citations), the page's /api/search and /api/ask and Dify's
/retrieval each embed a query exactly once, in Python, and the database none. The endpoint the clients embed
with is also the database's embedding_url, so an embedding the database made would be counted too. An
embedding that times out is tried once: the database does not try again, and the answer says lexical only.

World: server_process's (alice, team-docs ...); real servers and clients, real offline-model vectors
served over HTTP (tests/fake_embeddings.py counts the requests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from pgkb.serving.config import EMBED_WORKERS
from server_process import free_port, http_request, running, server_env, world  # noqa: F401 (world: a fixture)

pytestmark = pytest.mark.slow  # starts the CLI, MCP and HTTP servers

ALICE = {"Authorization": "Bearer alice-token"}
QUESTION = "退款多久到账"


@pytest.fixture
def endpoint(world, embedder, fake_embeddings):
    """The counting endpoint, serving the offline model's vectors; the database embeds with it too."""
    served = fake_embeddings(embedder.embed)
    world.execute("update kb.settings set value = %s where key = 'embedding_url'", [served.url])
    world.execute("update kb.settings set value = '' where key = 'chat_url'")
    return served


def client_env(world, url: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, **server_env(world, PGKB_EMBED_PROVIDER="http", PGKB_EMBED_URL=url)}
    env.pop("PGKB_USER", None)
    return {**env, **extra}


def cli(world, url: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "pgkb.cli", *args, "--user", "alice", "--json"],
        env=client_env(world, url), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def inputs(endpoint, since: int) -> list:
    return [r["input"] for r in endpoint.requests[since:]]


def test_cli_search_and_ask_embed_once_in_python(world, endpoint):
    out = cli(world, endpoint.url, "search", QUESTION)
    assert inputs(endpoint, 0) == [[f"query: {QUESTION}"]]
    assert out["vector_used"] is True and out["degraded"] is False
    row = cli(world, endpoint.url, "ask", QUESTION)
    assert inputs(endpoint, 1) == [[f"query: {QUESTION}"]]
    assert row["found"] is True and "lexical_only" not in row["evidence"]


def test_mcp_tools_embed_once_in_python(world, endpoint):
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "pgkb.cli", "mcp"],
        env=client_env(world, endpoint.url, PGKB_USER="alice", PGKB_MCP_EMBED_TIMEOUT_MS="0"),
    )  # fmt: skip
    seen: list[int] = []

    async def main():
        async with Client(params, read_timeout_seconds=60) as client:
            for tool, argument in (("search_knowledge", "query"), ("ask_knowledge", "question")):
                before = len(endpoint.requests)
                result = await client.call_tool(tool, {argument: QUESTION})
                assert not result.is_error, result.content
                seen.append(len(endpoint.requests) - before)
                if tool == "search_knowledge":
                    assert result.structured_content["degraded"] is False
            before = len(endpoint.requests)
            prompt = await client.get_prompt("answer_with_citations", {"question": QUESTION})
            seen.append(len(endpoint.requests) - before)
            assert "query embedding failed" not in prompt.messages[0].content.text

    anyio.run(main)
    assert seen == [1, 1, 1]


@pytest.fixture
def serve(world, endpoint):
    def start(url: str, timeout_ms: str = "0"):
        port = free_port()
        env = client_env(world, url, PGKB_MCP_TOKENS="alice-token:alice", PGKB_MCP_EMBED_TIMEOUT_MS=timeout_ms)
        return port, running(["serve", "--port", str(port)], env, port)

    return start


def post(port: int, path: str, body: dict) -> dict:
    status, raw, _ = http_request(f"http://127.0.0.1:{port}{path}", body, ALICE)
    assert status == 200, raw
    return json.loads(raw)


RETRIEVAL = {"knowledge_id": "team-docs", "query": QUESTION, "retrieval_setting": {"top_k": 2, "score_threshold": 0}}


def test_page_and_dify_embed_once_in_python(world, endpoint, serve):
    port, server = serve(endpoint.url)
    with server:
        for path, body in (
            ("/api/search", {"query": QUESTION}),
            ("/api/ask", {"question": QUESTION}),
            ("/retrieval", RETRIEVAL),
        ):
            before = len(endpoint.requests)
            out = post(port, path, body)
            assert inputs(endpoint, before) == [[f"query: {QUESTION}"]], path
            assert out.get("degraded") is not True and "lexical_only" not in out.get("evidence", {}), out


def test_a_timed_out_embedding_is_tried_once(world, endpoint, serve, fake_embeddings):
    """The endpoint hangs: each call waits PGKB_MCP_EMBED_TIMEOUT_MS once, then runs the lexical legs; the
    database, whose embedding_url is the same hung endpoint, is never asked to embed."""
    hung = fake_embeddings(stall=True)
    world.execute("update kb.settings set value = %s where key = 'embedding_url'", [hung.url])
    port, server = serve(hung.url, "500")
    with server:
        searched = post(port, "/api/search", {"query": QUESTION})
        assert searched["degraded"] is True and "500 ms" in searched["degraded_reason"]
        assert len(hung.requests) == 1
        answered = post(port, "/api/ask", {"question": QUESTION})
        said = answered["evidence"]["lexical_only"]
        assert said.startswith("lexical only: query embedding failed") and said in answered["notes"], said
        assert len(hung.requests) == 2
        assert post(port, "/retrieval", RETRIEVAL)["records"]
        # both embedding workers still wait on the hung endpoint: this one gave up without a request
        assert EMBED_WORKERS == 2 and len(hung.requests) == 2


def test_an_english_question_embeds_its_offline_translation_in_the_same_request(world, endpoint, serve):
    """Over Chinese knowledge (team-docs), an English question's embedding is blended with its offline
    translation's (kb.query_translation, kb.blend_query_embeddings): one request holds both, on every path;
    the CLI says what it translated."""
    question = "What is the refund policy?"
    translation = world.execute("select kb.query_translation(%s, 'team-docs')", [question]).fetchone()[0]
    assert translation and translation.split()[0] == "退款", translation
    both = [f"query: {question}", f"query: {translation}"]
    before = len(endpoint.requests)
    out = cli(world, endpoint.url, "search", question, "--kb", "team-docs")
    assert inputs(endpoint, before) == [both] and out["translation"] == translation
    assert out["results"][0]["doc_key"] == "policy/refund.md"
    port, server = serve(endpoint.url)
    with server:
        for path, body in (("/api/search", {"query": question, "kb": "team-docs"}),
                           ("/api/ask", {"question": question, "kb": "team-docs"})):  # fmt: skip
            before = len(endpoint.requests)
            post(port, path, body)
            assert inputs(endpoint, before) == [both], path
    # a Chinese question over the same knowledge is not translated
    assert world.execute("select kb.query_translation('退款多久到账', 'team-docs')").fetchone()[0] is None
