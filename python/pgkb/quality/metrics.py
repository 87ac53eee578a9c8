"""Retrieval metrics of `pgkb eval` and `pgkb sweep`, computed on **documents**: a search returns chunks; they
are mapped to their documents and deduplicated in rank order (:func:`dedupe`) before scoring.

* ``recall@k``: BEIR -- the share of the query's relevant documents found in the top k (the BEIR/trec_eval
  definition; with several relevant documents recall@1 is at most 1/n). doc-questions -- the relevant files
  are alternatives ("a hit is any chunk of a relevant file"), so recall@k is 1 when any of them is in the
  top k (hit rate).
* ``mrr@10``: reciprocal rank of the first relevant document within the top 10, else 0.
* ``ndcg@10``: linear gain (the grade) / log2(rank + 1), normalised by the ideal ordering of the judged
  grades (trec_eval's ndcg_cut_10). doc-questions: only the first relevant file found earns gain, the ideal
  being one relevant file at rank 1.
* ``p50_ms`` / ``p95_ms``: per-query latency percentiles (linear interpolation).
* ``by_kind``: recall@5 and the number of queries per ``kind`` (when the queries carry one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgkb.quality.datasets import Query

__all__ = ["ModeResult", "dedupe", "mrr_at", "ndcg_at", "percentile", "recall_at", "score_mode"]


def dedupe(keys: Iterable[str]) -> list[str]:
    """Keys in first-seen order without repeats (chunks -> their documents, best rank kept)."""
    seen: set[str] = set()
    out = []
    for key in keys:
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def _positive(relevant: Mapping[str, float]) -> dict[str, float]:
    return {doc: float(g) for doc, g in relevant.items() if g > 0}


def recall_at(ranked: Sequence[str], relevant: Mapping[str, float], k: int, *, any_relevant: bool = False) -> float:
    """Share of the relevant documents in ``ranked[:k]`` (``any_relevant``: 1.0 if any of them is there)."""
    rel = _positive(relevant)
    if not rel:
        return 0.0
    found = sum(1 for doc in ranked[:k] if doc in rel)
    if any_relevant:
        return 1.0 if found else 0.0
    return found / len(rel)


def mrr_at(ranked: Sequence[str], relevant: Mapping[str, float], k: int = 10) -> float:
    """1 / rank of the first relevant document within the top k, else 0."""
    rel = _positive(relevant)
    for i, doc in enumerate(ranked[:k], 1):
        if doc in rel:
            return 1.0 / i
    return 0.0


def ndcg_at(ranked: Sequence[str], relevant: Mapping[str, float], k: int = 10, *, any_relevant: bool = False) -> float:
    """nDCG@k with linear gains (trec_eval ndcg_cut). ``any_relevant``: only the first relevant document
    earns gain and the ideal is the best-graded one at rank 1."""
    rel = _positive(relevant)
    if not rel:
        return 0.0
    if any_relevant:
        for i, doc in enumerate(ranked[:k], 1):
            if doc in rel:
                return rel[doc] / math.log2(i + 1) / max(rel.values())
        return 0.0
    dcg = sum(rel.get(doc, 0.0) / math.log2(i + 1) for i, doc in enumerate(ranked[:k], 1))
    ideal = sum(g / math.log2(i + 1) for i, g in enumerate(sorted(rel.values(), reverse=True)[:k], 1))
    return dcg / ideal


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) with linear interpolation between closest ranks; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class ModeResult:
    ranked: list[list[str]] = field(default_factory=list)  # documents per query, in query order
    latencies_ms: list[float] = field(default_factory=list)


def score_mode(queries: Sequence[Query], result: ModeResult, any_relevant: bool) -> dict[str, Any]:
    """The metrics of one mode (the ``modes.<mode>`` object of the JSON report)."""
    if len(result.ranked) != len(queries):
        raise ValueError(f"{len(result.ranked)} rankings for {len(queries)} queries")
    ranked = dict(zip(map(id, queries), result.ranked, strict=True))

    def mean(values: Iterable[float]) -> float:
        values = list(values)
        return round(sum(values) / len(values), 4) if values else 0.0

    def rec(q: Query, k: int) -> float:
        return recall_at(ranked[id(q)], q.relevant, k, any_relevant=any_relevant)

    out: dict[str, Any] = {f"recall@{k}": mean(rec(q, k) for q in queries) for k in (1, 5, 10)}
    out["mrr@10"] = mean(mrr_at(ranked[id(q)], q.relevant, 10) for q in queries)
    out["ndcg@10"] = mean(ndcg_at(ranked[id(q)], q.relevant, 10, any_relevant=any_relevant) for q in queries)
    out["p50_ms"] = round(percentile(result.latencies_ms, 50), 2)
    out["p95_ms"] = round(percentile(result.latencies_ms, 95), 2)
    kinds: dict[str, list[Query]] = {}
    for q in queries:
        if q.kind is not None:
            kinds.setdefault(q.kind, []).append(q)
    out["by_kind"] = {k: {"recall@5": mean(rec(q, 5) for q in qs), "n": len(qs)} for k, qs in sorted(kinds.items())}
    return out
