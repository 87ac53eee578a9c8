"""kb.limits() (db/functions/03_limits.sql) states every bound the SQL API enforces: each is probed here at
its value (accepted) and just past it (refused with the bound in the message), so the list and the checks
cannot drift apart. Python reads the list (pgkb.limits; tests/test_limits.py)."""

from __future__ import annotations

import json

import psycopg
import pytest

HIT = (
    "row(1, 'k', 'd', 't', '{}', 0, 'c', null, 'text', '{}', 1.0, 1, 1, null, 0.9, 1.0, null, true, '{}')"
    "::kb.search_result"
)


@pytest.fixture
def limits(db) -> dict[str, float]:
    db.execute("select kb.create_knowledge_base('limits', 'public')")
    return dict(db.execute("select name, value from kb.limits()").fetchall())


def refused(db, sql: str, args: list, message: str) -> None:
    with pytest.raises(psycopg.Error, match=message):
        db.execute(sql, args)


def document(db, doc_key: str, title: str = "t") -> None:
    db.execute(
        "select * from kb.replace_document('limits', %s, %s, %s::jsonb)",
        [doc_key, title, json.dumps([{"content": "text"}])],
    )


def test_every_bound_is_listed_with_what_it_bounds(db):
    rows = db.execute("select name, value, bounds from kb.limits()").fetchall()
    assert len({r[0] for r in rows}) == len(rows) >= 11 and all(r[1] > 0 and r[2] for r in rows)
    with pytest.raises(psycopg.errors.UndefinedObject, match='no bound "nope"'):
        db.execute("select kb_internal.api_limit('nope')")


def test_search_bounds(db, limits):
    chars, top_k, candidates = int(limits["query_chars"]), int(limits["top_k"]), int(limits["candidates"])
    db.execute("select kb.check_search_input(repeat('x', %s), %s)", [chars, top_k])
    refused(db, "select kb.check_search_input(repeat('x', %s), 1)", [chars + 1], f"at most {chars} are accepted")
    refused(db, "select kb.check_search_input('x', %s)", [top_k + 1], f"between 1 and {top_k}")
    search = "select * from kb.hybrid_search('x', 1, vector_weight => 0, candidates => %s)"
    db.execute(search, [candidates])
    refused(db, search, [candidates + 1], f"candidates must be between 1 and {candidates}")


def test_embedding_norm_bounds(db, limits):
    low, high = limits["embedding_norm_min"], limits["embedding_norm_max"]
    usable = "select kb_internal.usable_embedding(%s::text::vector)"
    for norm, expected in ((low, True), (low * 0.9, False), (high, True), (high * 1.1, False)):
        assert db.execute(usable, [f"[{norm!r}]"]).fetchone()[0] is expected, norm


def test_name_key_and_title_bounds(db, limits):
    name = int(limits["kb_name_chars"])
    key_chars, key_bytes = int(limits["doc_key_chars"]), int(limits["doc_key_bytes"])
    db.execute("select kb.create_knowledge_base(%s, 'public')", ["n" * name])
    refused(db, "select kb.create_knowledge_base(%s, 'public')", ["n" * (name + 1)], "name")
    document(db, "k" * key_chars)
    document(db, "文" * (key_bytes // 3))
    for bad in ("k" * (key_chars + 1), "文" * (key_bytes // 3 + 1)):
        with pytest.raises(psycopg.Error, match=f"at most {key_chars} characters and {key_bytes} bytes"):
            document(db, bad)
    title = int(limits["title_chars"])
    document(db, "titled", "t" * title)
    with pytest.raises(psycopg.Error, match=f"longer than {title} characters"):
        document(db, "titled", "t" * (title + 1))


def test_hit_array_bounds(db, limits):
    sources, evidence = int(limits["answer_sources"]), int(limits["evidence_hits"])
    prompt = f"select kb.answer_prompt('q', array_fill({HIT}, array[%s]))"
    db.execute(prompt, [sources])
    refused(db, prompt, [sources + 1], f"at most {sources} sources")
    weigh = f"select kb.answer_evidence('q', array_fill({HIT}, array[%s]))"
    db.execute(weigh, [evidence])
    refused(db, weigh, [evidence + 1], f"at most {evidence} are accepted")
