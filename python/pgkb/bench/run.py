"""Search benchmark (``pgkb bench``): latency of ``kb.hybrid_search`` against a plain pgvector HNSW query
and the single legs, HNSW recall, index build time and size, a concurrency sweep, and the MCP overhead.

:func:`run_search_bench` loads (or reuses) a synthetic knowledge base -- chunks made of real sentences
sampled from the shared evaluation corpora (about 70% Chinese, 30% English) with random unit embeddings
(``vectors="uniform"``) or embeddings anchored on real passage embeddings (``vectors="anchored"``, the
one to read recall from; see pgkb.bench.data), written in bulk or through ``kb.replace_document``
(pgkb.bench.load) -- and measures in one run:

1. latency per mode on one connection, every query once in every mode in a per-query shuffled order (so
   drift affects them alike), client-side wall clock of execute + fetch, p50/p95/p99:

   * ``hybrid``        -- ``kb.hybrid_search(q, 10, kb => name, query_embedding => e)``;
   * ``vector_plain``  -- ``select chunk_id from kb.embeddings where model_id = M and kb_id = K
     order by embedding::vector(384) <=> e limit 10`` at ``kb_internal.vector_leg``'s ``hnsw.ef_search``
     (kb.settings.hnsw_ef_search, so both find the same neighbours): the baseline, what an application
     querying pgvector directly would pay;
   * ``vector_plain_ef40`` -- the same at pgvector's default ``hnsw.ef_search = 40``;
   * ``vector`` / ``lexical`` / ``fuzzy`` -- ``kb.vector_search`` / ``kb.lexical_search`` /
     ``kb.fuzzy_search`` with ``top_k = 10`` (vector-only, lexical-only, fuzzy-only);

   then where a hybrid search's time goes, per query: each leg, fusion and materialisation, the rest
   (pgkb.bench.breakdown); then the shared question sets' own questions through ``kb.lexical_search``
   (pgkb.bench.question_sets);
2. HNSW recall@10 against exact search (pgkb.bench.recall);
3. relation sizes, and the index build times of a bulk load (pgkb.bench.load);
4. a concurrency sweep of ``hybrid`` and ``vector_plain`` (pgkb.bench.concurrency);
5. the MCP overhead of ``search_knowledge`` through a real MCP client (pgkb.bench.mcp);

and checks the goals (pgkb.bench.report). The Markdown report goes to stdout and, with ``out``, is appended
to that file; progress goes to stderr.

Uniform random embeddings carry no meaning and are the worst case for HNSW recall, so with them this
measures cost, not quality (anchored ones have real neighbourhoods, and the queries' vectors are then the
real embeddings of the query strings); the lexical and fuzzy legs see
real text and real query strings, so their work (postings, vocabulary lookups) is realistic, except that
sentences repeat across chunks (the corpora hold only a few thousand passages).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from pgkb.bench.breakdown import hybrid_breakdown
from pgkb.bench.concurrency import sweep
from pgkb.bench.data import (
    ANCHORS,
    SEED,
    VECTOR_KINDS,
    VectorSource,
    anchored_source,
    default_model,
    load_pools,
    log,
    sample_distinct_queries,
    sample_queries,
)
from pgkb.bench.latency import (
    MODES,
    ModeStats,
    explain_plain,
    mode_sql,
    query_params,
    shipped_ef_search,
    time_modes,
)
from pgkb.bench.load import LOAD_METHODS, prepare_kb
from pgkb.bench.machine import lexical_storage, machine_info, relation_sizes, server_settings
from pgkb.bench.mcp import measure_mcp_overhead
from pgkb.bench.question_sets import load_question_sets, time_question_sets
from pgkb.bench.recall import measure_recall
from pgkb.bench.report import BenchResult, check_goals, render_report
from pgkb.db import connect, database_url

__all__ = ["MODES", "BenchOptions", "BenchResult", "ModeStats", "run_search_bench"]

CONCURRENCY_MODES = ("hybrid", "vector_plain")


@dataclass
class BenchOptions:
    """What to load and measure; :meth:`check` raises ValueError naming the first bad value."""

    chunks: int = 100_000
    queries: int = 200
    datasets: str = "../shared/datasets"
    kb_name: str = "bench"
    out: str | None = None
    load: str = "bulk"
    recall_queries: int = 200
    clients: tuple[int, ...] = (1, 4, 16)
    client_queries: int = 50
    mcp_calls: int = 200
    set_queries: int = 400  # questions per shared question set through kb.lexical_search (0: skip)
    maintenance_work_mem: str = "4GB"
    vectors: str = "uniform"
    anchors: int = ANCHORS
    url: str | None = None
    mcp_query_log: str | None = None  # the MCP server's PGKB_QUERY_LOG (None: none)
    allow_shared_database: bool = False  # bulk-load next to other knowledge bases (see pgkb.bench.load)

    def check(self) -> None:
        for name in ("chunks", "queries", "recall_queries", "client_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.set_queries < 0:
            raise ValueError(f"set-queries must be >= 0 (0 skips the question sets), got {self.set_queries}")
        if self.mcp_calls < 0:
            raise ValueError(f"mcp-calls must be >= 0 (0 skips the MCP measurement), got {self.mcp_calls}")
        if not self.clients or any(c < 1 for c in self.clients):
            raise ValueError(f"clients must be a non-empty list of counts >= 1, got {list(self.clients)}")
        if self.vectors not in VECTOR_KINDS:
            raise ValueError(f"vectors must be one of {', '.join(VECTOR_KINDS)}, got {self.vectors!r}")
        if self.anchors < 1:
            raise ValueError(f"anchors must be >= 1, got {self.anchors}")
        if self.load not in LOAD_METHODS:
            raise ValueError(f"load must be one of {', '.join(LOAD_METHODS)}, got {self.load!r}")
        if not re.fullmatch(r"[0-9]+(kB|MB|GB)", self.maintenance_work_mem):
            raise ValueError(f"maintenance-work-mem must look like 4GB or 512MB, got {self.maintenance_work_mem!r}")


def run_search_bench(options: BenchOptions, embedder=None, settings=None) -> BenchResult:
    """Load (or reuse) the synthetic knowledge base and measure everything; see the module docstring.

    The knowledge base ``options.kb_name`` is deleted outright and reloaded when it holds a different
    number of chunks, so do not point it at one you care about; the bulk load drops and rebuilds the
    chunk and embedding indexes of the whole database, so it refuses a database holding other knowledge
    bases unless ``options.allow_shared_database`` (pgkb.bench.load.SharedDatabase). Returns the
    measurements; the report is printed to stdout and appended to ``options.out`` if given.

    ``options.vectors == "anchored"`` embeds ``options.anchors`` passages and the query strings with
    ``embedder`` (None: the one ``settings`` -- or the environment -- configure for the default model).
    """
    options.check()
    pools = load_pools(Path(options.datasets))
    log(
        f"{len(pools.zh)} zh / {len(pools.en)} en sentences, "
        f"{len(pools.zh_queries)} zh / {len(pools.en_queries)} en queries"
    )
    url = options.url or database_url()
    query_texts = sample_queries(pools, options.queries)
    with connect(url) as conn:
        model = default_model(conn)
        source = VectorSource()
        recall_vectors = None
        if options.vectors == "anchored":
            from pgkb.config import Settings
            from pgkb.models.embedding import load_embedder, model_spec

            spec = model_spec(conn, model.name)
            embedder = embedder or load_embedder(settings or Settings.from_env(), spec)
            recall_texts = sample_distinct_queries(pools, options.recall_queries, SEED + 7)
            t0 = time.perf_counter()
            source = anchored_source(pools, embedder, spec, query_texts + recall_texts, options.anchors)
            source = source.sized_for(options.chunks)
            log(f"anchored vectors: {source.describe()}, embedded in {time.perf_counter() - t0:.0f} s")
            recall_vectors = source.query_vectors(recall_texts, 7, model.dimension)
        kb_id, load = prepare_kb(
            conn,
            url,
            options.kb_name,
            options.chunks,
            pools,
            model,
            options.load,
            options.maintenance_work_mem,
            source,
            allow_shared=options.allow_shared_database,
        )
        ef_search = shipped_ef_search(conn)
        explain, uses_hnsw = explain_plain(conn, model, kb_id, ef_search)
        log("plain vector query plan:\n" + explain)
        if not uses_hnsw:
            log("WARNING: the plain vector query does not use the HNSW index")
        sql = mode_sql(model, kb_id)
        params = query_params(options.kb_name, query_texts, model.dimension, source)
        stats = time_modes(conn, sql, params, ef_search)
        breakdown = hybrid_breakdown(conn, sql["hybrid"], params)
        question_sets = []
        if options.set_queries:
            sets = load_question_sets(Path(options.datasets))
            question_sets = time_question_sets(conn, options.kb_name, sets, options.set_queries)
        recall = measure_recall(conn, model, kb_id, options.kb_name, options.recall_queries, recall_vectors, ef_search)
        concurrency = sweep(
            url,
            {
                m: (sql[m], [f"set hnsw.ef_search = {ef_search}"] if m == "vector_plain" else [])
                for m in CONCURRENCY_MODES
            },
            params,
            options.clients,
            options.client_queries,
        )
        mcp = None
        if options.mcp_calls:
            mcp = measure_mcp_overhead(
                conn, url, options.kb_name, [p["q"] for p in params], options.mcp_calls, options.mcp_query_log
            )
        result = BenchResult(
            kb_name=options.kb_name,
            chunks=options.chunks,
            queries=options.queries,
            vectors=options.vectors,
            ef_search=ef_search,
            load=load,
            machine=machine_info(conn),
            settings=server_settings(conn),
            sizes=relation_sizes(conn, model, kb_id),
            lexical_bytes=lexical_storage(conn),
            explain=explain,
            uses_hnsw=uses_hnsw,
            stats=stats,
            breakdown=breakdown,
            question_sets=question_sets,
            recall=recall,
            concurrency=concurrency,
            mcp=mcp,
        )
    result.goals = check_goals(result)
    report = render_report(result)
    print(report)
    if options.out:
        with open(options.out, "a", encoding="utf-8") as fh:
            fh.write("\n" + report)
    return result
