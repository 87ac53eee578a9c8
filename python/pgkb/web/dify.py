"""Dify's External Knowledge API: ``POST /retrieval``.

Request ``{"knowledge_id", "query", "retrieval_setting": {"top_k", "score_threshold"}, "metadata_condition"?}``
with ``Authorization: Bearer <key>``; the key is an API key or a PGKB_MCP_TOKENS token, so the records are what
its pgkb user may see, and knowledge_id is a knowledge base name. Response ``{"records": [{"content", "score",
"title", "metadata"}]}``: kb.retrieve's hits in pgkb's order, score in 0..1 (see db/functions/58_retrieve.sql:
the hit's absolute relevance -- query-term coverage or calibrated cosine similarity, whichever is higher --
lowered where needed so scores never rise down the list), records below score_threshold left out (so they are
a prefix of pgkb's ranking; ``{"records": []}`` when none passes). metadata is always an object: the
document's metadata, then pgkb's own keys (kb, doc_id, chunk_index, heading_path, path = the source URL or
the kb:// URI -- never a path on the server --, page when the chunk has one, also_in when other documents hold
the same text: their kb:// URIs). metadata_condition is applied inside the search (kb.hybrid_search's
metadata_condition); an operator or value pgkb cannot honour is a 400, never ignored.

Errors ``{"error_code", "error_msg"}``: 1001 malformed Authorization header and 1002 unknown key (HTTP 403,
the spec's AccessDeniedException), 2001 knowledge base does not exist (HTTP 404; also for one the key's user
may not see -- the same answer, so no caller learns which names exist), HTTP 400 / 413 / 503 with the HTTP
status as error_code for bad or oversized bodies and an unavailable database.
"""

from __future__ import annotations

import logging

from pgkb.serving.arguments import BadInput, NotFound, ServiceError, check_text
from pgkb.serving.auth import bearer, bearer_user
from pgkb.serving.config import MAX_ARGUMENT_CHARS
from pgkb.web.http import RequestError, json_response, read_json

log = logging.getLogger("pgkb.web")

DIFY_MAX_TOP_K = 50


def error(status: int, code: int, message: str):
    return json_response(status, {"error_code": code, "error_msg": message})


def knowledge_missing(name: str):
    return error(404, 2001, f'The knowledge does not exist: no knowledge base "{name[:200]}" is visible to this key')


def parse(body: dict) -> tuple[str, str, int, float, dict | None]:
    """(knowledge_id, query, top_k, score_threshold, metadata_condition) or RequestError 400."""
    knowledge_id, query = body.get("knowledge_id"), body.get("query")
    if not isinstance(knowledge_id, str) or not knowledge_id.strip():
        raise RequestError(400, "knowledge_id must be a knowledge base name (a non-empty string)")
    if not isinstance(query, str):
        raise RequestError(400, "query must be a string")
    setting = body.get("retrieval_setting")
    if not isinstance(setting, dict):
        raise RequestError(400, "retrieval_setting must be an object with top_k and score_threshold")
    top_k, threshold = setting.get("top_k"), setting.get("score_threshold")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= DIFY_MAX_TOP_K:
        raise RequestError(400, f"retrieval_setting.top_k must be an integer between 1 and {DIFY_MAX_TOP_K}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise RequestError(400, "retrieval_setting.score_threshold must be a number between 0 and 1")
    condition = body.get("metadata_condition")
    if condition is not None and not isinstance(condition, dict):
        raise RequestError(400, "metadata_condition must be an object with logical_operator and conditions")
    try:
        check_text("query", query, MAX_ARGUMENT_CHARS)
    except ServiceError as e:
        raise RequestError(400, str(e)) from None
    return knowledge_id, query, top_k, float(threshold), condition


def record(row: dict) -> dict:
    """A kb.retrieve row as a Dify record; metadata is an object, never null."""
    source = row["source_url"] or row["uri"]
    metadata = {
        **(row["document_metadata"] or {}),
        "kb": row["knowledge_base"],
        "doc_id": row["doc_key"],
        "chunk_index": row["chunk_index"],
        "heading_path": row["heading_path"] or [],
        "path": source,
    }
    page = (row["chunk_metadata"] or {}).get("page")
    if page is not None:
        metadata["page"] = page
    if row["also_in"]:
        metadata["also_in"] = row["also_in"]
    return {
        "content": row["content"],
        "score": round(float(row["score"]), 6),
        "title": row["title"] or row["doc_key"],
        "metadata": metadata,
    }


def routes(backend):
    from starlette.concurrency import run_in_threadpool
    from starlette.routing import Route

    async def retrieval(request):
        token = bearer(request.headers.get("authorization"))
        if token is None:
            return error(403, 1001, "Invalid Authorization header format. Expected 'Bearer <api-key>' format.")
        try:
            user = await run_in_threadpool(bearer_user, backend, token)
        except ServiceError as e:
            return error(503, 503, str(e))
        if user is None:
            return error(403, 1002, "Authorization failed")
        try:
            knowledge_id, query, top_k, threshold, condition = parse(await read_json(request))
        except RequestError as e:
            return error(e.status, e.status, str(e))
        try:
            rows, degraded = await run_in_threadpool(
                backend.retrieve, user, query, top_k, knowledge_id, condition, threshold
            )
        except NotFound:
            return knowledge_missing(knowledge_id)
        except BadInput as e:
            return error(400, 400, str(e))
        except ServiceError as e:
            return error(503, 503, str(e))
        if degraded:
            log.warning("retrieval for %s: %s", user, degraded)
        return json_response(200, {"records": [record(r) for r in rows]})

    return [Route("/retrieval", retrieval, methods=["POST"])]
