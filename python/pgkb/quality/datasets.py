"""The judged datasets of `pgkb eval` and `pgkb sweep`, read and checked.

* a **BEIR folder**: ``corpus.jsonl`` (``_id, title, text``), ``queries.jsonl`` (``_id, text``; optional
  ``kind`` or ``metadata.kind``) and ``qrels.tsv`` (header line, then ``query-id  corpus-id  score``;
  graded scores are used by nDCG, score <= 0 means not relevant). Every corpus entry becomes one document
  (:func:`beir_documents`: doc_key = ``_id``, title = ``title``, ``text`` through
  ``pgkb.chunking.chunk_text``; the title is in every chunk's breadcrumb, so both the embedding and the
  BM25 terms see it), hashed on the chunker version and options, the model, title and text.
* **doc-questions**: a folder of documents (loaded like `pgkb ingest` does) and a JSONL file, each line
  ``{"id", "query", "relevant": [paths relative to the folder], "kind"}``.
* **the question log** (``--from-log``): a knowledge base's logged questions rated helpful
  (kb.rated_questions), judged on the documents their answers cited, over the knowledge base as it is.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import psycopg

from pgkb.models.embedding import ModelSpec
from pgkb.sources import TextDocument

__all__ = [
    "EVAL_CHUNKER_VERSION",
    "Dataset",
    "EvalError",
    "Query",
    "beir_documents",
    "default_kb",
    "load_beir",
    "load_questions",
    "load_rated_questions",
    "question_translation",
    "read_jsonl",
    "read_qrels",
    "replace_queries",
    "sample",
]

EVAL_CHUNKER_VERSION = "1"  # part of the BEIR content hash: bump when the document layout changes


class EvalError(ValueError):
    """Bad evaluation input (missing file, malformed line, unknown mode ...); the message says what and where."""


@dataclass
class Query:
    id: str
    text: str
    relevant: dict[str, float]
    kind: str | None = None
    answers: tuple[str, ...] = ()  # gold answer strings (BEIR metadata.answers), when the set has them
    same_answer: tuple[str, ...] = ()  # other documents whose text equals a relevant one's (FAQ duplicates)
    translation: str | None = None  # the question in the knowledge's language, by hand (a file's "translation")


@dataclass
class Dataset:
    name: str
    queries: list[Query]
    any_relevant: bool  # doc-questions: relevant files are alternatives
    corpus: list[dict] = field(default_factory=list)  # BEIR only
    docs_dir: Path | None = None  # doc-questions only


def read_jsonl(path: Path, what: str) -> list[dict]:
    """The JSON objects of a JSONL file (blank lines skipped); EvalError naming the file and line."""
    if not path.is_file():
        raise EvalError(f"{what} not found: {path}")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalError(f"{path}:{n}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise EvalError(f"{path}:{n}: expected a JSON object")
            rows.append(row)
    return rows


def read_qrels(path: Path) -> dict[str, dict[str, float]]:
    """``{query_id: {corpus_id: score}}`` from a BEIR qrels.tsv (header line optional)."""
    if not path.is_file():
        raise EvalError(f"qrels not found: {path}")
    qrels: dict[str, dict[str, float]] = {}
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\r\n").split("\t") if "\t" in line else line.split()
            if len(parts) != 3:
                raise EvalError(f"{path}:{n}: expected 3 tab-separated columns (query-id, corpus-id, score)")
            qid, doc, raw = (p.strip() for p in parts)
            try:
                score = float(raw)
            except ValueError as e:
                if n == 1 and not qrels:  # the header line
                    continue
                raise EvalError(f"{path}:{n}: score {raw!r} is not a number") from e
            if not qid or not doc:
                raise EvalError(f"{path}:{n}: empty query-id or corpus-id")
            qrels.setdefault(qid, {})[doc] = score
    if not any(s > 0 for rel in qrels.values() for s in rel.values()):
        raise EvalError(f"{path}: no relevance judgments (score > 0)")
    return qrels


def _answers(row: dict) -> tuple[str, ...]:
    """The gold answer strings of at least two characters (a one-character answer is in most texts)."""
    meta = row.get("metadata")
    raw = meta.get("answers") if isinstance(meta, dict) else None
    return tuple(a.strip() for a in raw if isinstance(a, str) and len(a.strip()) >= 2) if isinstance(raw, list) else ()


def _kind(row: dict) -> str | None:
    kind = row.get("kind")
    if kind is None and isinstance(row.get("metadata"), dict):
        kind = row["metadata"].get("kind")
    return str(kind) if kind not in (None, "") else None


def question_translation(row: dict) -> str | None:
    """A questions file's hand translation of a question (its "translation" string), or None."""
    text = row.get("translation")
    return text.strip() if isinstance(text, str) and text.strip() else None


def load_beir(folder: Path, warn: Callable[[str], None] = lambda _m: None) -> Dataset:
    """Read and check a BEIR folder; queries without a relevant document in the corpus are left out."""
    if not folder.is_dir():
        raise EvalError(f"dataset folder not found: {folder}")
    corpus = read_jsonl(folder / "corpus.jsonl", "corpus.jsonl")
    ids = set()
    for n, doc in enumerate(corpus, 1):
        if not isinstance(doc.get("_id"), (str, int)) or str(doc["_id"]).strip() == "":
            raise EvalError(f"{folder / 'corpus.jsonl'}: entry {n} has no _id")
        if not isinstance(doc.get("text", ""), str) or not isinstance(doc.get("title", "") or "", str):
            raise EvalError(f"{folder / 'corpus.jsonl'}: entry {n} (_id {doc['_id']}): title/text must be strings")
        doc["_id"] = str(doc["_id"])
        if doc["_id"] in ids:
            raise EvalError(f"{folder / 'corpus.jsonl'}: duplicate _id {doc['_id']!r}")
        ids.add(doc["_id"])
    if not corpus:
        raise EvalError(f"{folder / 'corpus.jsonl'} is empty")
    raw_queries = read_jsonl(folder / "queries.jsonl", "queries.jsonl")
    qrels = read_qrels(folder / "qrels.tsv")
    queries, unknown_docs, no_text = [], 0, 0
    by_text: dict[str, list[str]] = {}
    for doc in corpus:
        by_text.setdefault(" ".join((doc.get("text") or "").split()), []).append(doc["_id"])
    text_of = {doc["_id"]: " ".join((doc.get("text") or "").split()) for doc in corpus}
    for row in raw_queries:
        qid = str(row.get("_id", ""))
        relevant = qrels.get(qid)
        if not relevant:
            continue
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            no_text += 1
            continue
        kept = {doc: s for doc, s in relevant.items() if doc in ids}
        unknown_docs += len(relevant) - len(kept)
        if any(s > 0 for s in kept.values()):
            positive = [d for d, s in kept.items() if s > 0]
            twins = sorted({t for d in positive if text_of[d] for t in by_text[text_of[d]]} - set(positive))
            queries.append(Query(qid, text.strip(), kept, _kind(row), _answers(row), tuple(twins)))
    known_qids = {str(r.get("_id", "")) for r in raw_queries}
    missing = [q for q in qrels if q not in known_qids]
    if missing:
        warn(f"{len(missing)} qrels query ids are not in queries.jsonl (e.g. {missing[0]!r}); ignored")
    if unknown_docs:
        warn(f"{unknown_docs} qrels rows name documents missing from corpus.jsonl; ignored")
    if no_text:
        warn(f"{no_text} judged queries have no text; skipped")
    if not queries:
        raise EvalError(f"{folder}: no query in queries.jsonl has a relevant document in qrels.tsv")
    return Dataset(folder.resolve().name, queries, any_relevant=False, corpus=corpus)


def load_questions(docs: Path, questions: Path) -> Dataset:
    """Read and check a doc-questions file (relevant paths are relative to ``docs``)."""
    if not docs.is_dir():
        raise EvalError(f"docs folder not found: {docs}")
    rows = read_jsonl(questions, "questions file")
    queries = []
    for n, row in enumerate(rows, 1):
        text, relevant = row.get("query"), row.get("relevant")
        if not isinstance(text, str) or not text.strip():
            raise EvalError(f'{questions}: question {n} has no "query" string')
        if not isinstance(relevant, list) or not relevant or not all(isinstance(p, str) and p for p in relevant):
            raise EvalError(f'{questions}: question {n} needs "relevant": a non-empty list of paths')
        queries.append(
            Query(
                str(row.get("id", n)),
                text.strip(),
                {p: 1.0 for p in relevant},
                _kind(row),
                translation=question_translation(row),
            )
        )
    if not queries:
        raise EvalError(f"{questions} has no questions")
    missing = sorted({p for q in queries for p in q.relevant if not (docs / p).is_file()})
    if missing:
        raise EvalError(f"relevant files not found under {docs}: {', '.join(missing[:5])}")
    return Dataset(questions.resolve().parent.name, queries, any_relevant=True, docs_dir=docs)


def load_rated_questions(conn, kb: str, since: str) -> Dataset:
    """`pgkb eval --from-log`: the questions of knowledge base ``kb`` asked in the last ``since`` (an interval)
    whose answers were rated helpful (kb.rated_questions: its owner or an administrator), each once. The judged
    documents are those an ask cited or, for a search, its first document (the one a reader sees first; a
    search cites nothing); the kind is the mode it was asked in. EvalError when there are none."""
    try:
        with conn.transaction():
            rows = conn.execute(
                "select question_id, question, mode, documents from kb.rated_questions(%s, %s::interval, 10000)",
                [kb, since],
            ).fetchall()
    except psycopg.Error as e:  # unknown or invisible kb, not its owner, a malformed interval: the database's words
        raise EvalError(str(e).strip().splitlines()[0]) from e
    queries = [
        Query(str(qid), text, {doc: 1.0 for doc in (docs if mode == "ask" else docs[:1])}, kind=mode)
        for qid, text, mode, docs in rows
    ]
    if not queries:
        raise EvalError(
            f"no question of {kb} asked in the last {since} was rated helpful: turn its question log on"
            f" (pgkb questions log {kb} 30) and rate answers (pgkb rate, the page, MCP rate_answer)"
        )
    return Dataset(f"log-{kb}", queries, any_relevant=False)


def replace_queries(dataset: Dataset, path: Path) -> None:
    """Ask the questions of ``path`` instead of the dataset's own (e.g. translations): one JSON object per
    line with the id of a judged question (``_id`` or ``id``) and its new text (``text`` or ``query``). Only
    the questions in the file are kept, with their judgments; EvalError for an unknown or repeated id."""
    by_id = {q.id: q for q in dataset.queries}
    kept: list[Query] = []
    for n, row in enumerate(read_jsonl(path, "queries file"), 1):
        qid, text = str(row.get("_id", row.get("id", ""))), row.get("text", row.get("query"))
        if any(q.id == qid for q in kept):
            raise EvalError(f"{path}:{n}: question id {qid!r} is given twice")
        if qid not in by_id:
            raise EvalError(f"{path}:{n}: question id {qid!r} is not a judged question of {dataset.name}")
        if not isinstance(text, str) or not text.strip():
            raise EvalError(f'{path}:{n}: no "text" (or "query") string')
        original = by_id.pop(qid)
        kept.append(replace(original, text=text.strip()))
    if not kept:
        raise EvalError(f"{path} has no questions")
    dataset.queries = kept


def sample(queries: list[Query], n: int | None, seed: int) -> list[Query]:
    """At most n queries, a seeded random sample kept in file order."""
    if n is None or n >= len(queries):
        return queries
    picked = set(random.Random(seed).sample(range(len(queries)), n))
    return [q for i, q in enumerate(queries) if i in picked]


def default_kb(dataset: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", dataset).strip("-.") or "dataset"
    return f"eval-{slug}"[:100]


def beir_documents(corpus: list[dict], spec: ModelSpec) -> list[TextDocument]:
    """The corpus entries as documents for the ingest engine (pgkb.ingest.ingest_documents); their content
    hash covers the model too, so a run with another model embeds them again."""
    version = f"eval-beir-{EVAL_CHUNKER_VERSION}|{spec.name}|{spec.passage_prefix}"
    return [
        TextDocument(doc["_id"], doc.get("title") or "", doc.get("text") or "", {"beir_id": doc["_id"]}, version)
        for doc in corpus
    ]
