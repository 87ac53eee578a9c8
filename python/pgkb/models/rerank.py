"""Rerankers: ``score(query, documents) -> one relevance score per document`` (higher is better).

- ``LocalReranker``: a sentence-transformers ``CrossEncoder`` in-process (model name or local path; the
  production recommendation is ``BAAI/bge-reranker-v2-m3``). Sigmoid scores in [0, 1].
- ``HttpReranker``: a remote rerank endpoint, either the Cohere/Jina shape (``POST …/v1/rerank`` or
  ``…/v2/rerank`` with ``{"model", "query", "documents"}`` -> ``{"results": [{"index",
  "relevance_score"}]}``; `pgkb embed-server`, Jina, Cohere, vLLM) or the TEI shape (``POST …/rerank`` with
  ``{"query", "texts"}`` -> ``[{"index", "score"}]``; text-embeddings-inference). Bounded retries with
  exponential backoff on connection errors, timeouts, 429 and 5xx.

Configuration (``load_reranker``):
  PGKB_RERANK_URL      remote endpoint (full URL: …/v1/rerank, …/v2/rerank or …/rerank); wins over the model
  PGKB_RERANK_API_KEY  bearer token for PGKB_RERANK_URL
  PGKB_RERANK_MODEL    local CrossEncoder name/path; with PGKB_RERANK_URL, the model name sent to it
  PGKB_RERANK_API      cohere | tei (default: guessed from the URL path)

The tests use a CrossEncoder built locally from all-MiniLM-L6-v2's encoder with an untrained one-logit
head: it exercises the real code paths but its scores mean nothing. Any statement about rerank quality
needs the real model (BAAI/bge-reranker-v2-m3 or similar).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from pgkb.models.embedding import EmbeddingError, sentence_transformers_model
from pgkb.models.http_json import JsonEndpoint

RERANK_URL_ENV = "PGKB_RERANK_URL"
RERANK_KEY_ENV = "PGKB_RERANK_API_KEY"
RERANK_MODEL_ENV = "PGKB_RERANK_MODEL"
RERANK_API_ENV = "PGKB_RERANK_API"
APIS = ("cohere", "tei")


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder (model name or local path) with a single relevance output."""

    def __init__(self, model: str, device: str | None = None, batch_size: int = 16) -> None:
        self.name = model
        self._model = sentence_transformers_model("CrossEncoder", model, device, "a reranker")
        if self._model.num_labels != 1:
            raise EmbeddingError(
                f"{model!r} has {self._model.num_labels} output labels; a reranker must produce one relevance score"
            )
        self.batch_size = batch_size

    def score(self, query: str, documents: Sequence[str], *, raw: bool = False) -> np.ndarray:
        """One score per document: sigmoid relevance in [0, 1], or the raw logit with ``raw``."""
        kwargs = {}
        if raw:
            import torch

            kwargs["activation_fn"] = torch.nn.Identity()
        scores = self._model.predict(
            [(query, d) for d in documents], batch_size=self.batch_size, show_progress_bar=False, **kwargs
        )
        return np.asarray(scores, dtype=np.float64).reshape(len(documents))


class RerankError(RuntimeError):
    """Reranking failed (endpoint down, bad answer, model not loadable)."""


class Reranker(Protocol):
    name: str

    def score(self, query: str, documents: Sequence[str]) -> Sequence[float]: ...


class LocalReranker(CrossEncoderReranker):
    """A sentence-transformers CrossEncoder in this process, safe to share between threads.

    Also usable as the ``reranker`` of ``pgkb.embed_server.start_in_thread`` (same interface)."""

    def __init__(self, model: str, device: str | None = None, batch_size: int = 16) -> None:
        try:
            super().__init__(model, device=device, batch_size=batch_size)
        except Exception as e:
            raise RerankError(f"cannot load rerank model {model!r}: {e}") from e
        self._lock = threading.Lock()

    def score(self, query: str, documents: Sequence[str], *, raw: bool = False):
        if not documents:
            return []
        with self._lock:
            return super().score(query, documents, raw=raw)


def guess_api(url: str) -> str:
    """``tei`` for a URL whose path ends in /rerank without a /v1 or /v2 before it, else ``cohere``."""
    path = url.split("?", 1)[0].rstrip("/")
    if path.endswith("/rerank") and not path.endswith(("/v1/rerank", "/v2/rerank")):
        return "tei"
    return "cohere"


class HttpReranker(JsonEndpoint):
    """A remote rerank endpoint (Cohere/Jina or TEI shape), retried with exponential backoff."""

    error = RerankError

    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key: str = "",
        *,
        api: str | None = None,
        timeout: float = 30.0,
        retries: int = 2,
        backoff: float = 0.5,
    ) -> None:
        super().__init__(url, api_key, what="rerank", timeout=timeout, retries=retries, backoff=backoff)
        api = api or guess_api(url)
        if api not in APIS:
            raise RerankError(f"rerank API must be one of {APIS}, got {api!r}")
        self.model, self.api = model, api
        self.name = model or url

    def score(self, query: str, documents: Sequence[str]) -> list[float]:
        documents = list(documents)
        if not documents:
            return []
        if self.api == "tei":
            body: dict = {"query": query, "texts": documents, "raw_scores": False}
        else:
            body = {"query": query, "documents": documents, "top_n": len(documents)}
            if self.model:
                body["model"] = self.model
        answer = self.post(body)
        items: Any = answer.get("results") if isinstance(answer, dict) else answer  # a wrong shape: TypeError below
        key = "score" if self.api == "tei" else "relevance_score"
        scores: list[float | None] = [None] * len(documents)
        try:
            for item in items:
                scores[int(item["index"])] = float(item[key])
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise RerankError(f"{self.shown} returned no usable rerank results") from e
        if any(s is None for s in scores):
            raise RerankError(f"{self.shown} scored {sum(s is not None for s in scores)} of {len(documents)} documents")
        return scores  # type: ignore[return-value]


def load_reranker(env: Mapping[str, str] | None = None) -> Reranker | None:
    """The reranker the environment configures, or None (see the module docstring)."""
    env = os.environ if env is None else env
    url = env.get(RERANK_URL_ENV, "").strip()
    model = env.get(RERANK_MODEL_ENV, "").strip() or None
    if url:
        return HttpReranker(url, model, env.get(RERANK_KEY_ENV, ""), api=env.get(RERANK_API_ENV, "").strip() or None)
    if model:
        return LocalReranker(model)
    return None
