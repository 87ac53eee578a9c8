"""The embed server's HTTP side: routes, bearer token, request bodies (Content-Length required, at most
MAX_BODY_BYTES), JSON answers and errors, on a threading server that waits for in-flight requests when
closed; /healthz, /readyz and /metrics as pgkb.serving.monitoring describes them (behind its Origin / Host
checks, without the token but for /metrics in token mode), every answer counted in the service's metrics."""

from __future__ import annotations

import base64
import hmac
import json
import logging
import socket
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from pgkb.embed_server.api import ApiError, check_bool, check_model, parse_embeddings, parse_rerank
from pgkb.embed_server.models import Service
from pgkb.serving.auth import request_refusal, user_for_token
from pgkb.serving.metrics import route_label
from pgkb.serving.monitoring import PATHS as MONITORING_PATHS
from pgkb.serving.monitoring import is_loopback, metrics_refusal

__all__ = ["MAX_BODY_BYTES", "EmbedServer"]

MAX_BODY_BYTES = 8 * 1024 * 1024  # request body
_DRAIN_LIMIT = 64 * 1024 * 1024  # oversized bodies up to this are read and dropped so the client sees the 413
_NO_TOKEN = ("/health", *MONITORING_PATHS)  # liveness, readiness and metrics probes send no token

log = logging.getLogger("pgkb.embed_server")


class _Exposition:
    """A route's answer that is not JSON (/metrics)."""

    def __init__(self, data: bytes, content_type: str) -> None:
        self.data, self.content_type = data, content_type


class _Handler(BaseHTTPRequestHandler):
    server: EmbedServer
    server_version = "pgkb-embed-server"
    sys_version = ""
    timeout = 30  # seconds a client may take to send its request

    # dispatch ---------------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_OPTIONS(self) -> None:  # noqa: N802
        self._dispatch("OPTIONS")

    def _routes(self) -> dict[str, dict[str, Callable[[], object]]]:
        return {
            "/health": {"GET": self._health},
            "/healthz": {"GET": self._healthz},
            "/readyz": {"GET": self._readyz},
            "/metrics": {"GET": self._metrics},
            "/v1/models": {"GET": self._models},
            "/v1/embeddings": {"POST": self._embeddings},
            "/v1/rerank": {"POST": self._rerank_cohere},
            "/v2/rerank": {"POST": self._rerank_cohere},
            "/rerank": {"POST": self._rerank_tei},
        }

    def _dispatch(self, method: str) -> None:
        started = self._started = time.perf_counter()
        self._status = 0
        self._body_done = False
        path = urlsplit(self.path).path
        try:
            methods = self._routes().get(path)
            if methods is None:
                raise ApiError(404, f"unknown path {path!r}", "not_found")
            if method not in methods:
                allowed = ", ".join(methods)
                raise ApiError(405, f"{method} is not allowed on {path}; use {allowed}", "method_not_allowed")
            if path in MONITORING_PATHS:
                self._refuse_foreign()
            if path not in _NO_TOKEN:
                self._authorize()
            self._send(200, methods[method]())
        except ApiError as e:
            self._send_error(e)
        except Exception as e:  # a bug: still answer, and log it
            log.exception("unhandled error on %s %s", method, path)
            self._send_error(ApiError(500, f"internal error: {type(e).__name__}", "internal_error", "server_error"))
        finally:
            log.info(
                "%s %s %s %s %.1f ms",
                self.client_address[0],
                method,
                path,
                self._status,
                (time.perf_counter() - started) * 1000,
            )

    # plumbing -----------------------------------------------------------------------------------------
    def _refuse_foreign(self) -> None:
        """The servers' Origin / Host checks (pgkb.serving.auth): a foreign Origin, or on a loopback bind a
        Host that names no loopback address (DNS rebinding)."""
        refusal = request_refusal(self.headers, (), is_loopback(self.server.server_address[0]))
        if refusal is not None:
            raise ApiError(refusal[0], refusal[1], "forbidden", "permission_error")

    def _authorize(self) -> None:
        token = self.server.service.token
        if not token:
            return
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ApiError(401, "missing or wrong bearer token", "invalid_api_key", "authentication_error")

    def _content_length(self) -> int:
        """The declared body length; ApiError for a missing, chunked or invalid one."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(411, "chunked request bodies are not supported; send a Content-Length", "length_required")
        header = self.headers.get("Content-Length")
        if header is None:
            raise ApiError(411, "a Content-Length header is required", "length_required")
        try:
            length = int(header)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise ApiError(400, "invalid Content-Length", "invalid_request")
        return length

    def _discard_body(self) -> None:
        """Read and drop an unread request body before answering an error, so the client is not reset
        (closing a socket with unread input sends RST) before it reads the answer."""
        if self._body_done or "Content-Length" not in self.headers:
            return
        self._body_done = True
        try:
            remaining = self._content_length()
        except ApiError:
            return
        if remaining > _DRAIN_LIMIT:
            return
        try:
            while remaining > 0 and (chunk := self.rfile.read(min(remaining, 1 << 16))):
                remaining -= len(chunk)
        except OSError:
            self.close_connection = True

    def _read_json(self) -> dict:
        length = self._content_length()
        if length > MAX_BODY_BYTES:
            raise ApiError(
                413, f"request body of {length} bytes exceeds the limit of {MAX_BODY_BYTES}", "request_too_large"
            )
        self._body_done = True
        try:
            raw = self.rfile.read(length)
        except OSError as e:  # includes the socket timeout
            self.close_connection = True
            raise ApiError(408, f"could not read the request body: {e}", "request_timeout") from e
        if len(raw) != length:
            self.close_connection = True
            raise ApiError(400, "request body shorter than its Content-Length", "invalid_request")
        try:
            body = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ApiError(400, "request body is not valid UTF-8", "invalid_json") from e
        except (ValueError, RecursionError) as e:
            raise ApiError(400, f"request body is not valid JSON: {e}", "invalid_json") from e
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object", "invalid_json")
        return body

    def _send(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        self._status = status
        route = route_label(urlsplit(self.path).path, self._routes())
        # counted before the client can see the answer
        self.server.service.metrics.request(route, status, time.perf_counter() - self._started)
        if isinstance(payload, _Exposition):
            data, content_type = payload.data, payload.content_type
        else:
            content_type = "application/json"
            try:
                data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            except UnicodeEncodeError:  # an unpaired surrogate echoed from a request: escape it
                data = json.dumps(payload, separators=(",", ":")).encode("ascii")
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_error(self, e: ApiError) -> None:
        self._discard_body()
        headers = dict(e.headers)
        if e.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="pgkb"'
        elif e.status == 405:
            headers["Allow"] = ", ".join(self._routes()[urlsplit(self.path).path])
        self._send(e.status, {"error": {"message": e.message, "type": e.type, "code": e.code}}, headers)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server API)
        log.debug("%s " + format, self.client_address[0], *args)

    # routes ---------------------------------------------------------------------------------------------
    def _health(self) -> dict:
        service = self.server.service
        return {
            "status": "ok",
            "model": service.model_name,
            "dimension": service.embedder.dimension,
            "rerank_model": service.reranker.name if service.reranker else None,
        }

    def _healthz(self) -> dict:
        return {"status": "ok"}

    def _readyz(self) -> dict:
        # ready = the models are loaded, and serve() loads and tries them before it opens the port
        return {"status": "ready", "model": self.server.service.model_name}

    def _metrics(self) -> _Exposition:
        service = self.server.service
        tokens = {service.token: "embed-server"} if service.token else {}
        refusal = metrics_refusal(
            service.metrics_access,
            self.client_address[0],
            self.headers.get("Authorization"),
            lambda token: user_for_token(tokens, token) is not None,
        )
        if refusal is not None:
            log.warning("refused /metrics to %s: %s", self.client_address[0], refusal[1])
            code = "invalid_api_key" if refusal[0] == 401 else "forbidden"
            raise ApiError(refusal[0], refusal[1], code, "authentication_error")  # 401: _send_error's challenge
        return _Exposition(*service.metrics.exposition(self.headers.get("Accept")))

    def _models(self) -> dict:
        service = self.server.service
        data = [
            {
                "id": service.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "pgkb",
                "type": "embedding",
                "dimension": service.embedder.dimension,
            }
        ]
        if service.reranker:
            data.append(
                {"id": service.reranker.name, "object": "model", "created": 0, "owned_by": "pgkb", "type": "rerank"}
            )
        return {"object": "list", "data": data}

    def _embeddings(self) -> dict:
        service = self.server.service
        body = self._read_json()
        check_model(body, service.accepted_names, "embedding")
        texts, as_base64 = parse_embeddings(body, service.embedder.dimension, service.model_name)
        with service.admitted(self.client_address[0]):
            vectors, tokens = service.embed(texts)
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                if as_base64
                else [float(x) for x in v],
            }
            for i, v in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": service.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _rerank_cohere(self) -> dict:
        service = self.server.service
        body = self._read_json()
        model = check_model(body, [service.require_reranker().name], "rerank")
        query, docs = parse_rerank(body, "documents")
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise ApiError(400, "'top_n' must be a positive integer", "invalid_type")
        with_docs = check_bool(body, "return_documents", False)
        with service.admitted(self.client_address[0]):
            scores = service.rerank(query, docs)
        ranked = sorted(range(len(docs)), key=lambda i: (-scores[i], i))[: top_n or len(docs)]
        results = []
        for i in ranked:
            item: dict = {"index": i, "relevance_score": float(scores[i])}
            if with_docs:
                item["document"] = {"text": docs[i]}
            results.append(item)
        return {"model": model, "results": results}

    def _rerank_tei(self) -> list:
        service = self.server.service
        body = self._read_json()
        service.require_reranker()
        query, docs = parse_rerank(body, "texts")
        raw = check_bool(body, "raw_scores", False)
        with_text = check_bool(body, "return_text", False)
        with service.admitted(self.client_address[0]):
            scores = service.rerank(query, docs, raw=raw)
        ranked = sorted(range(len(docs)), key=lambda i: (-scores[i], i))
        results = []
        for i in ranked:
            item: dict = {"index": i, "score": float(scores[i])}
            if with_text:
                item["text"] = docs[i]
            results.append(item)
        return results


class EmbedServer(ThreadingHTTPServer):
    """A threading HTTP server that waits for in-flight requests when closed."""

    daemon_threads = False
    block_on_close = True
    server_address: tuple[str, int] | tuple[str, int, int, int]  # AF_INET or AF_INET6: the host is a str

    def __init__(self, address: tuple[str, int], service: Service) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.service = service
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
