"""The ASGI application of `pgkb serve`: routing, the Origin / Host guard, bounded JSON bodies, and the
command's server loop."""

from __future__ import annotations

import json
import logging
import sys
from importlib import resources

from pgkb.serving.arguments import _SURROGATE_MESSAGE
from pgkb.serving.auth import request_refusal
from pgkb.serving.backend import Backend, open_backend
from pgkb.serving.config import _SURROGATE, LOOPBACK

log = logging.getLogger("pgkb.web")

DEFAULT_PORT = 8767
MAX_BODY_BYTES = 64 * 1024  # a query is at most 4000 characters; conditions at most 50
MAX_JSON_DEPTH = 20
STATIC_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
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
    not UTF-8 JSON, not an object, nested deeper than MAX_JSON_DEPTH, uses NaN / Infinity, or holds a
    string with a NUL character or an unpaired surrogate (anywhere, keys included)."""
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

    try:
        value = json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"the request body is not valid JSON ({e.msg} at character {e.pos})") from None
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


class Guard:
    """ASGI middleware: pgkb.serving.auth.request_refusal's 403 for foreign origins (the page's own is
    fine) and 421 for a non-loopback Host on a loopback bind, as JSON."""

    def __init__(self, app, *, allowed_origins: tuple[str, ...], loopback: bool) -> None:
        self.app, self.allowed_origins, self.loopback = app, allowed_origins, loopback

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.datastructures import Headers

        refusal = request_refusal(Headers(scope=scope), self.allowed_origins, self.loopback)
        if refusal is not None:
            log.warning("refused %s %s: %s", scope.get("method"), scope.get("path"), refusal[1])
            await json_response(refusal[0], {"error": refusal[1]})(scope, receive, send)
            return
        await self.app(scope, receive, send)


def static_file(name: str) -> bytes:
    return resources.files("pgkb.web").joinpath("static", name).read_bytes()


def build_app(backend: Backend, host: str = "127.0.0.1"):
    """The ASGI app: Dify's /retrieval, the page and its JSON API, behind the Guard."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from pgkb.web import api, dify

    async def page(request):
        name, media_type = STATIC_FILES[request.url.path]
        return Response(static_file(name), 200, SECURITY_HEADERS, media_type=media_type)

    async def not_found(request, exc):
        return json_response(exc.status_code, {"error": exc.detail or "not found"})

    routes = [Route(path, page, methods=["GET", "HEAD"]) for path in STATIC_FILES]
    routes += dify.routes(backend) + api.routes(backend)
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    config = backend.config
    return Guard(app, allowed_origins=config.allowed_origins, loopback=host in LOOPBACK)


def serve(settings, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, verbose: bool = False, rerank: bool = True):
    """Serve until stopped (`pgkb serve`). Configuration errors, missing tokens and a role that bypasses
    visibility print to stderr and return 2."""
    backend = open_backend(settings, command="serve", verbose=verbose, rerank=rerank)
    if backend is None:
        return 2
    config = backend.config
    if not config.tokens:
        print(
            'pgkb: serve: set PGKB_MCP_TOKENS ("token1:alice,token2:bob"): every caller of the page and of Dify\'s'
            " API signs in with a token that names the pgkb user it acts as",
            file=sys.stderr,
        )
        return 2
    import uvicorn

    try:
        log.info("serving the page on http://%s:%d/ and Dify's API at /retrieval", host, port)
        uvicorn.Server(
            uvicorn.Config(
                build_app(backend, host), host=host, port=port, log_level="info" if verbose else "warning",
                limit_concurrency=max(64, 4 * config.max_concurrent),
            )
        ).run()
        return 0
    finally:
        backend.close()
