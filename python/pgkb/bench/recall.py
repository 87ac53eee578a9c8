"""HNSW recall@10 for ``pgkb bench``: the model's HNSW index against exact search on the same data.

For each query vector (random unit vectors, or with ``--vectors anchored`` real query embeddings), the
exact top 10 is the plain vector query's distance computed for every embedding of the same model and
knowledge base in a subquery (``offset 0``, so the ORDER BY cannot use the index) and sorted, with index
scans disabled as well (``set local enable_indexscan = off``). Every statement here is planned afresh
(``prepare=False``): a cached plan would ignore those settings. Compared with it:

* ``vector_plain`` -- the same query through the HNSW index at ``hnsw.ef_search`` 40 (pgvector's
  default), 100 (kb_internal.vector_leg's value before kb.settings.hnsw_ef_search), 200, 300 (that setting's
  default) and 400, and at the setting's current value if it is none of those;
* ``vector_search`` -- ``kb.vector_search(q, 10, kb => name, query_embedding => e)`` (ef_search from
  kb.settings.hnsw_ef_search; no iterative scan without a document filter).

recall@10 = |approximate top 10 ∩ exact top 10| / 10, averaged over the queries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import psycopg

from pgkb.bench.data import Model, log, query_vectors

__all__ = ["RecallResult", "exact_vector_sql", "measure_recall", "plain_vector_sql"]

TOP_K = 10
EF_SEARCH = (40, 100, 200, 300, 400)  # pgvector's default, the vector leg's old one, larger ones (300: the default)


@dataclass
class RecallResult:
    """Mean recall@10 per method over `queries` queries; exact_ms = mean time of one exact query."""

    queries: int
    recall: dict[str, float]
    min_recall: dict[str, float]
    exact_ms: float


def plain_vector_sql(model: Model, kb_id: int) -> str:
    """The plain pgvector top-10 query on the model's partial HNSW index (parameter %(e)s)."""
    return (
        f"select chunk_id from kb.embeddings where model_id = {model.id} and kb_id = {kb_id} "
        f"order by {model.column} <=> %(e)s::{model.cast} limit {TOP_K}"
    )


def exact_vector_sql(model: Model, kb_id: int) -> str:
    """The plain query's top 10 by computing every distance (no index can serve it)."""
    return (
        f"select chunk_id from (select chunk_id, {model.column} <=> %(e)s::{model.cast} as distance"
        f" from kb.embeddings where model_id = {model.id} and kb_id = {kb_id} offset 0) as every_chunk"
        f" order by distance limit {TOP_K}"
    )


def measure_recall(
    conn: psycopg.Connection,
    model: Model,
    kb_id: int,
    kb_name: str,
    queries: int,
    vectors: np.ndarray | None = None,
    shipped_ef: int = 300,
) -> RecallResult:
    """recall@10 of the HNSW paths against exact search, over `vectors` (default: `queries` random unit
    query vectors)."""
    plain, exact_sql = plain_vector_sql(model, kb_id), exact_vector_sql(model, kb_id)
    search = (  # the query text is not used by the vector leg
        f"select chunk_id from kb.vector_search('recall', {TOP_K}, kb => %(kb)s::text,"
        f" query_embedding => %(e)s::vector, model => '{model.name}')"
    )
    if vectors is None:
        vectors = query_vectors(7, queries, model.dimension)
    queries = len(vectors)
    ef_values = sorted({*EF_SEARCH, shipped_ef})
    hits: dict[str, list[float]] = {f"vector_plain (ef_search {ef})": [] for ef in ef_values}
    hits["vector_search"] = []
    exact_seconds = 0.0
    log(f"recall@{TOP_K}: {queries} queries against exact search")
    for i, e in enumerate(vectors):
        with conn.transaction():
            conn.execute("set local enable_indexscan = off")
            t0 = time.perf_counter()
            exact = {r[0] for r in conn.execute(exact_sql, {"e": e}, prepare=False).fetchall()}
            exact_seconds += time.perf_counter() - t0
        with conn.transaction():
            for ef in ef_values:
                label = f"vector_plain (ef_search {ef})"
                conn.execute(f"set local hnsw.ef_search = {ef}")
                got = {r[0] for r in conn.execute(plain, {"e": e}, prepare=False).fetchall()}
                hits[label].append(len(got & exact) / TOP_K)
        got = {r[0] for r in conn.execute(search, {"kb": kb_name, "e": e}, prepare=False).fetchall()}
        hits["vector_search"].append(len(got & exact) / TOP_K)
        if (i + 1) % 50 == 0:
            log(f"recall: {i + 1}/{queries} queries")
    return RecallResult(
        queries=queries,
        recall={k: float(np.mean(v)) for k, v in hits.items()},
        min_recall={k: float(np.min(v)) for k, v in hits.items()},
        exact_ms=exact_seconds / queries * 1000,
    )
