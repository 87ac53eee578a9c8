"""Answer work is linear and bounded in a chunk's length, and chunks have a length limit (issue 20, finding 2).

A public knowledge base holding one long single-line chunk made everyone's kb.ask spend time quadratic in its
length (22.6 s at 160k characters) splitting it into sentences (a look-behind split rescans the line from its
start at every position) inside kb.extractive_answer and kb.cite.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest

LINE = "数据库连接池满了怎么办。 token expired. "
QUESTION = "数据库连接池满了怎么办"
HIT = (
    "row(1, 'k', 'd', 't', '{}', 0, %s, null, 'text', '{}', 1.0, 1, 1, null, 0.9, 1.0, null, true, '{}')"
    "::kb.search_result"
)
MAX_CHUNK_CHARS = 100000


def answer_seconds(db, content: str) -> float:
    """kb.extractive_answer then kb.cite of its answer, over one hit holding content."""
    start = time.monotonic()
    answer = db.execute(f"select kb.extractive_answer(%s, array[{HIT}])", [QUESTION, content]).fetchone()[0]
    row = db.execute(f"select answer, citations from kb.cite(%s, array[{HIT}])", [answer, content]).fetchone()
    assert "数据库连接池满了怎么办" in row[0] and row[1][0]["quote"]
    return time.monotonic() - start


def test_answer_time_is_linear_and_bounded_in_chunk_length(db):
    answer_seconds(db, LINE * 10)  # warm the function caches
    short = min(answer_seconds(db, LINE * (40000 // len(LINE))) for _ in range(2))
    long = min(answer_seconds(db, LINE * (160000 // len(LINE))) for _ in range(2))
    assert long < 2.0, (short, long)
    assert long < 4 * short + 0.2, (short, long)  # 4x the text: at most 4x the time (quadratic was 12-16x)


def test_ask_on_a_longest_chunk_is_quick(db):
    content = (LINE * (MAX_CHUNK_CHARS // len(LINE)))[:MAX_CHUNK_CHARS]
    db.execute("select kb.create_knowledge_base('public-pool', 'public')")
    db.execute(
        "select * from kb.replace_document('public-pool', 'pool.md', 'pool', %s::jsonb)",
        [json.dumps([{"content": content}])],
    )
    db.execute("update kb.settings set value = '' where key = 'embedding_url'")
    start = time.monotonic()
    found, mode = db.execute("select found, mode from kb.ask(%s, mode => 'extractive')", [QUESTION]).fetchone()
    assert found and mode == "extractive"
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("chunk_type", ["text", "table", "image"])
def test_an_over_long_chunk_is_refused_and_nothing_changes(db, chunk_type):
    db.execute("select kb.create_knowledge_base('limits', 'public')")
    db.execute(
        "select * from kb.replace_document('limits', 'doc.md', 'doc', %s::jsonb)",
        [json.dumps([{"content": "first version"}])],
    )
    chunks = [{"content": "fine"}, {"content": "x" * (MAX_CHUNK_CHARS + 1), "chunk_type": chunk_type}]
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match=r"chunk 1: content is 100001 characters"):
        db.execute("select * from kb.replace_document('limits', 'doc.md', 'doc', %s::jsonb)", [json.dumps(chunks)])
    rows = db.execute(
        "select c.content from kb.chunks c join kb.documents d on d.id = c.document_id where d.doc_key = 'doc.md'"
    ).fetchall()
    assert rows == [("first version",)]
    # the limit itself is accepted
    chunks[1]["content"] = "x" * MAX_CHUNK_CHARS
    db.execute("select * from kb.replace_document('limits', 'doc.md', 'doc', %s::jsonb)", [json.dumps(chunks)])
