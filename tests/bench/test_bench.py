"""`pgkb bench` on a tiny synthetic knowledge base against the session's real PostgreSQL. The results are
checked by properties they must have, not by redoing the bench's arithmetic: HNSW recall is exactly 1 where
ef_search covers every vector, the concurrency wall time covers the timed queries (Little's law), the MCP
stages are the ones the server's own query log recorded (a real stdio MCP server and client); the bulk
load writes what kb.replace_document writes; bad CLI input is refused. The sentence pools come from a tiny
BEIR-layout dataset written here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pgkb.bench.breakdown import PARTS
from pgkb.bench.data import (
    ANCHOR_COSINE,
    CHUNKS_PER_CENTRE,
    EN_SETS,
    SEED,
    ZH_SETS,
    VectorSource,
    anchor_sigma,
    anchored_source,
    default_model,
    document_vectors,
    load_pools,
    make_document,
    query_vectors,
    unit_vectors,
)
from pgkb.bench.load import prepare_kb
from pgkb.bench.mcp import WARMUP_CALLS
from pgkb.bench.recall import exact_vector_sql
from pgkb.bench.run import MODES, BenchOptions, run_search_bench
from pgkb.cli import main
from pgkb.models.embedding import ModelSpec
from term_dictionary import TERM_DICTIONARY

ZH_TEXT = (
    "数据库连接池满了以后，新的请求会排队等待。排查时先看活跃连接数和慢查询日志。"
    "登录态失效通常是令牌过期或者时钟不同步造成的。退款在审核通过后七个工作日内原路退回。"
    "部署新版本之前需要在预发布环境完成回归测试。监控告警的阈值应该根据历史数据调整。"
)
EN_TEXT = (
    "Masks reduce the spread of respiratory droplets in crowded places. Children under two should not wear "
    "masks. The retrieval system indexes documents by their terms and ranks them by relevance. "
    "Information retrieval evaluates ranking quality with recall and precision measures."
)
ZH_QUERIES = ["连接池满了怎么办", "登录态失效", "退款多久到账", "回归测试"]
EN_QUERIES = ["Should children wear masks?", "ranking quality", "retrieval system"]
PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"


@pytest.fixture(autouse=True)
def hnsw_at_any_size(request):
    """The bench's knowledge bases here are tiny: give them their HNSW index anyway (below
    kb.settings.vector_exact_chunks pgkb searches exactly and expects none), as a real-sized bench has."""
    if "db" in request.fixturenames:
        db = request.getfixturevalue("db")
        db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")


@pytest.fixture
def datasets(tmp_path: Path) -> Path:
    """The four sets pgkb bench reads, a few passages and queries each, in BEIR layout."""
    root = tmp_path / "datasets"
    for names, text, queries in ((ZH_SETS, ZH_TEXT, ZH_QUERIES), (EN_SETS, EN_TEXT, EN_QUERIES)):
        for name in names:
            folder = root / name
            folder.mkdir(parents=True)
            corpus = [{"_id": f"d{i}", "title": f"{name} {i}", "text": text} for i in range(3)]
            (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in corpus))
            (folder / "queries.jsonl").write_text(
                "\n".join(json.dumps({"_id": f"q{i}", "text": q}, ensure_ascii=False) for i, q in enumerate(queries))
            )
    return root


def dsn(db) -> str:
    info = db.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}"


@pytest.mark.slow
def test_bench_reports_everything(db, datasets, tmp_path):
    out, query_log = tmp_path / "report.md", tmp_path / "mcp-queries.jsonl"
    chunks = 90  # fewer than kb_internal.vector_leg's hnsw.ef_search (100): see the recall checks
    options = BenchOptions(
        chunks=chunks,
        queries=6,
        datasets=str(datasets),
        out=str(out),
        recall_queries=5,
        clients=(1, 3),
        client_queries=2,
        mcp_calls=3,
        url=dsn(db),
        mcp_query_log=str(query_log),
    )
    r = run_search_bench(options)

    assert set(r.stats) == set(MODES)
    for m in r.stats.values():
        assert len(m.samples) == 6 and all(x > 0 for x in m.samples)
        assert m.pct(50) <= m.pct(95) <= m.pct(99)
    assert db.execute("select count(*) from kb.embeddings").fetchone()[0] == chunks

    # recall: an HNSW search whose ef_search is at least the number of vectors never drops a candidate, so it
    # explores the whole graph and is exact -- for every query, not on average; this holds for ef_search
    # 100 and up and for kb.vector_search (kb.settings.hnsw_ef_search, 300); and recall cannot fall as
    # ef_search grows
    assert r.recall.queries == 5
    exact = [f"vector_plain (ef_search {ef})" for ef in (100, 200, 300, 400)] + ["vector_search"]
    assert {k: (r.recall.recall[k], r.recall.min_recall[k]) for k in exact} == {k: (1.0, 1.0) for k in exact}
    by_ef = [r.recall.recall[f"vector_plain (ef_search {ef})"] for ef in (40, 100, 200, 300, 400)]
    assert by_ef == sorted(by_ef) and len(r.recall.recall) == 6 and r.ef_search == 300
    recall_goals = [g for g in r.goals if g.name.startswith("HNSW recall@10")]
    assert len(recall_goals) == 2 and all(g.met and g.measured == "1.000" for g in recall_goals)

    # concurrency: every client ran its queries; C clients can have at most C queries in flight, so
    # (Little's law) QPS x mean latency <= C, i.e. the wall time covers at least the queries' latency / C
    assert [(c.mode, c.clients, c.queries, len(c.latencies)) for c in r.concurrency] == [
        ("hybrid", 1, 2, 2),
        ("hybrid", 3, 6, 6),
        ("vector_plain", 1, 2, 2),
        ("vector_plain", 3, 6, 6),
    ]
    for c in r.concurrency:
        assert c.qps * np.mean(c.latencies) / 1000 <= c.clients * (1 + 1e-9), (c.mode, c.clients)
        assert c.seconds * 1000 >= sum(c.latencies) / c.clients and c.seconds * 1000 >= max(c.latencies)

    # the shared question sets: every query of each (fewer than set_queries), the slowest one named
    assert [(q.name, q.questions, len(q.samples)) for q in r.question_sets] == [
        (name, len(ZH_QUERIES if name in ZH_SETS else EN_QUERIES), len(ZH_QUERIES if name in ZH_SETS else EN_QUERIES))
        for name in ZH_SETS + EN_SETS
    ]
    for q in r.question_sets:
        assert q.worst == max(q.samples) > 0 and q.worst_query in ZH_QUERIES + EN_QUERIES
    assert len([g for g in r.goals if g.name.startswith("slowest ")]) == 4
    assert any(g.name.startswith("MCP SQL p50") for g in r.goals)

    assert len(r.sizes) == 8 and all(size for _, size in r.sizes.values())
    assert r.load.method == "bulk" and not r.load.reused
    bench_kb = db.execute("select id from kb.knowledge_bases where name = 'bench'").fetchone()[0]
    assert set(r.load.index_builds) == {
        f"embeddings_hnsw_model_1_kb_{bench_kb}",
        "kb.postings",
    }

    # MCP: the server's stages of each timed call are the ones its own query log recorded for that call
    # (after the warm-up calls); the client waited at least as long as the server worked on the call
    assert r.mcp is not None and r.mcp.calls == 3
    logged = [json.loads(line) for line in query_log.read_text(encoding="utf-8").splitlines()]
    assert len(logged) == WARMUP_CALLS + 3 and all(e["kb"] == "bench" for e in logged)
    timed = [e["ms"] for e in logged[WARMUP_CALLS:]]
    assert r.mcp.embed_ms == [t["embed"] for t in timed] and r.mcp.search_ms == [t["search"] for t in timed]
    for k in range(3):
        assert r.mcp.client_ms[k] > timed[k]["total"] >= timed[k]["embed"] + timed[k]["search"] - 0.02
        assert r.mcp.search_ms[k] > 0 and 0 < r.mcp.outside_search_ms[k] <= r.mcp.overhead_ms[k] + 0.02

    # the breakdown: every query once, its legs and fusion timed by the server's function timers, which run
    # inside the call (so the parts fit in its wall time) and name kb_internal.search's legs
    b = r.breakdown
    assert b is not None and len(b.wall) == 6 and set(b.parts) == set(PARTS)
    for k in range(6):
        assert b.parts["vector leg"][k] > 0 and b.parts["BM25 legs"][k] > 0
        assert b.parts["fusion and materialisation"][k] > 0 and b.parts["the rest"][k] >= 0
        assert sum(b.parts[p][k] for p in PARTS) == pytest.approx(b.wall[k])
    assert any(g.name.startswith("fusion and materialisation p95") for g in r.goals)

    report = out.read_text()
    headings = (
        "p99 ms", "Where hybrid's time goes", "recall@10", "| QPS |", "MCP `search_knowledge`", "build s", "| goal |",
        "slowest question",
    )  # fmt: skip
    for heading in headings:
        assert heading in report

    # a second run reuses the knowledge base and still knows how it was loaded
    again = run_search_bench(
        BenchOptions(
            chunks=chunks,
            queries=2,
            datasets=str(datasets),
            recall_queries=1,
            clients=(1,),
            client_queries=1,
            mcp_calls=0,
            url=dsn(db),
        )
    )
    assert again.load.reused and again.load.index_builds == r.load.index_builds and again.mcp is None


@pytest.mark.slow
def test_bulk_load_matches_replace_document(db, datasets):
    pools = load_pools(datasets)
    model = default_model(db)
    prepare_kb(db, dsn(db), "via-bulk", 120, pools, model, "bulk")
    prepare_kb(db, dsn(db), "via-replace", 120, pools, model, "replace")

    def kb(name: str):
        return db.execute(
            "select chunk_count, term_total, visibility, zh_chunks, en_chunks, other_chunks from kb.knowledge_bases"
            " where name = %s",
            [name],
        ).fetchone()

    assert kb("via-bulk") == kb("via-replace") and kb("via-bulk")[0] == 120 and sum(kb("via-bulk")[3:]) == 120

    def term_stats(name: str):
        return db.execute(
            f"select term, df from {TERM_DICTIONARY} as s join kb.knowledge_bases k on k.id = s.kb_id where k.name = %s"
            " order by term",
            [name],
        ).fetchall()

    assert term_stats("via-bulk") == term_stats("via-replace") != []

    def postings(name: str):
        """The postings (blocks and recent ones; the split differs) by (doc_key, ordinal) (chunk ids
        differ), and the term tiers."""
        rows = db.execute(
            "select x.term, kb_internal.posting_tier(x.tf, x.dl), d.doc_key, c.ordinal, x.tf, x.dl from ("
            " select p.kb_id, p.term, y.* from kb.postings p,"
            " kb_internal.decode_postings(p.tier, p.first_chunk, p.n, p.payload) y (id, tf, dl)"
            f" union all select s.kb_id, s.term, y.* from {TERM_DICTIONARY} as s,"
            " unnest(s.recent_ids, s.recent_tfs, s.recent_dls) y (id, tf, dl)) x"
            " join kb.knowledge_bases k on k.id = x.kb_id"
            " join kb.chunks c on c.id = x.id join kb.documents d on d.id = c.document_id where k.name = %s",
            [name],
        ).fetchall()
        tiers = db.execute(
            f"select term, tiers from {TERM_DICTIONARY} as s join kb.knowledge_bases k on k.id = s.kb_id"
            " where k.name = %s",
            [name],
        ).fetchall()
        return sorted(rows), sorted(tiers)

    assert postings("via-bulk") == postings("via-replace") and postings("via-bulk")[0]

    def chunks(name: str):
        return db.execute(
            "select d.doc_key, d.title, d.chunk_count, d.status, c.ordinal, c.content, c.heading_path, c.chunk_type,"
            " c.char_count, c.metadata, c.term_count, e.embedding"
            " from kb.chunks c join kb.documents d on d.id = c.document_id"
            " join kb.knowledge_bases k on k.id = c.kb_id join kb.embeddings e on e.chunk_id = c.id"
            " where k.name = %s order by d.doc_key, c.ordinal",
            [name],
        ).fetchall()

    bulk, replaced = chunks("via-bulk"), chunks("via-replace")
    assert len(bulk) == 120 and [r[:-1] for r in bulk] == [r[:-1] for r in replaced]
    # the same float32 values (binary COPY vs JSON text; -0.0 == 0.0)
    assert all(np.array_equal(a[-1], b[-1]) for a, b in zip(bulk, replaced, strict=True))
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    # the recall benchmark's exact search is the true top 10 by cosine distance
    kb_id = db.execute("select id from kb.knowledge_bases where name = 'via-bulk'").fetchone()[0]
    ids, vectors = zip(
        *db.execute("select chunk_id, embedding from kb.embeddings where kb_id = %s", [kb_id]).fetchall(), strict=True
    )
    matrix = np.array([v.to_numpy() if hasattr(v, "to_numpy") else v for v in vectors], dtype=np.float64)
    e = unit_vectors(np.random.default_rng(3), 1, model.dimension)[0]
    distance = 1 - matrix @ e / np.linalg.norm(matrix, axis=1) / np.linalg.norm(e)
    expected = {ids[k] for k in np.argsort(distance)[:10]}
    assert {r[0] for r in db.execute(exact_vector_sql(model, kb_id), {"e": e}).fetchall()} == expected
    # the dropped indexes are back, defined as before
    indexes = {r[0] for r in db.execute("select indexname from pg_indexes where schemaname = 'kb'").fetchall()}
    assert {f"embeddings_hnsw_model_{model.id}_kb_{kb_id}"} <= indexes


def bench_indexes(db, kb: str = "bench") -> set[str]:
    """Which of the indexes a bulk load of knowledge base kb drops exist (and are valid): kb's HNSW index of the
    default model."""
    hnsw = db.execute(
        "select kb.hnsw_index_name(m.id, k.id) from kb.embedding_models as m, kb.knowledge_bases as k"
        " where m.is_default and k.name = %s",
        [kb],
    ).fetchall()
    return {
        r[0]
        for r in db.execute(
            "select c.relname from pg_class c join pg_index i on i.indexrelid = c.oid"
            " where c.relnamespace = 'kb'::regnamespace and c.relname = any(%s) and i.indisvalid",
            [[h[0] for h in hnsw]],
        ).fetchall()
    }


def test_bulk_load_refuses_a_database_with_other_knowledge_bases(db, datasets, monkeypatch, capsys):
    """The bulk load writes as the superuser around kb.replace_document: next to another knowledge base it
    refuses (SharedDatabase), changing nothing, unless told (--allow-shared-database); --load replace drops
    nothing."""
    db.execute("select kb.create_knowledge_base('team-docs', 'public')")
    before = bench_indexes(db, "team-docs")
    pools, model = load_pools(datasets), default_model(db)
    with pytest.raises(RuntimeError, match=r"other knowledge bases \(team-docs\).*--allow-shared-database"):
        prepare_kb(db, dsn(db), "bench", 40, pools, model, "bulk")
    assert bench_indexes(db, "team-docs") == before and len(before) == 1
    assert db.execute("select count(*) from kb.knowledge_bases where name = 'bench'").fetchone()[0] == 0
    monkeypatch.setenv("PGKB_DATABASE_URL", dsn(db))
    assert main(["bench", "--chunks", "40", "--datasets", str(datasets), "--mcp-calls", "0"]) == 2
    assert "--allow-shared-database" in capsys.readouterr().err
    prepare_kb(db, dsn(db), "replaced", 40, pools, model, "replace")
    prepare_kb(db, dsn(db), "bench", 40, pools, model, "bulk", allow_shared=True)
    assert bench_indexes(db, "team-docs") == before and len(bench_indexes(db)) == 1


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)])
def test_a_signal_during_a_bulk_load_puts_the_indexes_back(db, datasets, tmp_path, signum, exit_code):
    """`pgkb bench` in a subprocess, sent SIGTERM (or SIGINT) once the bulk load has dropped the indexes and
    committed some chunks: it stops its loading threads, rebuilds the HNSW index, and exits non-zero; nothing
    pgkb expects is missing afterwards."""
    assert bench_indexes(db) == set()  # no knowledge base "bench" yet
    env = {**os.environ, "PGKB_DATABASE_URL": dsn(db), "PYTHONPATH": str(PYTHON_DIR)}
    cli = [sys.executable, "-m", "pgkb.cli", "bench", "--chunks", "200000", "--datasets", str(datasets)]
    log = tmp_path / "bench.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cli, "--mcp-calls", "0"], env=env, stdout=out, stderr=subprocess.STDOUT,
            # a shell runs background jobs with SIGINT ignored, and a child inherits that: give it the default
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
    try:
        loaded = 0
        deadline = time.monotonic() + 120
        while loaded < 500:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
            loaded = db.execute(
                "select count(*) from kb.chunks c join kb.knowledge_bases k on k.id = c.kb_id where k.name = 'bench'"
            ).fetchone()[0]
        assert bench_indexes(db) == set(), "the indexes should be down while the load runs"
        proc.send_signal(signum)
        code = proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(bench_indexes(db)) == 1, log.read_text()
    assert code == exit_code, log.read_text()
    assert db.execute("select count(*) from kb_admin.index_problems()").fetchone()[0] == 0
    assert db.execute("select to_regclass('public.pgkb_bench_df')").fetchone()[0] is None


def test_other_embeddings_are_rewritten_in_place(db, datasets, monkeypatch):
    """A knowledge base with the right chunks but other embeddings keeps its chunks; only the vectors are
    rewritten (to what a fresh load would write, documents staged one per COPY so the mapping from the
    block's position is checked too) and the HNSW index rebuilt."""
    monkeypatch.setattr("pgkb.bench.load.REWRITE_DOCUMENTS", 1)
    pools = load_pools(datasets)
    model = default_model(db)
    kb_id, first = prepare_kb(db, dsn(db), "revector", 120, pools, model, "bulk")
    chunk_ids = db.execute("select array_agg(id order by id) from kb.chunks where kb_id = %s", [kb_id]).fetchone()[0]
    anchors = unit_vectors(np.random.default_rng(11), 4, model.dimension)
    source = VectorSource(kind="anchored", anchors=anchors, sigma=anchor_sigma(model.dimension), model=model.name)
    again_id, again = prepare_kb(db, dsn(db), "revector", 120, pools, model, "bulk", vectors=source)
    assert again_id == kb_id and again.reused and again.vectors == source.describe() != first.vectors
    hnsw = f"embeddings_hnsw_model_{model.id}_kb_{kb_id}"
    assert again.index_builds[hnsw] > 0 and set(first.index_builds) == set(again.index_builds)
    assert db.execute("select array_agg(id order by id) from kb.chunks where kb_id = %s", [kb_id]).fetchone()[0] == (
        chunk_ids
    )
    rows = db.execute(
        "select d.doc_key, d.chunk_count, c.ordinal, e.embedding from kb.embeddings e"
        " join kb.chunks c on c.id = e.chunk_id join kb.documents d on d.id = c.document_id where d.kb_id = %s",
        [kb_id],
    ).fetchall()
    assert len(rows) == 120
    for key, n, ordinal, v in rows:
        expected = document_vectors(int(key.removeprefix("bench-")), n, model.dimension, source)[ordinal]
        assert np.allclose(v.to_numpy() if hasattr(v, "to_numpy") else v, expected, atol=1e-6)
    assert (
        db.execute("select count(*) from pg_indexes where schemaname = 'kb' and indexname = %s", [hnsw]).fetchone()[0]
        == 1
    )
    # the next run reuses it as it is
    _, third = prepare_kb(db, dsn(db), "revector", 120, pools, model, "bulk", vectors=source)
    assert third.reused and third.index_builds == again.index_builds


def test_anchored_clusters_keep_their_density_at_every_size():
    anchors = unit_vectors(np.random.default_rng(5), 6, 384)
    source = VectorSource(kind="anchored", anchors=anchors, sigma=anchor_sigma(384), model="m")
    small = source.sized_for(6 * CHUNKS_PER_CENTRE)
    assert small.per_anchor == 1 and np.array_equal(small.chunk_vectors(3, 20, 384), source.chunk_vectors(3, 20, 384))
    assert small.describe() == source.describe() == "anchored (6 m passage embeddings, sigma 0.02472)"
    big = source.sized_for(6 * CHUNKS_PER_CENTRE * 4)
    assert big.per_anchor == 4 and big.centres.shape == (24, 384)
    assert big.describe() == "anchored (6 m passage embeddings, 4 sub-centres each, sigma 0.02472)"
    assert np.allclose(np.linalg.norm(big.centres, axis=1), 1, atol=1e-5)
    # sub-centre k * 4 + j lies around anchor k, as a chunk lies around its centre
    cosines = np.einsum("ij,ij->i", big.centres, np.repeat(anchors, 4, axis=0))
    assert abs(cosines.mean() - ANCHOR_COSINE) < 0.02
    assert np.array_equal(big.centres, source.sized_for(6 * CHUNKS_PER_CENTRE * 4).centres)  # deterministic
    v = big.chunk_vectors(3, 200, 384)
    nearest = (v @ big.centres.T).max(axis=1)
    assert abs(nearest.mean() - ANCHOR_COSINE) < 0.02 and len(set((v @ big.centres.T).argmax(axis=1))) > 6


def test_query_vectors_are_not_stored_vectors(datasets):
    pools = load_pools(datasets)
    stored = np.vstack([make_document(i, pools, 384, 50).embeddings for i in range(10)])
    for stream in (2, 5, 7):
        queries = query_vectors(stream, 50, 384)
        nearest = (stored @ queries.T).max(axis=0)  # cosine similarity of each query to its nearest
        assert nearest.max() < 0.5


def test_anchored_vectors_are_deterministic_unit_and_near_their_anchors(datasets, embedder):
    pools = load_pools(datasets)
    spec = ModelSpec("multilingual-e5-small", 384, query_prefix="query: ", passage_prefix="passage: ")
    queries = ["连接池满了怎么办", "ranking quality"]
    source = anchored_source(pools, embedder, spec, queries, n_anchors=6)
    anchors = source.anchors
    assert anchors.shape == (6, 384)
    assert np.allclose(np.linalg.norm(anchors, axis=1), 1, atol=1e-4)
    assert source.sigma == pytest.approx(anchor_sigma(384)) == pytest.approx(0.02472, abs=1e-5)

    v = source.chunk_vectors(3, 200, 384)
    assert np.array_equal(v, source.chunk_vectors(3, 200, 384))  # deterministic in the document number
    assert not np.allclose(v[:10], source.chunk_vectors(4, 10, 384))
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    # the anchor of each vector is the generator's first draw; the cosine to it is ANCHOR_COSINE on average
    picks = np.random.default_rng([SEED, 3, 1]).integers(0, len(anchors), size=200)
    cosines = np.einsum("ij,ij->i", v, anchors[picks])
    assert abs(cosines.mean() - ANCHOR_COSINE) < 0.01 and cosines.min() > 0.85
    assert len(set(picks.tolist())) > 1
    # the document carries them (rounded for JSON); the uniform default is unchanged
    doc = make_document(3, pools, 384, 200, source)
    assert np.allclose(doc.embeddings, v, atol=1e-6)
    assert np.array_equal(
        VectorSource().chunk_vectors(3, 5, 384), unit_vectors(np.random.default_rng([SEED, 3]), 5, 384)
    )

    # query vectors: the real query embeddings, with the registry's query prefix
    q = source.query_vectors(queries, 7, 384)
    assert np.allclose(q, embedder.embed([f"query: {t}" for t in queries]), atol=1e-5)
    assert source.describe() == "anchored (6 multilingual-e5-small passage embeddings, sigma 0.02472)"


@pytest.mark.parametrize(
    "args",
    [
        ["--chunks", "0"],
        ["--queries", "-1"],
        ["--clients", "0"],
        ["--clients", "1,,4"],
        ["--client-queries", "x"],
        ["--recall-queries", "0"],
        ["--mcp-calls", "-1"],
        ["--load", "copy"],
        ["--vectors", "gaussian"],
        ["--anchors", "0"],
    ],
)
def test_bench_cli_refuses_bad_numbers(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *args])
    assert exc.value.code == 2
    assert "error: argument" in capsys.readouterr().err


def test_bench_cli_refuses_bad_memory_setting(capsys):
    assert main(["bench", "--maintenance-work-mem", "4G"]) == 2
    assert "maintenance-work-mem must look like 4GB" in capsys.readouterr().err


@pytest.mark.slow
def test_precision_bench_compares_full_and_half_precision_and_leaves_nothing_behind(db, datasets, embedder, tmp_path):
    """`pgkb bench --dimension`: both storages measured on the same chunks; recall is exact where ef_search
    covers every vector, the halfvec index and vectors are smaller, and the run's models are gone after."""
    from pgkb.bench.precision import run_precision_bench

    prepare_kb(db, dsn(db), "bench", 90, load_pools(datasets), default_model(db), "bulk")
    before = db.execute("select name from kb.embedding_models order by id").fetchall()
    out = tmp_path / "precision.md"
    report = run_precision_bench(
        600, datasets=str(datasets), queries=4, recall_queries=5, anchors=6, out=str(out), url=dsn(db),
        embedder=embedder,
    )  # fmt: skip
    assert out.read_text().strip() == report.strip()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]] for line in report.splitlines()
            if line.startswith("| ") and not line.startswith("| |")}  # fmt: skip
    assert rows["recall@10, plain query at ef_search 300"][:2] == ["1.000", "1.000"]
    assert rows["recall@10, kb.vector_search"][:2] == ["1.000", "1.000"]
    assert 0.45 < float(rows["stored vectors (sum of pg_column_size)"][2]) < 0.55
    assert float(rows["HNSW index size"][2]) < 1
    for mode in ("plain", "hybrid"):
        assert float(rows[f"{mode} p95 ms"][0]) > 0 and float(rows[f"{mode} p95 ms"][1]) > 0
    assert db.execute("select name from kb.embedding_models order by id").fetchall() == before
    assert db.execute("select count(*) from pg_indexes where indexname like 'embeddings_hnsw_model_%'").fetchone()[
        0
    ] == len(before)
    assert db.execute("select count(*) from kb.embeddings where half is not null").fetchone()[0] == 0
