"""Streamable HTTP: the ASGI guard in front of the SDK's app (Origin and Host checks against DNS
rebinding, bearer tokens -- API keys or PGKB_MCP_TOKENS -- mapped to pgkb users), with /healthz, /readyz and
/metrics (pgkb.serving.monitoring) behind the Origin and Host checks but not the tokens; every request
counted."""

from __future__ import annotations

import json
import logging

from pgkb.serving.arguments import ServiceError
from pgkb.serving.auth import accepts_token, bearer, bearer_user, request_refusal
from pgkb.serving.backend import Backend
from pgkb.serving.config import LOOPBACK
from pgkb.serving.metrics import route_label
from pgkb.serving.monitoring import PATHS as MONITORING_PATHS
from pgkb.serving.monitoring import Metered, Monitoring

log = logging.getLogger("pgkb.mcp")


class HttpGuard:
    """ASGI middleware in front of the MCP apps: Origin check, Host check on loopback binds, then
    ``monitoring`` for its paths, bearer tokens; routes /sse and /messages/ to the deprecated HTTP+SSE
    transport, everything else to streamable HTTP. A request that sends a bearer token needs a valid one
    (pgkb.serving.auth.bearer_user; 401 otherwise, 503 when the database cannot tell); one without needs
    none only where anonymous callers act as PGKB_USER: a loopback bind with no PGKB_MCP_TOKENS (one
    developer's machine, `pgkb up`)."""

    def __init__(self, app, *, backend, loopback: bool, monitoring, sse_app=None):
        self.app, self.sse_app, self.backend, self.loopback = app, sse_app, backend, loopback
        self.monitoring = monitoring
        self.allowed_origins = backend.config.allowed_origins
        self.anonymous = loopback and not backend.config.tokens

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        refusal = request_refusal(headers, self.allowed_origins, self.loopback)
        if refusal is not None:
            log.warning("refused a request: %s", refusal[1])
            await _reply(send, *refusal)
            return
        path = scope.get("path", "")
        if path in MONITORING_PATHS:
            await self.monitoring(scope, receive, send)
            return
        token = bearer(headers.get("authorization"))
        if token is not None or not self.anonymous:
            import anyio

            try:
                user = await anyio.to_thread.run_sync(bearer_user, self.backend, token)
            except ServiceError as e:
                await _reply(send, 503, str(e))
                return
            if user is None:
                await _reply(send, 401, "a valid bearer token is required", {"www-authenticate": "Bearer"})
                return
        if self.sse_app is not None and (path == "/sse" or path.startswith("/messages")):
            await self.sse_app(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _reply(send, status: int, message: str, extra: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def http_app(server, backend: Backend, host: str):
    from mcp.server.transport_security import TransportSecuritySettings

    config = backend.config
    off = TransportSecuritySettings(enable_dns_rebinding_protection=False)  # HttpGuard does these checks
    app = server.streamable_http_app(transport_security=off, host=host)
    sse = server.sse_app(transport_security=off, host=host)
    monitoring = Monitoring(backend.metrics, backend.readiness, config.metrics_access, accepts_token(backend))
    guard = HttpGuard(app, backend=backend, loopback=host in LOOPBACK, monitoring=monitoring, sse_app=sse)
    routes = ("/mcp", "/sse", *MONITORING_PATHS)
    return Metered(guard, backend.metrics, lambda path: route_label(path, routes, ("/messages/",)))
