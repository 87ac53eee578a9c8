"""`pgkb eval --ask`: what kb.ask answers, question by question, through the product's own client
(pgkb.answer.ask, extractive: the question embedded and translated as `pgkb ask` does). An answerable question
is *right* (found, and the first citation is a relevant document), *wrong topic* (found, first citation not
relevant) or *refused* (not found, or only the closest passages: mode 'closest'). A question of --unrelated
(one the knowledge base cannot answer) is refused or answered. --with-translation also passes each question's
hand translation (its "translation" field) as ``also``, the phrasing an agent is asked to send. Python only
counts: the answer, the gate and the citations are the database's."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pgkb.quality.datasets import Dataset, EvalError, Query

__all__ = ["AskOutcome", "ask_questions", "markdown", "run_loaded"]

ASK_TOP_K = 5  # kb.ask's default top_k


@dataclass
class AskOutcome:
    """How kb.ask answered one question."""

    id: str
    query: str
    kind: str | None
    verdict: str  # right | wrong topic | refused (answerable); refused | answered (unanswerable)
    mode: str
    first_cited: str | None
    also: list[str] = field(default_factory=list)


def verdict(row: dict, relevant: dict[str, float]) -> tuple[str, str | None]:
    """(verdict, the first cited doc_key) of kb.ask's row for a question with these relevant documents (none:
    a question the knowledge base cannot answer)."""
    citations = row.get("citations") or []
    first = citations[0].get("doc_key") if citations else None
    answered = bool(row.get("found")) and row.get("mode") != "closest"
    if not relevant:
        return ("answered" if answered else "refused"), first
    if not answered:
        return "refused", first
    return ("right" if first in relevant else "wrong topic"), first


def ask_questions(
    conn, settings, queries: list[Query], kb: str, *, with_translation: bool, embedder=None, spec=None,
    progress: Callable[[str], None] | None = None,
) -> list[AskOutcome]:  # fmt: skip
    """kb.ask of every question over ``kb`` (extractive, top_k 5), through pgkb.answer.ask."""
    from pgkb.answer import ask

    out = []
    for n, q in enumerate(queries, 1):
        also = [q.translation] if with_translation and q.translation else []
        row = ask(
            conn, settings, q.text, top_k=ASK_TOP_K, kb=kb, mode="extractive", embedder=embedder, spec=spec,
            also=also or None,
        )  # fmt: skip
        said, first = verdict(row, q.relevant)
        out.append(AskOutcome(q.id, q.text, q.kind, said, row.get("mode") or "", first, also))
        if progress:
            progress(f"\rasking: {n}/{len(queries)}")
    if progress and queries:
        progress("\n")
    return out


def counts(outcomes: list[AskOutcome]) -> dict[str, int]:
    found: dict[str, int] = {}
    for o in outcomes:
        found[o.verdict] = found.get(o.verdict, 0) + 1
    return found


def markdown(name: str, answerable: list[AskOutcome], unanswerable: list[AskOutcome], with_translation: bool) -> str:
    """The report: counts per verdict, then every question that was not answered right (or was answered
    though it cannot be)."""
    how = "the question and its hand translation in `also`" if with_translation else "the question alone"
    lines = [f"### kb.ask on {name} ({how}; extractive, top_k {ASK_TOP_K})", ""]
    lines += ["| questions | n | right | wrong topic | refused | answered |", "|---|---:|---:|---:|---:|---:|"]
    for label, outcomes in (("answerable", answerable), ("unanswerable", unanswerable)):
        if not outcomes:
            continue
        c = counts(outcomes)
        n = len(outcomes)
        cells = [c.get("right", 0), c.get("wrong topic", 0), c.get("refused", 0), c.get("answered", 0)]
        if label == "unanswerable":
            cells[0] = cells[1] = "—"  # type: ignore[call-overload]
        lines.append(f"| {label} | {n} | " + " | ".join(f"{v}" for v in cells) + " |")
    misses = [o for o in answerable if o.verdict != "right"] + [o for o in unanswerable if o.verdict != "refused"]
    if misses:
        lines += ["", "| id | kind | question | verdict | mode | first cited |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {o.id} | {o.kind or ''} | {o.query} | {o.verdict} | {o.mode} | {o.first_cited or ''} |" for o in misses
        ]
    return "\n".join(lines)


def run_loaded(conn, args, settings, dataset: Dataset, kb: str, spec, embedder, progress=None) -> int:
    """`pgkb eval --ask` on a knowledge base that holds the dataset: Markdown on stdout, --out JSON."""
    from pgkb.quality.answerability import load_unrelated
    from pgkb.quality.datasets import sample

    with_translation = bool(getattr(args, "with_translation", False))
    if with_translation and not any(q.translation for q in dataset.queries):
        raise EvalError('--with-translation: the questions have no "translation" field')
    unrelated: list[Query] = []
    if getattr(args, "unrelated", None):
        unrelated = sample(load_unrelated(Path(args.unrelated)).queries, args.max_queries, args.seed)
    answerable = ask_questions(
        conn, settings, dataset.queries, kb, with_translation=with_translation, embedder=embedder, spec=spec,
        progress=progress,
    )  # fmt: skip
    unanswerable = ask_questions(
        conn, settings, unrelated, kb, with_translation=with_translation, embedder=embedder, spec=spec,
        progress=progress,
    )  # fmt: skip
    print(markdown(dataset.name, answerable, unanswerable, with_translation))
    if args.out:
        report = {
            "dataset": dataset.name, "kb": kb, "with_translation": with_translation,
            "answerable": counts(answerable), "unanswerable": counts(unanswerable),
            "questions": [o.__dict__ for o in answerable + unanswerable],
        }  # fmt: skip
        Path(args.out).write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    sys.stdout.flush()
    return 0
