"""`pgkb worker` and the queue API (db/functions/35_queue.sql) on real PostgreSQL with the real offline model."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import fixture_docs
import numpy as np
import psycopg
import pytest
from pgkb.config import ConfigError, Settings
from pgkb.models.embedding import HttpEmbedder, ModelSpec, model_spec, prefixed
from pgkb.worker import embedding_text, run_worker
from pgvector import Vector
from pgvector.psycopg import register_vector

pytestmark = pytest.mark.slow  # embedding workers in threads and processes

MODEL = "multilingual-e5-small"


@pytest.fixture
def settings(db) -> Settings:
    info = db.info
    url = f"host={info.host} port={info.port} user={info.user} dbname={info.dbname}"
    return dataclasses.replace(
        Settings.from_env(), database_url=url, embed_provider="offline", embed_model=None, embed_batch=16
    )


def write(conn, doc_key, chunks, kb="docs", title="T"):
    """replace_document without embeddings, as SQL / dbt / ETL would: the chunks are queued."""
    payload = [c if isinstance(c, dict) else {"content": c} for c in chunks]
    return conn.execute(
        "select * from kb.replace_document(kb => %s, doc_key => %s, title => %s, chunks => %s)",
        [kb, doc_key, title, json.dumps(payload)],
    ).fetchone()


def load_fixture_without_embeddings(conn, kb="team-docs"):
    for doc_key, title, chunks in fixture_docs.DOCS:
        write(conn, doc_key, [{"content": c, "heading_path": p} for c, p in chunks], kb=kb, title=title)


def queue(conn):
    return conn.execute(
        "select chunk_id, attempts, parked, last_error, extract(epoch from next_attempt_at - now())::float8"
        " from kb.embedding_queue order by chunk_id"
    ).fetchall()


def queue_state(conn):
    """The queue's rows as stored (no clock-relative columns): for "nothing changed" checks."""
    return conn.execute(
        "select chunk_id, model_id, attempts, parked, last_error, next_attempt_at from kb.embedding_queue order by 1, 2"
    ).fetchall()


def make_due(conn):
    """Pretend the backoff has passed."""
    conn.execute("update kb.embedding_queue set next_attempt_at = now() where not parked")


# ---------------------------------------------------------------------------------------------------
# embedding queued chunks


def test_embedding_text_is_prefix_breadcrumb_and_content():
    spec = ModelSpec(MODEL, 384, "query: ", "passage: ")
    assert embedding_text(spec, "退款政策", ["规则", "时限"], "七天内") == "passage: 退款政策 > 规则 > 时限\n七天内"
    assert embedding_text(spec, "Guide", ["Guide", "Install"], "x") == "passage: Guide > Install\nx"  # no repeat
    assert embedding_text(spec, "", [], "x") == "passage: x"
    assert embedding_text(ModelSpec("m", 8), None, None, "x") == "x"


def test_worker_embeds_queued_chunks_and_they_become_searchable(db, settings, embedder):
    load_fixture_without_embeddings(db)
    n = sum(len(chunks) for _, _, chunks in fixture_docs.DOCS)
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == n
    assert {r[0] for r in db.execute("select status from kb.documents")} == {"embedding"}
    # without an embedding the vector leg has nothing to find
    vec = Vector(embedder.embed(prefixed(model_spec(db, None), ["系统响应很慢怎么优化"], query=True))[0])
    rows = db.execute("select doc_key from kb.vector_search('系统响应很慢怎么优化', 3, query_embedding => %s)", [vec])
    assert rows.fetchall() == []

    stats = run_worker(settings, once=True)  # loads the offline model itself, like `pgkb worker --once`

    assert (stats.embedded, stats.failed) == (n, 0)
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    assert {r[0] for r in db.execute("select status from kb.documents")} == {"ready"}
    assert db.execute("select count(*) from kb.embeddings").fetchone()[0] == n
    top = db.execute(
        "select doc_key, vector_rank from kb.vector_search('系统响应很慢怎么优化', 3, query_embedding => %s)", [vec]
    ).fetchone()
    assert top == ("perf/tuning.md", 1)
    vec = Vector(embedder.embed(["query: how do I roll back a release"])[0])
    top = db.execute(
        "select doc_key, vector_rank from kb.hybrid_search('how do I roll back a release', 3, query_embedding => %s)",
        [vec],
    ).fetchone()
    assert top == ("ops/deploy.md", 1)


def test_worker_embeds_the_same_text_as_ingestion(db, settings, embedder):
    """Same vectors as fixture_docs.load, which embeds "passage: title > path\\ncontent" at ingestion."""
    load_fixture_without_embeddings(db, kb="queued")
    run_worker(settings, once=True, embedder=embedder)
    fixture_docs.load(db, embedder, kb="inline")
    pairs = db.execute(
        "select a.embedding::text, b.embedding::text from kb.embeddings a"
        " join kb.chunks ca on ca.id = a.chunk_id join kb.documents da on da.id = ca.document_id"
        " join kb.documents db on db.doc_key = da.doc_key and db.kb_id <> da.kb_id"
        " join kb.chunks cb on cb.document_id = db.id and cb.ordinal = ca.ordinal"
        " join kb.embeddings b on b.chunk_id = cb.id"
        " where da.kb_id = (select id from kb.knowledge_bases where name = 'queued')"
    ).fetchall()
    assert len(pairs) == sum(len(chunks) for _, _, chunks in fixture_docs.DOCS)
    for a, b in pairs:
        assert float(np.dot(json.loads(a), json.loads(b))) > 0.999


def test_two_workers_in_parallel_never_embed_a_chunk_twice(db, settings, embedder):
    for d in range(6):
        write(db, f"doc{d}.md", [f"第{d}篇 第{i}段 内容" for i in range(10)])
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 60
    # every store of an embedding (insert, or update by a second store) is logged
    db.execute("create table public.stored_log (chunk_id bigint not null)")
    db.execute(
        "create function public.log_store() returns trigger language plpgsql as"
        " $$ begin insert into public.stored_log values (new.chunk_id); return null; end $$"
    )
    db.execute(
        "create trigger log_store after insert or update on kb.embeddings"
        " for each row execute function public.log_store()"
    )

    class Recording:
        """The real model, recording how many texts each worker embedded."""

        name, dimension = embedder.name, embedder.dimension

        def __init__(self):
            self.texts = 0

        def embed(self, texts):
            self.texts += len(texts)
            return embedder.embed(texts)

    recorders = [Recording(), Recording()]
    results: list = [None, None]

    def work(i):
        results[i] = run_worker(settings, once=True, batch=3, embedder=recorders[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(isinstance(r, type(results[0])) and r is not None for r in results), "a worker raised"
    assert results[0].embedded + results[1].embedded == 60
    assert all(r.texts > 0 for r in recorders), [r.texts for r in recorders]  # both did work
    assert recorders[0].texts + recorders[1].texts == 60  # no chunk was claimed twice
    logged = [r[0] for r in db.execute("select chunk_id from public.stored_log")]
    assert len(logged) == len(set(logged)) == 60
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    assert {r[0] for r in db.execute("select status from kb.documents")} == {"ready"}


class UnitEmbedder:
    """A stand-in model for queue tests: a fixed unit vector per text (cheap, so the database is the
    bottleneck). Counts the texts it embedded."""

    name, dimension = MODEL, 384

    def __init__(self):
        self.texts = 0
        self._lock = threading.Lock()

    def embed(self, texts):
        with self._lock:
            self.texts += len(texts)
        out = []
        for text in texts:
            v = np.zeros(384, dtype=np.float32)
            v[sum(text.encode()) % 384] = 1.0
            out.append(v)
        return out


def log_stores(conn):
    """Log every store of an embedding (insert, or update by a second store) into public.stored_log."""
    conn.execute("create table public.stored_log (chunk_id bigint not null)")
    conn.execute(
        "create function public.log_store() returns trigger language plpgsql as"
        " $$ begin insert into public.stored_log values (new.chunk_id); return null; end $$"
    )
    conn.execute(
        "create trigger log_store after insert or update on kb.embeddings"
        " for each row execute function public.log_store()"
    )


def test_two_workers_storing_the_last_chunks_of_a_document_mark_it_ready(db):
    """Issue 9: each worker deleted its own queue entries and then looked for the document's remaining
    ones; under READ COMMITTED each still saw the other's uncommitted deletes undone, so neither marked
    the document ready. Two open transactions make that instant last as long as the test needs."""
    write(db, "a.md", ["第一段", "第二段"])
    first, second = [r[0] for r in db.execute("select chunk_id from kb.claim_embedding_batch(%s, 2)", [MODEL])]
    vec = Vector(np.eye(384, dtype=np.float32)[0])
    one = psycopg.connect(db.info.dsn)
    two = psycopg.connect(db.info.dsn)
    try:
        register_vector(one)
        register_vector(two)
        one.execute("select kb.store_embeddings(%s, %s, %s)", [MODEL, [first], [vec]])  # not committed yet
        errors = []

        def store_second():
            try:
                two.execute("select kb.store_embeddings(%s, %s, %s)", [MODEL, [second], [vec]])
            except psycopg.Error as e:  # pragma: no cover - reported below
                errors.append(e)

        thread = threading.Thread(target=store_second)
        thread.start()
        thread.join(timeout=2)  # the fix makes it wait for the first store's transaction
        one.commit()
        thread.join(timeout=30)
        assert not thread.is_alive() and errors == []
        two.commit()
    finally:
        one.close()
        two.close()
    assert queue(db) == []
    assert db.execute("select status from kb.documents").fetchone()[0] == "ready"


def test_many_concurrent_workers_leave_no_document_embedding(db, settings):
    """Stress: 8 workers (real connections, pgkb.worker with a cheap stand-in model, one chunk per claim)
    over many small documents, several rounds. Every chunk is embedded exactly once, the queue ends
    empty and no document stays 'embedding'."""
    log_stores(db)
    n_workers, n_docs, n_chunks, rounds = 8, 30, 3, 4
    embedder = UnitEmbedder()

    def work(barrier, results, i):
        barrier.wait()
        results[i] = run_worker(settings, once=True, batch=1, embedder=embedder)

    deadline = time.monotonic() + 240
    for r in range(rounds):
        db.execute("truncate public.stored_log")
        for d in range(n_docs):
            write(db, f"doc{d}.md", [f"第{r}轮 第{d}篇 第{i}段" for i in range(n_chunks)])
        expected = sorted(row[0] for row in db.execute("select chunk_id from kb.embedding_queue"))
        assert len(expected) == n_docs * n_chunks
        barrier = threading.Barrier(n_workers)
        results: list = [None] * n_workers
        threads = [threading.Thread(target=work, args=(barrier, results, i)) for i in range(n_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(deadline - time.monotonic(), 1))
        assert not any(t.is_alive() for t in threads), "workers did not finish in time"
        assert all(res is not None for res in results), "a worker raised"
        assert sum(res.embedded for res in results) == len(expected)
        assert sorted(row[0] for row in db.execute("select chunk_id from public.stored_log")) == expected
        assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
        stuck = db.execute("select doc_key from kb.documents where status <> 'ready' order by 1").fetchall()
        assert stuck == [], f"round {r}: documents left 'embedding': {stuck}"


def test_a_store_after_the_lease_ran_out_and_a_second_claim_is_harmless(db):
    """Lease expiry: a slow worker's entries are claimed again; both workers store (in either order), or
    the slow one reports a failure after the other stored. The document ends ready with one embedding
    per chunk and nothing left in the queue."""
    write(db, "a.md", ["慢的一段", "快的一段"])
    claim = "select chunk_id from kb.claim_embedding_batch(%s, 10, interval '1 second')"
    slow = sorted(r[0] for r in db.execute(claim, [MODEL]))
    make_due(db)  # the lease ran out
    fast = sorted(r[0] for r in db.execute(claim, [MODEL]))
    assert slow == fast and len(slow) == 2
    vecs = [Vector(np.eye(384, dtype=np.float32)[i]) for i in range(2)]
    assert db.execute("select kb.store_embeddings(%s, %s, %s)", [MODEL, fast, vecs]).fetchone()[0] == 2
    assert db.execute("select * from kb.fail_embedding_batch(%s, %s, 'too slow')", [MODEL, slow]).fetchone() == (0, 0)
    assert db.execute("select kb.store_embeddings(%s, %s, %s)", [MODEL, slow, vecs]).fetchone()[0] == 2
    assert queue(db) == []
    assert db.execute("select count(*) from kb.embeddings").fetchone()[0] == 2
    assert db.execute("select status from kb.documents").fetchone()[0] == "ready"


def test_claims_are_disjoint_and_leased(db):
    write(db, "a.md", [f"段落 {i}" for i in range(5)])
    first = [r[0] for r in db.execute("select chunk_id from kb.claim_embedding_batch(%s, 3)", [MODEL])]
    second = [r[0] for r in db.execute("select chunk_id from kb.claim_embedding_batch(%s, 3)", [MODEL])]
    assert len(first) == 3 and len(second) == 2 and not set(first) & set(second)
    assert db.execute("select count(*) from kb.claim_embedding_batch(%s, 3)", [MODEL]).fetchone()[0] == 0
    for _, attempts, parked, _, due_in in queue(db):
        assert attempts == 1 and not parked and 295 < due_in <= 300  # leased for 5 minutes
    # columns for the worker
    make_due(db)
    row = db.execute("select * from kb.claim_embedding_batch(null, 1, interval '1 minute')").fetchone()
    assert row[1:] == (db.execute("select id from kb.documents").fetchone()[0], "T", [], "段落 0")
    # a lock held by a concurrent claim is skipped, not waited for
    with db.transaction():
        db.execute("select * from kb.embedding_queue where chunk_id = %s for update", [row[0]])
        other = psycopg.connect(db.info.dsn, autocommit=True)
        try:
            other.execute("set lock_timeout = '2s'")
            got = [r[0] for r in other.execute("select chunk_id from kb.claim_embedding_batch(%s, 10)", [MODEL])]
        finally:
            other.close()
    assert len(got) == 4 and row[0] not in got


def test_crashed_workers_lease_expires_and_repeated_crashes_park(db):
    write(db, "a.md", ["只有一段"])
    claim = "select chunk_id from kb.claim_embedding_batch(%s, 1, max_attempts => 3)"
    for attempt in range(1, 4):
        assert len(db.execute(claim, [MODEL]).fetchall()) == 1
        make_due(db)  # the lease ran out: the worker never reported back
        assert queue(db)[0][1] == attempt
    write(db, "b.md", ["另一篇"])
    # the oldest due entry is parked instead of claimed a 4th time; the claim moves on to the next one
    b_chunk = db.execute(
        "select c.id from kb.chunks c join kb.documents d on d.id = c.document_id where d.doc_key = 'b.md'"
    ).fetchone()[0]
    assert db.execute(claim, [MODEL]).fetchall() == [(b_chunk,)]
    (_, attempts, parked, last_error, _) = queue(db)[0]
    assert (attempts, parked) == (3, True) and "claimed 3 times without a result" in last_error
    make_due(db)
    assert len(db.execute(claim, [MODEL]).fetchall()) == 1  # b's first retry
    assert db.execute("select doc_key, attempts from kb.parked_embeddings").fetchall() == [("a.md", 3)]


# ---------------------------------------------------------------------------------------------------
# failures, backoff, parking


def test_failing_embedder_backs_off_parks_and_can_be_retried(db, settings, embedder, dead_embedding_url):
    write(db, "a.md", ["第一段", "第二段", "第三段"])
    dead = HttpEmbedder(dead_embedding_url, MODEL, 384, retries=0, timeout=2)
    expected_backoff = [30, 60, 120, 240]
    for attempt in range(1, 6):
        started = time.monotonic()
        stats = run_worker(settings, once=True, embedder=dead)
        assert time.monotonic() - started < 15  # --once terminates instead of spinning on the failure
        assert (stats.embedded, stats.failed) == (0, 3)
        rows = queue(db)
        assert all(r[1] == attempt and "unreachable" in r[3] for r in rows), rows
        if attempt < 5:
            assert stats.parked == 0 and not any(r[2] for r in rows)
            assert all(expected_backoff[attempt - 1] - 5 < r[4] <= expected_backoff[attempt - 1] for r in rows), rows
            # not due yet: the next --once run finds nothing to do
            assert run_worker(settings, once=True, embedder=dead).batches == 0
            make_due(db)
        else:
            assert stats.parked == 3 and all(r[2] for r in rows)
    make_due(db)
    assert run_worker(settings, once=True, embedder=embedder).batches == 0  # parked entries are left alone
    parked = db.execute(
        "select kb, doc_key, ordinal, model, attempts, last_error from kb.parked_embeddings order by ordinal"
    ).fetchall()
    assert [r[:5] for r in parked] == [("docs", "a.md", i, MODEL, 5) for i in range(3)]
    assert all("unreachable" in r[5] for r in parked)
    assert db.execute("select status from kb.documents").fetchone()[0] == "embedding"

    assert db.execute("select kb_admin.retry_parked_embeddings('multilingual-e5-small')").fetchone()[0] == 3
    assert db.execute("select count(*) from kb.parked_embeddings").fetchone()[0] == 0
    assert all(r[1] == 0 and not r[2] and r[4] <= 0 for r in queue(db))
    assert run_worker(settings, once=True, embedder=embedder).embedded == 3
    assert db.execute("select status from kb.documents").fetchone()[0] == "ready"
    assert db.execute("select kb_admin.retry_parked_embeddings()").fetchone()[0] == 0


def test_fail_embedding_batch_reports_counts_and_ignores_unknown_ids(db):
    write(db, "a.md", ["一", "二"])
    ids = [r[0] for r in db.execute("select chunk_id from kb.claim_embedding_batch(%s, 10)", [MODEL])]
    assert db.execute(
        "select * from kb.fail_embedding_batch(%s, %s, 'boom', max_attempts => 1)", [MODEL, [ids[0], -1]]
    ).fetchone() == (0, 1)
    assert db.execute("select * from kb.fail_embedding_batch(%s, %s, 'boom')", [MODEL, ids]).fetchone() == (1, 0)
    assert db.execute("select * from kb.fail_embedding_batch(%s, %s, %s)", [MODEL, ids, "x" * 5000]).fetchone() == (
        1,
        0,
    )
    assert len(queue(db)[1][3]) == 2000


def test_parked_view_and_retry_are_for_admins_only(db, connect_as):
    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.create_knowledge_base('alice-kb', owner => 'alice')")
    write(db, "a.md", ["一"], kb="alice-kb")
    db.execute("update kb.embedding_queue set parked = true, last_error = 'boom'")
    alice = connect_as("alice")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        alice.execute("select * from kb.parked_embeddings")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        alice.execute("select kb_admin.retry_parked_embeddings()")
    db.execute("grant select on kb.parked_embeddings to pgkb_user")  # even if granted by mistake:
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="table embedding_queue"):  # security_invoker
        alice.execute("select count(*) from kb.parked_embeddings")
    assert db.execute("select count(*) from kb.parked_embeddings").fetchone()[0] == 1


def test_non_admin_claims_only_knowledge_bases_they_may_write(db, connect_as):
    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.create_knowledge_base('alice-kb', owner => 'alice')")
    db.execute("select kb.create_knowledge_base('pub', 'public')")
    write(db, "a.md", ["alice 的段落"], kb="alice-kb")
    write(db, "p.md", ["公开段落"], kb="pub")
    db.execute("grant execute on function kb.claim_embedding_batch, kb.fail_embedding_batch to pgkb_user")
    alice = connect_as("alice")
    assert [r[0] for r in alice.execute("select content from kb.claim_embedding_batch(null, 10)")] == ["alice 的段落"]
    public_chunk = db.execute("select id from kb.chunks where content = '公开段落'").fetchone()[0]
    before = queue_state(db)
    # a chunk she may not write is ignored exactly like one that does not exist (no existence oracle)
    assert alice.execute("select * from kb.fail_embedding_batch(null, %s, 'x')", [[public_chunk]]).fetchone() == (0, 0)
    assert queue_state(db) == before


def test_store_and_fail_answer_alike_for_unknown_and_foreign_chunks(db, connect_as):
    """Issue 9 (L3): "you may not write to these chunks" for other users' chunk ids but 0 for ids that do
    not exist told a user which ids exist. Both are now skipped alike, changing nothing."""
    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.create_user('bob', 'bob')")
    db.execute("select kb.create_knowledge_base('alice-kb', owner => 'alice')")
    write(db, "secret.md", ["alice 的秘密段落"], kb="alice-kb")
    db.execute("select kb.create_knowledge_base('bob-kb', owner => 'bob')")
    write(db, "b.md", ["bob 的段落"], kb="bob-kb")
    secret = db.execute("select id from kb.chunks where content = 'alice 的秘密段落'").fetchone()[0]
    own = db.execute("select id from kb.chunks where content = 'bob 的段落'").fetchone()[0]
    missing = db.execute("select max(id) + 1000 from kb.chunks").fetchone()[0]
    bob = connect_as("bob")
    db.execute("grant execute on function kb.fail_embedding_batch to pgkb_user")
    vec = Vector(np.eye(384, dtype=np.float32)[0])
    before = (queue_state(db), db.execute("select chunk_id from kb.embeddings order by 1").fetchall())

    def answers(ids):
        out = []
        for sql, args in [
            ("select kb.store_embeddings(%s, %s, %s)", [MODEL, ids, [vec] * len(ids)]),
            ("select * from kb.fail_embedding_batch(%s, %s, 'boom')", [MODEL, ids]),
        ]:
            try:
                out.append(("ok", bob.execute(sql, args).fetchone()))
            except psycopg.Error as e:
                out.append(("error", e.sqlstate, str(e)))
        return out

    assert answers([secret]) == answers([missing]) == [("ok", (0,)), ("ok", (0, 0))]
    assert (queue_state(db), db.execute("select chunk_id from kb.embeddings order by 1").fetchall()) == before
    # mixed with a chunk of his own, only his own counts
    assert answers([own, secret])[0] == answers([own, missing])[0] == ("ok", (1,))
    assert db.execute("select chunk_id from kb.embeddings").fetchall() == [(own,)]


# ---------------------------------------------------------------------------------------------------
# waiting for work


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_notification_wakes_a_waiting_worker_and_stop_event_stops_it(db, settings, embedder):
    stop = threading.Event()
    result: list = []
    thread = threading.Thread(
        target=lambda: result.append(run_worker(settings, idle_timeout=60, stop_event=stop, embedder=embedder))
    )
    thread.start()
    try:
        write(db, "first.md", ["第一篇"])
        embedded = "select count(*) from kb.embeddings"
        assert wait_for(lambda: db.execute(embedded).fetchone()[0] == 1, 20)
        time.sleep(0.3)  # the worker is idle now, waiting up to 60 s for a notification
        started = time.monotonic()
        write(db, "second.md", ["第二篇", "第二篇 第二段"])
        assert wait_for(lambda: db.execute(embedded).fetchone()[0] == 3, 10)
        assert time.monotonic() - started < 10
        assert db.execute("select count(*) from kb.documents where status = 'ready'").fetchone()[0] == 2
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert result and result[0].embedded == 3


# ---------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("select * from kb.claim_embedding_batch('multilingual-e5-small', 0)", "batch_size must be between 1 and 1000"),
        (
            "select * from kb.claim_embedding_batch('multilingual-e5-small', -5)",
            "batch_size must be between 1 and 1000",
        ),
        ("select * from kb.claim_embedding_batch('multilingual-e5-small', 1000000)", "batch_size must be between"),
        ("select * from kb.claim_embedding_batch('multilingual-e5-small', null)", "batch_size must be between"),
        ("select * from kb.claim_embedding_batch('nope', 10)", 'unknown embedding model "nope"'),
        ("select * from kb.claim_embedding_batch(null, 10, interval '0 seconds')", "lease must be between"),
        ("select * from kb.claim_embedding_batch(null, 10, interval '1 year')", "lease must be between"),
        ("select * from kb.claim_embedding_batch(null, 10, max_attempts => 0)", "max_attempts must be between"),
        ("select * from kb.fail_embedding_batch('nope', '{1}', 'x')", 'unknown embedding model "nope"'),
        ("select * from kb.fail_embedding_batch(null, null, 'x')", "chunk_ids must be an array"),
        ("select * from kb.fail_embedding_batch(null, '{1}', '  ')", "error must be a non-empty message"),
        ("select * from kb.fail_embedding_batch(null, '{1}', null)", "error must be a non-empty message"),
        ("select * from kb.fail_embedding_batch(null, '{1}', 'x', 1000)", "max_attempts must be between"),
        ("select kb_admin.retry_parked_embeddings('nope')", 'unknown embedding model "nope"'),
    ],
)
def test_bad_input_is_a_clear_error(db, sql, message):
    with pytest.raises(psycopg.DatabaseError, match=message):
        db.execute(sql)


def test_bad_worker_arguments(settings, embedder):
    with pytest.raises(ConfigError, match="batch must be between"):
        run_worker(settings, once=True, batch=0, embedder=embedder)
    with pytest.raises(psycopg.errors.NoDataFound, match='unknown embedding model "nope"'):
        run_worker(settings, once=True, model="nope", embedder=embedder)


def test_worker_process_logs_progress_and_stops_gracefully_on_sigterm(db, settings):
    """What `pgkb worker` runs (run_cli), as its own process: progress on stderr, SIGTERM -> exit 0."""
    write(db, "a.md", ["第一段", "第二段"])
    env = {**os.environ, "PGKB_DATABASE_URL": settings.database_url, "PGKB_EMBED_PROVIDER": "offline"}
    env.pop("PGKB_EMBED_MODEL", None)
    code = "import sys; from pgkb.config import Settings; from pgkb.worker import run_cli; "
    code += "sys.exit(run_cli(Settings.from_env()))"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: db.execute("select count(*) from kb.embeddings").fetchone()[0] == 2, 30)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "pgkb worker: model multilingual-e5-small (384-d" in err
    assert "embedded 2 chunks in 1 batches" in err and "chunks/s" in err
    assert "SIGTERM: stopping after the current batch" in err


class _ZeroFor:
    """The offline model, except that texts containing ``word`` get an all-zero vector (which
    kb.store_embeddings refuses as unusable)."""

    def __init__(self, inner, word: str) -> None:
        self.inner, self.word, self.name, self.dimension = inner, word, inner.name, inner.dimension

    def embed(self, texts):
        out = np.array(self.inner.embed(texts), dtype=np.float32)
        for i, text in enumerate(texts):
            if self.word in text:
                out[i] = 0.0
        return out


def test_an_unusable_vector_fails_only_its_chunk_and_the_worker_goes_on(db, settings, embedder):
    """A zero vector from the embedder is refused by the database (22000); the worker records it as that
    chunk's failure -- its batch mates are stored -- instead of crashing."""
    write(db, "a.md", ["第一段", "毒药 ZEROWORD", "第三段", "第四段"])
    stats = run_worker(settings, once=True, embedder=_ZeroFor(embedder, "ZEROWORD"), max_attempts=1)
    assert (stats.embedded, stats.failed, stats.parked) == (3, 1, 1)
    rows = queue(db)
    assert len(rows) == 1 and rows[0][2] is True and "unusable vector" in rows[0][3]
    assert db.execute("select count(*) from kb.embeddings").fetchone()[0] == 3
