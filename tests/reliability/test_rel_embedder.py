"""Reliability 4: embedding endpoint faults -- down, slow (beyond the timeout), HTTP 500, vectors of the wrong
dimension, the wrong number of vectors, an answer that is not JSON -- from in-process fake OpenAI-compatible
servers on 127.0.0.1.

- ingest: nothing half-stored, the failure is reported, and a re-run once the endpoint is healthy converges
  to the folder; failed documents are recorded in kb.ingest_failures;
- worker: the batch is failed with the endpoint's message (retried later, nothing stored), and embedded once
  the endpoint is healthy;
- search: lexical-only results flagged as such -- in SQL (kb.hybrid_search embedding in the database:
  vector_used = false and a NOTICE), in pgkb.search (degraded + reason) and over MCP (degraded) -- within a
  bounded time.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
import relhelpers as rh
from pgkb.config import Settings
from pgkb.ingest import IngestOptions, ingest
from pgkb.models.embedding import EmbeddingError, HttpEmbedder, ModelSpec

pytestmark = pytest.mark.reliability

FAULTS = ["down", "slow", "error500", "wrong_dim", "wrong_count", "garbage", "reset"]
SPEC = ModelSpec(rh.MODEL, rh.DIM, "query: ", "passage: ")
TIMEOUT = 1.0  # the embedder's timeout in these tests; "slow" answers after 3 s


def embedder_for(fake, fault: str) -> HttpEmbedder:
    """An HTTP embedder with a short timeout and one retry, pointed at ``fake`` set to ``fault``."""
    if fault == "down":
        return HttpEmbedder(rh.dead_url(), rh.MODEL, rh.DIM, timeout=TIMEOUT, retries=1, backoff=0.05)
    fake.set(fault, delay=3.0 if fault == "slow" else 0.0)
    return HttpEmbedder(fake.url, rh.MODEL, rh.DIM, timeout=TIMEOUT, retries=1, backoff=0.05)


def corpus(root: Path, n: int = 6) -> Path:
    for i in range(n):
        (root / f"doc{i}.md").parent.mkdir(parents=True, exist_ok=True)
        (root / f"doc{i}.md").write_text(
            f"# 文档 {i}\n\n## 第一节\n\n网关超时先看日志 embedfault{i}。\n\n"
            "## 第二节\n\n数据库连接池满了要查长事务。\n",
            encoding="utf-8",
        )
    return root


def run_ingest(db, root: Path, embedder):
    """(summary or None, exception or None, seconds)."""
    t0 = time.monotonic()
    try:
        summary = ingest(db, db.info.dsn, root, "faults", SPEC, embedder, IngestOptions())
        return summary, None, time.monotonic() - t0
    except EmbeddingError as e:
        return None, e, time.monotonic() - t0


@pytest.mark.parametrize("fault", FAULTS)
def test_ingest_with_a_faulty_embedder_stores_nothing_half_and_resumes(rdb, fake, tmp_path, fault):
    root = corpus(tmp_path / "src")
    # the endpoint fails half-way: the first documents go in, then the fault starts
    healthy = HttpEmbedder(fake.url, rh.MODEL, rh.DIM, timeout=TIMEOUT, retries=1, backoff=0.05)
    ingest(rdb, rdb.info.dsn, corpus(tmp_path / "first", 2), "faults", SPEC, healthy, IngestOptions(delete=False))
    summary, error, seconds = run_ingest(rdb, root, embedder_for(fake, fault))
    # reported: an error naming the endpoint, or failures in the summary
    reported = str(error) if error else json.dumps(summary.failures, ensure_ascii=False)
    assert error is not None or summary.failed > 0, "a failing embedder went unnoticed"
    assert "127.0.0.1" in reported or "embedd" in reported.lower(), reported
    assert seconds < 30, f"a faulty endpoint held ingestion for {seconds:.0f} s"
    # nothing half-stored: every stored document is whole and embedded
    assert rh.integrity_problems(rdb) == []
    assert rdb.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    # resumable: healthy again, a re-run converges to the folder
    fake.set("ok")
    ingest(rdb, rdb.info.dsn, root, "faults", SPEC, healthy, IngestOptions())
    assert rh.convergence_problems(rdb, "faults", root) == []
    rh.publish("embedder-ingest", fault=fault, seconds_to_report=round(seconds, 2), reported=reported[:160])


@pytest.mark.parametrize("fault", ["down", "error500"])
def test_ingest_records_documents_it_could_not_embed(rdb, fake, tmp_path, fault):
    root = corpus(tmp_path / "src")
    """Every document the run did not store is either recorded in kb.ingest_failures with the endpoint's
    error, or among the files the run left for the next one after deciding the endpoint is down (counted and
    explained in the summary)."""
    summary, error, _ = run_ingest(rdb, root, embedder_for(fake, fault))
    assert error is None, error
    recorded = dict(rdb.execute("select doc_key, error from kb.ingest_failures").fetchall())
    stored = {r[0] for r in rdb.execute("select doc_key from kb.documents")}
    missing = set(rh.expected_documents(root)) - stored
    assert set(recorded) <= missing and len(missing - set(recorded)) == summary.not_attempted
    assert all("127.0.0.1" in e for e in recorded.values()), recorded
    assert summary.failed == len(recorded) and {f["doc_key"] for f in summary.failures} == set(recorded)
    if summary.not_attempted:
        assert "127.0.0.1" in summary.stopped and str(summary.not_attempted) in summary.stopped


def test_ingest_cli_with_the_endpoint_down_says_so(rdb, tmp_path):
    root = corpus(tmp_path / "src", 1)  # one document: the HTTP embedder's retries take ~3.5 s
    env = rh.child_env(rdb.info.dsn, rh.dead_url(), PGKB_EMBED_BATCH="16")
    child = rh.spawn(["ingest", str(root), "--kb", "faults"], env, tmp_path, "ingest")
    code = child.proc.wait(120)
    assert code == 1 and "unreachable" in child.stderr() and "Traceback" not in child.stderr(), child.stderr()
    assert rh.integrity_problems(rdb) == []


# ------------------------------------------------------------------------------------------------ worker


@pytest.mark.parametrize("fault", FAULTS)
def test_worker_fails_the_batch_and_embeds_once_healthy(rdb, fake, fault):
    from pgkb.worker import run_worker

    for i in range(3):
        rdb.execute(
            "select * from kb.replace_document('faults', %s, 'T', %s)",
            [f"q{i}.md", json.dumps([{"content": f"排队的段落 {i} 第 {j} 段"} for j in range(3)])],
        )
    info = rdb.info
    settings = dataclasses.replace(
        Settings.from_env(), database_url=f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}"
    )
    stats = run_worker(settings, once=True, batch=16, embedder=embedder_for(fake, fault), lease=timedelta(seconds=30))
    assert stats.failed == 9 and stats.embedded == 0
    errors = {r[0] for r in rdb.execute("select last_error from kb.embedding_queue")}
    assert len(errors) == 1 and ("127.0.0.1" in errors.pop()), errors
    assert rdb.execute("select count(*) from kb.embeddings").fetchone()[0] == 0
    assert rh.integrity_problems(rdb) == []
    fake.set("ok")
    rdb.execute("update kb.embedding_queue set next_attempt_at = now()")  # the backoff has passed
    healthy = HttpEmbedder(fake.url, rh.MODEL, rh.DIM, timeout=TIMEOUT, retries=0)
    assert run_worker(settings, once=True, batch=16, embedder=healthy).embedded == 9
    assert rdb.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    assert rh.integrity_problems(rdb) == []


# ------------------------------------------------------------------------------------------------ search


@pytest.fixture
def searchable(rdb):
    rdb.execute("select kb.create_knowledge_base('faults', 'public', owner => 'alice')")
    for i in range(4):
        content = f"退款 refundword {i}：审核通过后三个工作日内原路退回。"
        rdb.execute(
            "select * from kb.replace_document('faults', %s, 'T', %s)",
            [f"r{i}.md", json.dumps([{"content": content, "embedding": rh.fake_vector(content)}])],
        )
    rdb.execute("update kb.settings set value = %s where key = 'embedding_timeout_ms'", [str(int(TIMEOUT * 1000))])
    return rdb


@pytest.mark.parametrize("fault", FAULTS)
def test_sql_search_degrades_to_lexical_and_says_why(searchable, connect_as, fake, fault):
    if fault == "down":
        searchable.execute("update kb.settings set value = %s where key = 'embedding_url'", [rh.dead_url()])
    else:
        fake.set(fault, delay=3.0 if fault == "slow" else 0.0)
    conn = connect_as("alice")
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    t0 = time.monotonic()
    rows = conn.execute("select doc_key, vector_used, vector_rank from kb.hybrid_search('refundword 退款')").fetchall()
    seconds = time.monotonic() - t0
    assert rows and all(not used and rank is None for _, used, rank in rows)
    assert any("lexical" in n for n in notices), notices
    assert seconds < TIMEOUT + 2.0
    fake.set("ok")
    searchable.execute("update kb.settings set value = %s where key = 'embedding_url'", [fake.url])
    assert all(used for _, used, _ in conn.execute("select doc_key, vector_used, 1 from kb.hybrid_search('退款')"))


@pytest.mark.parametrize("fault", FAULTS)
def test_client_search_degrades_to_lexical_and_says_why(searchable, connect_as, fake, fault):
    from pgkb.search import search

    conn = connect_as("alice")
    t0 = time.monotonic()
    response = search(conn, Settings.from_env(), "refundword 退款", 5, embedder=embedder_for(fake, fault), spec=SPEC)
    seconds = time.monotonic() - t0
    assert response.degraded and "lexical-only" in response.degraded_reason
    assert response.results and all(h.vector_rank is None for h in response.results)
    assert seconds < 2 * TIMEOUT + 2.0


def test_mcp_search_degrades_to_lexical_and_says_why(searchable, dsn_of, fake):
    """One MCP stdio session; the endpoint goes through every fast fault and back to healthy."""
    import anyio

    async def main():
        seen = {}
        async with rh.stdio_client(dsn_of("svc"), fake.url, PGKB_USER="alice") as client:
            for fault in ["ok", "error500", "wrong_dim", "wrong_count", "garbage", "reset", "ok"]:
                fake.set(fault)
                t0 = time.monotonic()
                result = await client.call_tool("search_knowledge", {"query": "refundword 退款"})
                seen[fault] = (result, time.monotonic() - t0)
        return seen

    for fault, (result, seconds) in anyio.run(main).items():
        assert not result.is_error, rh.text_of(result)
        out = result.structured_content
        assert out["results"], fault
        if fault == "ok":
            assert not out["degraded"] and out["results"][0]["vector_rank"] is not None
            continue
        assert out["degraded"] and all(r["vector_rank"] is None for r in out["results"]), fault
        assert rh.text_of(result).startswith("Note: degraded results")
        rh.publish("embedder-mcp-search", fault=fault, seconds=round(seconds, 2))


def test_mcp_search_with_a_slow_endpoint_degrades_within_seconds(searchable, dsn_of, fake):
    import anyio

    """The query embedding has its own deadline (PGKB_MCP_EMBED_TIMEOUT_MS, 5 s by default): an endpoint
    that takes 70 s costs a search that long, then it runs lexical-only and says so."""
    fake.set("slow", delay=70.0)

    async def main():
        async with rh.stdio_client(dsn_of("svc"), fake.url, PGKB_USER="alice") as client:
            t0 = time.monotonic()
            with anyio.fail_after(15):
                result = await client.call_tool("search_knowledge", {"query": "refundword 退款"})
            return result, time.monotonic() - t0

    try:
        result, seconds = anyio.run(main)
    except TimeoutError:
        pytest.fail("search_knowledge did not answer within 15 s with a slow embedding endpoint")
    assert not result.is_error and result.structured_content["degraded"], rh.text_of(result)
    assert seconds < 5.0 + 3.0
    rh.publish("embedder-mcp-search", fault="slow (70 s)", seconds=round(seconds, 2))


def test_search_never_waits_on_the_database_for_an_unreachable_endpoint(searchable, connect_as):
    """The in-database embedding's timeout bounds the wait even where the endpoint accepts and never answers
    (a listening socket nobody serves)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        searchable.execute(
            "update kb.settings set value = %s where key = 'embedding_url'", [f"http://127.0.0.1:{port}/v1/embeddings"]
        )
        conn = connect_as("alice")
        t0 = time.monotonic()
        rows = conn.execute("select vector_used from kb.hybrid_search('refundword')").fetchall()
        assert rows and not rows[0][0] and time.monotonic() - t0 < TIMEOUT + 2.0
    with pytest.raises(psycopg.errors.NoDataFound):  # bad input is still an error, not a degraded search
        conn.execute("select * from kb.hybrid_search('x', kb => 'no-such-kb')")
