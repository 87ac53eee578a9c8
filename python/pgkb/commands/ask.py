"""`pgkb ask QUESTION`: the answer of kb.ask, streamed as the chat endpoint sends it (NOTICEs through a
notice handler, pgkb.answer), then the numbered sources: ``[n] title > headings (page p) — URL or kb:// URI``;
notes (extractive, lexical only, a failed chat endpoint ...: pgkb.answer.notes) go to stderr. ``--json``
prints kb.ask's row as one JSON object. Exit 0 for an answer and for "not found", 2 for a question the
database refuses, 1 for a timeout."""

from __future__ import annotations

import json
import sys

MODES = ("auto", "llm", "extractive")  # kb.ask mode; NULL = auto


def register(sub) -> None:
    parser = sub.add_parser("ask", help="answer a question with numbered citations (kb.ask), or say not found")
    parser.add_argument("question", help="the question (Chinese or English)")
    parser.add_argument("--kb", default=None, help="answer from one knowledge base (default: all you can see)")
    parser.add_argument("--top-k", type=int, default=5, help="sources retrieved (default 5; kb.limits() top_k at most)")
    parser.add_argument(
        "--mode", choices=MODES, default=None,
        help="llm: the chat endpoint (kb.settings chat_url); extractive: passages of the sources, offline; "
        "default auto (llm when an endpoint is configured)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print kb.ask's row as one JSON object")
    parser.add_argument(
        "--also",
        action="append",
        default=None,
        metavar="PHRASING",
        help="another phrasing of the question, e.g. its translation into the knowledge's language (repeatable)",
    )
    parser.add_argument(
        "--user", default=None, help="act as this pgkb user (the connection must be a member of pgkb_service)"
    )
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    """`pgkb ask`: stream the answer, then the numbered sources. Exit 2 on a question the database refuses,
    1 on a timeout; a "not found" answer is exit 0 (it is an answer)."""
    import psycopg

    from pgkb.answer import AskError, ask, notes, source_line
    from pgkb.db import connect, database_url
    from pgkb.search import SearchOptions

    try:
        timeout_ms = SearchOptions.from_env().statement_timeout_ms
    except ValueError as e:
        print(f"pgkb: ask: {e}", file=sys.stderr)
        return 2
    streamed: list[str] = []

    def on_delta(piece: str) -> None:
        streamed.append(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()

    with connect(database_url(settings)) as conn:
        try:
            row = ask(
                conn, settings, args.question, top_k=args.top_k, kb=args.kb, mode=args.mode, user=args.user,
                timeout_ms=timeout_ms, on_delta=None if args.json else on_delta, also=args.also, entry_point="cli",
            )  # fmt: skip
        except AskError as e:
            print(f"pgkb: ask: {e}", file=sys.stderr)
            return 2
        except psycopg.errors.QueryCanceled:
            print(f"pgkb: ask: timed out after {timeout_ms} ms (PGKB_STATEMENT_TIMEOUT_MS)", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(row, ensure_ascii=False, default=str))
        return 0
    if streamed:
        # the streamed text is the model's raw answer; kb.cite removed citations naming no source
        if row["dropped_citations"]:
            print(f"\n\n(checked answer: {row['dropped_citations']} citations named no source and were removed)")
            print(row["answer"])
        else:
            print()
    else:
        print(row["answer"])
    if row["citations"]:
        print("\nSources:")
        for citation in row["citations"]:
            print(source_line(citation))
    for note in notes(row):
        print(f"pgkb: ask: {note}", file=sys.stderr)
    print(
        f"-- {row['mode']} in {row['total_ms']:.0f} ms (retrieve {row['retrieve_ms']:.0f}, "
        f"generate {row['generate_ms']:.0f})",
        file=sys.stderr,
    )
    question_id = (row["evidence"] or {}).get("question_id")
    if question_id is not None:
        print(f"-- logged as question {question_id}: rate it with `pgkb rate {question_id} up|down`", file=sys.stderr)
    return 0
