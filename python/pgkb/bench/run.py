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
     order by embedding::vector(384) <=> e limit 10`` at ``kb.vector_leg``'s ``hnsw.ef_search`` (100): the
     baseline, what an application querying pgvector directly would pay;
   * ``vector_plain_ef40`` -- the same at pgvector's default ``hnsw.ef_search = 40``;
   * ``vector`` / ``lexical`` / ``fuzzy`` -- ``kb.vector_search`` / ``kb.lexical_search`` /
     ``kb.fuzzy_search`` with ``top_k = 10`` (vector-only, lexical-only, fuzzy-only);

2. HNSW recall@10 against exact search (pgkb.bench.recall);
3. relation sizes, and the index build times of a bulk load (pgkb.bench.load);
4. a concurrency sweep of ``hybrid`` and ``vector_plain`` (pgkb.bench.concurrency);
5. the MCP overhead of ``search_knowledge`` through a real MCP client (pgkb.bench.mcp);

and checks the goals (:data:`GOALS`). The Markdown report goes to stdout and, with ``out``, is appended
to that file; progress goes to stderr.

Uniform random embeddings carry no meaning and are the worst case for HNSW recall, so with them this
measures cost, not quality (anchored ones have real neighbourhoods, and the queries' vectors are then the
real embeddings of the query strings); the lexical and fuzzy legs see
real text and real query strings, so their work (postings, trigram matches) is realistic, except that
sentences repeat across chunks (the corpora hold only a few thousand passages).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psycopg

from pgkb.bench.concurrency import ConcurrencyRow, sweep
from pgkb.bench.data import (
    ANCHORS,
    SEED,
    VECTOR_KINDS,
    Model,
    VectorSource,
    anchored_source,
    default_model,
    load_pools,
    log,
    query_vectors,
    sample_distinct_queries,
    sample_queries,
)
from pgkb.bench.load import LOAD_METHODS, LoadReport, prepare_kb
from pgkb.bench.mcp import McpResult, measure_mcp_overhead
from pgkb.bench.recall import RecallResult, measure_recall, plain_vector_sql
from pgkb.db import connect, database_url

__all__ = ["BenchOptions", "BenchResult", "ModeStats", "run_search_bench"]

TOP_K = 10
VECTOR_LEG_EF_SEARCH = 100  # kb.vector_leg's SET hnsw.ef_search
MODES = ("hybrid", "vector_plain", "vector_plain_ef40", "vector", "lexical", "fuzzy")
CONCURRENCY_MODES = ("hybrid", "vector_plain")
LARGE = 1_000_000  # from this many chunks the 1M goals apply
GOALS = {
    "hybrid_ratio": 1.5,  # hybrid p95 / vector_plain p95, below LARGE chunks
    "hybrid_ratio_large": 2.0,  # the same from LARGE chunks
    "recall": 0.95,  # HNSW recall@10 (plain query at ef_search 100, and kb.vector_search)
    "mcp_overhead_ms": 10.0,  # p95 of client time - embed - search of search_knowledge
}
SETTINGS = (
    "shared_buffers",
    "effective_cache_size",
    "work_mem",
    "maintenance_work_mem",
    "jit",
    "max_parallel_workers_per_gather",
    "max_parallel_maintenance_workers",
    "random_page_cost",
    "hnsw.ef_search",
    "hnsw.iterative_scan",
    "pg_trgm.word_similarity_threshold",
    "plan_cache_mode",
)


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
    maintenance_work_mem: str = "4GB"
    vectors: str = "uniform"
    anchors: int = ANCHORS
    url: str | None = None
    mcp_query_log: str | None = None  # the MCP server's PGKB_QUERY_LOG (None: none)

    def check(self) -> None:
        for name in ("chunks", "queries", "recall_queries", "client_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
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


# --------------------------------------------------------------------------------------------------
# Latency per mode


@dataclass
class ModeStats:
    """Latency statistics of one mode, in milliseconds."""

    mode: str
    sql: str
    samples: list[float]
    rows: list[int]

    def pct(self, p: float) -> float:
        return float(np.percentile(self.samples, p))

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples))


def _mode_sql(model: Model, kb_id: int) -> dict[str, str]:
    plain = plain_vector_sql(model, kb_id)
    return {
        "hybrid": f"select * from kb.hybrid_search(%(q)s::text, {TOP_K}, kb => %(kb)s::text, "
        "query_embedding => %(e)s::vector)",
        "vector_plain": plain,
        "vector_plain_ef40": plain,
        "vector": f"select * from kb.vector_search(%(q)s::text, {TOP_K}, kb => %(kb)s::text, "
        "query_embedding => %(e)s::vector)",
        "lexical": f"select * from kb.lexical_search(%(q)s::text, {TOP_K}, kb => %(kb)s::text)",
        "fuzzy": f"select * from kb.fuzzy_search(%(q)s::text, {TOP_K}, kb => %(kb)s::text)",
    }


def _ef_setter(conn: psycopg.Connection) -> Callable[[int], None]:
    current = [0]

    def set_ef(ef: int) -> None:
        if current[0] != ef:
            conn.execute(f"set hnsw.ef_search = {int(ef)}")
            current[0] = ef

    return set_ef


def _query_params(kb_name: str, query_texts: list[str], dim: int, source: VectorSource) -> list[dict]:
    """Per query: text, knowledge base and its query embedding (its own random one, or its real one)."""
    embeddings = source.query_vectors(query_texts, 2, dim)
    return [{"q": q, "kb": kb_name, "e": e} for q, e in zip(query_texts, embeddings, strict=True)]


def _time_modes(conn: psycopg.Connection, sql: dict[str, str], params: list[dict]) -> dict[str, ModeStats]:
    set_ef = _ef_setter(conn)
    ef_of = {m: (40 if m == "vector_plain_ef40" else VECTOR_LEG_EF_SEARCH) for m in MODES}

    def call(mode: str, p: dict) -> tuple[float, int]:
        set_ef(ef_of[mode])
        t0 = time.perf_counter()
        rows = conn.execute(sql[mode], p).fetchall()
        return (time.perf_counter() - t0) * 1000.0, len(rows)

    warm = min(20, max(5, len(params) // 10))
    log(f"warming up ({warm} queries x {len(MODES)} modes)")
    wrng = random.Random(SEED + 3)
    for _ in range(warm):
        for mode in MODES:
            call(mode, wrng.choice(params))

    stats = {m: ModeStats(m, sql[m], [], []) for m in MODES}
    order_rng = random.Random(SEED + 4)
    log(f"timing {len(params)} queries x {len(MODES)} modes")
    for i, p in enumerate(params):
        order = list(MODES)
        order_rng.shuffle(order)
        for mode in order:
            ms, n = call(mode, p)
            stats[mode].samples.append(ms)
            stats[mode].rows.append(n)
        if (i + 1) % 50 == 0:
            log(f"timed {i + 1}/{len(params)} queries")
    conn.execute("reset hnsw.ef_search")
    return stats


def _explain_plain(conn: psycopg.Connection, model: Model, kb_id: int) -> tuple[str, bool]:
    """EXPLAIN (ANALYZE) of the plain vector query; whether it scans the model's HNSW index."""
    e = query_vectors(5, 1, model.dimension)[0]
    conn.execute(f"set hnsw.ef_search = {VECTOR_LEG_EF_SEARCH}")
    plan = conn.execute(
        "explain (analyze, costs off, timing off, summary off) " + plain_vector_sql(model, kb_id), {"e": e}
    ).fetchall()
    conn.execute("reset hnsw.ef_search")
    text = re.sub(r"'\[[^\]]*\]'", "'[...]'", "\n".join(r[0] for r in plan))
    index = conn.execute("select kb.hnsw_index_name(%s)", [model.id]).fetchone()[0]
    return text, f"Index Scan using {index}" in text


# --------------------------------------------------------------------------------------------------
# Machine information, sizes


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip(chr(34))}, Linux {platform.release()}"
    except OSError:
        pass
    return platform.platform()


def _machine(conn: psycopg.Connection) -> dict[str, str]:
    pg = conn.execute("select version()").fetchone()[0]
    vec = conn.execute("select extversion from pg_extension where extname = 'vector'").fetchone()
    trgm = conn.execute("select extversion from pg_extension where extname = 'pg_trgm'").fetchone()
    return {
        "CPU": _cpu_model(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "RAM": _ram(),
        "OS": _os_name(),
        "PostgreSQL": pg.split(" on ")[0] if " on " in pg else pg,
        "pgvector": vec[0] if vec else "not installed",
        "pg_trgm": trgm[0] if trgm else "not installed",
        "client": f"Python {platform.python_version()}, psycopg {psycopg.__version__}, same host",
        "load average (1/5/15 min, at report time)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _settings(conn: psycopg.Connection) -> dict[str, str]:
    out = {}
    for name in SETTINGS:
        row = conn.execute("select current_setting(%s, true)", [name]).fetchone()
        out[name] = row[0] if row and row[0] is not None else "(unset)"
    return out


def _sizes(conn: psycopg.Connection, model: Model) -> dict[str, tuple[str, str]]:
    """{label: (relation, pretty size)} of the tables and the indexes the search reads."""
    index = conn.execute("select kb.hnsw_index_name(%s)", [model.id]).fetchone()[0]
    rels = {
        "kb.chunks (heap + TOAST)": ("kb.chunks", "pg_table_size('kb.chunks')"),
        "kb.embeddings (heap + TOAST)": ("kb.embeddings", "pg_table_size('kb.embeddings')"),
        f"HNSW index {index}": (index, f"pg_relation_size('kb.{index}')"),
        "GIN term index chunks_terms_idx": ("chunks_terms_idx", "pg_relation_size('kb.chunks_terms_idx')"),
        "GIN trigram index chunks_trgm_idx": ("chunks_trgm_idx", "pg_relation_size('kb.chunks_trgm_idx')"),
        "kb.term_stats (table + indexes)": ("kb.term_stats", "pg_total_relation_size('kb.term_stats')"),
    }
    return {
        label: (rel, conn.execute(f"select pg_size_pretty({expr})").fetchone()[0])
        for label, (rel, expr) in rels.items()
    }


# --------------------------------------------------------------------------------------------------
# Result, goals, report


@dataclass
class Goal:
    """One goal: what, the measured value (text), met or not."""

    name: str
    measured: str
    met: bool


@dataclass
class BenchResult:
    """Everything the report shows."""

    kb_name: str
    chunks: int
    queries: int
    vectors: str
    load: LoadReport
    machine: dict[str, str]
    settings: dict[str, str]
    sizes: dict[str, tuple[str, str]]
    explain: str
    uses_hnsw: bool
    stats: dict[str, ModeStats]
    recall: RecallResult
    concurrency: list[ConcurrencyRow]
    mcp: McpResult | None
    goals: list[Goal] = field(default_factory=list)


def _goals(r: BenchResult) -> list[Goal]:
    s = r.stats
    large = r.chunks >= LARGE
    limit = GOALS["hybrid_ratio_large" if large else "hybrid_ratio"]
    ratio = s["hybrid"].pct(95) / s["vector_plain"].pct(95)
    goals = [
        Goal(
            f"hybrid p95 <= {limit:g} x vector-only (plain) p95",
            f"{_fmt(s['hybrid'].pct(95))} / {_fmt(s['vector_plain'].pct(95))} ms = {ratio:.2f}",
            ratio <= limit,
        )
    ]
    if large:
        lex, vec = s["lexical"].pct(95), s["vector"].pct(95)
        goals.append(
            Goal("lexical leg p95 <= vector leg p95", f"{_fmt(lex)} vs {_fmt(vec)} ms ({lex / vec:.2f})", lex <= vec)
        )
    for label in ("vector_plain (ef_search 100)", "vector_search"):
        value = r.recall.recall[label]
        kind = "anchored vectors" if r.vectors == "anchored" else "uniform random vectors, the worst case"
        goals.append(
            Goal(f"HNSW recall@10 >= {GOALS['recall']:g}, {label} ({kind})", f"{value:.3f}", value >= GOALS["recall"])
        )
    if r.mcp is not None:
        over = r.mcp.pct(r.mcp.overhead_ms, 95)
        goals.append(
            Goal(
                f"MCP overhead p95 <= {GOALS['mcp_overhead_ms']:g} ms",
                f"{over:.1f} ms",
                over <= GOALS["mcp_overhead_ms"],
            )
        )
    return goals


def _fmt(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _report(r: BenchResult) -> str:
    s = r.stats
    when = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    lines = [
        f"## pgkb bench, {r.chunks} chunks, {r.queries} queries ({when})",
        "",
        f"Knowledge base `{r.kb_name}`: {r.load.describe()}.",
        "",
        "| goal | measured | |",
        "|---|---|---|",
    ]
    lines += [f"| {g.name} | {g.measured} | {'met' if g.met else '**missed**'} |" for g in r.goals]
    lines += [
        "",
        "### Latency per mode (one connection)",
        "",
        "| mode | p50 ms | p95 ms | p99 ms | mean ms | avg rows |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        m = s[mode]
        lines.append(
            f"| {mode} | {_fmt(m.pct(50))} | {_fmt(m.pct(95))} | {_fmt(m.pct(99))} | {_fmt(m.mean)} "
            f"| {np.mean(m.rows):.1f} |"
        )
    plain95 = s["vector_plain"].pct(95)
    lines += [
        "",
        f"- p95 ratios to vector_plain: hybrid {s['hybrid'].pct(95) / plain95:.2f}, "
        f"vector (kb.vector_search) {s['vector'].pct(95) / plain95:.2f}, lexical {s['lexical'].pct(95) / plain95:.2f}, "
        f"fuzzy {s['fuzzy'].pct(95) / plain95:.2f}; hybrid vs vector_plain_ef40: "
        f"{s['hybrid'].pct(95) / s['vector_plain_ef40'].pct(95):.2f}",
        f"- lexical p95 / vector (kb.vector_search) p95 = {s['lexical'].pct(95) / s['vector'].pct(95):.2f}",
        f"- plain vector query uses the HNSW index: **{'yes' if r.uses_hnsw else 'NO'}**",
        "",
        f"### HNSW recall@10 against exact search ({r.recall.queries} "
        f"{'random query vectors' if r.vectors == 'uniform' else 'real query embeddings'})",
        "",
        f"Exact search: the plain query with index scans off, {_fmt(r.recall.exact_ms)} ms per query.",
        "",
        "| method | mean recall@10 | worst query |",
        "|---|---:|---:|",
    ]
    lines += [f"| {k} | {v:.3f} | {r.recall.min_recall[k]:.1f} |" for k, v in r.recall.recall.items()]
    lines += [
        "",
        "### Concurrency (each client its own connection, same number of queries each)",
        "",
        "| mode | clients | queries | QPS | p50 ms | p95 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {c.mode} | {c.clients} | {c.queries} | {c.qps:.1f} | {_fmt(c.pct(50))} | {_fmt(c.pct(95))} |"
        for c in r.concurrency
    ]
    if r.mcp is not None:
        m = r.mcp
        lines += [
            "",
            f"### MCP `search_knowledge` end to end ({m.calls} calls over {m.transport}, top_k 5)",
            "",
            "| per call | p50 ms | p95 ms | p99 ms |",
            "|---|---:|---:|---:|",
        ]
        for label, values in (
            ("client-observed call", m.client_ms),
            ("embed (server, timings_ms.embed)", m.embed_ms),
            ("SQL (server, timings_ms.search)", m.search_ms),
            ("**overhead** = call - embed - SQL", m.overhead_ms),
            ("of which outside pgkb.search (connect, MCP, rendering)", m.outside_search_ms),
        ):
            lines.append(
                f"| {label} | {_fmt(m.pct(values, 50))} | {_fmt(m.pct(values, 95))} | {_fmt(m.pct(values, 99))} |"
            )
    builds = r.load.index_builds
    lines += ["", "### Sizes and index builds", "", "| relation | size | build s |", "|---|---|---:|"]
    for label, (rel, size) in r.sizes.items():
        build = f"{builds[rel]:.1f}" if rel in builds else ""
        lines.append(f"| {label} | {size} | {build} |")
    lines += ["", "<details><summary>SQL per mode, plan of the plain vector query</summary>", "", "```sql"]
    for mode in MODES:
        ef = 40 if mode == "vector_plain_ef40" else VECTOR_LEG_EF_SEARCH
        suffix = f"  -- hnsw.ef_search = {ef}" if mode.startswith("vector_plain") else ""
        lines.append(f"-- {mode}{suffix}\n{s[mode].sql};")
    lines += ["```", "", "```", r.explain, "```", "", "</details>", "", "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.machine.items()]
    lines += ["", "| setting | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.settings.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Entry point


def run_search_bench(options: BenchOptions, embedder=None, settings=None) -> BenchResult:
    """Load (or reuse) the synthetic knowledge base and measure everything; see the module docstring.

    The knowledge base ``options.kb_name`` is deleted outright and reloaded when it holds a different
    number of chunks, so do not point it at one you care about; the bulk load drops and rebuilds the
    chunk and embedding indexes of the whole database (use a database of its own). Returns the
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
        )
        explain, uses_hnsw = _explain_plain(conn, model, kb_id)
        log("plain vector query plan:\n" + explain)
        if not uses_hnsw:
            log("WARNING: the plain vector query does not use the HNSW index")
        sql = _mode_sql(model, kb_id)
        params = _query_params(options.kb_name, query_texts, model.dimension, source)
        stats = _time_modes(conn, sql, params)
        recall = measure_recall(conn, model, kb_id, options.kb_name, options.recall_queries, recall_vectors)
        concurrency = sweep(
            url,
            {
                m: (sql[m], [f"set hnsw.ef_search = {VECTOR_LEG_EF_SEARCH}"] if m == "vector_plain" else [])
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
            load=load,
            machine=_machine(conn),
            settings=_settings(conn),
            sizes=_sizes(conn, model),
            explain=explain,
            uses_hnsw=uses_hnsw,
            stats=stats,
            recall=recall,
            concurrency=concurrency,
            mcp=mcp,
        )
    result.goals = _goals(result)
    report = _report(result)
    print(report)
    if options.out:
        with open(options.out, "a", encoding="utf-8") as fh:
            fh.write("\n" + report)
    return result
