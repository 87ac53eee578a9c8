"""Where a hybrid search's time goes (``pgkb bench`` part 1b): every query of the latency loop once more
through ``kb.hybrid_search``, each in its own rolled-back transaction with ``track_functions = 'all'``, and
PostgreSQL's per-function timers of that call (``pg_stat_xact_user_functions``, read before and after it)
split into parts, per query:

* ``vector leg`` -- ``kb_internal.vector_leg`` (the HNSW scan of the candidates);
* ``BM25 legs`` -- ``kb_internal.lexical_hits`` (the query's terms, their translations, the lexical and the
  fuzzy leg's scoring);
* ``fuzzy corrections`` -- ``kb_internal.fuzzy_expansions`` (the vocabulary lookups of the fuzzy leg);
* ``fusion and materialisation`` -- ``kb_internal.search``'s own time and the helpers it calls around the
  legs (``text_scripts`` of the phrasings, before them, for the cross-script rule; for the final rows
  ``heading_trail``, ``openable_source``; ``document_uri`` is inlined, so its time is the search's own): input
  checks, fusion, de-duplication, reading the top_k's content;
* ``the rest`` -- the call's wall time less the parts above (the entry point's settings, knowledge-base
  resolution and question-log check, the other helpers, the protocol).

The timers cost a little on every function call, so the wall time here is above the latency loop's; the
parts are what to read. Setting ``track_functions`` needs a superuser: without one the breakdown is skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import psycopg

from pgkb.bench.data import log
from pgkb.rows import one

__all__ = ["PARTS", "Breakdown", "hybrid_breakdown"]

# part -> the functions whose total time it is (kb_internal.search is counted by its self time)
LEGS = {
    "vector leg": ("kb_internal.vector_leg",),
    "BM25 legs": ("kb_internal.lexical_hits",),
    "fuzzy corrections": ("kb_internal.fuzzy_expansions",),
}
FUSION_HELPERS = (
    "kb_internal.text_scripts", "kb_internal.heading_trail", "kb_internal.openable_source", "kb.document_uri"
)  # fmt: skip
SEARCH = "kb_internal.search"
PARTS = (*LEGS, "fusion and materialisation", "the rest")
_STATS = (
    "select f.schemaname || '.' || f.funcname, f.calls, f.total_time, f.self_time from pg_stat_xact_user_functions as f"
    " where f.schemaname in ('kb', 'kb_internal')"
)


@dataclass
class Breakdown:
    """Per query: the wall time of the call and its parts, in milliseconds."""

    wall: list[float]
    parts: dict[str, list[float]]

    def pct(self, part: str, p: float) -> float:
        return float(np.percentile(self.parts[part], p))

    @property
    def floor(self) -> list[float]:
        """Per query: the legs one after another (vector + BM25 + fuzzy corrections), what no fusion can undercut."""
        return [sum(x) for x in zip(*(self.parts[p] for p in LEGS), strict=True)]


def _timers(conn: psycopg.Connection) -> dict[str, tuple[int, float, float]]:
    return {name: (calls, total, own) for name, calls, total, own in conn.execute(_STATS).fetchall()}


def hybrid_breakdown(conn: psycopg.Connection, sql: str, params: list[dict]) -> Breakdown | None:
    """Every query of params once through sql (kb.hybrid_search), its function timers split into PARTS;
    None when this role may not set track_functions (not a superuser)."""
    if not one(conn.execute("select rolsuper from pg_roles where rolname = current_user"))[0]:
        log("breakdown skipped: setting track_functions needs a superuser")
        return None
    log(f"breaking down {len(params)} hybrid searches (track_functions = 'all')")
    wall: list[float] = []
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    for p in params:
        with conn.transaction(force_rollback=True):
            conn.execute("set local track_functions = 'all'")
            conn.execute("set local pgkb.question_log = 'off'")  # as in the latency loop: nothing logged
            # the session's timers are pending until it reports them: this call's are the difference
            before = _timers(conn)
            t0 = time.perf_counter()
            conn.execute(sql, p).fetchall()
            ms = (time.perf_counter() - t0) * 1000.0
            after = _timers(conn)
        spent = {n: after[n][1] - before.get(n, (0, 0.0, 0.0))[1] for n in after}
        own = after.get(SEARCH, (0, 0.0, 0.0))[2] - before.get(SEARCH, (0, 0.0, 0.0))[2]
        wall.append(ms)
        for part, names in LEGS.items():
            parts[part].append(sum(spent.get(n, 0.0) for n in names))
        parts["fusion and materialisation"].append(own + sum(spent.get(n, 0.0) for n in FUSION_HELPERS))
        parts["the rest"].append(ms - sum(parts[q][-1] for q in PARTS[:-1]))
    return Breakdown(wall, parts)
