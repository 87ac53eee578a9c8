"""Client-side search: embed the query, call ``kb.hybrid_search``, optionally rerank.

``search(conn, settings, query, top_k, kb, embedder=..., reranker=..., user=...)`` is what the CLI and the
MCP server (pgkb.mcp) call:

1. checks the input with the database's own rule (kb.check_search_input: a blank or over-long query, top_k
   out of range, as kb.limits() states them; ``ValueError`` with a message meant for people and models);
2. embeds the query with the configured embedder (PGKB_EMBED_PROVIDER; the registry's query prefix, e.g.
   ``query: ``). When that fails (HttpEmbedder gives up after its bounded retries, the model cannot be
   loaded ...) the search runs the lexical legs only -- ``query_embedding => NULL, vector_weight => 0``, so
   the database does not try its own HTTP embedding either -- and the response says ``degraded=True``
   with the reason;
3. calls ``kb.hybrid_search`` in one transaction that sets ``pgkb.acting_user`` (when ``user`` is given;
   the connection must then belong to a member of pgkb_service) and ``statement_timeout``
   (PGKB_STATEMENT_TIMEOUT_MS, default 10000) with ``set_config(..., true)``, i.e. transaction-local:
   nothing leaks to the next use of the connection;
4. with a reranker (pgkb.models.rerank), reranks the fused top ``rerank_depth`` (PGKB_RERANK_DEPTH, default 40)
   and keeps the best ``top_k`` whose rerank score is at least PGKB_RERANK_MIN_SCORE (rerank scores only;
   the fused score is never thresholded). A failing reranker degrades to the fused order.

Per-stage wall-clock milliseconds (embed, search, rerank, total) come back in ``SearchResponse.timings_ms``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pgkb.chunking import breadcrumb
from pgkb.limits import api_limit, api_limits
from pgkb.models.embedding import Embedder, EmbeddingError, ModelSpec, load_embedder, model_spec, prefixed

DEFAULT_RERANK_DEPTH = 40
DEFAULT_STATEMENT_TIMEOUT_MS = 10_000
_BLANK = " \t\r\n\u3000"


@dataclass(frozen=True)
class SearchOptions:
    """Search settings from the environment (names shared by the CLI and the MCP server).

    PGKB_STATEMENT_TIMEOUT_MS  per-search statement_timeout (default 10000; 0 = none)
    PGKB_RERANK_DEPTH          fused candidates handed to the reranker (default 40; kb.limits() top_k caps it)
    PGKB_RERANK_MIN_SCORE      drop reranked results scoring below this (rerank scores only; default none)
    """

    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
    rerank_depth: int = DEFAULT_RERANK_DEPTH
    rerank_min_score: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SearchOptions:
        from pgkb.config import ConfigError

        env = os.environ if env is None else env

        def number(name: str, kind, default):
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return kind(raw)
            except ValueError as e:
                raise ConfigError(f"{name} must be a number, got {raw!r}") from e

        timeout = number("PGKB_STATEMENT_TIMEOUT_MS", int, DEFAULT_STATEMENT_TIMEOUT_MS)
        depth = number("PGKB_RERANK_DEPTH", int, DEFAULT_RERANK_DEPTH)
        if timeout < 0:
            raise ConfigError("PGKB_STATEMENT_TIMEOUT_MS must be >= 0 (0 disables it)")
        if depth < 1:
            raise ConfigError("PGKB_RERANK_DEPTH must be at least 1")
        return cls(timeout, depth, number("PGKB_RERANK_MIN_SCORE", float, None))


@dataclass
class SearchHit:
    """One kb.search_result row, plus ``rerank_score`` when a reranker ordered the results."""

    chunk_id: int
    kb: str
    doc_key: str
    title: str
    heading_path: list[str]
    chunk_index: int
    content: str
    source_url: str | None
    chunk_type: str
    metadata: dict
    score: float  # fused score from kb.hybrid_search
    vector_rank: int | None
    lexical_rank: int | None
    fuzzy_rank: int | None
    vector_score: float | None
    lexical_score: float | None
    fuzzy_score: float | None
    rerank_score: float | None = None
    also_in: list[str] = field(default_factory=list)  # kb:// URIs of other documents holding the same text
    uri: str = ""  # the document's kb://<kb>/<doc_key> URI (kb.document_uri)

    @property
    def source(self) -> str:
        """Where the chunk came from: its source URL, else the document's ``kb://`` resource URI."""
        return self.source_url or self.uri

    @property
    def final_score(self) -> float:
        """The score the results are ordered by: the rerank score when reranked, else the fused score."""
        return self.rerank_score if self.rerank_score is not None else self.score

    def location(self) -> str:
        """``title > heading > path`` (the title alone when there is no heading path)."""
        return breadcrumb(self.title or self.doc_key, self.heading_path)


@dataclass
class SearchResponse:
    query: str
    top_k: int
    kb: str | None
    user: str | None
    results: list[SearchHit]
    degraded: bool = False
    degraded_reasons: list[str] = field(default_factory=list)
    vector_used: bool = False
    reranked: bool = False
    below_min_score: int = 0  # reranked results dropped by PGKB_RERANK_MIN_SCORE
    model: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    also: list[str] = field(default_factory=list)  # the other phrasings searched with the query
    translation: str | None = None  # the question's offline translation, blended into its embedding
    question_id: int | None = None  # the question log's id of this search (None: not logged)

    @property
    def degraded_reason(self) -> str | None:
        return "; ".join(self.degraded_reasons) or None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["degraded_reason"] = self.degraded_reason
        for hit, row in zip(self.results, out["results"], strict=True):
            row["source"] = hit.source
        return out


def validate(query: object, top_k: object, max_top_k: int | None = None) -> tuple[str, int]:
    """The query (stripped) and top_k, or ValueError for the wrong types or a top_k outside the caller's own
    cap (``max_top_k``: the MCP server's 20; None: none). Whether the query is blank or too long and top_k
    in range is the database's rule (kb.check_search_input), which ``search`` asks before embedding."""
    if not isinstance(query, str):
        raise ValueError("query must not be empty: pass the question or keywords to search for")
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ValueError(f"top_k must be an integer, got {top_k!r}")
    if max_top_k is not None and not 1 <= top_k <= max_top_k:
        raise ValueError(f"top_k must be an integer between 1 and {max_top_k}, got {top_k!r}")
    return query.strip(_BLANK), top_k


def check_also(also: object) -> list[str] | None:
    """Other phrasings of the question (``also``) as the database takes them: None or a list of strings, each
    stripped; ValueError for anything else. How many, how long and how blank is the database's rule
    (kb.check_search_input)."""
    if also is None:
        return None
    if isinstance(also, str) or not isinstance(also, (list, tuple)):
        raise ValueError("also must be a list of other phrasings of the question (strings)")
    if not all(isinstance(a, str) for a in also):
        raise ValueError("also must hold strings only: other phrasings of the question")
    return [a.strip(_BLANK) for a in also] or None


def check_input(conn, query: str, top_k: int, also: list[str] | None = None) -> None:
    """kb.check_search_input: ValueError with the database's message for a blank or over-long query, a
    top_k out of range, or a bad ``also`` (one round trip, before any embedding work)."""
    import psycopg

    try:
        with conn.transaction():
            conn.execute("select kb.check_search_input(%s, %s, %s)", [query, top_k, also])
    except (psycopg.errors.InvalidParameterValue, psycopg.errors.ProgramLimitExceeded) as e:
        raise ValueError(e.diag.message_primary or str(e)) from None


def rerank_text(hit: SearchHit) -> str:
    """What a reranker reads for a hit: the location (title > headings) and the content."""
    return f"{hit.location()}\n{hit.content}"


_COLUMNS = (
    "chunk_id, kb, doc_key, title, heading_path, chunk_index, content, source_url, chunk_type, metadata, score,"
    " vector_rank, lexical_rank, fuzzy_rank, vector_score, lexical_score, fuzzy_score, also_in,"
    " kb.document_uri(kb, doc_key), vector_used"
)


@contextlib.contextmanager
def acting(
    conn, user: str | None, timeout_ms: int, entry_point: str | None = None, *, logged: bool = True
) -> Iterator[None]:
    """A transaction acting as ``user`` (None: as the connection's own role) with ``statement_timeout`` =
    ``timeout_ms`` (0: none) and, when given, ``pgkb.entry_point`` (what the question log records: 'cli',
    'mcp', 'page', 'http'; 'eval' logs nothing); ``logged`` False sets ``pgkb.question_log`` 'off' (a call
    that accompanies a logged one: the page's search beside its ask). All transaction-local: nothing leaks to
    the next use of the connection. The one place every Python client (search, ask, the servers) sets them."""
    with conn.transaction():
        if user is not None:
            conn.execute("select set_config('pgkb.acting_user', %s, true)", [user])
        conn.execute("select set_config('statement_timeout', %s, true)", [str(timeout_ms)])
        if entry_point is not None:
            conn.execute("select set_config('pgkb.entry_point', %s, true)", [entry_point])
        if not logged:
            conn.execute("select set_config('pgkb.question_log', 'off', true)")
        yield


# The SQL functions behind each mode and the settings each accepts by name (anything not given is left to the
# database: kb.search_defaults()).
MODE_FUNCTIONS = {
    "hybrid": "kb.hybrid_search",
    "vector": "kb.vector_search",
    "lexical": "kb.lexical_search",
    "fuzzy": "kb.fuzzy_search",
}
MODE_SETTINGS = {
    "hybrid": (
        "query_embedding", "model", "vector_weight", "lexical_weight", "fuzzy_weight", "rrf_k", "candidates",
        "filter", "bm25_k1", "bm25_b", "fusion", "also", "also_embeddings",
    ),
    "vector": ("query_embedding", "model", "filter"),
    "lexical": ("filter", "bm25_k1", "bm25_b"),
    "fuzzy": ("filter",),
}  # fmt: skip


def query_rows(
    conn, mode: str, query: str, top_k: int, kb: str | None, **settings: Any
) -> tuple[list[SearchHit], bool]:
    """The one SQL call of every search client (CLI, MCP, eval, sweep): ``kb.<mode>_search`` with the
    settings given by name. Returns the hits and whether the vector leg ran (vector_used)."""
    unknown = set(settings) - set(MODE_SETTINGS[mode])
    if unknown:
        raise ValueError(f"{mode} search takes no {', '.join(sorted(unknown))}")
    named = "".join(f", {k} => %({k})s" for k in settings)
    rows = conn.execute(
        f"select {_COLUMNS} from {MODE_FUNCTIONS[mode]}(%(query)s, top_k => %(top_k)s, kb => %(kb)s{named})",
        {"query": query, "top_k": top_k, "kb": kb, **settings},
    ).fetchall()
    # the 17 columns fill the fields before rerank_score (mypy cannot count a tuple slice)
    hits = [SearchHit(*row[:17], also_in=list(row[17] or []), uri=row[18]) for row in rows]  # type: ignore[misc]
    return hits, any(row[-1] for row in rows)


def snippets(conn, query: str, texts: list[str], width: int, marks: tuple[str, str] = ("", "")) -> list[str]:
    """kb.snippet of each text, in order: a window of ``width`` characters around the query's first term,
    the terms wrapped in ``marks`` (the database's term model decides what is highlighted)."""
    rows = conn.execute(
        "select kb.snippet(t.content, %s, %s, %s, %s) from unnest(%s::text[]) with ordinality as t (content, n)"
        " order by t.n",
        [query, width, marks[0], marks[1], texts],
    ).fetchall()
    return [r[0] for r in rows]


def rerank(reranker, query: str, hits: list[SearchHit]) -> list[SearchHit]:
    """The hits reordered by the reranker's score (set as ``rerank_score``); raises if it fails."""
    scores = list(reranker.score(query, [rerank_text(h) for h in hits]))
    if len(scores) != len(hits):
        raise RuntimeError(f"reranker returned {len(scores)} scores for {len(hits)} documents")
    ranked = sorted(zip(hits, (float(s) for s in scores), strict=True), key=lambda pair: -pair[1])
    for hit, score in ranked:
        hit.rerank_score = score
    return [hit for hit, _ in ranked]


QUERY_EMBEDDING_FAILED = "query embedding failed"  # how QueryEmbedding.failure begins


@dataclass(frozen=True)
class QueryEmbedding:
    """A query's embedding as every Python client hands it to the database (embed_query): the vector (a
    pgvector Vector; None when none could be had), the model's name and why there is no vector."""

    vector: Any
    model: str | None
    error: str | None = None
    also: list | None = None  # the embeddings of the other phrasings, in order (None: there are none)
    translation: str | None = None  # the question's offline translation blended into ``vector`` (None: none)

    @property
    def failure(self) -> str | None:
        """Why the search is lexical-only (a degraded reason), or None."""
        return None if self.error is None else f"{QUERY_EMBEDDING_FAILED}, lexical-only results ({self.error})"

    def sql_arguments(self) -> dict[str, Any]:
        """The named arguments query_embedding, model and vector_weight of kb.hybrid_search, kb.ask and
        kb.retrieve: the embedding and its model (vector_weight NULL: the database's default), or
        ``vector_weight => 0`` when there is none -- the lexical legs only, so the database never tries its
        own embedding after this one failed."""
        weight = 0.0 if self.vector is None else None
        out = {"query_embedding": self.vector, "model": self.model, "vector_weight": weight}
        if self.also:
            out["also_embeddings"] = self.also if self.vector is not None else None
        return out


def query_vectors(conn, spec: ModelSpec, embedder: Embedder, texts: Sequence[str]) -> list:
    """The query embeddings of ``texts`` (the registry's query prefix) as pgvector values, in one embed call;
    EmbeddingError for a vector the database would refuse: a NaN norm or one outside kb.limits()'
    embedding_norm_min .. embedding_norm_max (kb_internal.usable_embedding: zero or degenerate)."""
    bounds = api_limits(conn)
    vectors = embedder.embed(prefixed(spec, list(texts), query=True))
    for vector in vectors:
        norm = float(np.linalg.norm(np.asarray(vector, dtype=np.float64)))
        if not bounds["embedding_norm_min"] <= norm <= bounds["embedding_norm_max"]:
            raise EmbeddingError(f"the embedder returned an unusable query vector (norm {norm:g})")
    return [_vector(v) for v in vectors]


def query_translation(
    conn, query: str, kb: str | None, user: str | None = None, timeout_ms: int = 0, also: Sequence[str] | None = None
) -> str | None:
    """kb.query_translation as ``user``: the question's offline translation into the language of the knowledge
    a search of ``kb`` reads (when at least kb.settings.translation_min_share of it is in the other language),
    or None (too little of it is, nothing translates, or ``also`` holds the caller's own phrasings). Raises
    psycopg.errors.NoDataFound for a knowledge base ``user`` cannot see, as the search would."""
    with acting(conn, user, timeout_ms):
        row = conn.execute("select kb.query_translation(%s, %s, %s)", [query, kb, list(also) if also else None])
        return row.fetchone()[0]


def blend(conn, question, translation):
    """kb.blend_query_embeddings: the query embedding of a question and its offline translation."""
    return conn.execute("select kb.blend_query_embeddings(%s, %s)", [question, translation]).fetchone()[0]


def translated_vectors(conn, spec: ModelSpec, embedder: Embedder, texts: Sequence[str], translations) -> list:
    """query_vectors of ``texts``, each blended with the embedding of its offline translation (the same
    position of ``translations``; None: none), all embedded in one call."""
    extra = [t for t in translations if t]
    vectors = query_vectors(conn, spec, embedder, [*texts, *extra])
    rest = iter(vectors[len(texts) :])
    own = zip(vectors[: len(texts)], translations, strict=True)
    return [blend(conn, v, next(rest)) if t else v for v, t in own]


def embed_query(
    conn,
    settings,
    query: str,
    *,
    embedder: Embedder | None = None,
    spec: ModelSpec | None = None,
    also: Sequence[str] | None = None,
    kb: str | None = None,
    user: str | None = None,
    timeout_ms: int = 0,
):
    """The one query embedding of every Python path (search, ask, the servers' prompt and retrieval): a
    QueryEmbedding by the configured model (``embedder`` None loads it), with the other phrasings ``also``
    or else the question's offline translation over ``kb`` as ``user`` sees it (query_translation) embedded in
    the same call, the translation's blended into the question's (blend), as the database does when it embeds.
    Never raises for an embedder that fails or cannot be loaded: the QueryEmbedding then has no vector and
    says why, and the caller searches the lexical legs only (QueryEmbedding.sql_arguments). The database's
    errors of the translation (an invisible knowledge base, a timeout) are raised as the search raises them."""
    model = None
    translation = query_translation(conn, query, kb, user, timeout_ms, also)
    try:
        spec = spec or model_spec(conn, settings.embed_model)
        model = spec.name
        embedder = embedder or load_embedder(settings, spec)
        phrasings = [query, *(also or [])]
        vectors = translated_vectors(conn, spec, embedder, phrasings, [translation] + [None] * (len(phrasings) - 1))
        return QueryEmbedding(vectors[0], model, also=vectors[1:] or None, translation=translation)
    except (EmbeddingError, OSError, RuntimeError, ValueError, ImportError) as e:
        return QueryEmbedding(None, model, str(e))


def search(
    conn,
    settings,
    query: str,
    top_k: int = 5,
    kb: str | None = None,
    *,
    embedder: Embedder | None = None,
    reranker=None,
    user: str | None = None,
    options: SearchOptions | None = None,
    spec: ModelSpec | None = None,
    max_top_k: int | None = None,
    also: Sequence[str] | None = None,
    entry_point: str | None = None,
    logged: bool = True,
) -> SearchResponse:
    """Hybrid search as ``user`` (None: as the connection's own role). See the module docstring. ``also``:
    other phrasings of the question (a translation into the knowledge's language), searched by every leg.
    ``entry_point`` and ``logged``: the caller, as the question log records it, and whether it does (see
    acting); ``question_id`` of the response is the logged question's (None: not logged), for kb.rate_answer.

    ``embedder`` None loads the one ``settings`` configure (slow for the offline model: pass one in when
    searching repeatedly). Raises ValueError for bad input and psycopg errors from the database (unknown
    knowledge base: ``psycopg.errors.NoDataFound``; timeout: ``psycopg.errors.QueryCanceled``).
    """
    options = options or SearchOptions.from_env()
    query, top_k = validate(query, top_k, max_top_k)
    phrasings = check_also(also)
    check_input(conn, query, top_k, phrasings)
    kb = kb or None
    started = time.perf_counter()
    response = SearchResponse(query=query, top_k=top_k, kb=kb, user=user, results=[], also=phrasings or [])

    embedded = embed_query(
        conn, settings, query, embedder=embedder, spec=spec, also=phrasings, kb=kb, user=user,
        timeout_ms=options.statement_timeout_ms,
    )  # fmt: skip
    response.model = embedded.model
    response.translation = embedded.translation
    if embedded.failure is not None:
        response.degraded = True
        response.degraded_reasons.append(embedded.failure)
    t_embed = time.perf_counter()
    response.timings_ms["embed"] = round((t_embed - started) * 1000, 2)

    depth = min(max(options.rerank_depth, top_k), api_limit(conn, "top_k")) if reranker is not None else top_k
    with acting(conn, user, options.statement_timeout_ms, entry_point, logged=logged):
        arguments = embedded.sql_arguments() | ({"also": phrasings} if phrasings else {})
        hits, response.vector_used = query_rows(conn, "hybrid", query, depth, kb, **arguments)
        response.question_id = conn.execute("select kb.last_question_id()").fetchone()[0]
    t_search = time.perf_counter()
    response.timings_ms["search"] = round((t_search - t_embed) * 1000, 2)

    if reranker is not None and hits:
        try:
            hits = rerank(reranker, query, hits)
            response.reranked = True
            if options.rerank_min_score is not None:
                kept = [h for h in hits if h.rerank_score is not None and h.rerank_score >= options.rerank_min_score]
                response.below_min_score = len(hits) - len(kept)
                hits = kept
        except Exception as e:  # a reranker is an optional refinement: never fail the search for it
            for hit in hits:
                hit.rerank_score = None
            response.degraded = True
            response.degraded_reasons.append(f"rerank failed, fused order kept ({e})")
        response.timings_ms["rerank"] = round((time.perf_counter() - t_search) * 1000, 2)
    response.results = hits[:top_k]
    response.timings_ms["total"] = round((time.perf_counter() - started) * 1000, 2)
    return response


def _vector(values):
    from pgvector import Vector

    return Vector(values)
