"""The question log through the SDK's real MCP client (`pgkb mcp` over stdio, real database, real embeddings):
with a knowledge base's log on, search_knowledge and ask_knowledge return the logged question's id, the log
records the entry point 'mcp', and rate_answer rates the caller's own question (or keeps a rating alone when
nothing was logged) and refuses another user's question id as it refuses a missing one."""

from __future__ import annotations

import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from server_process import server_env, world  # noqa: F401 (world is a fixture)

pytestmark = pytest.mark.slow  # starts `pgkb mcp` servers


def params(db, **env: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "pgkb.cli", "mcp"], env=server_env(db, **env))


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def test_an_agent_asks_gets_a_question_id_and_rates_the_answer(world):
    world.execute("select kb.set_question_log('team-docs', 30)")
    bobs = world.execute(
        "insert into kb.questions (user_id, question, mode, entry_point, found, latency_ms)"
        " select id, 'bob asked this', 'ask', 'sql', false, 1 from kb.users where name = 'bob' returning id"
    ).fetchone()[0]

    async def main():
        async with Client(params(world, PGKB_USER="alice"), read_timeout_seconds=90) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            rate = tools["rate_answer"]
            assert rate.annotations.read_only_hint is False and rate.annotations.destructive_hint is False
            assert rate.output_schema is not None

            found = await client.call_tool("search_knowledge", {"query": "退款", "kb": "team-docs"})
            assert not found.is_error and isinstance(found.structured_content["question_id"], int)

            asked = await client.call_tool("ask_knowledge", {"question": "退款政策是什么？", "kb": "team-docs"})
            assert not asked.is_error, text_of(asked)
            qid = asked.structured_content["question_id"]
            assert isinstance(qid, int) and f"question_id {qid}" in text_of(asked)

            rated = await client.call_tool("rate_answer", {"helpful": False, "question_id": qid, "note": "太笼统"})
            assert not rated.is_error, text_of(rated)
            assert rated.structured_content["question_id"] == qid
            again = await client.call_tool("rate_answer", {"helpful": True, "question_id": qid})
            assert not again.is_error and again.structured_content["rating_id"] == rated.structured_content["rating_id"]

            # nothing logged (alice-notes keeps no log): a rating kept alone, with its question
            private = await client.call_tool("ask_knowledge", {"question": "zebramarker 是什么", "kb": "alice-notes"})
            assert private.structured_content["question_id"] is None
            alone = await client.call_tool(
                "rate_answer", {"helpful": False, "question": "zebramarker 是什么", "kb": "alice-notes"}
            )
            assert not alone.is_error and alone.structured_content["question_id"] is None

            # another user's question id is refused as a missing one is
            theirs = await client.call_tool("rate_answer", {"helpful": True, "question_id": bobs})
            missing = await client.call_tool("rate_answer", {"helpful": True, "question_id": bobs + 1000})
            assert theirs.is_error and missing.is_error
            assert text_of(theirs).replace(str(bobs), "N") == text_of(missing).replace(str(bobs + 1000), "N")
            for arguments, message in [
                ({"helpful": True}, "give either question_id"),
                ({"helpful": "yes", "question_id": qid}, "helpful"),
                ({"helpful": True, "question_id": -1}, "question_id must be between 0"),
                ({"helpful": True, "question_id": qid, "note": "长" * 2001}, "at most 2000"),
                ({"helpful": True, "question_id": qid, "kb": "team-docs"}, "kb goes with question"),
                ({"helpful": True, "question": "x", "kb": "bob-notes"}, 'unknown knowledge base "bob-notes"'),
            ]:
                refused = await client.call_tool("rate_answer", arguments)
                assert refused.is_error and message in text_of(refused), (arguments, text_of(refused))

    anyio.run(main)
    # the search waits to be judged (its hits kept); the ask was judged as it answered
    pending = world.execute(
        "select mode, found, hits is not null from kb.questions"
        " where user_id = (select id from kb.users where name = 'alice') order by id"
    ).fetchall()
    assert pending == [("search", None, True), ("ask", True, False)]
    world.execute("select kb_internal.settle_questions(array(select id from kb.questions))")  # as a read does
    logged = world.execute(
        "select q.mode, q.entry_point, q.found, r.helpful, r.note from kb.questions q"
        " left join kb.answer_ratings r on r.question_id = q.id"
        " where q.user_id = (select id from kb.users where name = 'alice') order by q.id"
    ).fetchall()
    assert logged == [("search", "mcp", True, None, None), ("ask", "mcp", True, True, None)]
    alone = world.execute(
        "select r.question, k.name, r.helpful from kb.answer_ratings r join kb.knowledge_bases k on k.id = r.kb_id"
        " where r.question_id is null"
    ).fetchall()
    assert alone == [("zebramarker 是什么", "alice-notes", False)]
