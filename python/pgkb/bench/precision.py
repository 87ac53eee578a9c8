"""``pgkb bench --dimension D``: a large model's embeddings stored as ``vector(D)`` against ``halfvec(D)``
(issue 33), on the chunks of a bench knowledge base already loaded (``pgkb bench`` first).

Two models are registered for the run, ``bench-<D>-vector`` (storage vector) and ``bench-<D>-halfvec``
(storage halfvec), and every chunk of the knowledge base gets the same D-dimensional embedding under each.
The embeddings are anchored synthetic vectors: the real passage and query embeddings of the default model
(pgkb.bench.data.anchored_source, 384-d) mapped into D dimensions by one fixed random orthonormal map (which
keeps every cosine), the chunks spread around them as pgkb.bench.data does with sigma for D dimensions. Then,
for each model: the HNSW index build time and size (the shipped m / ef_construction, the given
maintenance_work_mem), recall@10 against exact search at the shipped ef_search, and p50 / p95 of the plain
pgvector query and of ``kb.hybrid_search(..., model => ...)``, the two models' queries interleaved. The two
models are removed at the end (their rows, queue entries and indexes).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psycopg

from pgkb.bench.data import (
    ANCHORS,
    SEED,
    Model,
    anchor_sigma,
    anchored_source,
    default_model,
    doc_key,
    document_vectors,
    load_pools,
    log,
    model_named,
    sample_distinct_queries,
    sample_queries,
)
from pgkb.bench.latency import shipped_ef_search
from pgkb.bench.load import refuse_shared
from pgkb.bench.machine import machine_info
from pgkb.bench.recall import measure_recall, plain_vector_sql
from pgkb.db import connect, database_url
from pgkb.rows import one

__all__ = ["run_precision_bench"]

STORAGES = ("vector", "halfvec")
COPY_DOCUMENTS = 500  # documents per COPY


def _project(source, dimension: int):
    """The anchored source mapped into `dimension` dimensions by a fixed random orthonormal map."""
    base = source.anchors.shape[1]
    q, _ = np.linalg.qr(np.random.default_rng([SEED, dimension]).normal(size=(dimension, base)))
    q = q.astype(np.float32)  # columns orthonormal: x -> q @ x keeps norms and cosines
    centres = source.anchors if source.centres is None else source.centres
    return replace(
        source,
        anchors=source.anchors @ q.T,
        centres=centres @ q.T,
        sigma=anchor_sigma(dimension),
        queries={t: v @ q.T for t, v in source.queries.items()},
    )


def _register(conn: psycopg.Connection, dimension: int, storage: str) -> Model:
    """The run's model of this storage, registered afresh, without its index and backfill queue (the vectors
    are written in bulk and the index built afterwards, timed)."""
    name = f"bench-{dimension}-{storage}"
    _remove(conn, name)
    conn.execute("select kb.register_embedding_model(%s, %s, storage => %s)", [name, dimension, storage])
    model = model_named(conn, name)
    _drop_indexes(conn, model.id)
    conn.execute("delete from kb.embedding_queue where model_id = %s", [model.id])
    return model


def _drop_indexes(conn: psycopg.Connection, model_id: int) -> None:
    """The model's HNSW indexes, in every knowledge base."""
    for (index,) in conn.execute(
        "select index_name from kb_internal.vector_index_definitions(model_id => %s)", [model_id]
    ).fetchall():
        conn.execute(f"drop index if exists kb.{index}")


def _remove(conn: psycopg.Connection, name: str) -> None:
    """The run's model of that name, with its indexes, rows and queue entries (ON DELETE CASCADE)."""
    row = conn.execute("select id from kb.embedding_models where name = %s", [name]).fetchone()
    if row is None:
        return
    _drop_indexes(conn, row[0])
    conn.execute("delete from kb.embedding_models where id = %s", [row[0]])


def _write_vectors(conn: psycopg.Connection, kb_id: int, model: Model, source) -> None:
    """Every chunk's embedding under the model, by document (chunks in ordinal order), in bulk."""
    column = "half" if model.storage == "halfvec" else "embedding"
    docs = conn.execute(
        "select d.doc_key, array_agg(c.id order by c.ordinal) from kb.documents as d"
        " join kb.chunks as c on c.document_id = d.id where d.kb_id = %s group by d.doc_key order by d.doc_key",
        [kb_id],
    ).fetchall()
    from pgvector import HalfVector, Vector

    wrap = HalfVector if model.storage == "halfvec" else Vector
    for start in range(0, len(docs), COPY_DOCUMENTS):
        with (
            conn.transaction(),
            conn.cursor().copy(f"copy kb.embeddings (chunk_id, model_id, kb_id, {column}) from stdin") as cp,
        ):
            for key, chunk_ids in docs[start : start + COPY_DOCUMENTS]:
                vectors = document_vectors(_document_number(key), len(chunk_ids), model.dimension, source)
                for chunk_id, v in zip(chunk_ids, vectors, strict=True):
                    cp.write_row((chunk_id, model.id, kb_id, wrap(v).to_text()))
        log(f"{model.name}: {min(start + COPY_DOCUMENTS, len(docs))}/{len(docs)} documents written")


def _document_number(key: str) -> int:
    """i of the bench document doc_key(i)."""
    number = int(key.rsplit("-", 1)[1])
    assert doc_key(number) == key
    return number


def _build_index(conn: psycopg.Connection, model: Model, kb_id: int, maintenance_work_mem: str) -> tuple[float, int]:
    """Seconds to build the model's HNSW index over the knowledge base, and its size in bytes."""
    definition, name = one(
        conn.execute(
            "select definition, index_name from kb_internal.vector_index_definitions(%s, %s)", [kb_id, model.id]
        )
    )
    conn.execute("select set_config('maintenance_work_mem', %s, false)", [maintenance_work_mem])
    t0 = time.perf_counter()
    conn.execute(definition)
    seconds = time.perf_counter() - t0
    conn.execute("reset maintenance_work_mem")
    return seconds, one(conn.execute(f"select pg_relation_size('kb.{name}')"))[0]


def _latency(conn: psycopg.Connection, models: list[Model], kb_id: int, kb_name: str, params, ef_search: int):
    """p50 / p95 ms of the plain query and of hybrid per model, the models' queries interleaved."""
    times: dict[str, list[float]] = {}
    conn.execute(f"set hnsw.ef_search = {int(ef_search)}")
    for q, e in params:
        for model in models:
            for mode, sql in (
                ("plain", plain_vector_sql(model, kb_id)),
                (
                    "hybrid",
                    "select * from kb.hybrid_search(%(q)s::text, 10, kb => %(kb)s::text,"
                    f" query_embedding => %(e)s::vector, model => '{model.name}')",
                ),
            ):
                t0 = time.perf_counter()
                conn.execute(sql, {"q": q, "kb": kb_name, "e": e}).fetchall()
                times.setdefault(f"{mode} {model.storage}", []).append((time.perf_counter() - t0) * 1000)
    conn.execute("reset hnsw.ef_search")

    def p95(xs: list[float]) -> float:
        return sorted(xs)[max(0, int(round(0.95 * len(xs))) - 1)]

    return {k: (statistics.median(v), p95(v)) for k, v in times.items()}


def run_precision_bench(
    dimension: int,
    kb_name: str = "bench",
    datasets: str = "../shared/datasets",
    queries: int = 200,
    recall_queries: int = 50,
    maintenance_work_mem: str = "4GB",
    anchors: int = ANCHORS,
    out: str | None = None,
    url: str | None = None,
    embedder=None,
    settings=None,
) -> str:
    """Measure and print (and append to `out`) the report; see the module docstring."""
    from pgkb.config import Settings
    from pgkb.models.embedding import load_embedder, model_spec

    pools = load_pools(Path(datasets))
    url = url or database_url()
    query_texts = sample_queries(pools, queries)
    recall_texts = sample_distinct_queries(pools, recall_queries, SEED + 7)
    with connect(url) as conn:
        row = conn.execute("select id, chunk_count from kb.knowledge_bases where name = %s", [kb_name]).fetchone()
        if row is None or not row[1]:
            raise RuntimeError(f"no bench knowledge base {kb_name!r} with chunks: run `pgkb bench` first")
        kb_id, chunks = row
        # registering the run's models queues every chunk of every knowledge base and writes their indexes
        refuse_shared(conn, kb_name)
        base = default_model(conn)
        spec = model_spec(conn, base.name)
        embedder = embedder or load_embedder(settings or Settings.from_env(), spec)
        t0 = time.perf_counter()
        source = anchored_source(pools, embedder, spec, query_texts + recall_texts, anchors).sized_for(chunks)
        source = _project(source, dimension)
        log(f"anchored {dimension}-d vectors: {source.describe()}, in {time.perf_counter() - t0:.0f} s")
        ef_search = shipped_ef_search(conn)
        models, builds = [], {}
        try:
            for storage in STORAGES:
                model = _register(conn, dimension, storage)
                models.append(model)
                t0 = time.perf_counter()
                _write_vectors(conn, kb_id, model, source)
                written = time.perf_counter() - t0
                conn.execute("vacuum analyze kb.embeddings")
                seconds, size = _build_index(conn, model, kb_id, maintenance_work_mem)
                table = one(
                    conn.execute(
                        "select sum(coalesce(pg_column_size(e.embedding), 0) + coalesce(pg_column_size(e.half), 0))"
                        " from kb.embeddings as e where e.model_id = %s",
                        [model.id],
                    )
                )[0]
                builds[storage] = (seconds, size, table, written)
                log(f"{model.name}: index {size / 2**20:.0f} MB in {seconds:.1f} s")
            recall_vectors = np.stack([source.queries[t] for t in recall_texts])
            recall = {
                m.storage: measure_recall(conn, m, kb_id, kb_name, len(recall_texts), recall_vectors, ef_search)
                for m in models
            }
            params = [(q, source.queries[q]) for q in query_texts]
            latency = _latency(conn, models, kb_id, kb_name, params, ef_search)
            machine = machine_info(conn)
        finally:
            for storage in STORAGES:
                _remove(conn, f"bench-{dimension}-{storage}")
    report = _render(dimension, kb_name, chunks, ef_search, builds, recall, latency, machine, len(query_texts))
    print(report)
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write("\n" + report)
    return report


def _render(dimension, kb_name, chunks, ef_search, builds, recall, latency, machine, n_queries) -> str:
    v, h = builds["vector"], builds["halfvec"]
    shipped = f"vector_plain (ef_search {ef_search})"
    lines = [
        f"### pgkb bench --dimension {dimension}: vector({dimension}) against halfvec({dimension}), "
        f"{chunks} chunks ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Knowledge base `{kb_name}`; anchored synthetic {dimension}-d vectors; shipped ef_search {ef_search}; "
        f"{n_queries} queries per mode, the two models' queries interleaved; recall over "
        f"{recall['vector'].queries} queries against exact search.",
        "",
        "| | vector | halfvec | halfvec / vector |",
        "|---|---:|---:|---:|",
        f"| HNSW index size | {v[1] / 2**20:.0f} MB | {h[1] / 2**20:.0f} MB | {h[1] / v[1]:.2f} |",
        f"| HNSW build (s) | {v[0]:.1f} | {h[0]:.1f} | {h[0] / v[0]:.2f} |",
        f"| stored vectors (sum of pg_column_size) | {v[2] / 2**20:.0f} MB | {h[2] / 2**20:.0f} MB "
        f"| {h[2] / v[2]:.2f} |",
        f"| recall@10, plain query at ef_search {ef_search} | {recall['vector'].recall[shipped]:.3f} "
        f"| {recall['halfvec'].recall[shipped]:.3f} | |",
        f"| recall@10, kb.vector_search | {recall['vector'].recall['vector_search']:.3f} "
        f"| {recall['halfvec'].recall['vector_search']:.3f} | |",
    ]
    for mode in ("plain", "hybrid"):
        a, b = latency[f"{mode} vector"], latency[f"{mode} halfvec"]
        lines.append(f"| {mode} p50 ms | {a[0]:.2f} | {b[0]:.2f} | {b[0] / a[0]:.2f} |")
        lines.append(f"| {mode} p95 ms | {a[1]:.2f} | {b[1]:.2f} | {b[1] / a[1]:.2f} |")
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    lines += [
        "",
        f"Machine: {machine.get('CPU', '')}, {machine.get('cores (os.cpu_count)', '')} cores; "
        f"load average at report time {load}.",
        "",
    ]
    return "\n".join(lines)
