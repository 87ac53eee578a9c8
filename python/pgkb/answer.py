"""`pgkb ask`: an answer with numbered citations from ``kb.ask``, streamed as it arrives.

``ask(conn, question, ...)`` calls ``kb.ask(question, top_k, kb, mode => ..., stream => true)`` in one
transaction that sets ``pgkb.acting_user`` (when ``user`` is given; the connection must then belong to a
member of pgkb_service) and ``statement_timeout``, both transaction-local. While the chat endpoint streams,
the database sends every delta as a NOTICE ``pgkb-delta:<text>``; a notice handler on the connection
hands each one to ``on_delta`` as it arrives, so the answer is printed before the statement ends. Retrieval,
the not-found gate, citation checking and the extractive answer are all the database's (kb.ask); this
module only prints.

The printed form: the answer (streamed when the endpoint streams; else printed whole), a blank line, then
the numbered sources ``[n] title > headings (page p) — source URL or kb://<kb>/<doc_key>``. ``--json``
prints kb.ask's row as one JSON object instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

DELTA_PREFIX = "pgkb-delta:"  # kb.chat_completion's NOTICE prefix for a streamed delta (64_chat_http.sql)
MODES = ("auto", "llm", "extractive")
COLUMNS = (
    "answer",
    "found",
    "citations",
    "mode",
    "model",
    "evidence",
    "dropped_citations",
    "uncited",
    "retrieve_ms",
    "generate_ms",
    "total_ms",
)


class AskError(ValueError):
    """A question kb.ask refuses (blank, too long, unknown kb, mode 'llm' without an endpoint ...): the
    database's message, meant for people and models."""


def ask(
    conn,
    question: str,
    *,
    top_k: int = 5,
    kb: str | None = None,
    mode: str | None = None,
    user: str | None = None,
    timeout_ms: int = 0,
    on_delta: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """kb.ask's row as a dict (keys COLUMNS). ``on_delta``: called with each streamed piece of the answer
    (only when the answer comes from a streaming chat endpoint). AskError for input the database refuses."""
    import psycopg

    def notice(diag) -> None:
        message = diag.message_primary or ""
        if on_delta is not None and message.startswith(DELTA_PREFIX):
            on_delta(message[len(DELTA_PREFIX) :])

    conn.add_notice_handler(notice)
    try:
        with conn.transaction():
            if user is not None:
                conn.execute("select set_config('pgkb.acting_user', %s, true)", [user])
            conn.execute("select set_config('statement_timeout', %s, true)", [str(timeout_ms)])
            row = conn.execute(
                f"select {', '.join(COLUMNS)} from kb.ask(%s, top_k => %s, kb => %s, mode => %s, stream => %s)",
                [question, top_k, kb, mode, on_delta is not None],
            ).fetchone()
    except (
        psycopg.errors.InvalidParameterValue,
        psycopg.errors.ProgramLimitExceeded,
        psycopg.errors.FeatureNotSupported,
        psycopg.errors.NoDataFound,
    ) as e:
        message = e.diag.message_primary or str(e)
        if e.diag.message_hint:
            message += f" ({e.diag.message_hint})"
        raise AskError(message) from None
    finally:
        conn.remove_notice_handler(notice)
    return dict(zip(COLUMNS, row, strict=True))


def source_line(citation: dict[str, Any]) -> str:
    """``[n] title > headings (page p) — source``: where a citation points."""
    parts = [citation.get("title") or citation.get("doc_key") or ""]
    parts += [h for h in citation.get("heading_path") or [] if h]
    line = f"[{citation['n']}] " + " > ".join(p for p in parts if p)
    if citation.get("page") is not None:
        line += f" (page {citation['page']})"
    return line + f" — {citation.get('source_url') or citation.get('uri')}"


def add_arguments(parser) -> None:
    """The `pgkb ask` options (argparse)."""
    parser.add_argument("question", help="the question (Chinese or English)")
    parser.add_argument("--kb", default=None, help="answer from one knowledge base (default: all you can see)")
    parser.add_argument("--top-k", type=int, default=5, help="sources retrieved (1..100, default 5)")
    parser.add_argument(
        "--mode", choices=MODES, default=None,
        help="llm: the chat endpoint (kb.settings chat_url); extractive: sentences of the sources, offline; "
        "default auto (llm when an endpoint is configured)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print kb.ask's row as one JSON object")
    parser.add_argument(
        "--user", default=None, help="act as this pgkb user (the connection must be a member of pgkb_service)"
    )


def run(args, settings) -> int:
    """`pgkb ask`: stream the answer, then the numbered sources. Exit 2 on a question the database refuses,
    1 on a timeout; a "not found" answer is exit 0 (it is an answer)."""
    import psycopg

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
                conn, args.question, top_k=args.top_k, kb=args.kb, mode=args.mode, user=args.user,
                timeout_ms=timeout_ms, on_delta=None if args.json else on_delta,
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
    notes = []
    if row["mode"] == "extractive":
        notes.append("extractive answer (sentences of the sources; no chat endpoint used)")
    if row["uncited"]:
        notes.append("the answer cites no source")
    if (row["evidence"] or {}).get("llm_error"):
        notes.append(f"chat endpoint failed: {row['evidence']['llm_error']}")
    for note in notes:
        print(f"pgkb: ask: {note}", file=sys.stderr)
    print(
        f"-- {row['mode']} in {row['total_ms']:.0f} ms (retrieve {row['retrieve_ms']:.0f}, "
        f"generate {row['generate_ms']:.0f})",
        file=sys.stderr,
    )
    return 0
