"""save_knowledge through the SDK's real MCP client (`pgkb mcp --allow-writes` over stdio, real database, real
embeddings): off by default, annotated as a write, saved as the acting user into a knowledge base they may
write, searchable at once, replaced when saved again, and refused with the read tools' own error for a
knowledge base the user cannot see."""

from __future__ import annotations

import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from server_process import server_env, world  # noqa: F401 (world is a fixture)

pytestmark = pytest.mark.slow  # starts `pgkb mcp` servers


def params(db, *flags: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "pgkb.cli", "mcp", *flags], env=server_env(db, **env)
    )


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def test_save_knowledge_is_off_unless_writes_are_allowed(world):
    async def main():
        async with Client(params(world, PGKB_USER="alice"), read_timeout_seconds=60) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert "save_knowledge" not in names
            refused = await client.call_tool("save_knowledge", {"kb": "alice-notes", "title": "t", "body": "b"})
            assert refused.is_error

    anyio.run(main)


def test_an_agent_saves_what_it_learned_and_finds_it(world):
    body = "登录态频繁失效的根因是 quokkamarker 网关把 session cookie 的 SameSite 改成了 Strict。\n\n修复：改回 Lax。"

    async def main():
        async with Client(params(world, "--allow-writes", PGKB_USER="alice"), read_timeout_seconds=90) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            save = tools["save_knowledge"]
            assert save.annotations.read_only_hint is False and save.annotations.destructive_hint is True
            assert save.output_schema is not None

            saved = await client.call_tool(
                "save_knowledge",
                {"kb": "alice-notes", "title": "登录态失效的根因", "body": body, "tags": ["登录", "cookie"]},
            )
            assert not saved.is_error, text_of(saved)
            out = saved.structured_content
            assert out["doc_id"] == "saved/登录态失效的根因" and out["kb"] == "alice-notes"
            assert out["searchable_now"] is True and out["changed"] is True and out["chunk_count"] >= 1
            assert out["uri"].startswith("kb://alice-notes/saved/")

            found = await client.call_tool("search_knowledge", {"query": "quokkamarker SameSite", "kb": "alice-notes"})
            top = found.structured_content["results"][0]
            assert top["doc_id"] == "saved/登录态失效的根因" and top["vector_rank"] is not None
            doc = await client.call_tool("get_document", {"doc_id": "saved/登录态失效的根因", "kb": "alice-notes"})
            assert "Saved through an MCP client (save_knowledge)" in text_of(doc)

            # saved again: replaced, not added
            again = await client.call_tool(
                "save_knowledge",
                {"kb": "alice-notes", "title": "登录态失效的根因", "body": "quokkamarker v2：改回 Lax。"},
            )
            assert not again.is_error and again.structured_content["doc_id"] == "saved/登录态失效的根因"
            found = await client.call_tool("search_knowledge", {"query": "quokkamarker", "kb": "alice-notes"})
            saved_hits = [r for r in found.structured_content["results"] if r["doc_id"].startswith("saved/")]
            assert len(saved_hits) == 1 and "v2" in saved_hits[0]["content"]

            # another user's knowledge base: the read tools' own error, word for word
            for kb in ("bob-notes", "no-such-kb"):
                refused = await client.call_tool("save_knowledge", {"kb": kb, "title": "t", "body": "b"})
                searched = await client.call_tool("search_knowledge", {"query": "x", "kb": kb})
                assert refused.is_error and searched.is_error
                assert text_of(refused).replace("save_knowledge", "") == text_of(searched).replace(
                    "search_knowledge", ""
                ), (text_of(refused), text_of(searched))
            for arguments, message in [
                ({"kb": "alice-notes", "title": " ", "body": "b"}, "needs a title"),
                ({"kb": "alice-notes", "title": "t", "body": ""}, "needs a body"),
                ({"kb": "alice-notes", "title": "t", "body": "长" * 20001}, "at most 20000 are accepted"),
                ({"kb": "alice-notes", "title": "t", "body": "b", "tags": ["x"] * 17}, "at most 16"),
            ]:
                refused = await client.call_tool("save_knowledge", arguments)
                assert refused.is_error and message in text_of(refused), (arguments, text_of(refused))

        # bob may read team-docs (public) but not write it
        async with Client(params(world, "--allow-writes", PGKB_USER="bob"), read_timeout_seconds=90) as client:
            refused = await client.call_tool("save_knowledge", {"kb": "team-docs", "title": "t", "body": "b"})
            assert refused.is_error and 'may not write to knowledge base "team-docs"' in text_of(refused)

    anyio.run(main)
    rows = world.execute(
        "select d.doc_key, d.metadata ->> 'saved_by', d.metadata ->> 'origin', d.metadata -> 'tags'"
        " from kb.documents d where d.doc_key like 'saved/%'"
    ).fetchall()
    assert rows == [("saved/登录态失效的根因", "alice", "mcp", [])]  # the second save had no tags
