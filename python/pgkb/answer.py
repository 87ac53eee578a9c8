"""Answers with numbered citations from ``kb.ask``, streamed as they arrive (`pgkb ask`, the MCP tool).

``ask(conn, settings, question, ...)`` embeds the question (pgkb.search.embed_query, the one query embedding
of every Python path) and calls ``kb.ask(question, top_k, kb, mode => ..., stream => true, query_embedding =>
..., model => ...)`` -- or, when the embedding failed, ``vector_weight => 0``, so the database does not try
again, with ``evidence.lexical_only`` saying why -- in one transaction that sets ``pgkb.acting_user`` (when
``user`` is given; the connection must then belong to a member of pgkb_service) and ``statement_timeout``,
both transaction-local. While the chat endpoint streams,
the database sends every delta as a NOTICE ``pgkb-delta:<text>``; a notice handler on the connection
hands each one to ``on_delta`` as it arrives, so the answer is printed before the statement ends. Retrieval,
the not-found gate, citation checking and the extractive answer are all the database's (kb.ask); this
module only prints.

The printed form: the answer (streamed when the endpoint streams; else printed whole), a blank line, then
the numbered sources ``[n] title > headings (page p) — source URL or kb://<kb>/<doc_key>`` (``; also in
kb://…`` for the other documents holding the same text). ``--json`` prints kb.ask's row as one JSON object
instead. :func:`notes` says what a reader should know about an answer (extractive, lexical only, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pgkb.models.embedding import Embedder, ModelSpec
from pgkb.search import QUERY_EMBEDDING_FAILED, acting, check_also, check_input, embed_query

DELTA_PREFIX = "pgkb-delta:"  # kb_internal.chat_completion's NOTICE prefix for a streamed delta (64_chat_http.sql)
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
    settings,
    question: str,
    *,
    top_k: int = 5,
    kb: str | None = None,
    mode: str | None = None,
    user: str | None = None,
    timeout_ms: int = 0,
    on_delta: Callable[[str], None] | None = None,
    embedder: Embedder | None = None,
    spec: ModelSpec | None = None,
    also: Sequence[str] | None = None,
    entry_point: str | None = None,
) -> dict[str, Any]:
    """kb.ask's row as a dict (keys COLUMNS). ``on_delta``: called with each streamed piece of the answer
    (only when the answer comes from a streaming chat endpoint). ``embedder`` / ``spec`` as for
    pgkb.search.search (None: the configured ones); ``also``: other phrasings of the question, embedded in
    the same call; ``entry_point``: the caller, as the question log records it (pgkb.search.acting; the row's
    ``evidence.question_id`` is the logged question's, for kb.rate_answer). AskError for input the database
    refuses (checked before the question is embedded)."""
    import psycopg

    try:
        phrasings = check_also(also)
        check_input(conn, question, top_k, phrasings)
    except ValueError as e:
        raise AskError(str(e)) from None
    refused = (
        psycopg.errors.InvalidParameterValue,
        psycopg.errors.ProgramLimitExceeded,
        psycopg.errors.FeatureNotSupported,
        psycopg.errors.NoDataFound,
    )
    try:  # the question's translation is read as the user: an unknown knowledge base fails here already
        embedded = embed_query(
            conn, settings, question, embedder=embedder, spec=spec, also=phrasings, kb=kb, user=user,
            timeout_ms=timeout_ms,
        )  # fmt: skip
    except refused as e:
        raise AskError(_refusal(e)) from None
    named = {"top_k": top_k, "kb": kb, "mode": mode, "stream": on_delta is not None, **embedded.sql_arguments()}
    if phrasings:
        named["also"] = phrasings

    def notice(diag) -> None:
        message = diag.message_primary or ""
        if on_delta is not None and message.startswith(DELTA_PREFIX):
            on_delta(message[len(DELTA_PREFIX) :])

    conn.add_notice_handler(notice)
    try:
        with acting(conn, user, timeout_ms, entry_point):
            arguments = "".join(f", {name} => %({name})s" for name in named)
            row = conn.execute(
                f"select {', '.join(COLUMNS)} from kb.ask(%(question)s{arguments})", {"question": question, **named}
            ).fetchone()
    except refused as e:
        raise AskError(_refusal(e)) from None
    finally:
        conn.remove_notice_handler(notice)
    answer = dict(zip(COLUMNS, row, strict=True))
    if embedded.error is not None:
        said = f"lexical only: {QUERY_EMBEDDING_FAILED} ({embedded.error})"
        answer["evidence"] = {**(answer["evidence"] or {}), "lexical_only": said}
    return answer


def _refusal(e) -> str:
    """The database's message for input it refused, with its hint."""
    message = e.diag.message_primary or str(e)
    return message + (f" ({e.diag.message_hint})" if e.diag.message_hint else "")


def source_line(citation: dict[str, Any]) -> str:
    """``[n] title > headings (page p) — source``: where a citation points (the headings as kb.ask gives
    them: never repeating the title), then ``; also in <uri>, …`` when other documents hold the same text."""
    parts = [citation.get("title") or citation.get("doc_key") or ""]
    parts += [h for h in citation.get("heading_path") or [] if h]
    line = f"[{citation['n']}] " + " > ".join(p for p in parts if p)
    if citation.get("page") is not None:
        line += f" (page {citation['page']})"
    line += f" — {citation.get('source_url') or citation.get('uri')}"
    if citation.get("also_in"):
        line += "; also in " + ", ".join(citation["also_in"])
    return line


def notes(row: dict[str, Any]) -> list[str]:
    """What to tell a reader about kb.ask's row besides the answer: an extractive answer, closest passages, lexical-only
    retrieval (evidence.lexical_only: the question could not be embedded), a failed chat endpoint, removed
    citation numbers, an answer citing nothing. The CLI, MCP and the page say the same."""
    evidence = row.get("evidence") or {}
    out = []
    if row["mode"] == "extractive":
        out.append("extractive answer: passages of the sources, no chat model (none configured or it failed)")
    if row["mode"] == "closest":
        out.append("not an answer: the closest passages, whose words barely match the question")
    if evidence.get("lexical_only"):
        out.append(str(evidence["lexical_only"]))
    if evidence.get("llm_error"):
        out.append(f"the chat endpoint failed: {evidence['llm_error']}")
    if row.get("dropped_citations"):
        out.append(f"{row['dropped_citations']} citation numbers named no source and were removed")
    if row.get("uncited"):
        out.append("the answer cites no source: treat it with care")
    return out
