"""`pgkb ask` (pgkb.commands.ask, pgkb.answer): the answer streamed as it arrives, then the numbered sources;
--json; clear errors. Real database and embeddings: `pgkb ask` embeds the question through a local endpoint
serving the offline model's vectors (PGKB_EMBED_PROVIDER=http, the URL the database's embedding_url names) and
hands the vector to kb.ask; the chat endpoint is tests/fake_chat.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fixture_docs
import pytest
from pgkb.answer import ask
from pgkb.config import Settings

pytestmark = pytest.mark.slow  # runs `pgkb ask` in a subprocess per test

REFUND = "订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。"


@pytest.fixture
def kbdb(db, embedder, fake_embeddings):
    if not db.execute("select 1 from pg_extension where extname = 'plpython3u'").fetchone():
        pytest.skip("plpython3u is not installed on this server: the database cannot embed the question")
    db.execute("select kb.create_knowledge_base('team-docs', 'public')")
    fixture_docs.load(db, embedder, "team-docs")
    endpoint = fake_embeddings(embedder.embed)
    db.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
    db.execute("update kb.settings set value = '' where key = 'chat_url'")
    return db


def embed_url(db) -> str:
    """The endpoint the database embeds with (kb.settings embedding_url): the CLI's too."""
    return db.execute("select value from kb.settings where key = 'embedding_url'").fetchone()[0]


def cli(db, *args: str) -> subprocess.CompletedProcess:
    info = db.info
    dsn = f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}"
    return subprocess.run(
        [sys.executable, "-m", "pgkb.cli", "ask", *args],
        env={**os.environ, "PGKB_DATABASE_URL": dsn, "PGKB_EMBED_PROVIDER": "http", "PGKB_EMBED_URL": embed_url(db)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_extractive_answer_with_numbered_sources_and_not_found(kbdb):
    done = cli(kbdb, "退款多久到账", "--kb", "team-docs")
    assert done.returncode == 0, done.stderr
    answer, _, sources = done.stdout.partition("\nSources:\n")
    assert "3 个工作日内原路退回" in answer and "[1]" in answer
    assert sources.splitlines()[0] == "[1] 退款政策 > 规则 — kb://team-docs/policy/refund.md"
    assert "extractive answer" in done.stderr and "-- extractive in " in done.stderr

    mars = cli(kbdb, "火星基地的氧气配额是多少")
    assert mars.returncode == 0, mars.stderr
    assert mars.stdout.strip() == "知识库中未找到相关信息" and "Sources:" not in mars.stdout
    assert "-- not_found in " in mars.stderr

    as_json = cli(kbdb, "退款多久到账", "--json", "--top-k", "2")
    assert as_json.returncode == 0, as_json.stderr
    row = json.loads(as_json.stdout)
    assert row["found"] is True and row["mode"] == "extractive" and row["evidence"]["sources"] == 2
    assert row["citations"][0]["doc_key"] == "policy/refund.md" and row["citations"][0]["quote"] in REFUND
    assert set(row) >= {"answer", "citations", "dropped_citations", "uncited", "retrieve_ms", "total_ms"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["   "], "must not be empty"),
        (["退款", "--top-k", "0"], "top_k must be between 1 and 100"),
        (["退款", "--kb", "no-such-kb"], "unknown knowledge base"),
        (["退款", "--mode", "llm"], "needs a chat endpoint"),
    ],
)
def test_bad_input_is_a_clear_error(kbdb, args, message):
    done = cli(kbdb, *args)
    assert done.returncode == 2 and message in done.stderr and done.stdout == ""


def test_streamed_answer_arrives_before_the_call_ends(kbdb, fake_chat):
    chat = fake_chat("stream", delay=0.3)
    kbdb.execute("update kb.settings set value = %s where key = 'chat_url'", [chat.url])
    arrivals: list[tuple[float, str]] = []
    started = time.monotonic()
    settings = Settings(None, Path("."), embed_provider="http", embed_url=embed_url(kbdb))
    row = ask(kbdb, settings, "退款多久到账", kb="team-docs", on_delta=lambda d: arrivals.append((time.monotonic(), d)))
    ended = time.monotonic()
    assert row["mode"] == "llm" and row["found"] is True and chat.requests[0]["stream"] is True
    assert len(arrivals) >= 3 and "".join(d for _, d in arrivals) == row["answer"]
    # the first piece was handed over while the endpoint was still sending the rest
    assert arrivals[0][0] - started < ended - started - 0.5
    assert all(c["n"] in (1, 2) for c in row["citations"]) and row["dropped_citations"] == 0

    done = cli(kbdb, "退款多久到账", "--kb", "team-docs")
    assert done.returncode == 0, done.stderr
    answer, _, sources = done.stdout.partition("\nSources:\n")
    assert answer.strip() == row["answer"] and "-- llm in " in done.stderr
    assert sources.splitlines()[0].startswith("[1] ") and " — kb://team-docs/" in sources


def test_invalid_citations_are_removed_from_what_is_printed(kbdb, fake_chat):
    chat = fake_chat("cite9")
    kbdb.execute("update kb.settings set value = %s where key = 'chat_url'", [chat.url])
    done = cli(kbdb, "退款多久到账", "--kb", "team-docs")
    assert done.returncode == 0, done.stderr
    answer = done.stdout.partition("\nSources:\n")[0]
    assert "[9]" not in answer and "[1]" in answer


def test_lexical_only_answer_says_so(kbdb, dead_embedding_url):
    """The embedding service down (what `make stop` leaves): the answer comes from the lexical legs, and
    `pgkb ask` says so; with it up, nothing is said."""
    done = cli(kbdb, "退款多久到账", "--kb", "team-docs")
    assert done.returncode == 0 and "lexical only" not in done.stderr, done.stderr
    kbdb.execute("update kb.settings set value = %s where key = 'embedding_url'", [dead_embedding_url])
    done = cli(kbdb, "无理由退款", "--kb", "team-docs")
    assert done.returncode == 0, done.stderr
    assert "3 个工作日内原路退回" in done.stdout
    assert "pgkb: ask: lexical only: query embedding failed (" in done.stderr and "unreachable" in done.stderr
    # a "not found" says it too: without the vector leg a paraphrase may find nothing
    done = cli(kbdb, "退款多久到账", "--kb", "team-docs")
    assert done.stdout.strip() == "知识库中未找到相关信息" and "lexical only: " in done.stderr, done.stderr
    row = json.loads(cli(kbdb, "无理由退款", "--json").stdout)
    assert row["evidence"]["lexical_only"].startswith("lexical only: query embedding failed")


def test_sources_name_the_other_copies_of_a_text(kbdb, embedder):
    """The fixture documents copied into a second knowledge base: each source is printed once, with where
    else its text is."""
    fixture_docs.load(kbdb, embedder, "mirror")
    done = cli(kbdb, "退款多久到账")
    assert done.returncode == 0, done.stderr
    sources = done.stdout.partition("\nSources:\n")[2].splitlines()
    refund = [s for s in sources if "policy/refund.md" in s]
    assert len(refund) == 1, sources
    assert refund[0].endswith(("; also in kb://mirror/policy/refund.md", "; also in kb://team-docs/policy/refund.md"))
