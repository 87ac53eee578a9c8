"""Latency per search mode on one connection (``pgkb bench`` part 1): the SQL of each mode, the query
parameters, the timed loop (every query once in every mode, in a per-query shuffled order so drift
affects the modes alike) and the plan of the plain pgvector query.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psycopg

from pgkb.bench.data import SEED, Model, VectorSource, log, query_vectors
from pgkb.bench.recall import plain_vector_sql
from pgkb.rows import one

__all__ = [
    "MODES",
    "TOP_K",
    "shipped_ef_search",
    "ModeStats",
    "explain_plain",
    "mode_sql",
    "query_params",
    "time_modes",
]

TOP_K = 10
MODES = (
    "hybrid", "hybrid_untranslated", "hybrid_logged", "vector_plain", "vector_plain_ef40", "vector", "lexical", "fuzzy"
)  # fmt: skip
# hybrid_untranslated: hybrid with the lexicon and the glossaries off (issue 31's cost is hybrid's p95 over it),
# set inside the timed query's own transaction and rolled back, so every other mode runs with the defaults
UNTRANSLATED = "update kb.settings set value = '0' where key in ('lexicon_weight', 'glossary_weight')"
# hybrid_logged: hybrid with the knowledge base's question log on (issue 34's cost is its p95 over hybrid's):
# the log is on for the timing loop, and every other mode runs with pgkb.question_log 'off' (nothing logged);
# the logged query commits on its own (autocommit), so its time holds the log's insert and the commit
LOG_ON, LOG_OFF = "set pgkb.question_log = 'on'", "set pgkb.question_log = 'off'"


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


def mode_sql(model: Model, kb_id: int) -> dict[str, str]:
    plain = plain_vector_sql(model, kb_id)
    hybrid = (
        f"select * from kb.hybrid_search(%(q)s::text, {TOP_K}, kb => %(kb)s::text, query_embedding => %(e)s::vector)"
    )
    return {
        "hybrid": hybrid,
        "hybrid_untranslated": hybrid,
        "hybrid_logged": hybrid,
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


def query_params(kb_name: str, query_texts: list[str], dim: int, source: VectorSource) -> list[dict]:
    """Per query: text, knowledge base and its query embedding (its own random one, or its real one)."""
    embeddings = source.query_vectors(query_texts, 2, dim)
    return [{"q": q, "kb": kb_name, "e": e} for q, e in zip(query_texts, embeddings, strict=True)]


def shipped_ef_search(conn: psycopg.Connection) -> int:
    """kb.settings.hnsw_ef_search: what kb_internal.vector_leg uses, and so what the plain baseline runs at."""
    return int(one(conn.execute("select kb_internal.setting_int('hnsw_ef_search')"))[0])


def time_modes(
    conn: psycopg.Connection, sql: dict[str, str], params: list[dict], ef_search: int
) -> dict[str, ModeStats]:
    """Every query once in every mode; vector_plain at ef_search (the setting kb_internal.vector_leg reads).
    The knowledge base's question log is on for hybrid_logged alone, and what it logged is purged after."""
    kb = params[0]["kb"]
    days = one(conn.execute("select kb.question_log_days(%s)", [kb]))[0]
    conn.execute("select kb.set_question_log(%s, 1)", [kb])
    conn.execute(LOG_OFF)
    try:
        return _time_modes(conn, sql, params, ef_search)
    finally:
        conn.execute("reset pgkb.question_log")
        conn.execute("select kb.set_question_log(%s, %s)", [kb, days])
        conn.execute("select kb.purge_question_log(%s)", [kb])


def _time_modes(
    conn: psycopg.Connection, sql: dict[str, str], params: list[dict], ef_search: int
) -> dict[str, ModeStats]:
    set_ef = _ef_setter(conn)
    ef_of = {m: (40 if m == "vector_plain_ef40" else ef_search) for m in MODES}

    def call(mode: str, p: dict) -> tuple[float, int]:
        set_ef(ef_of[mode])
        if mode == "hybrid_logged":
            conn.execute(LOG_ON)
            t0 = time.perf_counter()
            rows = conn.execute(sql[mode], p).fetchall()
            ms = (time.perf_counter() - t0) * 1000.0
            conn.execute(LOG_OFF)
            return ms, len(rows)
        if mode == "hybrid_untranslated":
            with conn.transaction(force_rollback=True):
                conn.execute(UNTRANSLATED)
                t0 = time.perf_counter()
                rows = conn.execute(sql[mode], p).fetchall()
                ms = (time.perf_counter() - t0) * 1000.0
            return ms, len(rows)
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


def explain_plain(conn: psycopg.Connection, model: Model, kb_id: int, ef_search: int) -> tuple[str, bool]:
    """EXPLAIN (ANALYZE) of the plain vector query; whether it scans the knowledge base's HNSW index of the model."""
    e = query_vectors(5, 1, model.dimension)[0]
    conn.execute(f"set hnsw.ef_search = {int(ef_search)}")
    plan = conn.execute(
        "explain (analyze, costs off, timing off, summary off) " + plain_vector_sql(model, kb_id), {"e": e}
    ).fetchall()
    conn.execute("reset hnsw.ef_search")
    text = re.sub(r"'\[[^\]]*\]'", "'[...]'", "\n".join(r[0] for r in plan))
    index = one(conn.execute("select kb.hnsw_index_name(%s, %s)", [model.id, kb_id]))[0]
    return text, f"Index Scan using {index}" in text
