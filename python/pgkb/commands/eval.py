"""`pgkb eval`: retrieval quality (Recall@k, MRR, nDCG) per search mode on a BEIR set, doc questions or a
knowledge base's helpful-rated logged questions (--from-log); with --answerability, the not-found gate
(pgkb.quality.answerability)."""

from __future__ import annotations


def register(sub) -> None:
    from pgkb.chunking import ChunkingOptions
    from pgkb.quality.evaluate import FUSIONS, MODES, SearchSettings

    parser = sub.add_parser(
        "eval", help="retrieval quality: Recall@k, MRR, nDCG per search mode (BEIR or doc questions)"
    )
    parser.add_argument("beir_dir", nargs="?", help="BEIR folder (corpus.jsonl, queries.jsonl, qrels.tsv)")
    parser.add_argument("--beir", metavar="DIR", help="the same as the positional BEIR folder (as in pgkb sweep)")
    parser.add_argument("--docs", help="doc-questions: folder of documents to ingest (paths are doc keys)")
    parser.add_argument("--questions", help="doc-questions: JSONL of {id, query, relevant: [paths], kind}")
    parser.add_argument(
        "--from-log", action="store_true",
        help="replay --kb's logged questions rated helpful, judged on the documents their answers cited (its owner)",
    )  # fmt: skip
    parser.add_argument(
        "--since", default="90 days", help="--from-log: how far back (an interval: 30 days, 12h; default 90 days)"
    )
    parser.add_argument(
        "--kb", default=None, help="knowledge base to load into (default eval-<dataset>); --from-log: the one to replay"
    )
    parser.add_argument(
        "--modes", default=None, help=f"comma-separated, of {', '.join(MODES)} (default: all available)"
    )
    parser.add_argument("--out", default=None, help="write the report as JSON to this file")
    parser.add_argument("--max-queries", type=int, default=None, help="evaluate a seeded sample of N queries")
    parser.add_argument("--seed", type=int, default=0, help="sample seed for --max-queries (default 0)")
    parser.add_argument(
        "--queries", metavar="FILE.jsonl", default=None,
        help="ask these questions instead (e.g. translations): {_id or id, text or query} per judged question id",
    )  # fmt: skip
    parser.add_argument(
        "--mixed", action="store_true",
        help="search every knowledge base you can read, judged on this dataset's (cross-collection/language)",
    )  # fmt: skip
    d = SearchSettings()
    db_default = "default: the database's, SELECT * FROM kb.search_defaults()"
    parser.add_argument("--fusion", default=None, choices=FUSIONS, help=f"how hybrid fuses the legs ({db_default})")
    parser.add_argument("--rrf-k", type=float, default=None, help=f"RRF k ({db_default})")
    parser.add_argument("--vector-weight", type=float, default=None, help=db_default)
    parser.add_argument("--lexical-weight", type=float, default=None, help=db_default)
    parser.add_argument("--fuzzy-weight", type=float, default=None, help=db_default)
    parser.add_argument("--candidates", type=int, default=None, help=f"rows per leg before fusion ({db_default})")
    parser.add_argument("--bm25-k1", type=float, default=None, help=db_default)
    parser.add_argument("--bm25-b", type=float, default=None, help=db_default)
    parser.add_argument(
        "--rerank-depth", type=int, default=None, help="fused chunks reranked (default PGKB_RERANK_DEPTH or 40)"
    )
    parser.add_argument(
        "--depth", type=int, default=d.depth, help=f"chunks fetched per query (default {d.depth}; max 100)"
    )
    c = ChunkingOptions()
    parser.add_argument("--chunk-chars", type=int, default=c.max_chars, help="chunk size in characters")
    parser.add_argument("--chunk-overlap", type=int, default=c.overlap, help="characters repeated between chunks")
    parser.add_argument(
        "--no-heading-prefix", dest="heading_prefix", action="store_false",
        help="embed chunk content without the 'title > heading' breadcrumb line (experiment)",
    )  # fmt: skip
    from pgkb.quality import answerability

    answerability.add_arguments(parser)  # --answerability, --thresholds, --gate-grid, --top-k, --unrelated
    parser.add_argument(
        "--ask", action="store_true",
        help="kb.ask each question (extractive, top_k 5): right / wrong topic / refused; --unrelated questions "
        "are counted refused or answered",
    )  # fmt: skip
    parser.add_argument(
        "--with-translation", action="store_true",
        help='--ask: also pass each question\'s "translation" field as another phrasing (also)',
    )  # fmt: skip
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.quality import evaluate

    return evaluate.run(args, settings)
