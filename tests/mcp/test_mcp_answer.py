"""The MCP tool ask_knowledge and the prompt answer_with_citations through the SDK's real client (stdio
subprocess), real database and real embeddings. The world is test_mcp's: team-docs (public fixture docs),
alice-notes (private to alice, marker zebramarker), bob-notes (private to bob, marker bobmarker).

The database embeds kb.ask's query itself (kb.settings embedding_url): here a local endpoint answering with
the offline model's real vectors, so nothing depends on what else listens on this machine."""

from __future__ import annotations

import json

import anyio
import pytest
from mcp import Client, MCPError
from test_mcp import stdio_params, text_of, world  # noqa: F401  (world is a fixture)

pytestmark = pytest.mark.slow  # starts `pgkb mcp` with a chat endpoint


@pytest.fixture
def ask_world(world, embedder, fake_embeddings):  # noqa: F811
    if not world.execute("select 1 from pg_extension where extname = 'plpython3u'").fetchone():
        pytest.skip("plpython3u is not installed on this server: the database cannot embed kb.ask's query")
    endpoint = fake_embeddings(embedder.embed)
    world.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
    world.execute("update kb.settings set value = '' where key = 'chat_url'")  # offline: extractive answers
    content = "bobmarker 私人计划：火星基地的氧气配额是每人每天 550 升。"
    vector = embedder.embed(["passage: bob 的计划\n" + content])[0]
    world.execute(
        "select * from kb.replace_document('bob-notes', 'bob-plan.md', 'bob 的计划', %s::jsonb)",
        [json.dumps([{"content": content, "embedding": [float(x) for x in vector]}], ensure_ascii=False)],
    )
    return world


def ask(client, **arguments):
    return client.call_tool("ask_knowledge", arguments)


def test_ask_knowledge_answers_with_citations_and_says_not_found(ask_world):
    async def main():
        async with Client(
            stdio_params(ask_world, PGKB_USER="alice", PGKB_MCP_EMBED_TIMEOUT_MS="120000"), read_timeout_seconds=60
        ) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            tool = tools["ask_knowledge"]
            assert tool.annotations.read_only_hint is True and tool.output_schema is not None
            assert {"answer", "found", "mode", "citations"} <= set(tool.output_schema["properties"])
            props = tool.input_schema["properties"]
            assert props["top_k"]["default"] == 5 and props["kb"]["default"] == ""

            result = await ask(client, question="退款多久到账", kb="team-docs")
            assert not result.is_error, text_of(result)
            out = result.structured_content
            assert out["found"] is True and out["mode"] == "extractive" and out["model"] is None
            assert out["citations"], out
            first = out["citations"][0]
            assert first["doc_key"] == "policy/refund.md" and first["kb"] == "team-docs"
            assert first["title"] == "退款政策" and first["heading_path"] == ["规则"]
            assert first["uri"] == "kb://team-docs/policy/refund.md"
            assert (
                first["quote"]
                and first["quote"] in "订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。"
            )
            assert f"[{first['n']}]" in out["answer"] and "3 个工作日" in out["answer"]
            assert out["dropped_citations"] == 0 and out["uncited"] is False
            assert set(out["timings_ms"]) == {"retrieve", "generate", "total"}
            text = text_of(result)
            assert "Sources:" in text and f"[{first['n']}] 退款政策 > 规则 — kb://team-docs/policy/refund.md" in text
            assert any("extractive" in n for n in out["notes"])

            # the answer is in bob's private notes only: alice gets "not found", never bob's text
            mars = await ask(client, question="火星基地的氧气配额是多少")
            assert not mars.is_error, text_of(mars)
            out = mars.structured_content
            assert out["found"] is False and out["mode"] == "not_found" and out["citations"] == []
            assert out["answer"] == "知识库中未找到相关信息"
            english = await ask(client, question="What is the oxygen quota of the Mars base?")
            assert english.structured_content["found"] is False
            assert english.structured_content["answer"].startswith("Not found in the knowledge base")
            marker = await ask(client, question="bobmarker 私人计划")
            assert "bob-notes" not in {c["kb"] for c in marker.structured_content["citations"]}
            assert "550" not in text_of(marker) and "bobmarker" not in marker.structured_content["answer"]

            # bad input: clear tool errors
            hidden = await ask(client, question="火星基地", kb="bob-notes")
            assert hidden.is_error and "unknown knowledge base" in text_of(hidden)
            blank = await ask(client, question="   ")
            assert blank.is_error and "must not be empty" in text_of(blank)
            zero = await ask(client, question="退款", top_k=0)
            assert zero.is_error and "top_k" in text_of(zero)
            long = await ask(client, question="退" * 5000)
            assert long.is_error and "characters" in text_of(long)

        # bob sees his own notes: the same question is answered from them (the test above could fail)
        async with Client(
            stdio_params(ask_world, PGKB_USER="bob", PGKB_MCP_EMBED_TIMEOUT_MS="120000"), read_timeout_seconds=60
        ) as client:
            mars = await ask(client, question="火星基地的氧气配额是多少")
            out = mars.structured_content
            assert out["found"] is True and {c["kb"] for c in out["citations"]} == {"bob-notes"}
            assert "550" in out["answer"]

    anyio.run(main)


def test_answer_with_citations_prompt(ask_world):
    async def main():
        async with Client(
            stdio_params(ask_world, PGKB_USER="alice", PGKB_MCP_EMBED_TIMEOUT_MS="120000"), read_timeout_seconds=60
        ) as client:
            prompts = {p.name: p for p in (await client.list_prompts()).prompts}
            prompt = prompts["answer_with_citations"]
            args = {a.name: a for a in prompt.arguments}
            assert set(args) == {"question", "kb", "top_k", "also"} and args["question"].required
            assert not args["kb"].required and not args["top_k"].required

            got = await client.get_prompt("answer_with_citations", {"question": "退款多久到账", "top_k": "3"})
            assert len(got.messages) == 1 and got.messages[0].role == "user"
            text = got.messages[0].content.text
            # the rules are kb.answer_prompt's (one implementation): cite [n], the not-found sentence
            assert "square brackets" in text and "知识库中未找到相关信息" in text
            assert "[1] 退款政策 > 规则" in text and "3 个工作日内原路退回" in text
            assert "[1] kb://team-docs/policy/refund.md" in text and "Question: 退款多久到账" in text
            assert "lexical search only" not in text  # the prompt's search used this server's query embedding
            assert text.count("] kb://") == 3  # top_k 3 sources, each with its location

            mine = await client.get_prompt("answer_with_citations", {"question": "bobmarker 火星基地 氧气配额"})
            assert "bobmarker" not in mine.messages[0].content.text.replace("Question: bobmarker", "")
            assert "bob-notes" not in mine.messages[0].content.text

            for arguments, message in [
                ({"question": "退款", "top_k": "abc"}, "top_k must be an integer"),
                ({"question": "退款", "top_k": "0"}, "top_k must be an integer between 1 and 20"),
                ({"question": "  "}, "must not be empty"),
                ({"question": "退款", "kb": "bob-notes"}, "unknown knowledge base"),
                ({"question": "退款", "also": "a\nb\nc\nd"}, "at most 3"),
            ]:
                with pytest.raises(MCPError, match=message):
                    await client.get_prompt("answer_with_citations", arguments)

        async with Client(
            stdio_params(ask_world, PGKB_USER="bob", PGKB_MCP_EMBED_TIMEOUT_MS="120000"), read_timeout_seconds=60
        ) as client:
            got = await client.get_prompt("answer_with_citations", {"question": "bobmarker 火星基地 氧气配额"})
            assert (
                "550" in got.messages[0].content.text and "kb://bob-notes/bob-plan.md" in got.messages[0].content.text
            )

    anyio.run(main)


def test_tools_say_lexical_only_show_titles_once_and_sources_people_can_open(ask_world, dead_embedding_url):
    """The embedding service down (the server's and the database's): ask_knowledge says its answer is
    lexical-only (and, with it up, a search finds the copies below). alice-notes' guide/login.md
    repeats its title as its first heading: shown once. team-docs' sources are paths on the server: the
    kb:// URI is shown. A text in two documents is one search result that names the other."""
    ask_world.execute("update kb.settings set value = %s where key = 'embedding_url'", [dead_embedding_url])
    refund = "订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。"
    ask_world.execute(
        "select * from kb.replace_document('alice-notes', 'refund-copy.md', '退款政策', %s::jsonb)",
        [json.dumps([{"content": refund}], ensure_ascii=False)],
    )

    async def main():
        async with Client(
            stdio_params(
                ask_world,
                PGKB_USER="alice",
                PGKB_MCP_EMBED_TIMEOUT_MS="120000",
                PGKB_EMBED_PROVIDER="http",
                PGKB_EMBED_URL=dead_embedding_url,
            ),
            read_timeout_seconds=60,
        ) as client:
            result = await ask(client, question="无理由退款", kb="team-docs")
            out = result.structured_content
            assert not result.is_error and out["found"] is True, text_of(result)
            lexical = [n for n in out["notes"] if n.startswith("lexical only: query embedding failed (")]
            assert lexical and f"Note: {lexical[0]}" in text_of(result)
            assert all(c["source_url"] is None for c in out["citations"])
        async with Client(
            stdio_params(ask_world, PGKB_USER="alice", PGKB_MCP_EMBED_TIMEOUT_MS="120000"), read_timeout_seconds=60
        ) as client:
            doc = await client.call_tool("get_document", {"doc_id": "guide/login.md", "kb": "alice-notes"})
            assert doc.structured_content["chunks"][0]["heading_path"] == ["问题"]
            assert doc.structured_content["source"] == "kb://alice-notes/guide/login.md"
            body = (await client.read_resource("kb://alice-notes/guide/login.md")).contents[0].text
            assert body.startswith("# alice 的登录笔记\n") and "[chunk 0] 问题\n" in body, body
            team = await client.call_tool("get_document", {"doc_id": "guide/login.md", "kb": "team-docs"})
            assert team.structured_content["source"] == "kb://team-docs/guide/login.md"

            found = await client.call_tool("search_knowledge", {"query": "无理由退款", "top_k": 10})
            copies = [r for r in found.structured_content["results"] if r["content"] == refund]
            assert len(copies) == 1 and copies[0]["doc_id"] == "policy/refund.md", found.structured_content
            assert copies[0]["also_in"] == ["kb://alice-notes/refund-copy.md"]
            assert "; also in kb://alice-notes/refund-copy.md)" in text_of(found)

    anyio.run(main)
