"""The real question sets against the bench knowledge base (``pgkb bench`` part 2): every shared set's
questions (the four BEIR sets' queries and the Vue developer questions; a seeded sample of at most
``per_set`` each) through ``kb.lexical_search`` one after another on one connection, so the BM25 leg's
tail shows -- long, question-style queries with many common terms, unlike the bench's own short query mix.
The worst query of each set is reported with its text; the goal compares it with the vector leg's p95.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg

from pgkb.bench.data import EN_SETS, SEED, ZH_SETS, log
from pgkb.bench.latency import TOP_K

__all__ = ["BEIR_SETS", "QuestionSetStats", "load_question_sets", "time_question_sets"]

BEIR_SETS = ZH_SETS + EN_SETS  # the sets the sentence pools come from
VUE_SET = "vue-docs-zh-cn"  # questions.jsonl: {"query": ...}
WARMUP = 5


@dataclass
class QuestionSetStats:
    """Milliseconds per question of one set, and its slowest question."""

    name: str
    questions: int  # in the set
    samples: list[float]
    worst_query: str

    def pct(self, q: float) -> float:
        return float(np.percentile(self.samples, q))

    @property
    def worst(self) -> float:
        return max(self.samples)


def _texts(path: Path, field: str) -> list[str]:
    with path.open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [t for t in (str(r.get(field) or "").strip() for r in rows) if t]


def load_question_sets(datasets: Path) -> dict[str, list[str]]:
    """{set name: its question texts} for the shared sets present under datasets (the BEIR sets are
    required, as for the bench's sentence pools; the Vue questions are used when present)."""
    sets = {name: _texts(datasets / name / "queries.jsonl", "text") for name in BEIR_SETS}
    vue = datasets / VUE_SET / "questions.jsonl"
    if vue.is_file():
        sets["vue-questions"] = _texts(vue, "query")
    return sets


def time_question_sets(
    conn: psycopg.Connection, kb_name: str, sets: dict[str, list[str]], per_set: int
) -> list[QuestionSetStats]:
    """Time kb.lexical_search(question, TOP_K) for a seeded sample of at most per_set questions per set."""
    sql = f"select * from kb.lexical_search(%s::text, {TOP_K}, kb => %s::text)"
    out = []
    for i, (name, texts) in enumerate(sets.items()):
        sample = texts if len(texts) <= per_set else random.Random(SEED + 11 + i).sample(texts, per_set)
        log(f"question set {name}: {len(sample)} of {len(texts)} questions through kb.lexical_search")
        for q in sample[:WARMUP]:
            conn.execute(sql, [q, kb_name]).fetchall()
        samples = []
        for q in sample:
            t0 = time.perf_counter()
            conn.execute(sql, [q, kb_name]).fetchall()
            samples.append((time.perf_counter() - t0) * 1000.0)
        worst = int(np.argmax(samples))
        out.append(QuestionSetStats(name, len(texts), samples, sample[worst]))
    return out
