"""`pgkb mcp`: the knowledge base as an MCP server (official ``mcp`` SDK 2.x, ``MCPServer``).

Tools (all read-only and idempotent; errors come back as tool errors the model can read):

- ``search_knowledge(query, top_k=5, kb="")`` -- hybrid search (pgkb.search: client-side query embedding,
  kb.hybrid_search, optional rerank). ``top_k`` is capped at MCP_MAX_TOP_K (20): larger values are
  lowered and the response says so. Structured output (``SearchOutput``) plus a concise text rendering
  ``[1] title > heading (score …, source)`` + content. The whole response stays under RESPONSE_BUDGET_CHARS
  (60k characters, ~20k tokens): long contents are trimmed -- never whole results -- and the response
  says which. An empty query is a tool error; no results is not (the text says so). When the embedding
  endpoint fails the results are lexical-only and flagged ``degraded`` with the reason.
- ``get_document(doc_id, kb="", chunk_index=-1, window=2)`` -- a whole document (chunk_index -1) or the
  chunks ``chunk_index ± window`` around a hit, through ``kb.get_document`` as the acting user (the
  database applies visibility). A doc_id present in several visible knowledge bases without ``kb`` is an
  error listing them.
- ``list_knowledge_bases()`` -- ``kb.list_knowledge_bases()``: the knowledge bases the caller can see, with
  document counts and the last update.

Resources: every document is ``kb://<kb>/<doc_key>`` (URI template ``kb://{kb}/{+doc_key}``; the
``source`` of results without a source URL), so clients can open a citation.

Identity: every call runs as a pgkb user -- ``set_config('pgkb.acting_user', user, true)`` in the call's
transaction -- so the database decides what is visible. The server connects with PGKB_DATABASE_URL, a role
that is a member of pgkb_service (unset: the embedded cluster as ``pgkb_mcp``, see pgkb.service_role), and
refuses to serve as a role that bypasses visibility (superuser, BYPASSRLS, pgkb administrator).
stdio: the user is PGKB_USER (unset: no user, public knowledge bases only). HTTP:
PGKB_MCP_TOKENS="token1:alice,token2:bob" maps bearer tokens to users (every request needs a valid token
then); without tokens, PGKB_USER again.

Transports: stdio (default; the SDK keeps stdout for the protocol, logs go to stderr) and
``--transport http`` (``--host`` 127.0.0.1, ``--port`` 8766): streamable HTTP at ``/mcp``, which the SDK
serves for both protocol generations (the ``initialize`` handshake revisions 2024-11-05 .. 2025-11-25 and
the stateless 2026-07-28 per-request envelope), plus the deprecated HTTP+SSE transport at ``/sse`` and
``/messages/`` for old clients. HTTP requests with an ``Origin`` other than localhost / 127.0.0.1 / [::1]
are refused (403) unless listed in PGKB_MCP_ALLOWED_ORIGINS (comma-separated, ``*`` for any); when bound
to a loopback address the ``Host`` header must be a loopback name too (DNS-rebinding protection).

Connections: a pool (psycopg_pool) of at most PGKB_MCP_POOL_SIZE connections (default 8, at least 1 kept
open), opened lazily on the first call -- the server starts and lists its tools while the database is down,
and calls then fail with a readable tool error. Every pooled connection is checked before use, so one
broken by a database restart is replaced, not handed out. The acting user and the statement timeout are
transaction-local (``set_config(..., true)``), so nothing carries over to the next call on a reused
connection.

Robustness: statement_timeout PGKB_STATEMENT_TIMEOUT_MS (default 10000) per call, reported as a clear tool
error; an unreachable embedding endpoint gives degraded lexical-only results, never an error, and so does a
query embedding slower than PGKB_MCP_EMBED_TIMEOUT_MS (default 5000; 0: no limit; it runs in a worker
thread and is abandoned). Arguments are checked strictly before any work: integers must be JSON integers
(not booleans, strings or 2.0), ``chunk_index`` -1 or >= 0, ``window`` 0..20; strings at most 4000
(query), 1000 (doc_id) and 100 (kb) characters, without NUL characters or unpaired surrogates. Error
messages quote at most the first 200 characters of a value. On stdio every line gets its JSON-RPC answer
(``parse_stdio_line``): -32700 for lines that are not UTF-8 JSON, -32600 for JSON that is no JSON-RPC
message, a tool error for an unpaired surrogate in a tool argument (-32602 elsewhere); the server goes on.

Logging: ``--verbose`` logs every stage to stderr. PGKB_QUERY_LOG=<path> appends one JSON line per search:
timestamp, user, query, kb, top_k, each result's doc/chunk/score and leg ranks, per-stage milliseconds.

Run as ``pgkb mcp``. Importing this module does not import the SDK
(``build_server`` does), so `pgkb` stays quick to start.
"""

import argparse
import contextlib
import hmac
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, BinaryIO
from urllib.parse import urlsplit

import psycopg
from pydantic import BaseModel, Field

from pgkb.chunking import breadcrumb
from pgkb.config import ConfigError, Settings
from pgkb.models.embedding import EmbeddingError, ModelSpec, load_embedder, model_spec
from pgkb.search import MAX_QUERY_CHARS, SearchOptions, SearchResponse, search, validate
from pgkb.service_role import PrivilegedRoleError, refuse_privileged, service_database_url

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8766
MCP_MAX_TOP_K = 20
RESPONSE_BUDGET_CHARS = 60_000  # ~20k tokens for the whole tool result (text + structured content)
RESOURCE_BUDGET_CHARS = 1_000_000  # a document read as a resource
MAX_WINDOW = 20
EMBEDDER_RETRY_SECONDS = 60  # after a failed embedder load, searches run lexical-only this long before retrying
DEFAULT_POOL_SIZE = 8  # PGKB_MCP_POOL_SIZE: most connections the pool opens
POOL_MIN_SIZE = 1  # connections the pool keeps open (fewer when PGKB_MCP_POOL_SIZE is smaller)
CONNECT_TIMEOUT_SECONDS = 10
POOL_QUICK_WAIT_SECONDS = 2.0  # waited for a pooled connection before checking whether the database is up
POOL_WAIT_SECONDS = 30.0  # most a call waits for a free pooled connection (all busy) in total
LOOPBACK = ("localhost", "127.0.0.1", "::1")
MAX_DOC_ID_CHARS = 1000  # kb.documents.doc_key's limit
MAX_KB_NAME_CHARS = 100  # a knowledge base name's limit
MAX_CHUNK_INDEX = 2_000_000_000  # chunk ordinals are 32-bit integers
SHOWN_CHARS = 200  # a value echoed in a message shows at most this many characters, then "…"
MAX_MESSAGE_CHARS = 2000  # an error message as a whole
DEFAULT_EMBED_TIMEOUT_MS = 5000  # PGKB_MCP_EMBED_TIMEOUT_MS: longest a query embedding may take (0: no limit)
EMBED_WORKERS = 2  # query embeddings running at once (an abandoned one finishes in the background)
_SURROGATE = re.compile("[\ud800-\udfff]")

log = logging.getLogger("pgkb.mcp")


# ------------------------------------------------------------------------------------------ configuration


def parse_tokens(raw: str) -> dict[str, str]:
    """``"token1:alice,token2:bob"`` -> {token: user}; ConfigError for malformed entries."""
    tokens: dict[str, str] = {}
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        token, sep, user = entry.rpartition(":")
        if not sep or not token.strip() or not user.strip():
            raise ConfigError('PGKB_MCP_TOKENS must look like "token1:alice,token2:bob"')
        tokens[token.strip()] = user.strip()
    return tokens


@dataclass
class McpConfig:
    settings: Settings
    database_url: str
    default_user: str | None = None
    tokens: dict[str, str] = field(default_factory=dict)
    allowed_origins: tuple[str, ...] = ()
    options: SearchOptions = field(default_factory=SearchOptions)
    query_log: Path | None = None
    verbose: bool = False
    pool_size: int = DEFAULT_POOL_SIZE
    embed_timeout_ms: int = DEFAULT_EMBED_TIMEOUT_MS

    @classmethod
    def from_env(cls, settings: Settings, env: dict[str, str] | None = None, *, verbose: bool = False) -> "McpConfig":
        env = os.environ if env is None else env
        log_path = env.get("PGKB_QUERY_LOG", "").strip()
        raw_pool = env.get("PGKB_MCP_POOL_SIZE", "").strip()
        try:
            pool_size = int(raw_pool) if raw_pool else DEFAULT_POOL_SIZE
        except ValueError:
            pool_size = 0
        if pool_size < 1:
            raise ConfigError(f"PGKB_MCP_POOL_SIZE must be a whole number >= 1, got {raw_pool!r}")
        raw_timeout = env.get("PGKB_MCP_EMBED_TIMEOUT_MS", "").strip()
        try:
            embed_timeout_ms = int(raw_timeout) if raw_timeout else DEFAULT_EMBED_TIMEOUT_MS
        except ValueError:
            embed_timeout_ms = -1
        if embed_timeout_ms < 0:
            raise ConfigError(f"PGKB_MCP_EMBED_TIMEOUT_MS must be a whole number >= 0, got {raw_timeout!r}")
        return cls(
            settings=settings,
            database_url=service_database_url(settings),
            default_user=env.get("PGKB_USER", "").strip() or None,
            tokens=parse_tokens(env.get("PGKB_MCP_TOKENS", "")),
            allowed_origins=tuple(o.strip() for o in env.get("PGKB_MCP_ALLOWED_ORIGINS", "").split(",") if o.strip()),
            options=SearchOptions.from_env(env),
            query_log=Path(log_path) if log_path else None,
            verbose=verbose,
            pool_size=pool_size,
            embed_timeout_ms=embed_timeout_ms,
        )


# ------------------------------------------------------------------------------------------ output models


class SearchResultItem(BaseModel):
    rank: int = Field(description="1 = best")
    content: str = Field(description="the chunk's text (may be trimmed, see content_trimmed)")
    title: str
    kb: str = Field(description="knowledge base")
    doc_id: str = Field(description="the document key; pass it to get_document")
    chunk_index: int
    heading_path: list[str]
    source: str = Field(description="source URL, else the kb://<kb>/<doc_key> resource URI")
    uri: str = Field(description="kb://<kb>/<doc_key>: read it as a resource for the whole document")
    score: float = Field(description="the ranking score: rerank_score when reranked, else fused_score")
    fused_score: float = Field(description="fused score of the search legs (kb.hybrid_search score; higher is better)")
    vector_rank: int | None = Field(description="rank in the vector (semantic) leg; null: not found by it")
    lexical_rank: int | None = Field(description="rank in the BM25 leg")
    fuzzy_rank: int | None = Field(description="rank in the trigram (typo) leg")
    rerank_score: float | None = Field(default=None, description="cross-encoder score (only when reranked)")
    content_trimmed: bool = False


class SearchOutput(BaseModel):
    query: str
    kb: str | None
    top_k: int
    result_count: int
    results: list[SearchResultItem]
    degraded: bool = Field(description="true when results are lexical-only or not reranked because of a failure")
    degraded_reason: str | None
    reranked: bool
    trimmed: bool = Field(description="true when some contents were shortened to fit the size budget")
    notes: list[str]
    timings_ms: dict[str, float]


class DocumentChunk(BaseModel):
    chunk_index: int
    heading_path: list[str]
    chunk_type: str
    content: str
    content_trimmed: bool = False


class DocumentOutput(BaseModel):
    kb: str
    doc_id: str
    title: str
    source: str
    uri: str
    chunk_count: int = Field(description="chunks in the whole document")
    updated_at: str
    chunks: list[DocumentChunk]
    trimmed: bool = Field(description="true when chunks or contents were left out to fit the size budget")
    notes: list[str]


class KnowledgeBaseInfo(BaseModel):
    name: str
    visibility: str
    description: str
    document_count: int
    chunk_count: int
    last_updated: str | None


class KnowledgeBasesOutput(BaseModel):
    knowledge_bases: list[KnowledgeBaseInfo]


# ----------------------------------------------------------------------------------------------- backend


class ToolFailure(Exception):
    """An error meant for the caller (becomes a tool error / resource error)."""


class _BrokenEmbedder:
    """Stands in for an embedder that could not be loaded: every embed raises the load error."""

    def __init__(self, error: Exception) -> None:
        self.error, self.name, self.dimension = error, "unavailable", 0

    def embed(self, texts):
        raise EmbeddingError(f"embedder unavailable: {self.error}")


class _BoundedEmbedder:
    """Query embedding with a deadline: the wrapped embedder runs in a worker thread and a call gives up
    after ``timeout_ms`` with an EmbeddingError, so the search runs lexical-only and says why. An abandoned
    embedding finishes in its (daemon) thread; at most EMBED_WORKERS run at once, and a call that finds them
    all busy waits only within its own deadline."""

    def __init__(self, inner, timeout_ms: int) -> None:
        self.inner, self.timeout_ms = inner, timeout_ms
        self.name, self.dimension = inner.name, inner.dimension
        self._slots = threading.BoundedSemaphore(EMBED_WORKERS)

    def embed(self, texts):
        deadline = time.monotonic() + self.timeout_ms / 1000
        late = EmbeddingError(f"query embedding took longer than {self.timeout_ms} ms (PGKB_MCP_EMBED_TIMEOUT_MS)")
        if not self._slots.acquire(timeout=self.timeout_ms / 1000):
            raise late
        outcome: dict = {}
        done = threading.Event()

        def work() -> None:
            try:
                outcome["vectors"] = self.inner.embed(texts)
            except BaseException as e:  # handed to the caller (when it still waits)
                outcome["error"] = e
            finally:
                self._slots.release()
                done.set()

        threading.Thread(target=work, name="pgkb-query-embedding", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            log.warning("query embedding abandoned after %d ms", self.timeout_ms)
            raise late
        if "error" in outcome:
            raise outcome["error"]
        return outcome["vectors"]


def _configure_connection(conn: psycopg.Connection) -> None:
    """Every new pooled connection: the pgvector type, when the extension is installed."""
    if conn.execute("select 1 from pg_extension where extname = 'vector'").fetchone():
        from pgvector.psycopg import register_vector

        register_vector(conn)


class Backend:
    """Database access for the tools; thread-safe (tools run in worker threads). Connections come from a
    pool opened on the first call (``close()`` closes it); each is checked before use, so a restarted
    database costs nothing but the calls in flight."""

    def __init__(self, config: McpConfig, *, reranker=None, embedder=None) -> None:
        self.config = config
        self.reranker = reranker
        self._embedder = embedder
        self._spec: ModelSpec | None = None
        self._embedder_failed_at = 0.0
        self._lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._pool_lock = threading.Lock()
        self._pool = None  # psycopg_pool.ConnectionPool, opened by the first call

    def _probe(self) -> None:
        """ToolFailure unless a direct connection to the database succeeds (it is closed again) as a role
        that sees no more than the users it acts for (PrivilegedRoleError otherwise)."""
        try:
            with psycopg.connect(self.config.database_url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                refuse_privileged(conn)
        except psycopg.OperationalError as e:
            raise ToolFailure(f"the knowledge base database is unavailable ({_first_line(e)}); try again") from e
        except psycopg.errors.UndefinedFunction as e:
            raise ToolFailure("the knowledge base database is not migrated: run `pgkb db migrate`") from e
        except PrivilegedRoleError as e:
            raise ToolFailure(str(e)) from e

    def check_role(self) -> None:
        """PrivilegedRoleError when the configured role bypasses visibility; nothing when it is fit or the
        database cannot be reached now (the first call checks again)."""
        try:
            with psycopg.connect(self.config.database_url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                refuse_privileged(conn)
        except psycopg.Error as e:
            log.warning("cannot check the database role now: %s", _first_line(e))

    def pool(self):
        """The connection pool, opened on first use. While the database is down no pool is opened and the
        call fails at once with the connection error."""
        with self._pool_lock:
            if self._pool is None:
                from psycopg_pool import ConnectionPool

                self._probe()
                self._pool = ConnectionPool(
                    self.config.database_url,
                    kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_SECONDS},
                    min_size=min(POOL_MIN_SIZE, self.config.pool_size),
                    max_size=self.config.pool_size,
                    configure=_configure_connection,
                    check=ConnectionPool.check_connection,
                    timeout=POOL_WAIT_SECONDS,
                    name="pgkb-mcp",
                    open=False,
                )
                self._pool.open(wait=False)
            return self._pool

    def close(self) -> None:
        """Close the pool (server shutdown); a later call would open a new one."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A checked connection from the pool (autocommit; calls open their own transactions), returned
        after the call. A pool that hands out nothing within POOL_QUICK_WAIT_SECONDS is either busy or cut
        off from the database: a direct connection tells which, so a database that went down is reported
        within seconds; a busy pool is waited for up to POOL_WAIT_SECONDS."""
        from psycopg_pool import PoolTimeout

        pool = self.pool()
        try:
            conn = pool.getconn(timeout=POOL_QUICK_WAIT_SECONDS)
        except PoolTimeout:
            self._probe()
            try:
                conn = pool.getconn(timeout=POOL_WAIT_SECONDS - POOL_QUICK_WAIT_SECONDS)
            except PoolTimeout as e:
                raise ToolFailure(
                    f"no free database connection after {POOL_WAIT_SECONDS:g} s (all {self.config.pool_size} "
                    "in use, PGKB_MCP_POOL_SIZE); try again"
                ) from e
        try:
            yield conn
        finally:
            pool.putconn(conn)

    @contextlib.contextmanager
    def acting(self, conn: psycopg.Connection, user: str | None) -> Iterator[None]:
        """A transaction acting as ``user`` with the statement timeout, both transaction-local."""
        with conn.transaction():
            if user is not None:
                conn.execute("select set_config('pgkb.acting_user', %s, true)", [user])
            conn.execute(
                "select set_config('statement_timeout', %s, true)", [str(self.config.options.statement_timeout_ms)]
            )
            yield

    def embedder(self, conn: psycopg.Connection):
        with self._lock:
            if self._spec is None:
                self._spec = model_spec(conn, self.config.settings.embed_model)
            if self._embedder is None or (
                isinstance(self._embedder, _BrokenEmbedder)
                and time.monotonic() - self._embedder_failed_at > EMBEDDER_RETRY_SECONDS
            ):
                started = time.perf_counter()
                try:
                    self._embedder = load_embedder(self.config.settings, self._spec)
                    log.info("loaded embedder %s in %.1f s", self._spec.name, time.perf_counter() - started)
                except Exception as e:  # degraded search, never a crash
                    log.warning("cannot load the embedder: %s", e)
                    self._embedder, self._embedder_failed_at = _BrokenEmbedder(e), time.monotonic()
            timeout = self.config.embed_timeout_ms
            if timeout > 0 and not isinstance(self._embedder, (_BoundedEmbedder, _BrokenEmbedder)):
                self._embedder = _BoundedEmbedder(self._embedder, timeout)
            return self._spec, self._embedder

    def search(self, user: str | None, query: str, top_k: int, kb: str | None) -> SearchResponse:
        with self.connection() as conn, _db_errors(self.config.options.statement_timeout_ms, "search"):
            spec, embedder = self.embedder(conn)
            response = search(
                conn,
                self.config.settings,
                query,
                top_k,
                kb,
                embedder=embedder,
                reranker=self.reranker,
                user=user,
                options=self.config.options,
                spec=spec,
                max_top_k=MCP_MAX_TOP_K,
            )
        t = response.timings_ms
        log.info(
            "search user=%s kb=%s top_k=%d: %d results, embed %.0f ms, search %.0f ms%s%s",
            user,
            kb,
            top_k,
            len(response.results),
            t.get("embed", 0),
            t.get("search", 0),
            f", rerank {t['rerank']:.0f} ms" if "rerank" in t else "",
            f" (degraded: {response.degraded_reason})" if response.degraded else "",
        )
        self.log_query(response)
        return response

    def document(self, user: str | None, doc_id: str, kb: str | None, chunk_index: int, window: int) -> dict:
        """kb.get_document as ``user``: visibility, the unknown / ambiguous / out-of-range errors and the
        chunk window are the database's."""
        if not doc_id or not doc_id.strip():
            raise ToolFailure("doc_id must not be empty: pass the doc_id of a search result")
        with (
            self.connection() as conn,
            _db_errors(self.config.options.statement_timeout_ms, "get_document"),
            self.acting(conn, user),
        ):
            kb_name, doc_key, title, source_url, chunk_count, updated, chunks = conn.execute(
                "select kb, doc_key, title, source_url, chunk_count, updated_at, chunks"
                " from kb.get_document(%s, %s, %s, %s)",
                [doc_id, kb, chunk_index, window],
            ).fetchone()
        return {
            "kb": kb_name,
            "doc_id": doc_key,
            "title": title,
            "source": source_url or f"kb://{kb_name}/{doc_key}",
            "uri": f"kb://{kb_name}/{doc_key}",
            "chunk_count": chunk_count,
            "updated_at": updated.isoformat(),
            "chunks": [
                {
                    "chunk_index": c["chunk_index"],
                    "heading_path": c["heading_path"],
                    "chunk_type": c["chunk_type"],
                    "content": c["content"],
                }
                for c in chunks
            ],
        }

    def knowledge_bases(self, user: str | None) -> list[dict]:
        with (
            self.connection() as conn,
            _db_errors(self.config.options.statement_timeout_ms, "list_knowledge_bases"),
            self.acting(conn, user),
        ):
            rows = conn.execute(
                "select name, visibility, description, document_count, chunk_count, last_updated"
                " from kb.list_knowledge_bases()"
            ).fetchall()
        return [
            {
                "name": n,
                "visibility": v,
                "description": desc,
                "document_count": int(docs),
                "chunk_count": int(chunks),
                "last_updated": last.isoformat() if last else None,
            }
            for n, v, desc, docs, chunks, last in rows
        ]

    def log_query(self, response: SearchResponse) -> None:
        path = self.config.query_log
        if path is None:
            return
        record = {
            "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "user": response.user,
            "query": response.query,
            "kb": response.kb,
            "top_k": response.top_k,
            "degraded": response.degraded,
            "degraded_reason": response.degraded_reason,
            "reranked": response.reranked,
            "results": [
                {
                    "kb": h.kb,
                    "doc": h.doc_key,
                    "chunk": h.chunk_index,
                    "score": h.final_score,
                    "fused_score": h.score,
                    "rerank_score": h.rerank_score,
                    "vector_rank": h.vector_rank,
                    "lexical_rank": h.lexical_rank,
                    "fuzzy_rank": h.fuzzy_rank,
                }
                for h in response.results
            ],
            "ms": response.timings_ms,
        }
        line = json.dumps(record, ensure_ascii=False) + "\n"
        try:
            with self._log_lock, path.open("a", encoding="utf-8") as f:
                f.write(line)
        except OSError as e:
            log.warning("cannot write the query log %s: %s", path, e)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


@contextlib.contextmanager
def _db_errors(timeout_ms: int, what: str) -> Iterator[None]:
    """Database failures as ToolFailure messages a model (and a person) can act on."""
    try:
        yield
    except psycopg.errors.QueryCanceled as e:
        raise ToolFailure(
            f"{what} timed out after {timeout_ms} ms (PGKB_STATEMENT_TIMEOUT_MS); try a more specific query or a kb"
        ) from e
    except psycopg.OperationalError as e:
        raise ToolFailure(f"the knowledge base database is unavailable ({_first_line(e)}); try again") from e
    except psycopg.Error as e:
        diag = getattr(e, "diag", None)
        message = (diag.message_primary if diag else None) or _first_line(e)
        hint = diag.message_hint if diag else None
        if isinstance(e, psycopg.errors.NoDataFound) and "knowledge base" in message:
            hint = "list_knowledge_bases shows the ones you can see"
        raise ToolFailure(message + (f" ({hint})" if hint else "")) from e


# ------------------------------------------------------------------------------------------- arguments


def _shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``value`` as echoed in a message: at most ``limit`` characters, a cut one ending in "…"."""
    try:
        text = value if isinstance(value, str) else str(value)
    except ValueError:  # an integer too long to print
        return "(a very long number)"
    return text if len(text) <= limit else text[:limit] + "…"


def _bounded_message(e: BaseException, *values: object) -> str:
    """An error message for the caller: every long argument value it quotes is cut to its first
    SHOWN_CHARS characters, and the whole message to MAX_MESSAGE_CHARS."""
    message = str(e)
    for value in values:
        if isinstance(value, str) and len(value) > SHOWN_CHARS:
            message = message.replace(value, _shown(value))
    return _shown(message, MAX_MESSAGE_CHARS)


def check_text(name: str, value: object, limit: int) -> str:
    """A string argument, or ToolFailure: not a string, longer than ``limit`` characters, a NUL character or
    an unpaired surrogate (text that is not valid Unicode). The value itself is never echoed."""
    if not isinstance(value, str):
        raise ToolFailure(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise ToolFailure(f"{name} is {len(value)} characters long; at most {limit} are accepted")
    if "\x00" in value:
        raise ToolFailure(f"{name} contains a NUL character, which is not allowed")
    if _SURROGATE.search(value):
        raise ToolFailure(f"{name} {_SURROGATE_MESSAGE}")
    return value


_SURROGATE_MESSAGE = "contains an unpaired surrogate (invalid Unicode); send valid UTF-8 text"


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """An integer argument within [low, high] (booleans are not integers), or ToolFailure."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolFailure(f"{name} must be an integer, got {type(value).__name__} {_shown(value, 20)}")
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ToolFailure(f"{name} must be {bounds}, got {_shown(value, 20)}")
    return value


# -------------------------------------------------------------------------------------------- rendering


def _trim(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[: max(0, limit - 12)].rstrip() + " …[trimmed]", True


def render_search(response: SearchResponse, notes: list[str]):
    """A CallToolResult: structured content + concise text, within RESPONSE_BUDGET_CHARS (contents trimmed,
    never whole results)."""
    from mcp.types import CallToolResult, TextContent

    hits = response.results
    # text and structured content both carry the contents: half the budget each, minus the fixed parts
    overhead = 600 + sum(400 + len(h.title) * 2 + len(h.source) * 2 + 40 * len(h.heading_path) for h in hits)
    budget = max(2000, (RESPONSE_BUDGET_CHARS - overhead) // 2)
    trimmed_ranks: list[int] = []
    contents: list[str] = []
    remaining = budget
    for i, hit in enumerate(hits):
        share = remaining // (len(hits) - i)  # fair share; unused share goes to later results
        content, cut = _trim(hit.content, max(200, share))
        if cut:
            trimmed_ranks.append(i + 1)
        contents.append(content)
        remaining -= len(content)
    notes = list(notes)
    if trimmed_ranks:
        notes.append(
            f"content of results {', '.join(map(str, trimmed_ranks))} was trimmed to fit the response size "
            "budget; get_document(doc_id, kb, chunk_index) returns the full text"
        )
    items = []
    for rank, (hit, content) in enumerate(zip(hits, contents, strict=True), 1):
        item = SearchResultItem(
            rank=rank,
            content=content,
            title=hit.title,
            kb=hit.kb,
            doc_id=hit.doc_key,
            chunk_index=hit.chunk_index,
            heading_path=list(hit.heading_path),
            source=hit.source,
            uri=f"kb://{hit.kb}/{hit.doc_key}",
            score=hit.final_score,
            fused_score=hit.score,
            vector_rank=hit.vector_rank,
            lexical_rank=hit.lexical_rank,
            fuzzy_rank=hit.fuzzy_rank,
            rerank_score=hit.rerank_score,
            content_trimmed=rank in trimmed_ranks,
        ).model_dump(mode="json")
        if item["rerank_score"] is None:
            del item["rerank_score"]
        items.append(item)
    if response.below_min_score:
        notes.append(f"{response.below_min_score} results scored below PGKB_RERANK_MIN_SCORE and were dropped")
    output = SearchOutput(
        query=response.query,
        kb=response.kb,
        top_k=response.top_k,
        result_count=len(items),
        results=[],
        degraded=response.degraded,
        degraded_reason=response.degraded_reason,
        reranked=response.reranked,
        trimmed=bool(trimmed_ranks),
        notes=notes,
        timings_ms=response.timings_ms,
    ).model_dump(mode="json")
    output["results"] = items

    lines: list[str] = []
    if response.degraded:
        lines.append(f"Note: degraded results — {response.degraded_reason}")
    lines.extend(f"Note: {n}" for n in notes)
    if not items:
        where = f' in knowledge base "{response.kb}"' if response.kb else ""
        lines.append(f'No results for "{_shown(response.query)}"{where}. Try other words or list_knowledge_bases.')
    for item in items:
        location = breadcrumb(item["title"] or item["doc_id"], item["heading_path"])
        lines.append(f"[{item['rank']}] {location} (score {item['score']:.4f}, {item['source']})")
        lines.append(item["content"])
        lines.append("")
    text = "\n".join(lines).rstrip() + "\n"
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=output)


def render_document(doc: dict, budget: int) -> tuple[dict, str]:
    """Fit a document's chunks into ``budget`` characters (text and structured both carry them: half each);
    chunks left out are named in the notes."""
    notes: list[str] = []
    half = max(2000, budget // 2 - 2000)
    chunks, used, omitted_from = [], 0, None
    for chunk in doc["chunks"]:
        room = half - used
        if room < 200:
            omitted_from = chunk["chunk_index"]
            break
        content, cut = _trim(chunk["content"], room)
        chunks.append({**chunk, "content": content, "content_trimmed": cut})
        used += len(content) + 40
        if cut:
            notes.append(f"chunk {chunk['chunk_index']} was trimmed to fit the size budget")
    if omitted_from is not None:
        last = doc["chunks"][-1]["chunk_index"]
        notes.append(
            f"chunks {omitted_from}..{last} were left out to fit the size budget; call get_document with "
            f"chunk_index={omitted_from} (and a window) to read them"
        )
    out = {**doc, "chunks": chunks, "trimmed": bool(notes), "notes": notes}
    lines = [f"# {doc['title'] or doc['doc_id']}", f"{doc['source']} ({doc['kb']}, {doc['chunk_count']} chunks)"]
    lines.extend(f"Note: {n}" for n in notes)
    for chunk in chunks:
        heading = " > ".join(chunk["heading_path"])
        lines.append("")
        lines.append(f"[chunk {chunk['chunk_index']}]" + (f" {heading}" if heading else ""))
        lines.append(chunk["content"])
    return out, "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ server


def build_server(backend: Backend):
    """The MCPServer with pgkb's tools and document resources."""
    from mcp.server.mcpserver import Context, MCPServer, ResourceSecurity
    from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
    from mcp.types import CallToolResult, TextContent, ToolAnnotations

    read_only = ToolAnnotations(
        read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False
    )
    config = backend.config
    server = MCPServer(
        "pgkb",
        title="pgkb knowledge base",
        instructions=(
            "Search the team's private knowledge base (docs, runbooks, FAQs; mostly Chinese, some English). "
            "Use search_knowledge first, then get_document(doc_id, kb, chunk_index) for more context. "
            "Cite sources by their source URL or kb:// URI."
        ),
        version=_version(),
        log_level="INFO" if config.verbose else "WARNING",
    )

    def user_of(ctx: Context | None) -> str | None:
        headers = None
        if ctx is not None:
            with contextlib.suppress(ValueError, AttributeError):
                headers = ctx.headers
        if config.tokens and headers is not None:
            token = _bearer(headers.get("authorization"))
            for known, user in config.tokens.items():
                if token is not None and hmac.compare_digest(token.encode(), known.encode()):
                    return user
            raise ToolFailure("unauthorized: send Authorization: Bearer <token>")
        return config.default_user

    @server.tool(name="search_knowledge", title="Search the knowledge base", annotations=read_only)
    def search_knowledge(
        query: Annotated[str, Field(description="the question or keywords (Chinese or English)")],
        ctx: Context,
        top_k: Annotated[int, Field(strict=True, description=f"results to return, 1-{MCP_MAX_TOP_K}")] = 5,
        kb: Annotated[str, Field(description='one knowledge base to search; "" = all you can see')] = "",
    ) -> Annotated[CallToolResult, SearchOutput]:
        """Search the knowledge base (hybrid semantic + keyword + fuzzy search; Chinese and English).

        query: the question or keywords. top_k: results to return (1-20; larger values are capped at 20).
        kb: search only this knowledge base ("" = every knowledge base you can see).
        Returns the best-matching passages with title, heading path, source, doc_id and chunk_index;
        call get_document(doc_id, kb, chunk_index) to read around a passage.
        """
        notes = []
        try:
            if check_int("top_k", top_k, 1) > MCP_MAX_TOP_K:
                notes.append(f"top_k {_shown(top_k, 20)} was capped at {MCP_MAX_TOP_K}")
                top_k = MCP_MAX_TOP_K
            query, top_k = validate(query, top_k, MCP_MAX_TOP_K)  # empty or longer than MAX_QUERY_CHARS
            check_text("query", query, MAX_QUERY_CHARS)
            check_text("kb", kb, MAX_KB_NAME_CHARS)
            user = user_of(ctx)
            response = backend.search(user, query, top_k, kb.strip() or None)
        except (ToolFailure, ValueError) as e:
            raise ToolError(_bounded_message(e, query, kb)) from e
        return render_search(response, notes)

    @server.tool(name="get_document", title="Read a document", annotations=read_only)
    def get_document(
        doc_id: Annotated[str, Field(description="the doc_id of a search result (the document key)")],
        ctx: Context,
        kb: Annotated[str, Field(description="the result's knowledge base (needed when ambiguous)")] = "",
        chunk_index: Annotated[
            int, Field(strict=True, description="-1: whole document; else the chunk (0, 1, ...) to centre on")
        ] = -1,
        window: Annotated[
            int, Field(strict=True, description=f"chunks before and after chunk_index, 0-{MAX_WINDOW}")
        ] = 2,
    ) -> Annotated[CallToolResult, DocumentOutput]:
        """Read a document of the knowledge base: all of it (chunk_index -1), or the chunks around one hit
        (chunk_index ± window, window 0-20). doc_id is the doc_id of a search result; pass its kb too when the
        same doc_id exists in several knowledge bases. Very long documents are cut to a size budget and the
        result says which chunks were left out."""
        try:
            check_text("doc_id", doc_id, MAX_DOC_ID_CHARS)
            check_text("kb", kb, MAX_KB_NAME_CHARS)
            if check_int("chunk_index", chunk_index, -MAX_CHUNK_INDEX, MAX_CHUNK_INDEX) < -1:
                raise ToolFailure(
                    f"chunk_index must be -1 (the whole document) or a chunk number >= 0, got {chunk_index}"
                )
            check_int("window", window, 0, MAX_WINDOW)
            doc = backend.document(user_of(ctx), doc_id, kb.strip() or None, chunk_index, window)
        except ToolFailure as e:
            raise ToolError(_bounded_message(e, doc_id, kb)) from e
        out, text = render_document(doc, RESPONSE_BUDGET_CHARS)
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=out)

    @server.tool(name="list_knowledge_bases", title="List knowledge bases", annotations=read_only)
    def list_knowledge_bases(ctx: Context) -> Annotated[CallToolResult, KnowledgeBasesOutput]:
        """The knowledge bases you can search, with their document counts and when they last changed."""
        try:
            kbs = backend.knowledge_bases(user_of(ctx))
        except ToolFailure as e:
            raise ToolError(_bounded_message(e)) from e
        if kbs:
            text = "\n".join(
                f"- {k['name']} ({k['visibility']}): {k['document_count']} documents, last updated "
                f"{k['last_updated']}" + (f" — {k['description']}" if k["description"] else "")
                for k in kbs
            )
        else:
            text = "No knowledge bases are visible to you."
        return CallToolResult(
            content=[TextContent(type="text", text=text + "\n")], structured_content={"knowledge_bases": kbs}
        )

    @server.resource(
        "kb://{kb}/{+doc_key}",
        name="document",
        title="Knowledge base document",
        description="A whole document of the knowledge base (Markdown), e.g. a search result's uri",
        mime_type="text/markdown",
        security=ResourceSecurity(exempt_params={"doc_key"}),  # a database key, not a file path
    )
    def read_document(kb: str, doc_key: str, ctx: Context) -> str:
        try:
            check_text("knowledge base", kb, MAX_KB_NAME_CHARS)
            check_text("document key", doc_key, MAX_DOC_ID_CHARS)
            doc = backend.document(user_of(ctx), doc_key, kb, -1, 0)
        except ToolFailure as e:
            message = _bounded_message(e, doc_key, kb)
            if message.startswith("unknown"):
                raise ResourceNotFoundError(message) from e
            raise ResourceError(message) from e
        return render_document(doc, RESOURCE_BUDGET_CHARS)[1]

    return server


def _bearer(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("pgkb")
    except Exception:
        return "0"


# ---------------------------------------------------------------------------------------- stdio transport


def _rpc_error(rid, code: int, message: str):
    from mcp_types import ErrorData, JSONRPCError

    return JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(code=code, message=message))


def _surrogate_path(value: object) -> list[str] | None:
    """The keys leading to the first string (or key) of a parsed JSON value holding an unpaired
    surrogate, else None. Iterative: nesting depth costs no recursion."""
    stack: list[tuple[object, list[str]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if _SURROGATE.search(key):
                    return [*path, key]
                stack.append((child, [*path, key]))
        elif isinstance(item, list):
            stack.extend((child, [*path, str(i)]) for i, child in enumerate(item))
    return None


def parse_stdio_line(line: bytes):
    """One line read by the stdio transport -> ``(message, None)`` for the server, ``(None, answer)`` to
    write back at once, or ``(None, None)`` to ignore (blank lines; notifications that cannot be answered).

    JSON-RPC 2.0 answers for what the SDK would drop silently: -32700 (id null) for a line that is not
    UTF-8 JSON (including numbers too long to read); -32600 for JSON that is no JSON-RPC message; an unpaired
    surrogate (which the SDK's JSON parser refuses) in a tool argument is that tool call's error result, and
    anywhere else -32602 / -32600. No unpaired surrogate ever reaches the server, so none can reach an answer.
    """
    import mcp_types as types
    from mcp.shared.message import SessionMessage
    from pydantic import ValidationError

    if not line.strip():
        return None, None
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False)), None
    except ValidationError:
        pass  # find out what is wrong, to say so
    try:
        value = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, _rpc_error(None, types.PARSE_ERROR, "Parse error: the line is not valid UTF-8")
    except (ValueError, RecursionError) as e:
        reason = "a number is too long" if "integer string conversion" in str(e) else _shown(_first_line(e))
        return None, _rpc_error(None, types.PARSE_ERROR, f"Parse error: {reason}")
    if not isinstance(value, dict):
        return None, _rpc_error(
            None, types.INVALID_REQUEST, "Invalid Request: a message must be a JSON object (batches are not supported)"
        )
    rid = value.get("id")
    if isinstance(rid, bool) or not isinstance(rid, (int, str)) or (isinstance(rid, str) and _SURROGATE.search(rid)):
        rid = None
    bad = _surrogate_path(value)
    if bad is None:
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(value, by_name=False)), None
        except ValidationError:
            return None, _rpc_error(
                rid, types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request, notification or response"
            )
    method = value.get("method")
    if "id" not in value and isinstance(method, str):
        log.warning("dropped a notification holding an unpaired surrogate (%s)", _shown(method, 50))
        return None, None
    where = _SURROGATE.sub("\ufffd", ".".join(bad))
    if method == "tools/call" and rid is not None and len(bad) >= 3 and bad[:2] == ["params", "arguments"]:
        from mcp_types import CallToolResult, JSONRPCResponse, TextContent

        argument = _shown(_SURROGATE.sub("\ufffd", bad[2]), 50)
        result = CallToolResult(
            content=[TextContent(type="text", text=f"{argument} {_SURROGATE_MESSAGE}")], is_error=True
        )
        return None, JSONRPCResponse(jsonrpc="2.0", id=rid, result=result.model_dump(by_alias=True, exclude_none=True))
    code, kind = (
        (types.INVALID_PARAMS, "Invalid params") if bad[0] == "params" else (types.INVALID_REQUEST, "Invalid Request")
    )
    return None, _rpc_error(rid, code, f"{kind}: {_shown(where, 100)} {_SURROGATE_MESSAGE}")


def _encode(message) -> bytes:
    """One JSON-RPC message as a line of UTF-8. An answer that cannot be encoded becomes an internal error
    for its request (never a dead transport); an unencodable notification is dropped."""
    try:
        text = message.model_dump_json(by_alias=True, exclude_unset=True)
    except Exception as e:
        log.error("cannot encode a %s: %s", type(message).__name__, _shown(e))
        from mcp_types import INTERNAL_ERROR, JSONRPCError, JSONRPCResponse

        if not isinstance(message, (JSONRPCResponse, JSONRPCError)):
            return b""
        text = _rpc_error(
            message.id, INTERNAL_ERROR, "Internal error: the answer could not be encoded"
        ).model_dump_json(by_alias=True, exclude_unset=True)
    return (text + "\n").encode("utf-8")


@contextlib.asynccontextmanager
async def stdio_transport(stdin: BinaryIO | None = None, stdout: BinaryIO | None = None):
    """MCP over newline-delimited JSON-RPC on stdin/stdout, like the SDK's ``stdio_server`` but answering
    every line (see ``parse_stdio_line``). Yields the server's (read, write) streams. Without explicit
    streams, fd 0 reads the null device and fd 1 writes to stderr while serving (stray output cannot
    corrupt the protocol); both are restored afterwards."""
    import anyio
    from mcp.shared.message import SessionMessage

    restore = None
    if stdin is None or stdout is None:
        sys.stdout.flush()
        wire_in, wire_out = os.dup(0), os.dup(1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        stdin, stdout = os.fdopen(wire_in, "rb"), os.fdopen(wire_out, "wb")

        def restore() -> None:
            os.dup2(wire_out, 1)
            os.dup2(wire_in, 0)

    read_send, read_receive = anyio.create_memory_object_stream(0)
    write_send, write_receive = anyio.create_memory_object_stream(0)
    answers = write_send.clone()
    lines, out = anyio.wrap_file(stdin), anyio.wrap_file(stdout)

    async def reader() -> None:
        async with read_send, answers:
            async for line in lines:
                message, answer = parse_stdio_line(line)
                if message is not None:
                    await read_send.send(message)
                elif answer is not None:
                    await answers.send(SessionMessage(answer))

    async def writer() -> None:
        async with write_receive:
            async for item in write_receive:
                data = _encode(item.message)
                if data:
                    await out.write(data)
                    await out.flush()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            yield read_receive, write_send
    finally:
        if restore is not None:
            restore()


async def serve_stdio(server) -> None:
    """Serve ``server`` (an MCPServer) over ``stdio_transport`` until stdin closes."""
    async with stdio_transport() as (read, write):
        lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async runs, over the SDK's transport
        await lowlevel.run(read, write, lowlevel.create_initialization_options())


# --------------------------------------------------------------------------------------------- HTTP guard


def origin_allowed(origin: str, allowed: tuple[str, ...]) -> bool:
    """Localhost origins always; others only when listed (or ``*``)."""
    if "*" in allowed or origin in allowed:
        return True
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in LOOPBACK


class HttpGuard:
    """ASGI middleware in front of the MCP apps: Origin check, Host check on loopback binds, bearer tokens;
    routes /sse and /messages/ to the deprecated HTTP+SSE transport, everything else to streamable HTTP."""

    def __init__(self, app, *, tokens: dict[str, str], allowed_origins: tuple[str, ...], loopback: bool, sse_app=None):
        self.app, self.sse_app = app, sse_app
        self.tokens, self.allowed_origins, self.loopback = tokens, allowed_origins, loopback

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin and not origin_allowed(origin, self.allowed_origins):
            log.warning("refused Origin %s", origin)
            await _reply(send, 403, f"Origin {origin} is not allowed (PGKB_MCP_ALLOWED_ORIGINS)")
            return
        if self.loopback:
            host = (headers.get("host") or "").rsplit(":", 1)[0].strip("[]")
            if host not in LOOPBACK:
                await _reply(send, 421, "Host must be localhost, 127.0.0.1 or [::1]")
                return
        if self.tokens:
            token = _bearer(headers.get("authorization"))
            if token is None or not any(hmac.compare_digest(token.encode(), t.encode()) for t in self.tokens):
                await _reply(send, 401, "a valid bearer token is required", {"www-authenticate": "Bearer"})
                return
        path = scope.get("path", "")
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


def http_app(server, config: McpConfig, host: str):
    from mcp.server.transport_security import TransportSecuritySettings

    off = TransportSecuritySettings(enable_dns_rebinding_protection=False)  # HttpGuard does these checks
    app = server.streamable_http_app(transport_security=off, host=host)
    sse = server.sse_app(transport_security=off, host=host)
    return HttpGuard(
        app, tokens=config.tokens, allowed_origins=config.allowed_origins, loopback=host in LOOPBACK, sse_app=sse
    )


# ---------------------------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `pgkb mcp` options (argparse)."""
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="default stdio")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"HTTP address (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})")
    parser.add_argument("--verbose", action="store_true", help="log every stage to stderr")
    parser.add_argument("--no-rerank", action="store_true", help="ignore PGKB_RERANK_URL / PGKB_RERANK_MODEL")


def run(args, settings: Settings) -> int:
    """Serve until stopped. Configuration errors print to stderr and return 2."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.verbose:
        log.setLevel(logging.INFO)
    from pgkb.models.rerank import RerankError, load_reranker

    try:
        config = McpConfig.from_env(settings, verbose=args.verbose)
        reranker = None if args.no_rerank else load_reranker()
    except (ConfigError, RerankError, EmbeddingError) as e:
        print(f"pgkb: mcp: {e}", file=sys.stderr)
        return 2
    if args.transport == "http" and not config.tokens and args.host not in LOOPBACK:
        log.warning("serving %s without PGKB_MCP_TOKENS: every caller acts as %s", args.host, config.default_user)
    backend = Backend(config, reranker=reranker)
    try:  # refuse at once to serve as a role that bypasses visibility; a database that is down is fine
        backend.check_role()
    except PrivilegedRoleError as e:
        print(f"pgkb: mcp: {e}", file=sys.stderr)
        return 2
    server = build_server(backend)
    try:
        if args.transport == "stdio":
            import anyio

            anyio.run(serve_stdio, server)
            return 0
        import uvicorn

        app = http_app(server, config, args.host)
        log.info("serving MCP on http://%s:%d/mcp", args.host, args.port)
        uvicorn.Server(
            uvicorn.Config(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
        ).run()
        return 0
    finally:
        backend.close()
