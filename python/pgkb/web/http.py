"""The web server's HTTP plumbing shared by its routes (the page's API and Dify's /retrieval): bounded,
strictly checked JSON bodies, JSON responses with the security headers, and the refusal of a request."""

from __future__ import annotations

import json
import math

from pgkb.serving.arguments import _SURROGATE_MESSAGE
from pgkb.serving.config import _SURROGATE

MAX_BODY_BYTES = 64 * 1024  # a query is at most 4000 characters; conditions at most 20
MAX_JSON_DEPTH = 20
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class RequestError(Exception):
    """A request refused before any work: HTTP ``status`` with a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_json(request) -> dict:
    """The request body as a JSON object, or RequestError: 413 beyond MAX_BODY_BYTES, 400 for a body that is
    not UTF-8 JSON, not an object, nested deeper than MAX_JSON_DEPTH, uses NaN / Infinity or a number no
    double holds (1e999, an integer of thousands of digits), or holds a string with a NUL character or an
    unpaired surrogate (anywhere, keys included)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise RequestError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    if not body.strip():
        raise RequestError(400, "the request body is empty; send a JSON object")
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(400, "the request body is not UTF-8") from None

    def refuse_constant(name: str):
        raise RequestError(400, f"the request body is not valid JSON ({name} is not a JSON number)")

    def finite(number: str) -> float:
        if not math.isfinite(parsed := float(number)):
            raise RequestError(400, f"the number {number[:40]} in the request body is beyond double precision's range")
        return parsed

    try:
        value = json.loads(text, parse_constant=refuse_constant, parse_float=finite)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"the request body is not valid JSON ({e.msg} at character {e.pos})") from None
    except ValueError as e:  # an integer beyond Python's digit limit
        raise RequestError(400, f"the request body holds a number pgkb cannot read ({e})") from None
    except RecursionError:
        raise RequestError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(value).__name__}")
    _check_strings(value, 0)
    return value


def _check_strings(value, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise RequestError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise RequestError(400, "a string in the request body contains a NUL character, which is not allowed")
        if _SURROGATE.search(value):
            raise RequestError(400, f"a string in the request body {_SURROGATE_MESSAGE}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, depth + 1)
            _check_strings(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_strings(item, depth + 1)


def json_response(status: int, payload, headers: dict[str, str] | None = None):
    from starlette.responses import Response

    body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()
    return Response(body, status, {**SECURITY_HEADERS, **(headers or {})}, media_type="application/json")
