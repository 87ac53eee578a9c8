"""`pgkb search QUERY`: rank, score, title > headings, source and a snippet with the query's terms marked
(by the database's kb.snippet, so highlights fall where the lexical leg matched)."""

from __future__ import annotations

import json
import sys

BOLD = ("\033[1m", "\033[0m")


def register(sub) -> None:
    parser = sub.add_parser("search", help="hybrid search: rank, score, title > headings, source, snippet")
    parser.add_argument("query", help="what to search for (question or keywords)")
    parser.add_argument("--kb", default=None, help="search one knowledge base (default: all you can see)")
    parser.add_argument("--top-k", type=int, default=5, help="results to show (default 5; kb.limits() top_k at most)")
    parser.add_argument("--json", action="store_true", help="print the response as one JSON object")
    parser.add_argument(
        "--also", action="append", default=None, metavar="PHRASING",
        help="another phrasing of the question, e.g. its translation into the knowledge's language (repeatable; "
        "kb.limits() phrasings in all)",
    )  # fmt: skip
    parser.add_argument(
        "--user", default=None, help="act as this pgkb user (the connection must be a member of pgkb_service)"
    )
    parser.add_argument(
        "--no-rerank", action="store_true", help="do not rerank even if PGKB_RERANK_URL / PGKB_RERANK_MODEL is set"
    )
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    import psycopg

    from pgkb.db import connect, read_database_url
    from pgkb.models.embedding import EmbeddingError
    from pgkb.models.rerank import RerankError, load_reranker
    from pgkb.search import SearchOptions, search, snippets

    try:
        options = SearchOptions.from_env()
        reranker = None if args.no_rerank else load_reranker()
    except (ValueError, RerankError, EmbeddingError) as e:
        print(f"pgkb: search: {e}", file=sys.stderr)
        return 2
    with connect(read_database_url(settings)) as conn:  # PGKB_READ_DATABASE_URL when set
        try:
            response = search(
                conn,
                settings,
                args.query,
                args.top_k,
                args.kb,
                reranker=reranker,
                user=args.user,
                options=options,
                also=args.also,
                entry_point="cli",
            )
        except ValueError as e:
            print(f"pgkb: search: {e}", file=sys.stderr)
            return 2
        except psycopg.errors.QueryCanceled:
            print(
                f"pgkb: search: timed out after {options.statement_timeout_ms} ms (PGKB_STATEMENT_TIMEOUT_MS)",
                file=sys.stderr,
            )
            return 1
        if args.json:
            print(json.dumps(response.as_dict(), ensure_ascii=False, default=str))
            return 0
        marks = BOLD if sys.stdout.isatty() else ("", "")
        lines = snippets(conn, response.query, [h.content for h in response.results], 160, marks)
    if response.degraded:
        print(f"pgkb: degraded: {response.degraded_reason}", file=sys.stderr)
    if response.question_id is not None:
        qid = response.question_id
        print(f"-- logged as question {qid}: rate it with `pgkb rate {qid} up|down`", file=sys.stderr)
    if not response.results:
        print("no results" + (f" in {response.kb}" if response.kb else ""))
        return 0
    for rank, (hit, line) in enumerate(zip(response.results, lines, strict=True), 1):
        score = f"{hit.final_score:.4f}" + (" (rerank)" if hit.rerank_score is not None else "")
        print(f"{rank:>2}. [{score}] {hit.location()}")
        print(f"    {hit.source}  ({hit.kb})" + (f"; also in {', '.join(hit.also_in)}" if hit.also_in else ""))
        print(f"    {line}")
    t = response.timings_ms
    print(
        f"-- {len(response.results)} results in {t.get('total', 0):.0f} ms (embed {t.get('embed', 0):.0f}, "
        f"search {t.get('search', 0):.0f}" + (f", rerank {t['rerank']:.0f}" if "rerank" in t else "") + ")",
        file=sys.stderr,
    )
    return 0
