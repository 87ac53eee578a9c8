"""The ASGI application of `pgkb serve`: routing, static files, the Origin / Host guard, /healthz, /readyz
and /metrics (pgkb.serving.monitoring; every request counted), and the command's server loop."""

from __future__ import annotations

import logging
from importlib import resources

from pgkb.serving.auth import accepts_token, request_refusal
from pgkb.serving.backend import Backend, open_backend
from pgkb.serving.config import LOOPBACK
from pgkb.serving.metrics import route_label
from pgkb.serving.monitoring import PATHS as MONITORING_PATHS
from pgkb.serving.monitoring import Metered, Monitoring
from pgkb.web import api, dify
from pgkb.web.http import SECURITY_HEADERS, json_response

log = logging.getLogger("pgkb.web")

DEFAULT_PORT = 8767
STATIC_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


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
    """The ASGI app: Dify's /retrieval, the page and its JSON API, the health and metrics endpoints, behind
    the Guard; every request is counted in the backend's metrics."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def page(request):
        name, media_type = STATIC_FILES[request.url.path]
        return Response(static_file(name), 200, SECURITY_HEADERS, media_type=media_type)

    async def not_found(request, exc):
        return json_response(exc.status_code, {"error": exc.detail or "not found"})

    routes = [Route(path, page, methods=["GET", "HEAD"]) for path in STATIC_FILES]
    routes += dify.routes(backend) + api.routes(backend)
    config = backend.config
    monitoring = Monitoring(backend.metrics, backend.readiness, config.metrics_access, accepts_token(backend))
    routes += [Route(path, monitoring) for path in MONITORING_PATHS]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    guarded = Guard(app, allowed_origins=config.allowed_origins, loopback=host in LOOPBACK)
    paths = frozenset(route.path for route in routes)
    return Metered(guarded, backend.metrics, lambda path: route_label(path, paths))


def serve(settings, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, verbose: bool = False, rerank: bool = True):
    """Serve until stopped (`pgkb serve`). Every caller signs in with an API key from the database (or a
    PGKB_MCP_TOKENS token). Configuration errors and a role that bypasses visibility print to stderr and
    return 2."""
    backend = open_backend(settings, command="serve", verbose=verbose, rerank=rerank)
    if backend is None:
        return 2
    config = backend.config
    import uvicorn

    try:
        log.info("serving the page on http://%s:%d/ and Dify's API at /retrieval", host, port)
        uvicorn.Server(
            uvicorn.Config(
                build_app(backend, host),
                host=host,
                port=port,
                log_level="info" if verbose else "warning",
                limit_concurrency=max(64, 4 * config.max_concurrent),
            )
        ).run()
        return 0
    finally:
        backend.close()
