"""The offline answer is a passage (issue 21): the smallest heading section that holds the evidence, verbatim
Markdown with tables, lists and code whole, the steps section for a how-to question, cut at a block boundary
(db/functions/62_answer_text.sql kb.extractive_answer, 63_answer_passages.sql kb.answer_sources)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pgkb.ingest import IngestOptions, ingest
from pgkb.models.embedding import OFFLINE_MODEL, ModelSpec
from test_ask import ask, every_block_cited, set_settings, write

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "kb"


@pytest.fixture
def sample(db):
    """examples/kb in the public knowledge base team-docs, searched by the lexical legs (no embedding)."""
    spec = ModelSpec(OFFLINE_MODEL, 384, "query: ", "passage: ")
    summary = ingest(db, db.info.dsn, SAMPLE, "team-docs", spec, None, IngestOptions(defer_embedding=True))
    assert summary.failed == 0 and summary.added >= 10
    set_settings(db, embedding_url="", chat_url="")
    return db


def fences_closed(answer: str) -> bool:
    return len(re.findall(r"^\s{0,3}```", answer, flags=re.M)) % 2 == 0


def test_how_to_question_answers_with_the_runbooks_steps(sample):
    """怎么办 / 怎么排查 show the runbook's steps section (its numbered subsections, code whole), not sentences
    about the symptom."""
    row = ask(sample, "数据库连接池满了怎么办")
    assert row["found"] and row["mode"] == "extractive", row
    answer = row["answer"]
    assert answer.startswith("**数据库连接池耗尽（Connection is not available） › 排查步骤**"), answer
    assert "**1. 是“慢”还是“漏”**" in answer
    assert "**2. 找慢查询和长事务**" in answer and "FROM information_schema.cluster_processlist" in answer
    assert fences_closed(answer) and every_block_cited(answer)
    assert {c["doc_key"] for c in row["citations"]} == {"runbooks/db-connection-pool-exhausted.md"}
    assert all(c["heading_path"][1] == "排查步骤" for c in row["citations"]), row["citations"]
    assert set(map(int, re.findall(r"\[(\d+)\]", answer))) == {c["n"] for c in row["citations"]}
    assert len(answer) <= 1800 + 2

    row = ask(sample, "登录态失效怎么排查")
    assert row["answer"].startswith("**登录态失效排查手册 › 排查步骤**") and "**1. 确认影响范围**" in row["answer"]
    assert {c["doc_key"] for c in row["citations"]} == {"runbooks/login-session-expired.md"}
    assert fences_closed(row["answer"])


def test_table_answer_is_the_faq_entry_verbatim(sample):
    """退款多久到账 answers with the FAQ entry as written: its table rows whole, not flattened with pipes."""
    row = ask(sample, "退款多久到账")
    answer = row["answer"]
    assert row["citations"][0]["doc_key"] == "faq.md"
    table = [line for line in (SAMPLE / "faq.md").read_text().splitlines() if line.startswith("| 微信")]
    assert table and all(line in answer.splitlines() for line in table), answer
    assert "到账时间; 微信" not in answer and every_block_cited(answer)


def test_a_question_without_steps_keeps_its_section(sample):
    """A question that asks no how-to gets the section its best hit is in, not the document's steps."""
    row = ask(sample, "HikariCP 的 maximum-pool-size 配置是多少")
    assert "maximum-pool-size: 30" in row["answer"] and " › 当前配置**" in row["answer"], row["answer"]
    assert "排查步骤" not in row["answer"] and fences_closed(row["answer"])


def test_long_sections_are_cut_at_a_block_boundary(db):
    """A section longer than the answer's 1800 characters is cut between blocks, a table between rows, a code
    block closed, and "…" marks the cut."""
    rows = "\n".join(f"| 参数{i} | 说明第 {i} 行，超时配置与重试次数 |" for i in range(200))
    table = f"连接池参数如下：\n\n| 参数 | 说明 |\n|---|---|\n{rows}"
    code = (
        "```bash\n" + "\n".join(f"kubectl rollout restart deploy/svc-{i}  # 重启连接池" for i in range(200)) + "\n```"
    )
    db.execute("select kb.create_knowledge_base('long', 'public')")
    write(db, "long", [("pool.md", "连接池", [(table, ["连接池参数"]), (code, ["重启连接池"])])])
    set_settings(db, embedding_url="", chat_url="")
    for question in ("连接池参数超时配置", "重启连接池 kubectl rollout restart"):
        answer = ask(db, question, kb="long")["answer"]
        assert len(answer) <= 1800 + 8 and answer.endswith("…"), answer
        body = [line for line in answer.splitlines() if line.startswith("|")]
        assert all(re.fullmatch(r"\|.*\|", line) for line in body)
        assert fences_closed(answer) and every_block_cited(answer)


def test_markdown_blocks(db):
    text = (
        "Intro line one\nline two\n\n- a\n- b\n\n```py\nx = 1\n\ny = 2\n```\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "~~~\nunclosed"
    )
    got = db.execute("select kind, block from kb_internal.markdown_blocks(%s) order by ord", [text]).fetchall()
    assert got == [
        ("text", "Intro line one\nline two"),
        ("text", "- a\n- b"),
        ("code", "```py\nx = 1\n\ny = 2\n```"),
        ("table", "| a | b |\n|---|---|\n| 1 | 2 |"),
        ("code", "~~~\nunclosed"),
    ]


def test_answer_sources_read_only_visible_chunks(db, connect_as):
    """kb.answer_sources reads sections from the tables: a hits array naming another user's chunks gives
    nothing (no oracle), and the caller's own hits give their sections."""
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("select kb.create_knowledge_base('bob-private', 'private', owner => 'bob')")
    write(db, "bob-private", [("s.md", "审批", [("退款审批口令是 bobsecretmarker。", ["审批"])])])
    bob_chunk = db.execute("select id from kb.chunks").fetchone()[0]
    hit = (
        "row(%s, 'bob-private', 's.md', 't', '{审批}', 0, 'x', null, 'text', '{}', "
        "1, 1, 1, null, 1, 1, null, true, null)"
    )
    alice = connect_as("alice")
    sources = alice.execute(
        f"select cardinality(kb.answer_sources('退款审批口令', array[{hit}::kb.search_result]))", [bob_chunk]
    )
    assert sources.fetchone()[0] == 0
    reply = alice.execute(
        f"select answer, citations from kb.extractive_reply('退款审批口令', array[{hit}::kb.search_result])",
        [bob_chunk],
    ).fetchone()
    assert "bobsecretmarker" not in json.dumps(reply, ensure_ascii=False) and reply[1] == []
    bob = connect_as("bob")
    hits = bob.execute("select array_agg(h) from kb.hybrid_search('退款审批口令', 5) as h").fetchone()[0]
    assert bob.execute("select cardinality(kb.answer_sources('退款审批口令', %s))", [hits]).fetchone()[0] == 1
