"""How the quality tools search: every mode through the search client (pgkb.search), with the settings of a
run (:class:`SearchSettings`; None leaves one to the database), and the queries embedded once, in batches."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pgkb.models.embedding import Embedder, ModelSpec
from pgkb.quality.datasets import EvalError
from pgkb.quality.metrics import dedupe
from pgkb.search import MODE_SETTINGS, query_rows, query_translation, rerank, translated_vectors

__all__ = [
    "DEFAULT_DEPTH",
    "FUSIONS",
    "SETTING_TYPES",
    "SearchSettings",
    "embed_queries",
    "other_kb_key",
    "search_mode",
    "unlogged",
]

DEFAULT_DEPTH = 50
FUSIONS = ("dbsf", "rrf")  # kb_internal.search's fusion methods


def unlogged(conn) -> None:
    """Mark the session as a replay of questions (pgkb.entry_point 'eval' for the session): no search or
    ask of an evaluation or sweep lands in a knowledge base's question log."""
    conn.execute("select set_config('pgkb.entry_point', 'eval', false)")


# kb.hybrid_search's settings a run may set, with their types; the defaults are the database's own
# (kb.search_defaults()), which it applies to every setting passed as NULL.
SETTING_TYPES: dict[str, type] = {
    "fusion": str,
    "rrf_k": float,
    "vector_weight": float,
    "lexical_weight": float,
    "fuzzy_weight": float,
    "candidates": int,
    "bm25_k1": float,
    "bm25_b": float,
}


@dataclass(frozen=True)
class SearchSettings:
    """kb.hybrid_search's settings for a run; None leaves one to the database (kb.search_defaults()), which
    also checks them (a bad value is the database's clear error). depth and rerank_depth are this tool's."""

    rrf_k: float | None = None
    vector_weight: float | None = None
    lexical_weight: float | None = None
    fuzzy_weight: float | None = None
    candidates: int | None = None
    bm25_k1: float | None = None
    bm25_b: float | None = None
    rerank_depth: int = 40
    depth: int = DEFAULT_DEPTH  # chunks fetched per query (deduplicated to documents afterwards)
    fusion: str | None = None

    def validate(self, max_top_k: int | None = None) -> None:
        """EvalError for a depth below 1 or, given the database's top_k bound (kb.limits()), above it."""
        for flag, value in (("--depth", self.depth), ("--rerank-depth", self.rerank_depth)):
            if value < 1 or (max_top_k is not None and value > max_top_k):
                raise EvalError(f"{flag} must be between 1 and {max_top_k or 'kb.limits() top_k'}")


def search_mode(
    conn, mode: str, query: str, embedding, kb: str, spec: ModelSpec, s: SearchSettings, reranker=None,
    *, mixed: bool = False,
):  # fmt: skip
    """(document keys in rank order (deduplicated), milliseconds) for one query in one mode, through the
    search client's own SQL call and reranker (pgkb.search.query_rows / rerank). ``mixed``: search every
    knowledge base the connection can read; a hit in another one than ``kb`` is keyed so it matches no
    judgment (``other_kb_key``) and still takes its rank."""
    leg = "hybrid" if mode == "hybrid+rerank" else mode
    given = {
        "query_embedding": embedding, "model": spec.name, "vector_weight": s.vector_weight,
        "lexical_weight": s.lexical_weight, "fuzzy_weight": s.fuzzy_weight, "rrf_k": s.rrf_k,
        "candidates": s.candidates, "bm25_k1": s.bm25_k1, "bm25_b": s.bm25_b, "fusion": s.fusion,
    }  # fmt: skip
    settings = {k: v for k, v in given.items() if k in MODE_SETTINGS[leg] and v is not None}
    top_k = max(s.depth, s.rerank_depth) if mode == "hybrid+rerank" else s.depth
    started = time.perf_counter()
    hits, _ = query_rows(conn, leg, query, top_k, None if mixed else kb, **settings)
    if mode == "hybrid+rerank" and hits:
        hits = rerank(reranker, query, hits[: s.rerank_depth]) + hits[s.rerank_depth :]
    ms = (time.perf_counter() - started) * 1000
    return dedupe(h.doc_key if h.kb == kb else other_kb_key(h.kb, h.doc_key) for h in hits), ms


def other_kb_key(kb: str, doc_key: str) -> str:
    """The ranking key of a document of another knowledge base in a mixed run: never a judged doc_key."""
    return f"\x00{kb}/{doc_key}"


def embed_queries(
    conn, spec: ModelSpec, embedder: Embedder, texts: Sequence[str], batch: int = 16, progress=None, *,
    kb: str | None,
) -> list:  # fmt: skip
    """The query embeddings, in batches of ``batch``, as the search client makes them (pgkb.search:
    query_vectors' registry query prefix and norm check; each question's offline translation over ``kb``,
    None: every knowledge base, blended in), as pgvector values."""
    texts = list(texts)
    out: list = []
    for i in range(0, len(texts), batch):
        part = texts[i : i + batch]
        out.extend(translated_vectors(conn, spec, embedder, part, [query_translation(conn, t, kb) for t in part]))
        if progress:
            progress(f"\rembedding queries: {min(i + batch, len(texts))}/{len(texts)}")
    if progress:
        progress("\n")
    return out
