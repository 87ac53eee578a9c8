"""`pgkb eval`: retrieval quality of each search mode on a judged dataset (pgkb.quality.datasets).

The dataset's documents go into a knowledge base of its own (``--kb``, default ``eval-<dataset>``, the
dataset being the BEIR folder's name or the folder holding the questions file), loaded through the ingest
engine (pgkb.ingest, as `pgkb ingest` writes: incremental by content hash, one transaction per document,
failures recorded; embedded in batches of PGKB_EMBED_BATCH texts across documents): a re-run skips
unchanged documents and deletes documents no longer in the dataset.

Modes: ``vector`` (kb.vector_search), ``lexical`` (kb.lexical_search, --bm25-k1/--bm25-b), ``fuzzy``
(kb.fuzzy_search: BM25 of the query with its terms' corrections from the vocabulary; the BM25 ranking
when no term needs one), ``hybrid``
(kb.hybrid_search with the weights, rrf_k, candidates and BM25 settings given) and ``hybrid+rerank`` (the
fused top --rerank-depth reordered by the configured reranker, PGKB_RERANK_URL / PGKB_RERANK_MODEL; only
offered when one is configured), all through the search client (pgkb.search). Each query is embedded once
(registry query prefix) and the embedding is passed to every mode (``query_embedding``), so latency is the
search call alone (plus the rerank call in hybrid+rerank), measured client-side around execute + fetch,
after one untimed warm-up query per mode (and an ANALYZE of the kb tables after loading). A search returns
--depth chunks per query (default 50), scored on their documents (pgkb.quality.metrics).

Output: a Markdown table per dataset on stdout, progress on stderr, and with ``--out FILE.json``::

    {"dataset", "model", "n_queries", "modes": {"<mode>": {"recall@1", "recall@5", "recall@10", "mrr@10",
     "ndcg@10", "p50_ms", "p95_ms", "by_kind": {"<kind>": {"recall@5", "n"}}}}}
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pgkb.chunking import ChunkingOptions
from pgkb.ingest import IngestOptions, IngestSummary, ingest, ingest_documents
from pgkb.limits import api_limit
from pgkb.models.embedding import Embedder, ModelSpec
from pgkb.quality.datasets import (
    Dataset,
    EvalError,
    beir_documents,
    default_kb,
    load_beir,
    load_questions,
    load_rated_questions,
    replace_queries,
    sample,
)
from pgkb.quality.metrics import ModeResult, dedupe, score_mode
from pgkb.quality.searching import (  # FUSIONS, SETTING_TYPES: `pgkb eval`'s too
    FUSIONS,
    SETTING_TYPES,
    SearchSettings,
    embed_queries,
    search_mode,
    unlogged,
)

__all__ = ["FUSIONS", "MODES", "SETTING_TYPES", "SearchSettings", "evaluate", "markdown", "run"]

MODES = ("vector", "lexical", "fuzzy", "hybrid", "hybrid+rerank")
EVAL_DESCRIPTION = "pgkb eval"  # description prefix of the knowledge bases pgkb eval creates


# ------------------------------------------------------------------------------------------- loading


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


def load_kb(
    conn, url: str, kb: str, dataset: Dataset, spec: ModelSpec, embedder: Embedder, options: IngestOptions, progress
) -> IngestSummary:
    """Sync the dataset's documents into ``kb`` through the ingest engine: the BEIR corpus as titled texts,
    the doc-questions folder as files (as `pgkb ingest` does). Raises IngestAborted when the database is lost."""
    if dataset.docs_dir is not None:
        return ingest(conn, url, dataset.docs_dir, kb, spec, embedder, options, progress=sys.stderr.isatty())

    def show(done: int, total: int, _key: str) -> None:
        progress(f"\rloading: {done}/{total} documents")
        if done == total:
            progress("\n")

    return ingest_documents(conn, url, kb, spec, embedder, beir_documents(dataset.corpus, spec), options, progress=show)


# ------------------------------------------------------------------------------------------- the run


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
    mixed: bool = False,
) -> dict[str, Any]:
    """Embed every query once, run it in every mode, and return the JSON report. ``mixed``: search every
    knowledge base the connection can read, judged on ``kb``'s documents (the others only compete)."""
    queries = dataset.queries
    embeddings = embed_queries(
        conn, spec, embedder, [q.text for q in queries], batch, progress, kb=None if mixed else kb
    )
    results = {m: ModeResult() for m in modes}
    for mode in modes:  # warm-up (caches, plans), not timed
        search_mode(conn, mode, queries[0].text, embeddings[0], kb, spec, settings, reranker, mixed=mixed)
    for n, (q, emb) in enumerate(zip(queries, embeddings, strict=True), 1):
        for mode in modes:
            ranked, ms = search_mode(conn, mode, q.text, emb, kb, spec, settings, reranker, mixed=mixed)
            results[mode].ranked.append(ranked)
            results[mode].latencies_ms.append(ms)
        if progress and (n % 10 == 0 or n == len(queries)):
            progress(f"\rsearching: {n}/{len(queries)} queries x {len(modes)} modes")
    if progress:
        progress("\n")
    searched = [kb]
    if mixed:
        searched = [r[0] for r in conn.execute("select name from kb.list_knowledge_bases() order by name")]
    return {
        "dataset": dataset.name,
        "model": spec.name,
        "n_queries": len(queries),
        "searched_kbs": searched,
        "modes": {m: score_mode(queries, results[m], dataset.any_relevant) for m in modes},
    }


def markdown(report: dict[str, Any], kb: str | None = None) -> str:
    """The report as Markdown: one row per mode, then recall@5 per kind (when the queries have kinds)."""
    head = f"### {report['dataset']} — {report['n_queries']} queries, model {report['model']}"
    lines = [head + (f", kb `{kb}`" if kb else ""), ""]
    others = [k for k in report.get("searched_kbs", []) if k != kb]
    if others:
        lines[-1:] = ["", f"Searched together with {', '.join(f'`{k}`' for k in others)} (mixed).", ""]
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


def select_modes(raw: str | None, rerank_available: bool) -> list[str]:
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
    from pgkb.ingest import IngestAborted
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
        if getattr(args, "mixed", False) and getattr(args, "answerability", False):
            raise EvalError("--mixed searches the search modes only; --answerability asks the set's own knowledge base")
        if getattr(args, "ask", False) and (getattr(args, "mixed", False) or getattr(args, "answerability", False)):
            raise EvalError("--ask asks the set's own knowledge base; it goes with neither --mixed nor --answerability")
        if getattr(args, "with_translation", False) and not getattr(args, "ask", False):
            raise EvalError("--with-translation goes with --ask")
        from_log = getattr(args, "from_log", False)
        if from_log:
            check_from_log(args)
        dataset = None if from_log else load_dataset(args, warn)
        if reranker is None:
            reranker = load_reranker()
        modes = select_modes(args.modes, reranker is not None)
        rerank_depth = args.rerank_depth or SearchOptions.from_env().rerank_depth
        search_settings = SearchSettings(
            args.rrf_k, args.vector_weight, args.lexical_weight, args.fuzzy_weight, args.candidates,
            args.bm25_k1, args.bm25_b, rerank_depth, args.depth, args.fusion,
        )  # fmt: skip
        search_settings.validate()
        chunking = ChunkingOptions(
            max_chars=args.chunk_chars, overlap=args.chunk_overlap, heading_prefix=args.heading_prefix
        )
        kb = (args.kb or default_kb(dataset.name)) if dataset else args.kb
    except (EvalError, RerankError, ValueError) as e:
        return fail(str(e))
    if dataset is not None:
        if getattr(args, "queries", None):
            try:
                replace_queries(dataset, Path(args.queries))
            except EvalError as e:
                return fail(str(e))
        dataset.queries = sample(dataset.queries, args.max_queries, args.seed)
    progress = _Progress()

    url = database_url(settings)
    with connect(url) as conn:
        unlogged(conn)
        try:
            search_settings.validate(api_limit(conn, "top_k"))
            spec, embedder = configured_embedder(conn, settings, embedder)
            if dataset is None:  # --from-log: the knowledge base as it is, its rated questions
                report = evaluate_log(
                    conn, args, kb, modes, spec, embedder, search_settings,
                    reranker=reranker, batch=settings.embed_batch, progress=progress,
                )  # fmt: skip
                return write_report(report, kb, args.out)
            prepare_kb(conn, kb, dataset.name)
        except EvalError as e:
            return fail(str(e))
        _stderr(f"pgkb: eval: {dataset.name} -> kb {kb} (model {spec.name}, modes {', '.join(modes)})")
        options = IngestOptions(chunking=chunking, embed_batch=settings.embed_batch)
        try:
            summary = load_kb(conn, url, kb, dataset, spec, embedder, options, progress)
        except IngestAborted as e:
            print(f"pgkb: eval: loading stopped: {e}", file=sys.stderr)
            return 1
        _stderr(f"pgkb: eval: loaded: {summary.line()}")
        for failure in summary.failures:
            warn(f"failed {failure['doc_key']}: {failure['error']}")
        if summary.stopped:
            print(f"pgkb: eval: loading stopped early, nothing evaluated: {summary.stopped}", file=sys.stderr)
            return 1
        keys = {r[0] for r in conn.execute("select doc_key from kb.list_documents(%s)", [kb]).fetchall()}
        absent = sorted({d for q in dataset.queries for d in q.relevant} - keys)
        if absent:
            warn(f"{len(absent)} relevant documents are not in kb {kb} (no text or failed): {', '.join(absent[:5])}")
        conn.execute(
            "analyze kb.documents, kb.chunks, kb.embeddings, kb.term_stats, kb.term_blocks"
        )  # fresh planner stats
        if getattr(args, "ask", False):  # kb.ask's answers instead of the search modes
            from pgkb.quality import asking

            try:
                return asking.run_loaded(conn, args, settings, dataset, kb, spec, embedder, progress)
            except EvalError as e:
                return fail(str(e))
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
            reranker=reranker, batch=settings.embed_batch, progress=progress, mixed=getattr(args, "mixed", False),
        )  # fmt: skip
    return write_report(report, kb, args.out)


def check_from_log(args) -> None:
    """--from-log replays a knowledge base's own questions: it needs --kb and takes no dataset, no other
    questions and no --ask / --answerability / --mixed; EvalError otherwise."""
    if not args.kb:
        raise EvalError("--from-log needs --kb: the knowledge base whose logged questions are replayed")
    given = [
        flag for flag, value in (
            ("a BEIR folder", args.beir_dir or args.beir), ("--docs", args.docs), ("--questions", args.questions),
            ("--queries", getattr(args, "queries", None)), ("--ask", getattr(args, "ask", False)),
            ("--answerability", getattr(args, "answerability", False)), ("--mixed", getattr(args, "mixed", False)),
        ) if value
    ]  # fmt: skip
    if given:
        raise EvalError(
            f"--from-log replays the knowledge base's own questions; it goes with none of: {', '.join(given)}"
        )


def evaluate_log(
    conn, args, kb: str, modes: Sequence[str], spec: ModelSpec, embedder: Embedder, settings: SearchSettings,
    *, reranker=None, batch: int = 16, progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`pgkb eval --from-log --kb NAME`: the knowledge base's logged questions rated helpful (kb.rated_questions,
    judged on their answers' documents), searched in every mode over the knowledge base as it is (nothing is
    loaded; the replay is not logged); the report of any other set."""
    dataset = load_rated_questions(conn, kb, args.since)
    dataset.queries = sample(dataset.queries, args.max_queries, args.seed)
    _stderr(f"pgkb: eval: {len(dataset.queries)} rated questions of {kb} (model {spec.name}, modes {', '.join(modes)})")
    return evaluate(
        conn, dataset, kb, modes, spec, embedder, settings, reranker=reranker, batch=batch, progress=progress
    )


def write_report(report: dict[str, Any], kb: str, out: str | None) -> int:
    """The report as Markdown on stdout and, with ``out``, as JSON to that file."""
    print(markdown(report, kb))
    if out:
        Path(out).write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
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


def _stderr(message: str, end: str = "\n") -> None:
    sys.stderr.write(message + end)
    sys.stderr.flush()
