"""The page's JSON endpoints. Every call needs ``Authorization: Bearer <token>`` (an API key, or a
PGKB_MCP_TOKENS token; 401 without a valid one) and acts as the token's pgkb user. Errors are
``{"error": "<message>"}``: 400 for bad input (empty, oversized or malformed JSON, invalid Unicode, wrong types,
top_k out of range), 403 for what the user sees but may not do (another owner's question log), 404 for a
knowledge base or document the user cannot see (the same as one that does not exist), 501 for /api/ask while
the database has no kb.ask, 503 when the database is unavailable or busy.

- ``GET /api/kbs`` -> ``{"user", "language", "knowledge_bases": [{name, visibility, description, document_count,
  ..., languages, can_manage, language}]}``; language: the profile in words ("mostly Chinese (97 %; English 3 %)"),
  at the top of everything the user may read; can_manage: the user owns it or is an administrator (/api/gaps).
- ``POST /api/search`` ``{"query", "kb"?, "top_k"? (1..20, default 5), "also"? (other phrasings of the question,
  e.g. its translation: a list of at most 3 strings)}`` -> ``{"query", "kb", "also", "results":
  [{rank, title, heading_path, kb, doc_id, chunk_index, source, uri, also_in, page, score, snippet}],
  "degraded", "degraded_reason"}``; snippet is kb.snippet's window as ``[{"text", "hit"}]`` parts (hit: a
  query term by the database's tokenizer), so the page highlights without parsing markup.
- ``POST /api/document`` ``{"kb", "doc_id", "chunk_index"? (-1: whole), "window"? (0..20)}`` -> kb.get_document,
  each chunk with ``content_html``: its Markdown as HTML (pgkb.web.markdown: no raw HTML, http(s) / kb:// links).
  At most DOCUMENT_CHARS characters of chunks, those nearest chunk_index (``chunk_count``: how many there are);
  the rendering holds one of the server's call slots, like a search.
- ``POST /api/ask`` ``{"question", "kb"?, "top_k"? (1..20), "also"?}`` -> kb.ask's row: ``{answer, found, citations:
  [{n, chunk_id, kb, doc_key, title, heading_path, page, source_url, uri, also_in, quote}], mode, model, ...,
  notes, answer_html, question_id}``; notes: what the page shows under the answer (pgkb.answer.notes: extractive,
  lexical only, ...); answer_html: the answer's Markdown as HTML, its [n] linked to the citations
  (pgkb.web.markdown); question_id: the question log's id of this ask (null: not logged), for /api/rate.
  /api/search also answers ``question_id``; with ``"logged": false`` (the page's search beside its ask) the
  question log leaves the search out.
- ``POST /api/rate`` ``{"helpful": true|false, "question_id"? (a logged question of yours), "note"?, "question"?,
  "kb"? (with question: when it was not logged)}`` -> ``{"rating_id"}`` (kb.rate_answer).
- ``POST /api/gaps`` ``{"kb", "since"? (an interval, default "7 days")}`` -> ``{"kb", "since", "question_log_days"
  (null: the log is off), "topics": [{topic,
  questions, unhelpful, examples, closest_documents, last_asked}]}`` (kb.knowledge_gaps: its owner or an
  administrator, 403 for another reader; /api/kbs says which with ``can_manage``).

Sources are what the database hands out (db/functions/47_shown_sources.sql): a web address or the kb:// URI,
never a path on the server; heading paths never repeat the title.
"""

from __future__ import annotations

import datetime
import decimal

from pgkb.answer import notes
from pgkb.languages import describe
from pgkb.serving.arguments import (
    BadInput,
    Forbidden,
    NotFound,
    ServiceError,
    Unsupported,
    check_int,
    check_phrasings,
    check_text,
)
from pgkb.serving.auth import bearer, bearer_user
from pgkb.serving.config import MAX_ARGUMENT_CHARS, MAX_CHUNK_INDEX, MAX_WINDOW, MCP_MAX_TOP_K
from pgkb.web import markdown
from pgkb.web.http import RequestError, json_response, read_json

SNIPPET_CHARS = 240
DOCUMENT_CHARS = 200_000  # of chunk text in one /api/document answer (a whole document may hold 100,000 chunks)
MARKS = ("\ue000", "\ue001")  # private-use characters: kb.snippet's marks, removed from contents first


def snippet_parts(marked: str) -> list[dict]:
    """kb.snippet output with MARKS -> [{"text", "hit"}] (empty parts dropped)."""
    parts, hit = [], False
    for piece in marked.replace(MARKS[1], MARKS[0]).split(MARKS[0]):
        if piece:
            parts.append({"text": piece, "hit": hit})
        hit = not hit
    return parts


def _plain(value):
    """A database value as JSON (timestamps as ISO text, numerics as numbers)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value


def _text(body: dict, name: str, limit: int, *, required: bool) -> str | None:
    value = body.get(name)
    if value is None or (value == "" and not required):
        if required:
            raise RequestError(400, f"{name} is required")
        return None
    try:
        value = check_text(name, value, limit)
    except ServiceError as e:
        raise RequestError(400, str(e)) from None
    if required and not value.strip():
        raise RequestError(400, f"{name} must not be empty")
    return value.strip() or None


def _int(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    try:
        return check_int(name, value, low, high)
    except ServiceError as e:
        raise RequestError(400, str(e)) from None


def _flag(body: dict, name: str, default: bool | None) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise RequestError(400, f"{name} must be true or false")
    return value


def _phrasings(body: dict) -> list[str] | None:
    try:
        return check_phrasings(body.get("also"), MAX_ARGUMENT_CHARS)
    except ServiceError as e:
        raise RequestError(400, str(e)) from None


def shown_chunks(chunks: list[dict], chunk_index: int) -> list[dict]:
    """The chunks one /api/document answer carries, in order, each with its ``content_html``: those nearest
    chunk_index (-1: the first ones) while their text stays within DOCUMENT_CHARS (at least one), rendered
    by pgkb.web.markdown.render_all (bounded work). ``chunk_count`` tells the page how many there are."""
    nearest = sorted(range(len(chunks)), key=lambda i: (abs(chunks[i]["chunk_index"] - chunk_index), i))
    kept: set[int] = set()
    size = 0
    for i in nearest:
        size += len(chunks[i]["content"] or "")
        if kept and size > DOCUMENT_CHARS:
            break
        kept.add(i)
    shown = [chunks[i] for i in sorted(kept)]
    rendered = markdown.render_all([c["content"] for c in shown])
    return [{**c, "content_html": h} for c, h in zip(shown, rendered, strict=True)]


def routes(backend):
    from starlette.concurrency import run_in_threadpool
    from starlette.routing import Route

    def endpoint(handler, *, body: bool):
        async def call(request):
            try:
                user = await run_in_threadpool(bearer_user, backend, bearer(request.headers.get("authorization")))
                if user is None:
                    challenge = {"www-authenticate": "Bearer"}
                    return json_response(401, {"error": "sign in: a valid token is required"}, challenge)
                payload = await read_json(request) if body else {}
                return json_response(200, await run_in_threadpool(handler, user, payload))
            except RequestError as e:
                return json_response(e.status, {"error": str(e)})
            except BadInput as e:
                return json_response(400, {"error": str(e)})
            except Forbidden as e:
                return json_response(403, {"error": str(e)})
            except NotFound as e:
                return json_response(404, {"error": str(e)})
            except Unsupported as e:
                return json_response(501, {"error": str(e)})
            except ValueError as e:  # pgkb.search's and the database's input checks
                return json_response(400, {"error": str(e)})
            except ServiceError as e:
                return json_response(503, {"error": str(e)})

        return call

    def kbs(user: str, _body: dict) -> dict:
        listed = backend.knowledge_bases(user)
        return {
            "user": user,
            "language": describe(backend.knowledge_languages(user)),  # of everything the user may read
            "knowledge_bases": [{**k, "language": describe(k["languages"])} for k in listed],
        }

    def search(user: str, body: dict) -> dict:
        query = _text(body, "query", MAX_ARGUMENT_CHARS, required=True)
        kb = _text(body, "kb", MAX_ARGUMENT_CHARS, required=False)
        top_k = _int(body, "top_k", 5, 1, MCP_MAX_TOP_K)
        also = _phrasings(body)
        response = backend.search(user, query, top_k, kb, also, logged=_flag(body, "logged", True))
        contents = [h.content.replace(MARKS[0], "").replace(MARKS[1], "") for h in response.results]
        # the snippet's window and marks: the terms of every phrasing and of the offline translation (a
        # translation's words in the passage)
        marked = " ".join([response.query, *response.also, response.translation or ""])[:MAX_ARGUMENT_CHARS]
        snippets = backend.snippets(marked, contents, SNIPPET_CHARS, MARKS) if contents else []
        return {
            "query": response.query,
            "kb": kb,
            "also": response.also,
            "results": [
                {
                    "rank": i,
                    "title": h.title or h.doc_key,
                    "heading_path": h.heading_path,
                    "kb": h.kb,
                    "doc_id": h.doc_key,
                    "chunk_index": h.chunk_index,
                    "source": h.source,
                    "uri": h.uri,
                    "also_in": h.also_in,
                    "page": (h.metadata or {}).get("page"),
                    "score": h.final_score,
                    "snippet": snippet_parts(s),
                }
                for i, (h, s) in enumerate(zip(response.results, snippets, strict=True), 1)
            ],
            "degraded": response.degraded,
            "degraded_reason": response.degraded_reason,
            "question_id": response.question_id,
        }

    def document(user: str, body: dict) -> dict:
        doc_id = _text(body, "doc_id", MAX_ARGUMENT_CHARS, required=True)
        kb = _text(body, "kb", MAX_ARGUMENT_CHARS, required=False)
        chunk_index = _int(body, "chunk_index", -1, -1, MAX_CHUNK_INDEX)
        window = _int(body, "window", 2, 0, MAX_WINDOW)
        return backend.document(user, doc_id, kb, chunk_index, window, shape=lambda c: shown_chunks(c, chunk_index))

    def ask(user: str, body: dict) -> dict:
        question = _text(body, "question", MAX_ARGUMENT_CHARS, required=True)
        kb = _text(body, "kb", MAX_ARGUMENT_CHARS, required=False)
        top_k = _int(body, "top_k", 5, 1, MCP_MAX_TOP_K)
        row = backend.ask(user, question, top_k, kb, _phrasings(body))
        cited = {c["n"] for c in row.get("citations") or []}
        question_id = (row.get("evidence") or {}).get("question_id")
        return _plain(
            {
                **row,
                "notes": notes(row),
                "answer_html": markdown.render(row["answer"], cited),
                "question_id": question_id,
            }
        )

    def rate(user: str, body: dict) -> dict:
        question_id = body.get("question_id")
        if question_id is not None:
            question_id = _int(body, "question_id", 0, 1, 2**63 - 1)
        note = _text(body, "note", MAX_ARGUMENT_CHARS, required=False)
        question = _text(body, "question", MAX_ARGUMENT_CHARS, required=False)
        kb = _text(body, "kb", MAX_ARGUMENT_CHARS, required=False)
        rating = backend.rate(user, _flag(body, "helpful", None), question_id, note, question, kb)
        return {"rating_id": rating}

    def gaps(user: str, body: dict) -> dict:
        kb = _text(body, "kb", MAX_ARGUMENT_CHARS, required=True)
        since = _text(body, "since", 100, required=False) or "7 days"
        days, topics = backend.gaps(user, kb, since)
        return {"kb": kb, "since": since, "question_log_days": days, "topics": _plain(topics)}

    return [
        Route("/api/kbs", endpoint(kbs, body=False), methods=["GET"]),
        Route("/api/search", endpoint(search, body=True), methods=["POST"]),
        Route("/api/document", endpoint(document, body=True), methods=["POST"]),
        Route("/api/ask", endpoint(ask, body=True), methods=["POST"]),
        Route("/api/rate", endpoint(rate, body=True), methods=["POST"]),
        Route("/api/gaps", endpoint(gaps, body=True), methods=["POST"]),
    ]
