"""Search latency benchmark: ``kb.hybrid_search`` against a plain pgvector HNSW query and the single legs.

``pgkb bench`` (:func:`run_search_bench`) loads a synthetic knowledge base -- chunks made of real
sentences sampled from the shared evaluation corpora (about 70% Chinese, 30% English) with random unit
embeddings -- and times, on one connection and in one run, for every query in turn (modes interleaved
in a per-query shuffled order so drift affects them alike):

* ``hybrid``        -- ``kb.hybrid_search(q, 10, kb => name, query_embedding => e)``;
* ``vector_plain``  -- ``select chunk_id from kb.embeddings where model_id = M and kb_id = K
  order by embedding::vector(384) <=> e limit 10`` with the same ``hnsw.ef_search`` as ``kb.vector_leg``
  (the baseline: what an application querying pgvector directly would pay);
* ``vector_plain_ef40`` -- the same at pgvector's default ``hnsw.ef_search = 40``;
* ``vector`` / ``lexical`` / ``fuzzy`` -- ``kb.vector_search`` / ``kb.lexical_search`` /
  ``kb.fuzzy_search`` with ``top_k = 10``.

Latency is client-side wall clock per call (execute + fetch all rows) with psycopg. The report (Markdown)
goes to stdout and, with ``out``, is appended to that file. Progress goes to stderr.

Random embeddings carry no meaning, so this measures cost, not quality; the lexical and fuzzy legs see
real text and real query strings, so their work (postings, trigram matches) is realistic, except that
sentences repeat across chunks (the corpora hold only a few thousand passages).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import queue
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from pgkb.db import connect, database_url

__all__ = ["BenchResult", "ModeStats", "run_search_bench"]

SEED = 20240611
TOP_K = 10
DOC_CHUNKS = 50  # chunks per synthetic document
MIN_CHARS, MAX_CHARS = 300, 800  # chunk length range (characters)
ZH_SHARE = 0.7  # share of Chinese documents / queries
ZH_SETS = ("cmrc2018-trial", "drcd-dev-zh_hans")
EN_SETS = ("covid-faq-en", "cisi")
LOAD_THREADS = 2  # loading connections
VECTOR_LEG_EF_SEARCH = 100  # kb.vector_leg's SET hnsw.ef_search
MODES = ("hybrid", "vector_plain", "vector_plain_ef40", "vector", "lexical", "fuzzy")
SETTINGS = (
    "shared_buffers",
    "effective_cache_size",
    "work_mem",
    "maintenance_work_mem",
    "jit",
    "max_parallel_workers_per_gather",
    "random_page_cost",
    "hnsw.ef_search",
    "hnsw.iterative_scan",
    "pg_trgm.word_similarity_threshold",
    "plan_cache_mode",
)

_ZH_SENTENCE_END = re.compile(r"(?<=[。！？；])")
_EN_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_SPACES = re.compile(r"\s+")


def _log(message: str) -> None:
    print(f"pgkb bench: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# Data: sentence pools and query strings from the shared BEIR-layout sets


@dataclass
class _Pools:
    """Sentences (title, sentence) per language and query strings per language."""

    zh: list[tuple[str, str]] = field(default_factory=list)
    en: list[tuple[str, str]] = field(default_factory=list)
    zh_queries: list[str] = field(default_factory=list)
    en_queries: list[str] = field(default_factory=list)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _split_sentences(text: str, chinese: bool) -> list[str]:
    text = _SPACES.sub(" ", text).strip()
    if chinese:
        return [s.strip() for s in _ZH_SENTENCE_END.split(text) if len(s.strip()) >= 8]
    return [s.strip() for s in _EN_SENTENCE_END.split(text) if len(s.strip()) >= 20]


def _load_pools(datasets: Path) -> _Pools:
    """Read the corpora and query sets; raises FileNotFoundError naming what is missing."""
    pools = _Pools()
    for names, chinese in ((ZH_SETS, True), (EN_SETS, False)):
        sentences = pools.zh if chinese else pools.en
        queries = pools.zh_queries if chinese else pools.en_queries
        for name in names:
            folder = datasets / name
            if not (folder / "corpus.jsonl").is_file():
                raise FileNotFoundError(f"{folder / 'corpus.jsonl'} not found (pass --datasets)")
            for doc in _read_jsonl(folder / "corpus.jsonl"):
                title = str(doc.get("title") or "")
                sentences.extend((title, s) for s in _split_sentences(str(doc.get("text") or ""), chinese))
            queries.extend(
                str(q["text"]).strip() for q in _read_jsonl(folder / "queries.jsonl") if str(q["text"]).strip()
            )
    if not (pools.zh and pools.en and pools.zh_queries and pools.en_queries):
        raise ValueError(f"no usable sentences or queries under {datasets}")
    return pools


def _unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def _make_chunk(rng: random.Random, pool: Sequence[tuple[str, str]], chinese: bool) -> tuple[str, str]:
    """One chunk of whole sentences (the last may be cut) of MIN_CHARS..MAX_CHARS characters."""
    target = rng.randint(MIN_CHARS, MAX_CHARS)
    sep = "" if chinese else " "
    parts: list[str] = []
    total = 0
    title = ""
    while total < target:
        t, s = pool[rng.randrange(len(pool))]
        title = title or t
        extra = len(s) + (len(sep) if parts else 0)
        if total + extra > MAX_CHARS:
            if total >= MIN_CHARS:
                break
            s = s[: MAX_CHARS - total - (len(sep) if parts else 0)]
            extra = len(s) + (len(sep) if parts else 0)
        parts.append(s)
        total += extra
    return title, sep.join(parts)


def _make_document(i: int, pools: _Pools, dim: int, n_chunks: int) -> tuple[str, str, str]:
    """Document i (deterministic in i): (doc_key, title, chunks JSON with embeddings)."""
    rng = random.Random(SEED * 1_000_003 + i)
    chinese = rng.random() < ZH_SHARE
    pool = pools.zh if chinese else pools.en
    vectors = np.round(_unit_vectors(np.random.default_rng([SEED, i]), n_chunks, dim), 6).tolist()
    chunks = []
    title = ""
    for j in range(n_chunks):
        t, content = _make_chunk(rng, pool, chinese)
        title = title or t
        chunks.append({"content": content, "embedding": vectors[j]})
    return f"bench-{i:07d}", title, json.dumps(chunks, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------------------------------
# Loading


@dataclass
class _Model:
    id: int
    name: str
    dimension: int


def _default_model(conn: psycopg.Connection) -> _Model:
    row = conn.execute("select id, name, dimension from kb.embedding_models where is_default").fetchone()
    if row is None:
        raise RuntimeError("no default embedding model registered (run `pgkb db migrate`)")
    return _Model(*row)


def _kb_state(conn: psycopg.Connection, kb_name: str, model: _Model) -> tuple[int | None, int, int]:
    """(kb id or None, chunks, embeddings of the model) of the knowledge base."""
    row = conn.execute("select id from kb.knowledge_bases where name = %s", [kb_name]).fetchone()
    if row is None:
        return None, 0, 0
    kb_id = row[0]
    n_chunks = conn.execute("select count(*) from kb.chunks where kb_id = %s", [kb_id]).fetchone()[0]
    n_emb = conn.execute(
        "select count(*) from kb.embeddings where kb_id = %s and model_id = %s", [kb_id, model.id]
    ).fetchone()[0]
    return kb_id, n_chunks, n_emb


def _load(
    url: str, conn: psycopg.Connection, kb_name: str, chunks: int, pools: _Pools, model: _Model
) -> tuple[int, str]:
    """Create the knowledge base and fill it with ceil(chunks / DOC_CHUNKS) documents through
    kb.replace_document (the real write path: tokenising, BM25 statistics, HNSW maintenance), from
    LOAD_THREADS connections. Returns (kb id, description of the load)."""
    sizes = [DOC_CHUNKS] * (chunks // DOC_CHUNKS) + ([chunks % DOC_CHUNKS] if chunks % DOC_CHUNKS else [])
    start = time.perf_counter()
    kb_id = conn.execute("select kb.create_knowledge_base(%s)", [kb_name]).fetchone()[0]
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(sizes)):
        todo.put(i)
    errors: list[BaseException] = []
    done = [0]
    lock = threading.Lock()

    def worker() -> None:
        try:
            with connect(url) as wconn:
                while not errors:
                    try:
                        i = todo.get_nowait()
                    except queue.Empty:
                        return
                    doc_key, title, chunks_json = _make_document(i, pools, model.dimension, sizes[i])
                    wconn.execute(
                        "select * from kb.replace_document(%s, %s, %s, %s::jsonb, model => %s)",
                        [kb_name, doc_key, title, chunks_json, model.name],
                    ).fetchall()
                    with lock:
                        done[0] += sizes[i]
                        n = done[0]
                    if n % 5000 < sizes[i] or n == chunks:
                        rate = n / (time.perf_counter() - start)
                        _log(f"loaded {n}/{chunks} chunks ({rate:.0f}/s, ~{(chunks - n) / rate:.0f} s left)")
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(LOAD_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    seconds = time.perf_counter() - start
    _log(f"loaded in {seconds:.1f} s")
    how = (
        f"loaded {chunks} chunks in {seconds:.0f} s ({chunks / seconds:.0f} chunks/s) through "
        f"`kb.replace_document` with embeddings from {LOAD_THREADS} connections ({DOC_CHUNKS} chunks per "
        "document; HNSW index and BM25 statistics maintained during the load)"
    )
    return kb_id, how


def _prepare_kb(
    conn: psycopg.Connection, url: str, kb_name: str, chunks: int, pools: _Pools, model: _Model
) -> tuple[int, str]:
    """Make the knowledge base hold exactly `chunks` bench chunks; returns (kb id, how)."""
    kb_id, n_chunks, n_emb = _kb_state(conn, kb_name, model)
    if kb_id is not None and n_chunks == chunks and n_emb == chunks:
        _log(f"reusing knowledge base {kb_name!r} ({chunks} chunks)")
        return kb_id, f"reused the existing knowledge base ({chunks} chunks)"
    if kb_id is not None:
        _log(f"dropping knowledge base {kb_name!r} ({n_chunks} chunks, {n_emb} embeddings)")
        t0 = time.perf_counter()
        conn.execute("delete from kb.knowledge_bases where id = %s", [kb_id])
        _log(f"dropped in {time.perf_counter() - t0:.1f} s")
    _log(f"loading {chunks} chunks into {kb_name!r}")
    kb_id, how = _load(url, conn, kb_name, chunks, pools, model)
    t0 = time.perf_counter()
    for table in ("kb.knowledge_bases", "kb.documents", "kb.chunks", "kb.embeddings", "kb.term_stats"):
        conn.execute(f"vacuum (analyze) {table}")
    vacuum = time.perf_counter() - t0
    _log(f"vacuum analyze {vacuum:.1f} s")
    _, n_chunks, n_emb = _kb_state(conn, kb_name, model)
    if n_chunks != chunks or n_emb != chunks:
        raise RuntimeError(f"load ended with {n_chunks} chunks / {n_emb} embeddings, expected {chunks}")
    return kb_id, how + f"; vacuum analyze {vacuum:.1f} s"


# --------------------------------------------------------------------------------------------------
# Timing


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


@dataclass
class BenchResult:
    """Everything the report shows."""

    kb_name: str
    chunks: int
    queries: int
    load: str
    machine: dict[str, str]
    settings: dict[str, str]
    sizes: dict[str, str]
    explain: str
    uses_hnsw: bool
    stats: dict[str, ModeStats]


def _sample_queries(pools: _Pools, n: int) -> list[str]:
    rng = random.Random(SEED + 1)
    return [rng.choice(pools.zh_queries) if rng.random() < ZH_SHARE else rng.choice(pools.en_queries) for _ in range(n)]


def _mode_sql(model: _Model, kb_id: int) -> dict[str, str]:
    dim = model.dimension
    plain = (
        f"select chunk_id from kb.embeddings where model_id = {model.id} and kb_id = {kb_id} "
        f"order by embedding::vector({dim}) <=> %(e)s::vector({dim}) limit {TOP_K}"
    )
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


def _time_modes(
    conn: psycopg.Connection, model: _Model, kb_id: int, kb_name: str, query_texts: list[str]
) -> dict[str, ModeStats]:
    sql = _mode_sql(model, kb_id)
    embeddings = _unit_vectors(np.random.default_rng([SEED, 2]), len(query_texts) + 20, model.dimension)
    set_ef = _ef_setter(conn)
    ef_of = {m: (40 if m == "vector_plain_ef40" else VECTOR_LEG_EF_SEARCH) for m in MODES}

    def call(mode: str, q: str, e: np.ndarray) -> tuple[float, int]:
        set_ef(ef_of[mode])
        t0 = time.perf_counter()
        rows = conn.execute(sql[mode], {"q": q, "kb": kb_name, "e": e}).fetchall()
        return (time.perf_counter() - t0) * 1000.0, len(rows)

    warm = min(20, max(5, len(query_texts) // 10))
    _log(f"warming up ({warm} queries x {len(MODES)} modes)")
    wrng = random.Random(SEED + 3)
    for k in range(warm):
        for mode in MODES:
            call(mode, wrng.choice(query_texts), embeddings[len(query_texts) + k % 20])

    stats = {m: ModeStats(m, sql[m], [], []) for m in MODES}
    order_rng = random.Random(SEED + 4)
    _log(f"timing {len(query_texts)} queries x {len(MODES)} modes")
    for i, q in enumerate(query_texts):
        order = list(MODES)
        order_rng.shuffle(order)
        for mode in order:
            ms, n = call(mode, q, embeddings[i])
            stats[mode].samples.append(ms)
            stats[mode].rows.append(n)
        if (i + 1) % 50 == 0:
            _log(f"timed {i + 1}/{len(query_texts)} queries")
    set_ef(VECTOR_LEG_EF_SEARCH)
    conn.execute("reset hnsw.ef_search")
    return stats


def _explain_plain(conn: psycopg.Connection, model: _Model, kb_id: int) -> tuple[str, bool]:
    """EXPLAIN (ANALYZE) of the plain vector query; whether it scans the model's HNSW index."""
    e = _unit_vectors(np.random.default_rng([SEED, 5]), 1, model.dimension)[0]
    conn.execute(f"set hnsw.ef_search = {VECTOR_LEG_EF_SEARCH}")
    plan = conn.execute(
        "explain (analyze, costs off, timing off, summary off) " + _mode_sql(model, kb_id)["vector_plain"],
        {"e": e},
    ).fetchall()
    conn.execute("reset hnsw.ef_search")
    text = re.sub(r"'\[[^\]]*\]'", "'[...]'", "\n".join(r[0] for r in plan))
    index = conn.execute("select kb.hnsw_index_name(%s)", [model.id]).fetchone()[0]
    return text, f"Index Scan using {index}" in text


# --------------------------------------------------------------------------------------------------
# Machine information and report


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


def _sizes(conn: psycopg.Connection, model: _Model) -> dict[str, str]:
    index = conn.execute("select kb.hnsw_index_name(%s)", [model.id]).fetchone()[0]
    rels = {
        "kb.chunks (heap + TOAST)": "pg_table_size('kb.chunks')",
        "kb.embeddings (heap + TOAST)": "pg_table_size('kb.embeddings')",
        f"HNSW index {index}": f"pg_relation_size('kb.{index}')",
        "GIN term index chunks_terms_idx": "pg_relation_size('kb.chunks_terms_idx')",
        "GIN trigram index chunks_trgm_idx": "pg_relation_size('kb.chunks_trgm_idx')",
        "kb.term_stats (table + indexes)": "pg_total_relation_size('kb.term_stats')",
    }
    out = {}
    for label, expr in rels.items():
        out[label] = conn.execute(f"select pg_size_pretty({expr})").fetchone()[0]
    return out


def _fmt(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _report(r: BenchResult) -> str:
    s = r.stats
    lines = [
        f"## Search latency, {r.chunks} chunks, {r.queries} queries "
        f"({dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')})",
        "",
        f"Knowledge base `{r.kb_name}`: {r.load}.",
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
    hybrid95, plain95 = s["hybrid"].pct(95), s["vector_plain"].pct(95)
    ratio = hybrid95 / plain95
    lines += [
        "",
        f"- hybrid p95 / vector_plain p95 = **{ratio:.2f}** (goal <= 1.5: "
        f"{'met' if ratio <= 1.5 else 'NOT met'}); "
        f"vs vector_plain_ef40: {hybrid95 / s['vector_plain_ef40'].pct(95):.2f}",
        f"- lexical p95 / vector p95 = {s['lexical'].pct(95) / s['vector'].pct(95):.2f}; "
        f"fuzzy p95 / vector p95 = {s['fuzzy'].pct(95) / s['vector'].pct(95):.2f}; "
        f"vector (kb.vector_search) p95 / vector_plain p95 = {s['vector'].pct(95) / plain95:.2f}",
        f"- plain vector query uses the HNSW index: **{'yes' if r.uses_hnsw else 'NO'}**",
        "",
        "<details><summary>SQL per mode, plan of the plain vector query</summary>",
        "",
        "```sql",
    ]
    for mode in MODES:
        ef = 40 if mode == "vector_plain_ef40" else VECTOR_LEG_EF_SEARCH
        suffix = f"  -- hnsw.ef_search = {ef}" if mode.startswith("vector_plain") else ""
        lines.append(f"-- {mode}{suffix}\n{s[mode].sql};")
    lines += ["```", "", "```", r.explain, "```", "", "</details>", "", "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.machine.items()]
    lines += ["", "| setting | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.settings.items()]
    lines += ["", "| relation | size |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.sizes.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Entry point


def run_search_bench(chunks: int, queries: int, datasets: str, out: str | None, kb_name: str) -> BenchResult:
    """Load (or reuse) a synthetic knowledge base and time hybrid search against its parts.

    Args:
        chunks: number of synthetic chunks the knowledge base must hold (it is dropped and reloaded when
            it holds a different number; reused as is when it holds exactly this many).
        queries: number of query strings timed per mode (sampled, seeded, from the shared sets).
        datasets: folder with the shared BEIR-layout sets (cmrc2018-trial, drcd-dev-zh_hans,
            covid-faq-en, cisi).
        out: if given, the Markdown report is appended to this file.
        kb_name: knowledge base to (re)load; it is deleted outright when its size differs, so do not
            point this at a knowledge base you care about.

    Returns:
        The measurements (the report is printed to stdout).
    """
    if chunks < 1 or queries < 1:
        raise ValueError("chunks and queries must be >= 1")
    pools = _load_pools(Path(datasets))
    _log(
        f"{len(pools.zh)} zh / {len(pools.en)} en sentences, "
        f"{len(pools.zh_queries)} zh / {len(pools.en_queries)} en queries"
    )
    url = database_url()
    with connect(url) as conn:
        model = _default_model(conn)
        kb_id, how = _prepare_kb(conn, url, kb_name, chunks, pools, model)
        explain, uses_hnsw = _explain_plain(conn, model, kb_id)
        _log("plain vector query plan:\n" + explain)
        if not uses_hnsw:
            _log("WARNING: the plain vector query does not use the HNSW index")
        stats = _time_modes(conn, model, kb_id, kb_name, _sample_queries(pools, queries))
        result = BenchResult(
            kb_name=kb_name,
            chunks=chunks,
            queries=queries,
            load=how,
            machine=_machine(conn),
            settings=_settings(conn),
            sizes=_sizes(conn, model),
            explain=explain,
            uses_hnsw=uses_hnsw,
            stats=stats,
        )
    report = _report(result)
    print(report)
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write("\n" + report)
    return result
