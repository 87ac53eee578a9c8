"""Health and metrics endpoints of pgkb's HTTP servers, and who may read /metrics.

- ``GET /healthz``: 200 ``{"status": "ok"}`` while the process serves (nothing else is touched).
- ``GET /readyz``: 200 ``{"status": "ready"}`` when the server can do its work, else 503 ``{"status": "not
  ready", "reason"}`` with a fixed phrase (the details go to the server's log, not to whoever asks). `pgkb
  serve` and `pgkb mcp`: the database answers and has every db/migrations file applied (checked at most once
  per READY_CACHE_SECONDS, one check at a time, however many probes come). The embed server: its models are
  loaded.
- ``GET /metrics``: pgkb.serving.metrics in Prometheus' text format (OpenMetrics when the scraper asks for
  it). PGKB_METRICS_ACCESS says who may read it: ``loopback`` (the default: clients on a loopback address;
  others get 403), ``token`` (a bearer key the server's other routes accept, else 401) or ``open``.

The three go through the server's Origin and Host checks like every route (a scraper sends no Origin; on a
loopback bind the Host must name a loopback address), and need no token, but /metrics in token mode.
``Metered`` counts and times every request of an ASGI server under its route."""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable

from pgkb.serving.auth import bearer
from pgkb.serving.config import METRICS_ACCESS_ENV
from pgkb.serving.metrics import ServerMetrics

log = logging.getLogger("pgkb.serving")

PATHS = ("/healthz", "/readyz", "/metrics")
READY_CACHE_SECONDS = 1.0
HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}


def is_loopback(address: str | None) -> bool:
    """Whether a client address is a loopback one (127.0.0.0/8, ::1, ::ffff:127.x); not a name, never None."""
    try:
        ip = ipaddress.ip_address((address or "").split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def metrics_refusal(
    access: str, client: str | None, authorization: str | None, accepts: Callable[[str | None], bool]
) -> tuple[int, str, dict[str, str]] | None:
    """(status, message, extra headers) when a /metrics request may not be served, else None: ``client`` is
    the peer's address, ``authorization`` its Authorization header, ``accepts`` whether the server's other
    routes accept a bearer token (may block: call from a worker thread)."""
    if access == "open":
        return None
    if access == "token":
        if accepts(bearer(authorization)):
            return None
        return 401, "a valid bearer token is required for /metrics", {"www-authenticate": "Bearer"}
    if is_loopback(client):
        return None
    return 403, f"/metrics is served to loopback clients only ({METRICS_ACCESS_ENV})", {}


def readiness_answer(reason: str | None) -> tuple[int, dict]:
    """/readyz's (status, JSON body) for a readiness check's outcome (None: ready)."""
    if reason is None:
        return 200, {"status": "ready"}
    return 503, {"status": "not ready", "reason": reason}


class Readiness:
    """A readiness check shared by all probes: at most one runs at a time and its outcome answers every
    probe for READY_CACHE_SECONDS, so hammering /readyz opens no more database connections than one probe."""

    def __init__(self, check: Callable[[], str | None]) -> None:
        self.check = check
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._reason: str | None = None

    def __call__(self) -> str | None:
        with self._lock:
            if time.monotonic() - self._at >= READY_CACHE_SECONDS:
                self._reason = self.check()
                self._at = time.monotonic()
            return self._reason


class Monitoring:
    """The ASGI app answering PATHS for `pgkb serve` and `pgkb mcp` (placed behind their Origin / Host
    checks, in front of their token checks)."""

    def __init__(
        self, metrics: ServerMetrics, ready: Callable[[], str | None], access: str,
        accepts: Callable[[str | None], bool],
    ):  # fmt: skip
        self.metrics, self.ready, self.access, self.accepts = metrics, Readiness(ready), access, accepts

    async def __call__(self, scope, receive, send) -> None:
        from starlette.concurrency import run_in_threadpool
        from starlette.datastructures import Headers
        from starlette.responses import Response

        path, headers = scope["path"], Headers(scope=scope)
        if scope["method"] not in ("GET", "HEAD"):
            response = _json(405, {"error": f"{path} answers GET only"}, {"allow": "GET, HEAD"})
        elif path == "/healthz":
            response = _json(200, {"status": "ok"})
        elif path == "/readyz":
            response = _json(*readiness_answer(await run_in_threadpool(self.ready)))
        else:
            client = (scope.get("client") or (None,))[0]
            refusal = await run_in_threadpool(
                metrics_refusal, self.access, client, headers.get("authorization"), self.accepts
            )
            if refusal is not None:
                log.warning("refused /metrics to %s: %s", client, refusal[1])
                response = _json(refusal[0], {"error": refusal[1]}, refusal[2])
            else:
                body, content_type = await run_in_threadpool(self.metrics.exposition, headers.get("accept"))
                response = Response(body, 200, HEADERS, media_type=content_type)
        await response(scope, receive, send)


def _json(status: int, payload: dict, headers: dict[str, str] | None = None):
    from starlette.responses import Response

    return Response(json.dumps(payload).encode(), status, {**HEADERS, **(headers or {})}, "application/json")


class Metered:
    """ASGI middleware: every HTTP request counted and timed under ``route(path)`` with the status it was
    answered with (recorded before the answer's last part is sent; 500 when none was sent)."""

    def __init__(self, app, metrics: ServerMetrics, route: Callable[[str], str]) -> None:
        self.app, self.metrics, self.route = app, metrics, route

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, route = time.perf_counter(), self.route(scope["path"])
        status, recorded = 500, False

        def record() -> None:
            nonlocal recorded
            if not recorded:
                recorded = True
                self.metrics.request(route, status, time.perf_counter() - started)

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                record()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            record()
