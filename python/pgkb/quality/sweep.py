"""`pgkb sweep`: compare search settings on evaluation knowledge bases that `pgkb eval` has loaded.

Every dataset's queries are embedded once; then every combination of the ``--grid`` values (a Cartesian
product of :class:`pgkb.quality.evaluate.SearchSettings` fields) runs the chosen modes on every query through the
same SQL calls as `pgkb eval`. The reference is the best single leg (vector or lexical, default settings)
per dataset; each row reports nDCG@10 per dataset and its worst difference to that reference, the figure
the defaults are chosen by (robust across sets, not best on one). Output: Markdown on stdout, ``--out``
JSON with every number.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from pgkb.limits import api_limit
from pgkb.quality.datasets import Dataset, EvalError, default_kb, load_beir, load_questions, sample
from pgkb.quality.evaluate import configured_embedder
from pgkb.quality.metrics import ModeResult, score_mode
from pgkb.quality.searching import FUSIONS, SETTING_TYPES, SearchSettings, embed_queries, search_mode, unlogged

SWEEPABLE = tuple(SETTING_TYPES)
SWEEP_MODES = ("hybrid", "lexical", "vector", "fuzzy")


def parse_grid(items: list[str]) -> list[tuple[dict[str, Any], SearchSettings]]:
    """``["lexical_weight=0.5,1", "fusion=dbsf,rrf"]`` -> every combination as (varied values, settings).

    Raises EvalError for an unknown key, a value of the wrong type or a key given twice; values kb_internal.search
    refuses are its error at the first query."""
    defaults = SearchSettings()
    axes: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SWEEPABLE:
            raise EvalError(f"--grid {item!r}: expected KEY=V1,V2,... with KEY one of {', '.join(SWEEPABLE)}")
        if key in axes:
            raise EvalError(f"--grid {key} is given twice")
        kind = SETTING_TYPES[key]
        try:
            values = [kind(v.strip()) for v in raw.split(",") if v.strip()]
        except ValueError as e:
            raise EvalError(f"--grid {item!r}: {e}") from None
        if not values:
            raise EvalError(f"--grid {item!r} has no values")
        if key == "fusion" and set(values) - set(FUSIONS):
            raise EvalError(f"--grid fusion: choose from {', '.join(FUSIONS)}")
        axes[key] = values
    combos = []
    for combo in itertools.product(*axes.values()):
        varied = dict(zip(axes, combo, strict=True))
        settings = dataclasses.replace(defaults, **varied)
        settings.validate()
        combos.append((varied, settings))
    return combos


def _label(varied: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in varied.items()) or "defaults"


def _ndcg(conn, dataset: Dataset, embeddings, kb, spec, mode: str, settings: SearchSettings) -> dict[str, float]:
    result = ModeResult()
    for q, emb in zip(dataset.queries, embeddings, strict=True):
        ranked, ms = search_mode(conn, mode, q.text, emb, kb, spec, settings)
        result.ranked.append(ranked)
        result.latencies_ms.append(ms)
    m = score_mode(dataset.queries, result, dataset.any_relevant)
    return {"ndcg@10": m["ndcg@10"], "recall@5": m["recall@5"], "p95_ms": m["p95_ms"]}


def sweep(conn, datasets: list[Dataset], spec, embedder, combos, modes, batch: int = 16) -> dict[str, Any]:
    """Run every combination on every dataset; returns the JSON report."""
    report: dict[str, Any] = {"model": spec.name, "datasets": {}, "rows": []}
    prepared = []
    for ds in datasets:
        kb = default_kb(ds.name)
        chunks = conn.execute(
            "select coalesce(max(chunk_count), 0) from kb.knowledge_bases where name = %s", [kb]
        ).fetchone()[0]
        if not chunks:
            raise EvalError(f"knowledge base {kb} is missing or empty: load it first with `pgkb eval` on {ds.name}")
        embeddings = embed_queries(conn, spec, embedder, [q.text for q in ds.queries], batch, kb=kb)
        legs = {leg: _ndcg(conn, ds, embeddings, kb, spec, leg, SearchSettings()) for leg in ("vector", "lexical")}
        best = max(legs, key=lambda leg: legs[leg]["ndcg@10"])
        report["datasets"][ds.name] = {
            "kb": kb, "n_queries": len(ds.queries), "legs": legs, "best_leg": best,
            "best_ndcg@10": legs[best]["ndcg@10"],
        }  # fmt: skip
        prepared.append((ds, kb, embeddings))
        print(f"pgkb: sweep: {ds.name}: {len(ds.queries)} queries, best leg {best}", file=sys.stderr, flush=True)
    for n, (varied, settings) in enumerate(combos, 1):
        row: dict[str, Any] = {"settings": varied, "modes": {}}
        for mode in modes:
            per_set = {ds.name: _ndcg(conn, ds, embs, kb, spec, mode, settings) for ds, kb, embs in prepared}
            deltas = [per_set[d]["ndcg@10"] - report["datasets"][d]["best_ndcg@10"] for d in per_set]
            row["modes"][mode] = {"datasets": per_set, "worst_delta": round(min(deltas), 4)}
        report["rows"].append(row)
        print(f"pgkb: sweep: {n}/{len(combos)} {_label(varied)}", file=sys.stderr, flush=True)
    return report


def markdown(report: dict[str, Any]) -> str:
    """One table per mode: a row per setting, nDCG@10 per dataset, worst difference to the best leg."""
    names = list(report["datasets"])
    refs = "; ".join(f"{d} {v['best_leg']} {v['best_ndcg@10']:.3f}" for d, v in report["datasets"].items())
    out = [f"Model {report['model']}. Reference (best single leg, default settings, nDCG@10): {refs}"]
    modes = list(report["rows"][0]["modes"]) if report["rows"] else []
    for mode in modes:
        out += ["", f"**{mode}** (nDCG@10; last column: worst difference to the best leg, in points)", ""]
        out.append("| settings | " + " | ".join(names) + " | worst Δ |")
        out.append("|---|" + "---:|" * (len(names) + 1))
        ranked = sorted(report["rows"], key=lambda r: -r["modes"][mode]["worst_delta"])
        for row in ranked:
            m = row["modes"][mode]
            cells = [f"{m['datasets'][d]['ndcg@10']:.3f}" for d in names]
            out.append(f"| {_label(row['settings'])} | " + " | ".join(cells) + f" | {m['worst_delta'] * 100:+.1f} |")
    return "\n".join(out)


def run(args, settings, *, embedder=None) -> int:
    """`pgkb sweep`. Exit 2 on bad arguments or a dataset whose knowledge base is not loaded."""
    from pgkb.db import connect, database_url

    def fail(message: str) -> int:
        print(f"pgkb: sweep: {message}", file=sys.stderr)
        return 2

    try:
        if args.max_queries is not None and args.max_queries < 1:
            raise EvalError("--max-queries must be at least 1")
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes or set(modes) - set(SWEEP_MODES):
            raise EvalError(f"--modes: choose from {', '.join(SWEEP_MODES)}")
        combos = parse_grid(args.grid)
        datasets = [load_beir(Path(d)) for d in args.beir]
        datasets += [load_questions(Path(docs), Path(q)) for docs, q in args.questions]
        if not datasets:
            raise EvalError("nothing to sweep: give --beir DIR and/or --questions DOCS FILE")
    except (EvalError, ValueError) as e:
        return fail(str(e))
    for ds in datasets:
        ds.queries = sample(ds.queries, args.max_queries, args.seed)
    with connect(database_url(settings)) as conn:
        unlogged(conn)
        try:
            for _, combo in combos:
                combo.validate(api_limit(conn, "top_k"))
            spec, embedder = configured_embedder(conn, settings, embedder)
            report = sweep(conn, datasets, spec, embedder, combos, modes, settings.embed_batch)
        except EvalError as e:
            return fail(str(e))
    print(markdown(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return 0
