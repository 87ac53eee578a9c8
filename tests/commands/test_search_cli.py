"""pgkb.search (client-side search) and `pgkb search`, plus reranking with a local CrossEncoder and the
remote /v1/rerank and /rerank shapes of `pgkb embed-server`.

The CrossEncoder is all-MiniLM-L6-v2's encoder with a fresh seeded one-logit head: its scores are
meaningless, so these tests check that the reranker's order is applied, not that it is better. Quality
numbers need the real model (BAAI/bge-reranker-v2-m3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import fixture_docs
import numpy as np
import psycopg
import pytest
from pgkb.config import Settings, packaged_db_dir
from pgkb.embed_server import start_in_thread
from pgkb.search import SearchOptions, rerank_text, search

pytestmark = pytest.mark.slow  # runs `pgkb search` in a subprocess per test


@pytest.fixture
def kbdb(db, embedder):
    fixture_docs.load(db, embedder)
    return db


def settings() -> Settings:
    return Settings(database_url=None, db_dir=packaged_db_dir(), embed_provider="offline")


def dsn(db) -> str:
    info = db.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}"


def cli(db, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pgkb.cli", "search", *args],
        env={**os.environ, "PGKB_DATABASE_URL": dsn(db), "PGKB_EMBED_PROVIDER": "offline", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


# --------------------------------------------------------------------------------------------- search()


def test_search_embeds_client_side(kbdb, embedder):
    response = search(kbdb, settings(), "how do I roll back a release", 3, embedder=embedder)
    assert response.vector_used and not response.degraded and response.model == "multilingual-e5-small"
    assert response.results[0].doc_key == "ops/deploy.md" and response.results[0].vector_rank == 1
    assert set(response.timings_ms) == {"embed", "search", "total"}


@pytest.mark.parametrize("query", ["", "   ", "\u3000\n"])
def test_empty_query_is_a_value_error(kbdb, embedder, query):
    with pytest.raises(ValueError, match="query must not be empty"):
        search(kbdb, settings(), query, embedder=embedder)


@pytest.mark.parametrize("top_k", [0, 101, True, "5"])
def test_bad_top_k(kbdb, embedder, top_k):
    with pytest.raises(ValueError, match="top_k must be"):
        search(kbdb, settings(), "退款", top_k, embedder=embedder)


def test_failing_embedder_degrades_to_lexical_only(kbdb):
    from pgkb.models.embedding import HttpEmbedder

    dead = HttpEmbedder("http://127.0.0.1:9/v1/embeddings", "multilingual-e5-small", 384, retries=1, backoff=0.01)
    response = search(kbdb, settings(), "退款", 3, embedder=dead)
    assert response.degraded and "unreachable" in response.degraded_reason
    assert not response.vector_used and response.results[0].doc_key == "policy/refund.md"
    assert all(h.vector_rank is None for h in response.results)


@pytest.mark.parametrize("value", [0.0, float("nan")])
def test_unusable_query_vector_degrades_to_lexical_only(kbdb, embedder, value):
    """A zero or NaN query vector (a broken embedder) would make the database refuse the search: the client
    sends none and says why."""

    class Broken:
        name, dimension = embedder.name, embedder.dimension

        def embed(self, texts):
            return np.full((len(texts), self.dimension), value, dtype=np.float32)

    response = search(kbdb, settings(), "退款", 3, embedder=Broken())
    assert response.degraded and "unusable query vector" in response.degraded_reason
    assert not response.vector_used and response.results[0].doc_key == "policy/refund.md"


def test_unknown_kb_raises(kbdb, embedder):
    with pytest.raises(psycopg.errors.NoDataFound, match="unknown knowledge base"):
        search(kbdb, settings(), "退款", kb="nope", embedder=embedder)


def test_acting_user_is_transaction_local(kbdb, embedder, connect_as):
    kbdb.execute("select kb.create_user('alice', 'alice')")
    kbdb.execute("grant pgkb_service to svc")
    try:
        kbdb.execute("select kb.create_knowledge_base('alice-only', 'private', owner => 'alice')")
        kbdb.execute(
            "select * from kb.replace_document('alice-only', 'x.md', 'x', %s::jsonb)",
            [json.dumps([{"content": "zebramarker 机密"}])],
        )
        svc = connect_as("svc")
        as_alice = search(svc, settings(), "zebramarker", 5, embedder=embedder, user="alice")
        assert as_alice.results[0].kb == "alice-only" and as_alice.user == "alice"
        as_nobody = search(svc, settings(), "zebramarker", 5, embedder=embedder)
        assert all(h.kb != "alice-only" for h in as_nobody.results)
        assert svc.execute("select current_setting('pgkb.acting_user', true)").fetchone()[0] in (None, "")
    finally:
        kbdb.execute("revoke pgkb_service from svc")


def snippet(db, text: str, query: str, width: int = 160, mark: tuple[str, str] = ("[", "]")) -> str:
    return db.execute("select kb.snippet(%s, %s, %s, %s, %s)", [text, query, width, *mark]).fetchone()[0]


def test_snippet_marks_the_terms_the_lexical_leg_matches(db):
    text = "排查时先检查 Redis 缓存击穿，再确认"
    assert snippet(db, text, "redis 缓存击穿") == "排查时先检查 [Redis] [缓存击穿]，再确认"
    assert snippet(db, text, "缓存击穿", mark=("", "")) == text
    # camelCase parts and Traditional characters: what kb.lexical_terms folds, the snippet finds
    assert snippet(db, "call getUserToken before retry", "token refresh") == "call getUser[Token] before retry"
    assert snippet(db, "資料庫連線逾時的處理", "资料库连线") == "[資料庫連線]逾時的處理"
    assert snippet(db, "ＡＰＩ　网关  限流", "api 限流") == "[ＡＰＩ] 网关 [限流]"
    assert snippet(db, "没有任何匹配", "redis") == "没有任何匹配"
    assert snippet(db, "", "redis") == "" and snippet(db, "text", "") == "text"


def test_english_highlights_mark_whole_tokens_and_never_function_words(db):
    """Issue 35: for a question holding "to", the page marked `to` inside "symptoms" and in "up to". A
    Latin-script term is marked only as a whole token (a word, or a camelCase, snake_case or letter/digit part),
    and function words never."""
    text = "Common symptoms appear up to 14 days later; tokens expire. Call getUserToken; ISO27001 and user_id."
    assert snippet(db, text, "how to treat symptoms", width=200) == (
        "Common [symptoms] appear up to 14 days later; tokens expire. Call getUserToken; ISO27001 and user_id."
    )
    assert snippet(db, text, "token iso user", width=200) == (
        "Common symptoms appear up to 14 days later; tokens expire. Call get[UserToken]; [ISO]27001 and [user]_id."
    )
    assert snippet(db, text, "to", width=200).count("[") == 1  # a question of function words only keeps them
    assert snippet(db, "Ｔｏｋｅｎｓ and ＴＯＫＥＮ", "token") == "Ｔｏｋｅｎｓ and [ＴＯＫＥＮ]"


def test_snippet_window_follows_the_first_match(db):
    long = "无关内容。" * 100 + "tidb_mem_quota_query 限制内存"
    s = snippet(db, long, "tidb_mem_quota_query", width=60, mark=("<b>", "</b>"))
    assert s.startswith("…") and "<b>tidb_mem_quota_query</b>" in s
    assert len(s.replace("<b>", "").replace("</b>", "")) == 60 + 1  # the window plus the leading ellipsis


def test_snippet_work_is_bounded(db):
    """Only the first 10000 characters are read: a huge text of one repeated term costs little and says it
    was cut."""
    s = snippet(db, "aa " * 2_000_000 + "zebra", "aa", width=40)
    assert s.startswith("[aa]") and s.endswith("…") and "zebra" not in s
    assert snippet(db, "x" * 9_000 + " zebra " + "y" * 20_000, "zebra", width=40).count("[zebra]") == 1


def test_cli_marks_snippets_only_on_a_terminal(kbdb):
    result = cli(kbdb, "退款", "--top-k", "1")
    assert result.returncode == 0, result.stderr
    assert "无理由退款" in result.stdout and "\033[1m" not in result.stdout


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_json(kbdb):
    result = cli(kbdb, "退款", "--json", "--top-k", "2")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["query"] == "退款" and out["top_k"] == 2 and len(out["results"]) == 2
    top = out["results"][0]
    assert top["doc_key"] == "policy/refund.md" and top["source"] == "kb://team-docs/policy/refund.md"
    assert out["degraded"] is False and out["vector_used"] is True and "search" in out["timings_ms"]


def test_cli_text_and_errors(kbdb):
    result = cli(kbdb, "缓存击穿", "--kb", "team-docs")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[:3]
    assert first[0].startswith(" 1. [") and first[0].endswith("登录态失效排查手册 > 排查步骤")
    assert first[1].strip().startswith("kb://team-docs/guide/login.md")
    assert "缓存击穿" in first[2] and "\033[" not in result.stdout  # no ANSI when not a TTY
    empty = cli(kbdb, "  ")
    assert empty.returncode == 2 and "query must not be empty" in empty.stderr
    unknown = cli(kbdb, "退款", "--kb", "nope")
    assert unknown.returncode == 1 and "unknown knowledge base" in unknown.stderr
    degraded = cli(
        kbdb, "退款", "--json", PGKB_EMBED_PROVIDER="http", PGKB_EMBED_URL="http://127.0.0.1:9/v1/embeddings"
    )
    assert degraded.returncode == 0, degraded.stderr
    assert json.loads(degraded.stdout)["degraded"] is True


# --------------------------------------------------------------------------------------------- rerank


@pytest.fixture(scope="module")
def cross_encoder_dir(make_cross_encoder):
    return make_cross_encoder(11)


@pytest.fixture(scope="module")
def local_reranker(cross_encoder_dir):
    from pgkb.models.rerank import LocalReranker

    return LocalReranker(str(cross_encoder_dir))


def test_local_rerank_orders_by_cross_encoder(kbdb, embedder, local_reranker):
    plain = search(kbdb, settings(), "登录 token 过期", 40, embedder=embedder)  # the rerank depth: every chunk
    reranked = search(kbdb, settings(), "登录 token 过期", 6, embedder=embedder, reranker=local_reranker)
    assert reranked.reranked and "rerank" in reranked.timings_ms
    scores = [h.rerank_score for h in reranked.results]
    assert scores == sorted(scores, reverse=True)
    expected = local_reranker.score("登录 token 过期", [rerank_text(h) for h in plain.results])
    by_chunk = {h.chunk_id: float(s) for h, s in zip(plain.results, expected, strict=True)}
    assert [h.chunk_id for h in reranked.results] == sorted(by_chunk, key=lambda c: -by_chunk[c])[:6]
    assert [h.chunk_id for h in reranked.results] != [h.chunk_id for h in plain.results[:6]]  # the order changed


def test_rerank_depth_and_min_score(kbdb, embedder, local_reranker):
    full = search(kbdb, settings(), "退款", 7, embedder=embedder, reranker=local_reranker)
    cut = sorted(h.rerank_score for h in full.results)[len(full.results) // 2]
    options = SearchOptions(rerank_min_score=cut)
    kept = search(kbdb, settings(), "退款", 7, embedder=embedder, reranker=local_reranker, options=options)
    assert kept.results and all(h.rerank_score >= cut for h in kept.results)
    assert kept.below_min_score == len(full.results) - len(kept.results) > 0
    top2 = search(kbdb, settings(), "退款", 2, embedder=embedder, reranker=local_reranker)
    assert [h.chunk_id for h in top2.results] == [h.chunk_id for h in full.results[:2]]  # depth 40 either way


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_remote_rerank_matches_local(kbdb, embedder, local_reranker, path):
    from pgkb.models.rerank import HttpReranker

    with start_in_thread(embedder, reranker=local_reranker) as server:
        remote = HttpReranker(server.url + path)
        assert remote.api == ("tei" if path == "/rerank" else "cohere")
        r = search(kbdb, settings(), "登录 token 过期", 5, embedder=embedder, reranker=remote)
    local = search(kbdb, settings(), "登录 token 过期", 5, embedder=embedder, reranker=local_reranker)
    assert [h.chunk_id for h in r.results] == [h.chunk_id for h in local.results]
    assert [h.rerank_score for h in r.results] == pytest.approx([h.rerank_score for h in local.results], abs=1e-5)


def test_remote_rerank_failure_keeps_fused_order(kbdb, embedder):
    from pgkb.models.rerank import HttpReranker

    dead = HttpReranker("http://127.0.0.1:9/v1/rerank", retries=1, backoff=0.01)
    r = search(kbdb, settings(), "退款", 3, embedder=embedder, reranker=dead)
    assert r.degraded and "rerank failed" in r.degraded_reason and not r.reranked
    assert r.results[0].doc_key == "policy/refund.md" and r.results[0].rerank_score is None


def test_load_reranker_from_env(cross_encoder_dir):
    from pgkb.models.rerank import HttpReranker, LocalReranker, load_reranker

    assert load_reranker({}) is None
    remote = load_reranker({"PGKB_RERANK_URL": "http://h/v1/rerank", "PGKB_RERANK_API_KEY": "k"})
    assert isinstance(remote, HttpReranker) and remote.api_key == "k" and remote.api == "cohere"
    assert load_reranker({"PGKB_RERANK_URL": "http://h/rerank"}).api == "tei"
    assert isinstance(load_reranker({"PGKB_RERANK_MODEL": str(cross_encoder_dir)}), LocalReranker)
