"""The search benchmark's result, its goals and its Markdown report."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np

from pgkb.bench.breakdown import PARTS, Breakdown
from pgkb.bench.concurrency import ConcurrencyRow
from pgkb.bench.latency import MODES, ModeStats
from pgkb.bench.load import LoadReport
from pgkb.bench.mcp import McpResult
from pgkb.bench.question_sets import QuestionSetStats
from pgkb.bench.recall import RecallResult

__all__ = ["GOALS", "LARGE", "BenchResult", "Goal", "check_goals", "render_report"]

LARGE = 1_000_000  # from this many chunks the 1M goals apply
GOALS = {
    "hybrid_ratio": 2.0,  # hybrid p95 / vector_plain p95, below LARGE chunks (issue 33)
    "hybrid_ratio_large": 2.2,  # the same from LARGE chunks
    "vector_search_ratio": 1.15,  # kb.vector_search p95 / vector_plain p95 (issue 33)
    "lexical_storage_ratio": 2.5,  # every lexical structure / the chunk text, in bytes (issue 33)
    "recall": 0.95,  # HNSW recall@10 (plain query at kb.settings.hnsw_ef_search, and kb.vector_search)
    "mcp_overhead_ms": 10.0,  # p95 of client time - embed - search of search_knowledge
    "mcp_sql_ratio": 1.25,  # the MCP server's SQL p50 / the same search from psql (hybrid mode) p50
    "worst_question_ratio": 3.0,  # slowest question of a shared set (lexical leg) / vector leg p95
    "translation_ratio": 1.1,  # hybrid p95 / hybrid p95 without the lexicon and glossaries (issue 31)
    "question_log_ratio": 1.05,  # hybrid p95 with the question log on / hybrid p95 (issue 34)
    "fusion_ms": 1.0,  # p95 of kb_internal.search's fusion and materialisation (pgkb.bench.breakdown; issue 33)
}


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
    ef_search: int  # kb.settings.hnsw_ef_search: kb_internal.vector_leg's and the plain baseline's
    load: LoadReport
    machine: dict[str, str]
    settings: dict[str, str]
    sizes: dict[str, tuple[str, str]]
    explain: str
    uses_hnsw: bool
    stats: dict[str, ModeStats]
    question_sets: list[QuestionSetStats]
    recall: RecallResult
    concurrency: list[ConcurrencyRow]
    mcp: McpResult | None
    # bytes of every lexical structure (machine.lexical_storage) and of the chunk text
    lexical_bytes: tuple[int, int] | None = None
    breakdown: Breakdown | None = None  # None: not measured (no superuser)
    goals: list[Goal] = field(default_factory=list)


def check_goals(r: BenchResult) -> list[Goal]:
    s = r.stats
    large = r.chunks >= LARGE
    limit = GOALS["hybrid_ratio_large" if large else "hybrid_ratio"]

    def p95_ratio(mode: str, base: str, goal: float, what: str) -> Goal:
        """Goal ``what`` (its {goal} filled in): mode's p95 at most goal x base's p95, both of this run."""
        top, bottom = s[mode].pct(95), s[base].pct(95)
        measured = f"{_fmt(top)} / {_fmt(bottom)} ms = {top / bottom:.2f}"
        return Goal(what.format(goal=f"{goal:g}"), measured, top <= goal * bottom)

    goals = [
        p95_ratio("hybrid", "vector_plain", limit, "hybrid p95 <= {goal} x vector-only (plain) p95"),
        p95_ratio("vector", "vector_plain", GOALS["vector_search_ratio"], "kb.vector_search p95 <= {goal} x plain p95"),
        p95_ratio(
            "hybrid", "hybrid_untranslated", GOALS["translation_ratio"],
            "hybrid p95 <= {goal} x hybrid without translations p95",
        ),
        p95_ratio(
            "hybrid_logged", "hybrid", GOALS["question_log_ratio"],
            "hybrid p95 with the question log on <= {goal} x hybrid p95",
        ),
    ]  # fmt: skip
    if r.breakdown is not None:
        fusion = r.breakdown.pct("fusion and materialisation", 95)
        goals.append(
            Goal(
                f"fusion and materialisation p95 <= {GOALS['fusion_ms']:g} ms (from the breakdown)",
                f"{_fmt(fusion)} ms",
                fusion <= GOALS["fusion_ms"],
            )
        )
    if r.lexical_bytes is not None:
        lexical, text = r.lexical_bytes
        goals.append(
            Goal(
                f"all lexical structures <= {GOALS['lexical_storage_ratio']:g} x chunk text",
                f"{lexical / 2**20:.0f} / {text / 2**20:.0f} MB = {lexical / max(text, 1):.2f}",
                lexical <= GOALS["lexical_storage_ratio"] * text,
            )
        )
    if large:
        lex, vec = s["lexical"].pct(95), s["vector"].pct(95)
        goals.append(
            Goal("lexical leg p95 <= vector leg p95", f"{_fmt(lex)} vs {_fmt(vec)} ms ({lex / vec:.2f})", lex <= vec)
        )
    for label in (f"vector_plain (ef_search {r.ef_search})", "vector_search"):
        value = r.recall.recall[label]
        kind = "anchored vectors" if r.vectors == "anchored" else "uniform random vectors, the worst case"
        goals.append(
            Goal(f"HNSW recall@10 >= {GOALS['recall']:g}, {label} ({kind})", f"{value:.3f}", value >= GOALS["recall"])
        )
    vec95 = s["vector"].pct(95)
    for q in r.question_sets:
        limit = GOALS["worst_question_ratio"]
        goals.append(
            Goal(
                f"slowest {q.name} question (lexical leg) <= {limit:g} x vector leg p95",
                f"{_fmt(q.worst)} / {_fmt(vec95)} ms = {q.worst / vec95:.2f}",
                q.worst <= limit * vec95,
            )
        )
    if r.mcp is not None:
        sql50, psql50 = r.mcp.pct(r.mcp.search_ms, 50), s["hybrid"].pct(50)
        goals.append(
            Goal(
                f"MCP SQL p50 <= {GOALS['mcp_sql_ratio']:g} x psql hybrid p50 (same queries, top_k 5 vs 10)",
                f"{_fmt(sql50)} / {_fmt(psql50)} ms = {sql50 / psql50:.2f}",
                sql50 <= GOALS["mcp_sql_ratio"] * psql50,
            )
        )
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


def _breakdown_lines(b: Breakdown, plain95: float) -> list[str]:
    lines = [
        f"### Where hybrid's time goes ({len(b.wall)} searches, function timers; pgkb.bench.breakdown)",
        "",
        "| part | p50 ms | p95 ms | mean ms |",
        "|---|---:|---:|---:|",
    ]
    rows = [(p, b.parts[p]) for p in PARTS] + [("the legs one after another (the floor)", b.floor)]
    rows.append(("the call, with the timers on", b.wall))
    lines += [
        f"| {label} | {_fmt(float(np.percentile(v, 50)))} | {_fmt(float(np.percentile(v, 95)))} "
        f"| {_fmt(float(np.mean(v)))} |"
        for label, v in rows
    ]
    floor95 = float(np.percentile(b.floor, 95))
    lines += ["", f"- the floor's p95 / vector_plain p95 = {floor95 / plain95:.2f}", ""]
    return lines


def render_report(r: BenchResult) -> str:
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
        stats = s[mode]
        lines.append(
            f"| {mode} | {_fmt(stats.pct(50))} | {_fmt(stats.pct(95))} | {_fmt(stats.pct(99))} | {_fmt(stats.mean)} "
            f"| {np.mean(stats.rows):.1f} |"
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
    ]
    if r.breakdown is not None:
        lines += _breakdown_lines(r.breakdown, s["vector_plain"].pct(95))
    if r.question_sets:
        lines += [
            "### Shared question sets through `kb.lexical_search` (top 10, one connection)",
            "",
            "| set | questions timed / in set | p50 ms | p95 ms | max ms | slowest question |",
            "|---|---:|---:|---:|---:|---|",
        ]
        lines += [
            f"| {q.name} | {len(q.samples)} / {q.questions} | {_fmt(q.pct(50))} | {_fmt(q.pct(95))} "
            f"| {_fmt(q.worst)} | {q.worst_query[:120].replace('|', '/')} |"
            for q in r.question_sets
        ]
        lines.append("")
    lines += [
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
        ef = 40 if mode == "vector_plain_ef40" else r.ef_search
        suffix = f"  -- hnsw.ef_search = {ef}" if mode.startswith("vector_plain") else ""
        lines.append(f"-- {mode}{suffix}\n{s[mode].sql};")
    lines += ["```", "", "```", r.explain, "```", "", "</details>", "", "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.machine.items()]
    lines += ["", "| setting | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.settings.items()]
    return "\n".join(lines) + "\n"
