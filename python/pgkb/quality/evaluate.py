"""`pgkb eval`: retrieval quality of each search mode on a judged dataset.

Two kinds of input:

* a **BEIR folder** (``pgkb eval DIR``): ``corpus.jsonl`` (``_id, title, text``), ``queries.jsonl``
  (``_id, text``; optional ``kind`` or ``metadata.kind``) and ``qrels.tsv`` (header line, then
  ``query-id  corpus-id  score``; graded scores are used by nDCG, score <= 0 means not relevant). Every
  corpus entry becomes one document (doc_key = ``_id``, title = ``title``, ``text`` through
  ``pgkb.chunking.chunk_text``; the title is in every chunk's breadcrumb, so both the embedding and the
  BM25 terms see it), embedded in batches with the configured embedder and written with
  ``kb.replace_document`` under a content hash (chunker version and options, model, title, text): a re-run
  skips unchanged documents and deletes documents no longer in the corpus.
* **doc-questions** (``--docs DIR --questions FILE.jsonl``): DIR is synced with ``pgkb.ingest.ingest``
  (incremental by content hash); each question line is ``{"id", "query", "relevant": [paths relative to
  DIR], "kind"}``.

Everything goes into a knowledge base of its own (``--kb``, default ``eval-<dataset>``, the dataset being
the BEIR folder's name or the folder holding the questions file).

Modes: ``vector`` (kb.vector_search), ``lexical`` (kb.lexical_search, --bm25-k1/--bm25-b), ``fuzzy``
(kb.fuzzy_search; the database runs the trigram leg only for short queries --
kb.settings.fuzzy_max_query_chars / fuzzy_max_query_words -- so other queries get no fuzzy results), ``hybrid``
(kb.hybrid_search with the weights, rrf_k, candidates and BM25 settings given) and ``hybrid+rerank`` (the
fused top --rerank-depth reordered by the configured reranker, PGKB_RERANK_URL / PGKB_RERANK_MODEL; only
offered when one is configured). Each query is embedded once (registry query prefix) and the embedding is
passed to every mode (``query_embedding``), so latency is the search call alone (plus the rerank call in
hybrid+rerank), measured client-side around execute + fetch, after one untimed warm-up query per mode
(and an ANALYZE of the kb tables after loading).

Metrics are computed on **documents**: a search returns chunks (--depth per query, default 50); they are
mapped to their documents and deduplicated in rank order before scoring.

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

Output: a Markdown table per dataset on stdout, progress on stderr, and with ``--out FILE.json``::

    {"dataset", "model", "n_queries", "modes": {"<mode>": {"recall@1", "recall@5", "recall@10", "mrr@10",
     "ndcg@10", "p50_ms", "p95_ms", "by_kind": {"<kind>": {"recall@5", "n"}}}}}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgkb.chunking import ChunkedDocument, ChunkingOptions, chunk_text
from pgkb.models.embedding import Embedder, ModelSpec, prefixed
from pgkb.search import MODE_SETTINGS, query_rows, rerank

MODES = ("vector", "lexical", "fuzzy", "hybrid", "hybrid+rerank")
DEFAULT_DEPTH = 50
MAX_TOP_K = 100  # kb.search's own limit
FUSIONS = ("dbsf", "rrf")  # kb.search's fusion methods
EVAL_CHUNKER_VERSION = "1"  # part of the BEIR content hash: bump when the document layout changes
EVAL_DESCRIPTION = "pgkb eval"  # description prefix of the knowledge bases pgkb eval creates


class EvalError(ValueError):
    """Bad evaluation input (missing file, malformed line, unknown mode ...); the message says what and where."""


# ------------------------------------------------------------------------------------------------ metrics


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


# --------------------------------------------------------------------------------------------- datasets


@dataclass
class Query:
    id: str
    text: str
    relevant: dict[str, float]
    kind: str | None = None


@dataclass
class Dataset:
    name: str
    queries: list[Query]
    any_relevant: bool  # doc-questions: relevant files are alternatives
    corpus: list[dict] = field(default_factory=list)  # BEIR only
    docs_dir: Path | None = None  # doc-questions only


def _read_jsonl(path: Path, what: str) -> list[dict]:
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


def _kind(row: dict) -> str | None:
    kind = row.get("kind")
    if kind is None and isinstance(row.get("metadata"), dict):
        kind = row["metadata"].get("kind")
    return str(kind) if kind not in (None, "") else None


def load_beir(folder: Path, warn: Callable[[str], None] = lambda _m: None) -> Dataset:
    """Read and check a BEIR folder; queries without a relevant document in the corpus are left out."""
    if not folder.is_dir():
        raise EvalError(f"dataset folder not found: {folder}")
    corpus = _read_jsonl(folder / "corpus.jsonl", "corpus.jsonl")
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
    raw_queries = _read_jsonl(folder / "queries.jsonl", "queries.jsonl")
    qrels = read_qrels(folder / "qrels.tsv")
    queries, unknown_docs, no_text = [], 0, 0
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
            queries.append(Query(qid, text.strip(), kept, _kind(row)))
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
    rows = _read_jsonl(questions, "questions file")
    queries = []
    for n, row in enumerate(rows, 1):
        text, relevant = row.get("query"), row.get("relevant")
        if not isinstance(text, str) or not text.strip():
            raise EvalError(f'{questions}: question {n} has no "query" string')
        if not isinstance(relevant, list) or not relevant or not all(isinstance(p, str) and p for p in relevant):
            raise EvalError(f'{questions}: question {n} needs "relevant": a non-empty list of paths')
        queries.append(Query(str(row.get("id", n)), text.strip(), {p: 1.0 for p in relevant}, _kind(row)))
    if not queries:
        raise EvalError(f"{questions} has no questions")
    missing = sorted({p for q in queries for p in q.relevant if not (docs / p).is_file()})
    if missing:
        raise EvalError(f"relevant files not found under {docs}: {', '.join(missing[:5])}")
    return Dataset(questions.resolve().parent.name, queries, any_relevant=True, docs_dir=docs)


def sample(queries: list[Query], n: int | None, seed: int) -> list[Query]:
    """At most n queries, a seeded random sample kept in file order."""
    if n is None or n >= len(queries):
        return queries
    picked = set(random.Random(seed).sample(range(len(queries)), n))
    return [q for i, q in enumerate(queries) if i in picked]


def default_kb(dataset: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", dataset).strip("-.") or "dataset"
    return f"eval-{slug}"[:100]


# ---------------------------------------------------------------------------------------------- loading


@dataclass
class LoadSummary:
    written: int = 0
    unchanged: int = 0
    removed: int = 0
    empty: int = 0
    chunks: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"{self.written} documents written ({self.chunks} chunks embedded), {self.unchanged} unchanged, "
            f"{self.removed} removed, {self.empty} without text; {self.seconds:.1f} s"
        )


def beir_hash(doc: dict, spec: ModelSpec, options: ChunkingOptions) -> str:
    h = hashlib.sha256()
    h.update(
        f"pgkb-eval-beir-{EVAL_CHUNKER_VERSION}|{options.fingerprint()}|{spec.name}|{spec.passage_prefix}|".encode()
    )
    h.update(json.dumps([doc.get("title") or "", doc.get("text") or ""], ensure_ascii=False).encode())
    return h.hexdigest()


def beir_document(doc: dict, options: ChunkingOptions) -> ChunkedDocument:
    """A corpus entry as a document: the text through chunk_text, the BEIR title as the document title."""
    title = (doc.get("title") or "").strip()
    text = doc.get("text") or ""
    if not text.strip():
        text = title
    chunked = chunk_text(text, "", options) if text.strip() else ChunkedDocument("", {}, [], "text")
    return dataclasses.replace(chunked, title=title[:1000], metadata={"beir_id": doc["_id"]})


def _stderr(message: str, end: str = "\n") -> None:
    sys.stderr.write(message + end)
    sys.stderr.flush()


def load_beir_corpus(
    conn,
    kb: str,
    corpus: list[dict],
    spec: ModelSpec,
    embedder: Embedder,
    *,
    batch: int = 16,
    options: ChunkingOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> LoadSummary:
    """Sync the corpus into ``kb``: unchanged documents (same hash) are skipped, the rest chunked, embedded
    in batches of ``batch`` texts and written with kb.replace_document; documents not in the corpus go."""
    options = options or ChunkingOptions()
    started = time.monotonic()
    summary = LoadSummary()
    if not conn.execute("select 1 from kb.list_knowledge_bases() where name = %s", [kb]).fetchone():
        conn.execute("select kb.create_knowledge_base(%s, description => %s)", [kb, EVAL_DESCRIPTION])
    known = dict(conn.execute("select doc_key, content_hash from kb.list_documents(%s)", [kb]).fetchall())
    todo: list[tuple[dict, str]] = []
    for doc in corpus:
        digest = beir_hash(doc, spec, options)
        if known.get(doc["_id"]) == digest:
            summary.unchanged += 1
        else:
            todo.append((doc, digest))

    group: list[tuple[str, ChunkedDocument, str]] = []
    n_texts = 0

    def flush() -> None:
        nonlocal group, n_texts
        texts = [
            t for _key, d, _h in group for t in prefixed(spec, d.embedding_texts(options.heading_prefix), query=False)
        ]
        vectors = []
        for i in range(0, len(texts), batch):
            vectors.extend(embedder.embed(texts[i : i + batch]))
        pos = 0
        with conn.transaction():
            for key, d, digest in group:
                chunks = d.chunks_json()
                for chunk in chunks:
                    chunk["embedding"] = [float(x) for x in vectors[pos]]
                    pos += 1
                conn.execute(
                    "select kb.replace_document(kb => %s, doc_key => %s, title => %s, chunks => %s,"
                    " metadata => %s, source_type => 'text', content_hash => %s, model => %s)",
                    [kb, key, d.title, json.dumps(chunks, ensure_ascii=False),
                     json.dumps(d.metadata, ensure_ascii=False), digest, spec.name],
                )  # fmt: skip
        summary.written += len(group)
        summary.chunks += len(texts)
        group, n_texts = [], 0

    for i, (doc, digest) in enumerate(todo, 1):
        chunked = beir_document(doc, options)
        if not chunked.chunks:
            summary.empty += 1
            if doc["_id"] in known:
                conn.execute("select kb.delete_document(%s, %s)", [kb, doc["_id"]])
            continue
        group.append((doc["_id"], chunked, digest))
        n_texts += len(chunked.chunks)
        if n_texts >= batch or i == len(todo):
            flush()
            if progress:
                rate = summary.chunks / max(time.monotonic() - started, 1e-9)
                progress(f"\rembedding: {i}/{len(todo)} documents, {summary.chunks} chunks ({rate:.1f} chunks/s)")
    if group:
        flush()
    if todo and progress:
        progress("\n")
    ids = {doc["_id"] for doc in corpus}
    for key in sorted(set(known) - ids):
        if conn.execute("select kb.delete_document(%s, %s)", [kb, key]).fetchone()[0]:
            summary.removed += 1
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def prepare_kb(conn, kb: str, dataset: str) -> None:
    """Create the evaluation knowledge base, or check that an existing one is safe to sync.

    Loading deletes documents that are not in the dataset, so a knowledge base that holds documents and
    was not created by `pgkb eval` (description ``pgkb eval: ...``) is refused."""
    row = conn.execute(
        "select description, document_count from kb.list_knowledge_bases() where name = %s", [kb]
    ).fetchone()
    if row is None:
        conn.execute("select kb.create_knowledge_base(%s, description => %s)", [kb, f"{EVAL_DESCRIPTION}: {dataset}"])
    elif row[1] and not (row[0] or "").startswith(EVAL_DESCRIPTION):
        raise EvalError(
            f"knowledge base {kb!r} holds {row[1]} documents not loaded by pgkb eval; evaluating would replace"
            " them: pass another --kb"
        )


def missing_embeddings(conn, kb: str, spec: ModelSpec) -> int:
    """Chunks of ``kb`` without an embedding for the model (their vector results would be missing)."""
    return conn.execute(
        "select count(*) from kb.chunks as c join kb.knowledge_bases as k on k.id = c.kb_id"
        " where k.name = %s and not exists (select from kb.embeddings as e join kb.embedding_models as m"
        " on m.id = e.model_id where e.chunk_id = c.id and m.name = %s)",
        [kb, spec.name],
    ).fetchone()[0]


# ------------------------------------------------------------------------------------------- searching


# kb.hybrid_search's settings a run may set, with their types; the defaults are the database's own
# (kb.search_defaults()), which it applies to every setting passed as NULL.
SETTING_TYPES: dict[str, type] = {
    "fusion": str,
    "rrf_k": float,
    "vector_weight": float,
    "lexical_weight": float,
    "fuzzy_weight": float,
    "candidates": int,
    "bm25_k1": float,
    "bm25_b": float,
}


@dataclass(frozen=True)
class SearchSettings:
    """kb.hybrid_search's settings for a run; None leaves one to the database (kb.search_defaults()), which
    also checks them (a bad value is the database's clear error). depth and rerank_depth are this tool's."""

    rrf_k: float | None = None
    vector_weight: float | None = None
    lexical_weight: float | None = None
    fuzzy_weight: float | None = None
    candidates: int | None = None
    bm25_k1: float | None = None
    bm25_b: float | None = None
    rerank_depth: int = 40
    depth: int = DEFAULT_DEPTH  # chunks fetched per query (deduplicated to documents afterwards)
    fusion: str | None = None

    def validate(self) -> None:
        if not 1 <= self.depth <= MAX_TOP_K:
            raise EvalError(f"--depth must be between 1 and {MAX_TOP_K}")
        if not 1 <= self.rerank_depth <= MAX_TOP_K:
            raise EvalError(f"--rerank-depth must be between 1 and {MAX_TOP_K}")


def search_mode(conn, mode: str, query: str, embedding, kb: str, spec: ModelSpec, s: SearchSettings, reranker=None):
    """(document keys in rank order (deduplicated), milliseconds) for one query in one mode, through the
    search client's own SQL call and reranker (pgkb.search.query_rows / rerank)."""
    leg = "hybrid" if mode == "hybrid+rerank" else mode
    given = {
        "query_embedding": embedding, "model": spec.name, "vector_weight": s.vector_weight,
        "lexical_weight": s.lexical_weight, "fuzzy_weight": s.fuzzy_weight, "rrf_k": s.rrf_k,
        "candidates": s.candidates, "bm25_k1": s.bm25_k1, "bm25_b": s.bm25_b, "fusion": s.fusion,
    }  # fmt: skip
    settings = {k: v for k, v in given.items() if k in MODE_SETTINGS[leg] and v is not None}
    top_k = max(s.depth, s.rerank_depth) if mode == "hybrid+rerank" else s.depth
    started = time.perf_counter()
    hits, _ = query_rows(conn, leg, query, top_k, kb, **settings)
    if mode == "hybrid+rerank" and hits:
        hits = rerank(reranker, query, hits[: s.rerank_depth]) + hits[s.rerank_depth :]
    ms = (time.perf_counter() - started) * 1000
    return dedupe(h.doc_key for h in hits), ms


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


def evaluate(
    conn,
    dataset: Dataset,
    kb: str,
    modes: Sequence[str],
    spec: ModelSpec,
    embedder: Embedder,
    settings: SearchSettings,
    *,
    reranker=None,
    batch: int = 16,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Embed every query once, run it in every mode, and return the JSON report."""
    queries = dataset.queries
    texts = prefixed(spec, [q.text for q in queries], query=True)
    embeddings = []
    for i in range(0, len(texts), batch):
        embeddings.extend(_vector(v) for v in embedder.embed(texts[i : i + batch]))
        if progress:
            progress(f"\rembedding queries: {min(i + batch, len(texts))}/{len(texts)}")
    if progress:
        progress("\n")
    results = {m: ModeResult() for m in modes}
    for mode in modes:  # warm-up (caches, plans), not timed
        search_mode(conn, mode, queries[0].text, embeddings[0], kb, spec, settings, reranker)
    for n, (q, emb) in enumerate(zip(queries, embeddings, strict=True), 1):
        for mode in modes:
            ranked, ms = search_mode(conn, mode, q.text, emb, kb, spec, settings, reranker)
            results[mode].ranked.append(ranked)
            results[mode].latencies_ms.append(ms)
        if progress and (n % 10 == 0 or n == len(queries)):
            progress(f"\rsearching: {n}/{len(queries)} queries x {len(modes)} modes")
    if progress:
        progress("\n")
    return {
        "dataset": dataset.name,
        "model": spec.name,
        "n_queries": len(queries),
        "modes": {m: score_mode(queries, results[m], dataset.any_relevant) for m in modes},
    }


def _vector(values):
    from pgvector import Vector

    return Vector([float(x) for x in values])


def markdown(report: dict[str, Any], kb: str | None = None) -> str:
    """The report as Markdown: one row per mode, then recall@5 per kind (when the queries have kinds)."""
    head = f"### {report['dataset']} — {report['n_queries']} queries, model {report['model']}"
    lines = [head + (f", kb `{kb}`" if kb else ""), ""]
    lines.append("| mode | R@1 | R@5 | R@10 | MRR@10 | nDCG@10 | p50 ms | p95 ms |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode, m in report["modes"].items():
        lines.append(
            f"| {mode} | {m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['recall@10']:.3f} | {m['mrr@10']:.3f}"
            f" | {m['ndcg@10']:.3f} | {m['p50_ms']:.1f} | {m['p95_ms']:.1f} |"
        )
    kinds = sorted({k for m in report["modes"].values() for k in m["by_kind"]})
    if kinds:
        modes = list(report["modes"])
        lines += ["", "Recall@5 by kind:", ""]
        lines.append("| kind | n | " + " | ".join(modes) + " |")
        lines.append("|---|---:|" + "---:|" * len(modes))
        for kind in kinds:
            n = next(m["by_kind"][kind]["n"] for m in report["modes"].values() if kind in m["by_kind"])
            cells = [f"{report['modes'][m]['by_kind'].get(kind, {}).get('recall@5', 0):.3f}" for m in modes]
            lines.append(f"| {kind} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- CLI


def _modes(raw: str | None, rerank_available: bool) -> list[str]:
    if raw is None:
        return [m for m in MODES if m != "hybrid+rerank" or rerank_available]
    modes = [m.strip() for m in raw.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise EvalError(f"unknown mode {unknown[0]!r}: choose from {', '.join(MODES)}")
    if not modes:
        raise EvalError("--modes is empty")
    if "hybrid+rerank" in modes and not rerank_available:
        raise EvalError("mode hybrid+rerank needs a reranker: set PGKB_RERANK_MODEL or PGKB_RERANK_URL")
    return dedupe(modes)


def load_dataset(args, warn: Callable[[str], None]) -> Dataset:
    if args.beir_dir and args.beir and Path(args.beir_dir).resolve() != Path(args.beir).resolve():
        raise EvalError(f"two BEIR folders given ({args.beir_dir} and --beir {args.beir}): give one")
    beir_dir = args.beir or args.beir_dir
    if beir_dir and (args.docs or args.questions):
        raise EvalError("give either a BEIR folder or --docs with --questions, not both")
    if beir_dir:
        return load_beir(Path(beir_dir), warn)
    if args.docs and args.questions:
        return load_questions(Path(args.docs), Path(args.questions))
    if args.docs or args.questions:
        raise EvalError("doc-questions mode needs both --docs DIR and --questions FILE.jsonl")
    raise EvalError("nothing to evaluate: give a BEIR folder or --docs DIR --questions FILE.jsonl")


def configured_embedder(conn, settings, embedder: Embedder | None) -> tuple[ModelSpec, Embedder]:
    """The default model's registry entry and an embedder for it (``embedder`` if given, else the one the
    settings configure); EvalError when it cannot be loaded."""
    from pgkb.models.embedding import EmbeddingError, load_embedder, model_spec

    spec = model_spec(conn, settings.embed_model)
    try:
        return spec, embedder or load_embedder(settings, spec)
    except (EmbeddingError, OSError, ImportError) as e:
        raise EvalError(f"cannot load the embedder: {e}") from e


def run(args, settings, *, embedder: Embedder | None = None, reranker=None) -> int:
    """`pgkb eval`: load (or reuse) the dataset's knowledge base, evaluate, print Markdown, write --out.

    ``embedder`` / ``reranker`` None: the ones ``settings`` and the environment configure."""
    from pgkb.db import connect, database_url
    from pgkb.ingest import IngestOptions, ingest
    from pgkb.models.rerank import RerankError, load_reranker
    from pgkb.search import SearchOptions

    def fail(message: str) -> int:
        print(f"pgkb: eval: {message}", file=sys.stderr)
        return 2

    def warn(message: str) -> None:
        print(f"pgkb: eval: warning: {message}", file=sys.stderr)

    try:
        if args.max_queries is not None and args.max_queries < 1:
            raise EvalError("--max-queries must be at least 1")
        dataset = load_dataset(args, warn)
        if reranker is None:
            reranker = load_reranker()
        modes = _modes(args.modes, reranker is not None)
        rerank_depth = args.rerank_depth or SearchOptions.from_env().rerank_depth
        search_settings = SearchSettings(
            args.rrf_k, args.vector_weight, args.lexical_weight, args.fuzzy_weight, args.candidates,
            args.bm25_k1, args.bm25_b, rerank_depth, args.depth, args.fusion,
        )  # fmt: skip
        search_settings.validate()
        chunking = ChunkingOptions(
            max_chars=args.chunk_chars, overlap=args.chunk_overlap, heading_prefix=args.heading_prefix
        )
        kb = args.kb or default_kb(dataset.name)
    except (EvalError, RerankError, ValueError) as e:
        return fail(str(e))
    dataset.queries = sample(dataset.queries, args.max_queries, args.seed)
    progress = _Progress()

    url = database_url(settings)
    with connect(url) as conn:
        try:
            spec, embedder = configured_embedder(conn, settings, embedder)
            prepare_kb(conn, kb, dataset.name)
        except EvalError as e:
            return fail(str(e))
        _stderr(f"pgkb: eval: {dataset.name} -> kb {kb} (model {spec.name}, modes {', '.join(modes)})")
        if dataset.docs_dir is None:
            summary = load_beir_corpus(
                conn, kb, dataset.corpus, spec, embedder, batch=settings.embed_batch, options=chunking,
                progress=progress,
            )  # fmt: skip
            _stderr(f"pgkb: eval: {summary.line()}")
        else:
            isummary = ingest(
                conn,
                url,
                dataset.docs_dir,
                kb,
                spec,
                embedder,
                IngestOptions(chunking=chunking),
                progress=sys.stderr.isatty(),
            )
            _stderr(f"pgkb: eval: ingest: {isummary.line()}")
            for failure in isummary.failures:
                warn(f"failed {failure['doc_key']}: {failure['error']}")
            keys = {r[0] for r in conn.execute("select doc_key from kb.list_documents(%s)", [kb]).fetchall()}
            absent = sorted({p for q in dataset.queries for p in q.relevant} - keys)
            if absent:
                warn(f"{len(absent)} relevant files are not in kb {kb} (no text or failed): {', '.join(absent[:5])}")
        conn.execute("analyze kb.documents, kb.chunks, kb.embeddings, kb.term_stats")  # fresh planner stats
        if getattr(args, "answerability", False):  # the not-found gate instead of the search modes
            from pgkb.quality import answerability

            try:
                return answerability.run_loaded(conn, args, dataset, kb, spec, embedder, settings.embed_batch, progress)
            except EvalError as e:
                return fail(str(e))
        lacking = missing_embeddings(conn, kb, spec)
        if lacking and any(m != "lexical" and m != "fuzzy" for m in modes):
            warn(f"{lacking} chunks of {kb} have no {spec.name} embedding: vector results are incomplete")
        report = evaluate(
            conn, dataset, kb, modes, spec, embedder, search_settings,
            reranker=reranker, batch=settings.embed_batch, progress=progress,
        )  # fmt: skip
    print(markdown(report, kb))
    if args.out:
        Path(args.out).write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return 0


class _Progress:
    """Progress lines on stderr: rewritten in place on a terminal, else at most one line every 10 s."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.pending = ""

    def __call__(self, message: str) -> None:
        if self.tty:
            sys.stderr.write(message)
        elif message == "\n":
            if self.pending:
                sys.stderr.write(self.pending + "\n")
            self.pending = ""
        else:
            self.pending = message.lstrip("\r")
            if time.monotonic() - self.last >= 10:
                sys.stderr.write(self.pending + "\n")
                self.last, self.pending = time.monotonic(), ""
        sys.stderr.flush()
