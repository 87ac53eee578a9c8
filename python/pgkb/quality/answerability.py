"""`pgkb eval --answerability`: does the not-found gate refuse what the knowledge base cannot answer, and
answer what it can?

Every question of a dataset is asked twice against the knowledge base `pgkb eval` loaded for it:

* **answerable** -- as it is: the top ``top_k`` hits of ``kb.hybrid_search`` (the retrieval ``kb.ask`` does);
* **unanswerable** -- with its relevant documents hidden: the same search run once with a larger depth
  (``depth``, default kb.limits() top_k: the most a search returns), every hit of a relevant document
  dropped, and the first ``top_k`` of the rest;
* **unanswerable, strict** -- the same, and also every hit that still holds the answer: a chunk containing
  one of the question's gold answer strings (BEIR ``metadata.answers``), a chunk of a document whose text
  equals a relevant one's (the same FAQ answer twice), and a chunk whose embedding is a near-duplicate
  (cosine >= ``NEAR_DUPLICATE``) of a chunk of a relevant document. A question made unanswerable only by
  hiding its judged documents can still be answerable; this one is not, as far as the data tells.

Both hit lists go to the database's own ``kb.answer_evidence(question, hits)``; the gate is
``kb.answer_gate(evidence, min_score)``, called for every threshold of the sweep (``min_score => NULL`` is
the shipped default, read from kb.settings). Nothing here re-implements the gate: Python only counts.

Why dropping hits stands for "a knowledge base without those documents": the gate reads absolute,
per-chunk signals (a chunk's vector cosine to the query does not depend on any other chunk; query-term
coverage is weighted with corpus idf, where one hidden document moves the document frequencies of its
own terms by one -- see docs/quality.md for that difference, measured against real knowledge bases built
without the documents, ``--holdout``). Ranks and DBSF-fused scores are relative per query and are not
gate signals.

Per threshold the report gives the share of unanswerable questions answered "not found" (``refused
unanswerable``, higher is better) and the share of answerable questions wrongly refused (``refused
answerable``, lower is better), plus the latter among the questions whose relevant document was in the
top ``top_k`` (the refusals the gate, not retrieval, is to blame for).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgkb.limits import api_limit
from pgkb.quality.datasets import Dataset, EvalError, Query, default_kb, question_translation, read_jsonl, sample
from pgkb.quality.searching import embed_queries

DEFAULT_TOP_K = 5  # kb.ask's default top_k
GOAL_REFUSED_UNANSWERABLE = 0.90  # issue goal: >= 90 % of unanswerable questions get "not found"
GOAL_REFUSED_ANSWERABLE = 0.10  # ... while <= 10 % of answerable ones do
NEAR_DUPLICATE = 0.95  # cosine at or above which a chunk counts as a copy of a judged one (strict hiding)


@dataclass
class Asked:
    """One question, asked as it is and with its relevant documents hidden."""

    query: Query
    evidence: dict  # kb.answer_evidence of the top_k hits
    hidden_evidence: dict  # kb.answer_evidence of the top_k hits left once the relevant documents are dropped
    retrieved: bool  # a relevant document is among the top_k hits
    hidden_hits: int  # hits left for the hidden case (< top_k: the depth ran out)
    strict_evidence: dict  # kb.answer_evidence once every hit that still holds the answer is dropped too
    strict_hits: int  # hits left for the strict case
    answer: str = ""  # kb.extractive_reply of the top_k hits
    citations: list = field(default_factory=list)  # kb.cite's citations of it
    dropped: int = 0  # citation numbers kb.cite removed (naming no source)
    contents: list = field(default_factory=list)  # the answer's sources' contents (source n = contents[n - 1])


@dataclass
class Report:
    dataset: str
    kb: str
    model: str
    top_k: int
    depth: int
    asked: list[Asked] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # per threshold
    faithfulness: dict[str, Any] = field(default_factory=dict)  # of the extractive answers the gate let through
    unrelated: list[Asked] = field(default_factory=list)  # another set's questions, asked of this kb
    unrelated_name: str | None = None
    seconds: float = 0.0


# The retrieval of one question, the as-is and hidden hit lists and their evidence, in one statement. The
# hits keep kb.hybrid_search's order (row_number over its output).
_ASK_SQL = """
with r as materialized (
    select h, row_number() over () as n
    from kb.hybrid_search(%(q)s, %(depth)s, %(kb)s, query_embedding => %(emb)s, model => %(model)s) as h
),
asis as (select coalesce(array_agg(h order by n), '{}') as hits from r where n <= %(top_k)s),
hidden as (
    select coalesce(array_agg(h order by n), '{}') as hits
    from (select h, n from r where (h).doc_key <> all(%(relevant)s) order by n limit %(top_k)s) as x
),
judged as materialized (
    -- the judged documents' chunk embeddings by the run's model, read once per question
    -- (a model above 512 dimensions keeps its vectors in half: kb.register_embedding_model)
    select coalesce(e.embedding, e.half::vector) as embedding, e.model_id from kb.embeddings as e
    join kb.embedding_models as m on m.id = e.model_id and m.name = %(model)s
    join kb.chunks as c on c.id = e.chunk_id
    join kb.documents as d on d.id = c.document_id
    join kb.knowledge_bases as k on k.id = d.kb_id
    where k.name = %(kb)s and d.doc_key = any(%(relevant)s)
),
strict_hidden as (
    select coalesce(array_agg(h order by n), '{}') as hits
    from (
        select h, n from r
        where (h).doc_key <> all(%(relevant)s) and (h).doc_key <> all(%(same_answer)s)
            and not exists (select from unnest(%(answers)s::text[]) as a where strpos((h).content, a) > 0)
            and not exists (
                select from judged as j
                join kb.embeddings as mine on mine.chunk_id = (h).chunk_id and mine.model_id = j.model_id
                where (coalesce(mine.embedding, mine.half::vector) <=> j.embedding) <= 1 - %(near)s
            )
        order by n limit %(top_k)s
    ) as x
)
select kb.answer_evidence(%(q)s, asis.hits), kb.answer_evidence(%(q)s, hidden.hits),
    exists (select from r where n <= %(top_k)s and (h).doc_key = any(%(relevant)s)),
    cardinality(hidden.hits),
    kb.answer_evidence(%(q)s, strict_hidden.hits), cardinality(strict_hidden.hits),
    cited.answer, cited.citations, cited.dropped,
    array(select (x).content from unnest(cited.sources) as x)
from asis, hidden, strict_hidden,
    lateral kb.extractive_reply(%(q)s, asis.hits) as cited
"""


def ask_all(
    conn,
    dataset: Dataset,
    kb: str,
    spec,
    embedder,
    *,
    top_k: int = DEFAULT_TOP_K,
    depth: int | None = None,
    batch: int = 16,
    progress: Callable[[str], None] | None = None,
) -> list[Asked]:
    """Ask every question of ``dataset`` as it is and with its relevant documents hidden (see the module
    docstring); the query embedding is the client's (registry query prefix), passed to the search."""
    most = api_limit(conn, "top_k")
    depth = depth or most
    if not 1 <= top_k <= depth <= most:
        raise EvalError(f"need 1 <= top_k ({top_k}) <= depth ({depth}) <= {most} (kb.limits() top_k)")
    queries = dataset.queries
    out: list[Asked] = []
    for i in range(0, len(queries), batch):
        vectors = embed_queries(conn, spec, embedder, [q.text for q in queries[i : i + batch]], batch, kb=kb)
        for q, emb in zip(queries[i : i + batch], vectors, strict=True):
            relevant = sorted(doc for doc, grade in q.relevant.items() if grade > 0)
            row = conn.execute(
                _ASK_SQL,
                {"q": q.text, "depth": depth, "kb": kb, "emb": emb, "model": spec.name, "top_k": top_k,
                 "relevant": relevant, "same_answer": list(q.same_answer), "answers": list(q.answers),
                 "near": NEAR_DUPLICATE},
            ).fetchone()  # fmt: skip
            out.append(Asked(q, *row))
        if progress:
            progress(f"\rasking: {len(out)}/{len(queries)} questions (as they are and with the answer hidden)")
    if progress:
        progress("\n")
    return out


def gate(conn, evidences: Sequence[dict], thresholds: Sequence[float | None]) -> list[list[bool]]:
    """``kb.answer_gate(evidence, min_score)`` for every threshold (None: the shipped default) and every
    evidence, in one statement: ``result[t][e]`` is True when the gate lets evidence ``e`` be answered."""
    rows = conn.execute(
        "select t.i, e.j, kb.answer_gate(e.ev, t.min_score)"
        " from unnest(%s::float8[]) with ordinality as t(min_score, i),"
        " unnest(%s::jsonb[]) with ordinality as e(ev, j)",
        [list(thresholds), [json.dumps(ev) for ev in evidences]],
    ).fetchall()
    out = [[False] * len(evidences) for _ in thresholds]
    for i, j, answered in rows:
        out[i - 1][j - 1] = bool(answered)
    return out


GATE_SETTINGS = ("answer_vector_weight", "answer_vector_floor", "answer_vector_ceiling")  # kb.answer_score's knobs


def parse_gate_grid(items: Sequence[str]) -> list[dict[str, str]]:
    """``["answer_vector_weight=0,0.5"]`` -> every combination of the gate settings' values (``[{}]``
    for none); EvalError for an unknown key, a non-number or a key given twice."""
    axes: dict[str, list[str]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not key.startswith("answer_"):
            key = "answer_" + key
        if not sep or key not in GATE_SETTINGS:
            raise EvalError(f"--gate-grid {item!r}: expected KEY=V1,V2 with KEY one of {', '.join(GATE_SETTINGS)}")
        if key in axes:
            raise EvalError(f"--gate-grid {key} is given twice")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        for v in values:
            try:
                float(v)
            except ValueError:
                raise EvalError(f"--gate-grid {key}: {v!r} is not a number") from None
        if not values:
            raise EvalError(f"--gate-grid {item!r} has no values")
        axes[key] = values
    combos: list[dict[str, str]] = [{}]
    for key, values in axes.items():
        combos = [{**c, key: v} for c in combos for v in values]
    return combos


def score(
    conn,
    asked: Sequence[Asked],
    thresholds: Sequence[float | None],
    gate_settings: dict[str, str] | None = None,
    unrelated: Sequence[Asked] = (),
) -> list[dict[str, Any]]:
    """One row per threshold: refused shares of the unanswerable and answerable questions (and of the
    ``unrelated`` questions, asked as they are). ``gate_settings`` (kb.settings answer_* values) are set for
    these gate calls only, in a transaction rolled back after."""
    n = len(asked)
    evidences = (
        [a.evidence for a in asked] + [a.hidden_evidence for a in asked] + [a.strict_evidence for a in asked]
        + [u.evidence for u in unrelated]
    )  # fmt: skip
    if gate_settings:
        with conn.transaction(force_rollback=True):
            for key, value in gate_settings.items():
                conn.execute("update kb.settings set value = %s where key = %s", [value, key])
            opens = gate(conn, evidences, thresholds)
    else:
        opens = gate(conn, evidences, thresholds)
    n_retrieved = sum(a.retrieved for a in asked)
    rows = []
    for threshold, answered in zip(thresholds, opens, strict=True):
        answerable, hidden, strict, foreign = (
            answered[:n], answered[n : 2 * n], answered[2 * n : 3 * n], answered[3 * n :]
        )  # fmt: skip
        refused = [not x for x in answerable]
        extra = {"refused_unrelated": _share(sum(not x for x in foreign), len(foreign))} if unrelated else {}
        rows.append({
            "settings": dict(gate_settings or {}),
            "min_score": threshold,
            "refused_unanswerable": _share(sum(not x for x in hidden), n),
            "refused_unanswerable_strict": _share(sum(not x for x in strict), n),
            "refused_answerable": _share(sum(refused), n),
            "refused_answerable_retrieved": _share(
                sum(r for r, a in zip(refused, asked, strict=True) if a.retrieved), n_retrieved
            ),
            **extra,
        })  # fmt: skip
    return rows


def _squash(text: str) -> str:
    return " ".join(text.split())


def faithfulness(asked: Sequence[Asked], answered: Sequence[bool]) -> dict[str, Any]:
    """Citation faithfulness of the extractive answers of the questions the gate ``answered``: of all their
    citations, the share whose quote is text of the cited chunk, whose cited document is relevant (qrels),
    and both; the share of answers citing a relevant document, and of answers whose first citation is one;
    the share of answer lines whose statement is verbatim text of the chunk it cites; dropped citation
    numbers (naming no source) in all."""
    n_cit = quoted = relevant = both = lines = verbatim = dropped = citing_relevant = first_relevant = 0
    for a, ok in zip(asked, answered, strict=True):
        if not ok:
            continue
        dropped += a.dropped
        citing_relevant += any(a.query.relevant.get(c["doc_key"], 0) > 0 for c in a.citations)
        first_relevant += bool(a.citations) and a.query.relevant.get(a.citations[0]["doc_key"], 0) > 0
        contents = [_squash(c or "") for c in a.contents]
        for c in a.citations:
            n_cit += 1
            in_chunk = bool(c.get("quote")) and _squash(c["quote"]) in contents[c["n"] - 1]
            rel = a.query.relevant.get(c["doc_key"], 0) > 0
            quoted += in_chunk
            relevant += rel
            both += in_chunk and rel
        for line in a.answer.splitlines():
            m = _CITED_LINE.match(line)
            if not m:
                continue
            lines += 1
            n = int(m.group(2))
            pieces = [p for p in (_squash(x) for x in m.group(1).split("; ")) if p]
            verbatim += 1 <= n <= len(contents) and all(p in contents[n - 1] for p in pieces)
    return {
        "questions": sum(bool(x) for x in answered),
        "citations": n_cit,
        "quote_in_cited_chunk": _share(quoted, n_cit),
        "cited_document_relevant": _share(relevant, n_cit),
        "faithful": _share(both, n_cit),
        "answer_lines": lines,
        "statement_in_cited_chunk": _share(verbatim, lines),
        "dropped_citations": dropped,
        "answers_citing_relevant": _share(citing_relevant, sum(bool(x) for x in answered)),
        "first_citation_relevant": _share(first_relevant, sum(bool(x) for x in answered)),
    }


_CITED_LINE = re.compile(r"^(.*\S)\s*\[(\d+)\]\s*$")


def _share(k: int, n: int) -> float:
    return round(k / n, 4) if n else 0.0


def meets_goal(row: dict[str, Any]) -> bool:
    return (
        row["refused_unanswerable_strict"] >= GOAL_REFUSED_UNANSWERABLE
        and row["refused_answerable"] <= GOAL_REFUSED_ANSWERABLE
    )


def parse_thresholds(raw: str | None) -> list[float]:
    """``"0.1,0.2"`` -> [0.1, 0.2]; EvalError for a value that is not a finite number."""
    if raw is None or not raw.strip():
        return []
    values = []
    for part in raw.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise EvalError(f"--thresholds: {part!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise EvalError(f"--thresholds: {part!r} is not a finite number")
        values.append(value)
    return sorted(set(values))


def evaluate(
    conn,
    dataset: Dataset,
    kb: str,
    spec,
    embedder,
    thresholds: Sequence[float],
    *,
    gate_grid: Sequence[dict[str, str]] = ({},),
    unrelated: Dataset | None = None,
    top_k: int = DEFAULT_TOP_K,
    depth: int | None = None,
    batch: int = 16,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Ask every question (``ask_all``) once and score the gate at its default and at every threshold, for
    every combination of gate settings in ``gate_grid`` (``{}``: the database's)."""
    started = time.monotonic()
    depth = depth or api_limit(conn, "top_k")
    report = Report(dataset.name, kb, spec.name, top_k, depth)
    report.asked = ask_all(conn, dataset, kb, spec, embedder, top_k=top_k, depth=depth, batch=batch,
                           progress=progress)  # fmt: skip
    if unrelated is not None:
        report.unrelated_name = unrelated.name
        report.unrelated = ask_all(conn, unrelated, kb, spec, embedder, top_k=top_k, depth=depth, batch=batch,
                                   progress=progress)  # fmt: skip
    answered = gate(conn, [a.evidence for a in report.asked], [None])[0]
    report.faithfulness = faithfulness(report.asked, answered)
    for combo in gate_grid:
        chosen = [None, *thresholds] if not combo else list(thresholds)
        report.rows += score(conn, report.asked, chosen, combo, report.unrelated)
    report.seconds = round(time.monotonic() - started, 1)
    return report


def default_setting(conn) -> str | None:
    """The gate's shipped threshold as kb.settings holds it (for the report's default row)."""
    row = conn.execute("select value from kb.settings where key = 'answer_min_score'").fetchone()
    return row[0] if row else None


def as_json(report: Report, default: str | None = None) -> dict[str, Any]:
    return {
        "dataset": report.dataset,
        "kb": report.kb,
        "model": report.model,
        "top_k": report.top_k,
        "depth": report.depth,
        "n_queries": len(report.asked),
        "retrieved@top_k": _share(sum(a.retrieved for a in report.asked), len(report.asked)),
        "short_hidden_lists": sum(a.hidden_hits < report.top_k for a in report.asked),
        "short_strict_lists": sum(a.strict_hits < report.top_k for a in report.asked),
        "default_min_score": default,
        "rows": report.rows,
        "extractive_faithfulness": report.faithfulness,
        "unrelated": {"dataset": report.unrelated_name, "n_queries": len(report.unrelated)}
        if report.unrelated
        else None,
        "seconds": report.seconds,
        "questions": [
            {
                "id": a.query.id,
                "evidence": a.evidence,
                "hidden_evidence": a.hidden_evidence,
                "strict_evidence": a.strict_evidence,
                "strict_hits": a.strict_hits,
                "retrieved": a.retrieved,
            }
            for a in report.asked
        ],  # fmt: skip
    }


def _settings_label(settings: dict[str, str]) -> str:
    return ", ".join(f"{k.removeprefix('answer_')}={v}" for k, v in settings.items())


def markdown(report: Report, default: str | None = None) -> str:
    """One row per gate setting and threshold: refused shares, and whether the issue's goal is met."""
    n = len(report.asked)
    retrieved = sum(a.retrieved for a in report.asked)
    varied = any(row["settings"] for row in report.rows)
    other = " | refused unrelated" if report.unrelated else ""
    lines = [
        f"### {report.dataset} — answerability, {n} questions, model {report.model}, kb `{report.kb}`",
        "",
        f"Relevant document in the top {report.top_k}: {retrieved}/{n}. Goal: refused unanswerable (strict) ≥ "
        f"{GOAL_REFUSED_UNANSWERABLE:.0%}, refused answerable ≤ {GOAL_REFUSED_ANSWERABLE:.0%}. Unanswerable: "
        "judged documents hidden; strict: also every chunk holding an answer string, the same FAQ answer, "
        f"or a near-duplicate (cosine ≥ {NEAR_DUPLICATE}) of a judged chunk."
        + (f" Unrelated: {len(report.unrelated)} questions of {report.unrelated_name}." if report.unrelated else ""),
        "",
        ("| gate settings " if varied else "")
        + "| min_score | refused unanswerable | refused unanswerable (strict) | refused answerable"
        + f" | refused answerable (retrieved){other} | goal |",
        ("|---" if varied else "") + "|---|---:|---:|---:|---:|" + ("---:|" if other else "") + "---|",
    ]
    for row in report.rows:
        label = f"default ({default})" if row["min_score"] is None else f"{row['min_score']:g}"
        prefix = f"| {_settings_label(row['settings']) or 'database'} " if varied else ""
        lines.append(
            f"{prefix}| {label} | {row['refused_unanswerable']:.1%} | {row['refused_unanswerable_strict']:.1%}"
            f" | {row['refused_answerable']:.1%}"
            f" | {row['refused_answerable_retrieved']:.1%}"
            + (f" | {row['refused_unrelated']:.1%}" if other else "")
            + f" | {'met' if meets_goal(row) else ''} |"
        )
    f = report.faithfulness
    if f:
        lines += [
            "",
            f"Extractive answers at the default gate ({f['questions']} answered questions, {f['citations']} "
            f"citations): quote is text of the cited chunk {f['quote_in_cited_chunk']:.1%}, cited document "
            f"relevant {f['cited_document_relevant']:.1%}, both {f['faithful']:.1%}; answer lines whose "
            f"statement is verbatim text of the cited chunk {f['statement_in_cited_chunk']:.1%} of "
            f"{f['answer_lines']}; answers citing a relevant document {f['answers_citing_relevant']:.1%}, "
            f"first citation relevant {f['first_citation_relevant']:.1%}; "
            f"citation numbers naming no source: {f['dropped_citations']}.",
        ]
    short = sum(a.hidden_hits < report.top_k for a in report.asked)
    strict_short = sum(a.strict_hits < report.top_k for a in report.asked)
    if short or strict_short:
        lines += [
            "",
            f"Questions with fewer than {report.top_k} hits left once their documents were hidden: {short};"
            f" in the strict case: {strict_short}.",
        ]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- CLI


def add_arguments(parser) -> None:
    """The answerability options of `pgkb eval`."""
    parser.add_argument(
        "--answerability", action="store_true",
        help="measure the not-found gate (kb.answer_gate): each question as it is and with its relevant "
        "documents hidden; refused shares per --thresholds",
    )  # fmt: skip
    parser.add_argument(
        "--thresholds", default=None, metavar="T1,T2",
        help="gate min_score values to compare with the default (answerability)",
    )  # fmt: skip
    parser.add_argument(
        "--gate-grid", action="append", default=[], metavar="KEY=V1,V2",
        help=f"gate settings to combine (repeatable; answerability), KEY one of {', '.join(GATE_SETTINGS)}",
    )  # fmt: skip
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="hits the gate sees (answerability)")
    parser.add_argument(
        "--unrelated", default=None, metavar="PATH",
        help="answerability and --ask: also ask another set's questions (a BEIR folder or a questions .jsonl), "
        "which this knowledge base cannot answer; sampled like --max-queries",
    )  # fmt: skip


def run_loaded(
    conn,
    args,
    dataset: Dataset,
    kb: str,
    spec,
    embedder,
    batch: int = 16,
    progress: Callable[[str], None] | None = None,
) -> int:
    """`pgkb eval --answerability` on a knowledge base that holds the dataset: Markdown on stdout, --out
    JSON. EvalError for bad options and for values the gate refuses (with the database's message)."""
    import psycopg

    thresholds = parse_thresholds(getattr(args, "thresholds", None))
    top_k = getattr(args, "top_k", DEFAULT_TOP_K)
    if not 1 <= top_k <= api_limit(conn, "top_k"):
        raise EvalError(f"--top-k must be between 1 and {api_limit(conn, 'top_k')}")
    grid = parse_gate_grid(getattr(args, "gate_grid", None) or [])
    if any(grid) and not thresholds:
        raise EvalError("--gate-grid needs --thresholds (the default threshold belongs to the default settings)")
    unrelated = None
    if getattr(args, "unrelated", None):
        unrelated = load_unrelated(Path(args.unrelated))
        unrelated.queries = sample(unrelated.queries, getattr(args, "max_queries", None), getattr(args, "seed", 0))
    try:
        with conn.transaction():  # a gate error must not leave the connection in a failed transaction
            conn.execute("select kb.answer_gate('{\"coverage\": 0}', t) from unnest(%s::float8[]) as t", [thresholds])
        report = evaluate(
            conn, dataset, kb, spec, embedder, thresholds, gate_grid=[{}, *grid] if any(grid) else [{}],
            unrelated=unrelated, top_k=top_k, batch=batch, progress=progress,
        )  # fmt: skip
    except psycopg.errors.InvalidParameterValue as e:
        raise EvalError(e.diag.message_primary or str(e)) from None
    default = default_setting(conn)
    print(markdown(report, default))
    if getattr(args, "out", None):
        Path(args.out).write_text(
            json.dumps(as_json(report, default), ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
        )
    return 0


def load_unrelated(path: Path) -> Dataset:
    """Questions of another set, with no relevant document here: a BEIR folder's queries.jsonl (``text``)
    or a questions file (``query`` or ``text`` per line). EvalError when there are none."""
    file = path / "queries.jsonl" if path.is_dir() else path
    rows = read_jsonl(file, "unrelated questions")
    queries = [
        Query(f"unrelated-{i}", text.strip(), {}, translation=question_translation(row))
        for i, row in enumerate(rows, 1)
        if isinstance(text := row.get("query", row.get("text")), str) and text.strip()
    ]
    if not queries:
        raise EvalError(f'{file}: no questions (a "query" or "text" string per line)')
    return Dataset(path.resolve().name if path.is_dir() else path.resolve().parent.name, queries, any_relevant=False)


def check_loaded(conn, dataset: Dataset, kb: str | None) -> str:
    """The knowledge base holding ``dataset`` (``kb`` or eval-<dataset>); EvalError when it is missing or
    lacks a relevant document of the questions."""
    kb = kb or default_kb(dataset.name)
    keys = (
        {r[0] for r in conn.execute("select doc_key from kb.list_documents(%s)", [kb]).fetchall()}
        if conn.execute("select 1 from kb.list_knowledge_bases() where name = %s", [kb]).fetchone()
        else set()
    )
    if not keys:
        raise EvalError(f"knowledge base {kb} is missing or empty: load it first with `pgkb eval` on {dataset.name}")
    missing = {d for q in dataset.queries for d in q.relevant} - keys
    if missing:
        print(f"pgkb: eval: warning: {len(missing)} relevant documents are not in {kb}", file=sys.stderr)
    return kb
