"""Database access for the servers (MCP tools, `pgkb serve`): the connection pool, the acting user and
statement timeout per call, API key checks (kb_service.verify_api_key), the query embedder with its deadline, the
reads (search, kb.get_document, kb.list_knowledge_bases), and what /readyz and /metrics ask of them (each stage
of a call is timed in the server's pgkb.serving.metrics)."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import psycopg

from pgkb.migrate import pending_migrations
from pgkb.models.embedding import EmbeddingError, ModelSpec, load_embedder, model_spec
from pgkb.rows import one
from pgkb.search import (
    QUERY_EMBEDDING_FAILED,
    QueryEmbedding,
    SearchResponse,
    acting,
    check_also,
    check_input,
    embed_query,
    search,
    snippets,
)
from pgkb.service_role import PrivilegedRoleError, refuse_privileged
from pgkb.serving.arguments import (
    BadInput,
    Forbidden,
    NotFound,
    ServiceError,
    Unsupported,
    _first_line,
)
from pgkb.serving.config import (
    API_KEY_CACHE_SECONDS,
    API_KEY_CACHE_SIZE,
    CONNECT_TIMEOUT_SECONDS,
    EMBED_WORKERS,
    EMBEDDER_RETRY_SECONDS,
    MCP_MAX_TOP_K,
    METRICS_WAIT_SECONDS,
    POOL_MIN_SIZE,
    POOL_QUICK_WAIT_SECONDS,
    POOL_WAIT_SECONDS,
    READY_CONNECT_SECONDS,
    SLOT_WAIT_SECONDS,
    ServiceConfig,
)
from pgkb.serving.metrics import ServerMetrics, backend_gauges, backlog_gauges

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool  # imported by the first call that needs the pool

    from pgkb.saving import SavedNote

log = logging.getLogger("pgkb.serving")


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

    def __init__(self, config: ServiceConfig, *, reranker=None, embedder=None, server: str = "mcp") -> None:
        self.config = config
        self.reranker = reranker
        self._embedder = embedder
        self._spec: ModelSpec | None = None
        self._embedder_failed_at = 0.0
        self._lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._pool_lock = threading.Lock()
        self._probe_lock = threading.Lock()  # one probe connection at a time, however many calls wait
        self._probed_at = float("-inf")  # when the last probe that found the database up started (monotonic)
        self._pool: ConnectionPool | None = None  # opened by the first call
        self._slots = threading.BoundedSemaphore(config.max_concurrent)  # tool calls served at once
        self._key_lock = threading.Lock()
        # (key_id, secret hash) -> (valid until, user); refusals apart, so a flood of made-up keys never
        # evicts the verdicts of real ones
        self._key_verdicts: dict[tuple[str, bytes], tuple[float, str | None]] = {}
        self._key_refusals: dict[tuple[str, bytes], tuple[float, str | None]] = {}
        # key checks run before the caller is known: at most a quarter of the call slots go to them
        self._key_checks = threading.BoundedSemaphore(max(1, config.max_concurrent // 4))
        self._calls = 0  # of them, in progress now (for /metrics)
        self._calls_lock = threading.Lock()
        self.metrics = ServerMetrics(server)
        # what the question log records of this server's searches and asks ("dify": kb.retrieve, Dify's API)
        self.entry_point = "page" if server == "serve" else "mcp"
        self.metrics.add_gauges(self._gauges)

    def _probe(self) -> None:
        """ServiceError unless a direct connection to the database succeeds (it is closed again) as a role
        that sees no more than the users it acts for (PrivilegedRoleError otherwise)."""
        try:
            with psycopg.connect(self.config.database_url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                refuse_privileged(conn)
        except psycopg.OperationalError as e:
            raise ServiceError(f"the knowledge base database is unavailable ({_first_line(e)}); try again") from e
        except psycopg.errors.UndefinedFunction as e:
            raise ServiceError("the knowledge base database is not migrated: run `pgkb db migrate`") from e
        except PrivilegedRoleError as e:
            raise ServiceError(str(e)) from e

    def check_role(self) -> None:
        """PrivilegedRoleError when the configured role bypasses visibility; nothing when it is fit or the
        database cannot be reached now (the first call checks again)."""
        try:
            with psycopg.connect(self.config.database_url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                refuse_privileged(conn)
        except psycopg.Error as e:
            log.warning("cannot check the database role now: %s", _first_line(e))

    def readiness(self) -> str | None:
        """Why the server cannot serve now, as /readyz says it (a fixed phrase; the details are logged), or
        None: a direct connection must succeed within READY_CONNECT_SECONDS and find every db/migrations
        file applied (what a server checks when it starts)."""
        try:
            with psycopg.connect(self.config.database_url, connect_timeout=READY_CONNECT_SECONDS) as conn:
                pending = pending_migrations(conn, self.config.settings.db_dir)
        except psycopg.Error as e:
            log.warning("not ready: the knowledge base database is unavailable (%s)", _first_line(e))
            return "database unavailable"
        if pending:
            log.warning("not ready: the database lacks %s (run `pgkb db migrate`)", ", ".join(pending))
            return "database not migrated"
        return None

    def embedding_backlog(self) -> list[tuple[str, int, int, float | None]]:
        """kb_service.embedding_backlog(): (model, chunks queued, chunks parked, age of the oldest queued one in
        seconds) per model. Through the pool but outside the call slots, waiting at most
        METRICS_WAIT_SECONDS for a connection: a scrape neither turns a call away nor queues behind them."""
        from psycopg_pool import PoolTimeout

        timeout = self.config.options.statement_timeout_ms
        try:
            with (
                self.pool().connection(timeout=METRICS_WAIT_SECONDS) as conn,
                _db_errors(timeout, "embedding_backlog"),
                self.acting(conn, None),
            ):
                return conn.execute(
                    "select model, queued, parked, oldest_queued_seconds from kb_service.embedding_backlog()"
                ).fetchall()
        except PoolTimeout as e:
            raise ServiceError(f"no free database connection within {METRICS_WAIT_SECONDS:g} s") from e

    def _gauges(self) -> list:
        """What /metrics reads from the backend when scraped: calls in progress, the pool and the embedding
        backlog (left out, and logged, while the database cannot tell it)."""
        pool = self._pool
        stats: dict[str, int] = pool.get_stats() if pool is not None else {}
        gauges = backend_gauges(self._calls, self.config.max_concurrent, stats, self.config.pool_size)
        try:
            gauges += backlog_gauges(self.embedding_backlog())
        except ServiceError as e:
            log.warning("/metrics without the embedding backlog: %s", e)
        return gauges

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
                    name="pgkb-serving",
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
        after the call, within one of the call slots (:meth:`slot`). A pool that hands out nothing within
        POOL_QUICK_WAIT_SECONDS is either busy or cut off from the database: a direct connection tells
        which, so a database that went down is reported within seconds; a busy pool is waited for up to
        POOL_WAIT_SECONDS."""
        with self.slot(), self._pooled() as conn:
            yield conn

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """One of the ``max_concurrent`` call slots, held for the block; beyond that many a call is turned
        away within SLOT_WAIT_SECONDS (ServiceError "busy")."""
        if not self._slots.acquire(timeout=SLOT_WAIT_SECONDS):
            self.metrics.busy.labels("max_concurrent").inc()
            raise ServiceError(
                f"the server is busy ({self.config.max_concurrent} calls in progress, PGKB_MCP_MAX_CONCURRENT); "
                "try again in a moment"
            )
        with self._calls_lock:
            self._calls += 1
        try:
            yield
        finally:
            with self._calls_lock:
                self._calls -= 1
            self._slots.release()

    @contextlib.contextmanager
    def _pooled(self) -> Iterator[psycopg.Connection]:
        from psycopg_pool import PoolTimeout

        pool = self.pool()
        waiting_since = time.monotonic()
        try:
            conn = pool.getconn(timeout=POOL_QUICK_WAIT_SECONDS)
        except PoolTimeout:
            self._probe_shared(waiting_since)
            try:
                conn = pool.getconn(timeout=POOL_WAIT_SECONDS - POOL_QUICK_WAIT_SECONDS)
            except PoolTimeout as e:
                raise ServiceError(
                    f"no free database connection after {POOL_WAIT_SECONDS:g} s (all {self.config.pool_size} "
                    "in use, PGKB_MCP_POOL_SIZE); try again"
                ) from e
        try:
            yield conn
        finally:
            pool.putconn(conn)

    def _probe_shared(self, waiting_since: float) -> None:
        """The probe of a call that has waited for a pooled connection since ``waiting_since``: a probe that
        started after that and found the database up answers for it too, so the calls that wait together
        open one probe connection, not one each in turn (a closed probe's backend can still be on the server
        while the next one connects: two extra connections instead of one)."""
        with self._probe_lock:
            if self._probed_at >= waiting_since:
                return
            started = time.monotonic()
            self._probe()
            self._probed_at = started

    @contextlib.contextmanager
    def acting(self, conn: psycopg.Connection, user: str | None, entry_point: str | None = None) -> Iterator[None]:
        """A transaction acting as ``user`` with this server's statement timeout and entry point (None: the
        server's own; pgkb.search.acting)."""
        with acting(conn, user, self.config.options.statement_timeout_ms, entry_point or self.entry_point):
            yield

    def api_key_user(self, key_id: str, secret_sha256: bytes) -> str | None:
        """The pgkb user of the database API key ``key_id`` whose secret hashes to ``secret_sha256``, or None
        for an unknown, wrong, revoked or expired one (kb_service.verify_api_key, which also records its last use).
        A verdict is reused for API_KEY_CACHE_SECONDS. ServiceError when the database cannot answer (a fixed
        message: the caller is not authenticated; the details go to the log)."""
        asked_at = time.monotonic()
        key = (key_id, secret_sha256)
        with self._key_lock:
            valid_until, user = self._key_verdicts.get(key) or self._key_refusals.get(key) or (asked_at, None)
        if valid_until > asked_at:
            return user
        if not self._key_checks.acquire(timeout=SLOT_WAIT_SECONDS):
            self.metrics.busy.labels("key_checks").inc()
            raise ServiceError("the server is busy checking API keys; try again in a moment")
        try:
            with (
                self.connection() as conn,
                _db_errors(self.config.options.statement_timeout_ms, "checking the API key"),
                self.acting(conn, None),
            ):
                user = one(conn.execute("select kb_service.verify_api_key(%s, %s)", [key_id, secret_sha256]))[0]
        except ServiceError as e:
            # the caller is not known yet: the database's address and roles are for the log, not for them
            log.warning("could not check an API key: %s", e)
            raise ServiceError(
                "cannot check the API key now: the knowledge base database is unavailable; try again"
            ) from None
        finally:
            self._key_checks.release()
        with self._key_lock:
            verdicts = self._key_verdicts if user is not None else self._key_refusals
            if len(verdicts) >= API_KEY_CACHE_SIZE:
                verdicts.clear()
            verdicts[key] = (asked_at + API_KEY_CACHE_SECONDS, user)
        return user

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

    def search(
        self,
        user: str | None,
        query: str,
        top_k: int,
        kb: str | None,
        also: list[str] | None = None,
        *,
        logged: bool = True,
    ) -> SearchResponse:
        """pgkb.search.search as ``user`` with this server's embedder, reranker and entry point; ``logged``
        False: the question log leaves it out (it accompanies a logged ask)."""
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
                also=also,
                entry_point=self.entry_point,
                logged=logged,
            )
        t = response.timings_ms
        for stage, timing in (("embed", "embed"), ("sql", "search"), ("rerank", "rerank")):
            if timing in t:
                self.metrics.stage("search", stage, t[timing] / 1000)
        if any(r.startswith(QUERY_EMBEDDING_FAILED) for r in response.degraded_reasons):
            self.metrics.degraded.labels("search").inc()
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

    def save(self, user: str | None, kb: str, title: str, body: str, tags: list[str], doc_key: str | None) -> SavedNote:
        """kb.save_knowledge as ``user`` (pgkb.saving.save_note): chunked and embedded here, written on the
        primary (a server reading from a standby writes through PGKB_DATABASE_URL / the embedded cluster),
        within a call slot. The database's refusals become NotFound / BadInput / ServiceError."""
        from pgkb.chunking import ChunkingError
        from pgkb.saving import save_note

        with (
            self.slot(),
            _db_errors(self.config.options.statement_timeout_ms, "save_knowledge"),
            self._writer() as conn,
        ):
            spec, embedder = self.embedder(conn)
            try:
                saved = save_note(
                    conn, kb, title, body, user=user, doc_key=doc_key, tags=tags, origin="mcp",
                    embedder=embedder, spec=spec, timeout_ms=self.config.options.statement_timeout_ms,
                )  # fmt: skip
            except ChunkingError as e:
                raise BadInput(str(e)) from e
        log.info("save user=%s kb=%s doc_key=%s: %d chunks", user, saved.kb, saved.doc_key, saved.chunk_count)
        return saved

    def rate(
        self,
        user: str | None,
        helpful: bool,
        question_id: int | None,
        note: str | None,
        question: str | None,
        kb: str | None,
    ) -> int:
        """kb.rate_answer as ``user``, on the primary (see _writer), within a call slot: the rating's id. The
        database's refusals (another user's or an unknown question id, a note too long, too many ratings)
        become NotFound / BadInput."""
        with (
            self.slot(),
            _db_errors(self.config.options.statement_timeout_ms, "rate_answer"),
            self._writer() as conn,
            self.acting(conn, user),
        ):
            rating = one(conn.execute(
                "select kb.rate_answer(%s, question_id => %s, note => %s, question => %s, kb => %s)",
                [helpful, question_id, note, question, kb],
            ))[0]  # fmt: skip
        log.info("rate user=%s question=%s helpful=%s", user, question_id, helpful)
        return rating

    def gaps(self, user: str | None, kb: str, since: str) -> tuple[int | None, list[dict]]:
        """kb.knowledge_gaps as ``user`` (its owner or an administrator), on the primary (see _writer), within
        a call slot: how many days
        ``kb`` keeps its question log (None: off) and the topics of what was asked of it in the last ``since``
        (an interval) and not found. The database's refusals (unknown or invisible kb: NotFound; not its
        owner: Forbidden; a bad interval: BadInput) are passed on."""
        with (
            self.slot(),
            _db_errors(self.config.options.statement_timeout_ms, "knowledge_gaps"),
            self._writer() as conn,  # reading judges the rows not judged yet (writes): the primary
            self.acting(conn, user),
        ):
            days = one(conn.execute("select kb.question_log_days(%s)", [kb]))[0]
            cursor = conn.execute("select * from kb.knowledge_gaps(%s, %s::interval)", [kb, since])
            names = [c.name for c in cursor.description or []]
            return days, [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    @contextlib.contextmanager
    def _writer(self) -> Iterator[psycopg.Connection]:
        """A connection that may write: a pooled one, unless the pool reads from a standby."""
        if not self.config.settings.read_database_url:
            with self._pooled() as conn:
                yield conn
            return
        from pgkb.db import connect, service_database_url

        with connect(service_database_url(self.config.settings), autocommit=True) as conn:
            yield conn

    def document(
        self,
        user: str | None,
        doc_id: str,
        kb: str | None,
        chunk_index: int,
        window: int,
        shape: Callable[[list[dict]], list[dict]] | None = None,
    ) -> dict:
        """kb.get_document as ``user``: visibility, the unknown / ambiguous / out-of-range errors and the
        chunk window are the database's. ``shape`` (the page's cut and rendering) runs on the chunks while
        the call still holds its slot, so its work counts against max_concurrent like a search."""
        if not doc_id or not doc_id.strip():
            raise ServiceError("doc_id must not be empty: pass the doc_id of a search result")
        with self.slot():
            with (
                self._pooled() as conn,
                _db_errors(self.config.options.statement_timeout_ms, "get_document"),
                self.metrics.timed("document", "sql"),
                self.acting(conn, user),
            ):
                kb_name, doc_key, title, source_url, chunk_count, updated, chunks, uri = one(
                    conn.execute(
                        "select kb, doc_key, title, source_url, chunk_count, updated_at, chunks,"
                        " kb.document_uri(kb, doc_key) from kb.get_document(%s, %s, %s, %s)",
                        [doc_id, kb, chunk_index, window],
                    )
                )
            shown = [
                {
                    "chunk_index": c["chunk_index"],
                    "heading_path": c["heading_path"],
                    "chunk_type": c["chunk_type"],
                    "content": c["content"],
                }
                for c in chunks
            ]
            if shape is not None:
                shown = shape(shown)
        return {
            "kb": kb_name,
            "doc_id": doc_key,
            "title": title,
            "source": source_url or uri,
            "uri": uri,
            "chunk_count": chunk_count,
            "updated_at": updated.isoformat(),
            "chunks": shown,
        }

    def ask(self, user: str | None, question: str, top_k: int, kb: str | None, also: list[str] | None = None) -> dict:
        """kb.ask as ``user`` (not streamed) with this server's query embedding (pgkb.answer.ask): retrieval,
        the not-found gate, the answer and its checked citations are the database's; its input errors become
        BadInput (an unknown or invisible kb: NotFound) with the database's message, and a database without
        kb.ask Unsupported."""
        from pgkb.answer import AskError, ask

        with self.connection() as conn, _db_errors(self.config.options.statement_timeout_ms, "ask_knowledge"):
            spec, embedder = self.embedder(conn)
            try:
                row = ask(
                    conn, self.config.settings, question, top_k=top_k, kb=kb, user=user,
                    timeout_ms=self.config.options.statement_timeout_ms, embedder=embedder, spec=spec, also=also,
                    entry_point=self.entry_point,
                )  # fmt: skip
            except AskError as e:
                unknown = isinstance(e.__context__, psycopg.errors.NoDataFound)
                raise (NotFound if unknown else BadInput)(str(e)) from e
        for stage, timing in (("sql", "retrieve_ms"), ("answer", "generate_ms")):
            if row[timing] is not None:
                self.metrics.stage("ask", stage, float(row[timing]) / 1000)
        if (row["evidence"] or {}).get("lexical_only"):
            self.metrics.degraded.labels("ask").inc()
        log.info(
            "ask user=%s kb=%s top_k=%d: %s, %d citations, %.0f ms", user, kb, top_k, row["mode"],
            len(row["citations"] or []), row["total_ms"] or 0,
        )  # fmt: skip
        return row

    def answer_prompt(
        self, user: str | None, question: str, top_k: int, kb: str | None, also: list[str] | None = None
    ) -> tuple[list, list, str]:
        """The chat messages kb.answer_prompt builds from the hits ``user`` may see (hybrid search with this
        server's query embedding; lexical legs only when it fails), the sources as [{n, title, heading_path,
        page, uri, source_url}] and why the search was degraded ("" when it was not)."""
        with self.connection() as conn, _db_errors(self.config.options.statement_timeout_ms, "answer_with_citations"):
            try:
                also = check_also(also)
                check_input(conn, question, top_k, also)
            except ValueError as e:
                raise ServiceError(str(e)) from e
            embedded = self._embed(conn, "answer_prompt", question, user, kb, also)
            with self.acting(conn, user), self.metrics.timed("answer_prompt", "sql"):
                messages, sources = one(conn.execute(
                    "with hits as (select array(select h from kb.hybrid_search(%(q)s, %(k)s, %(kb)s, query_embedding"
                    " => %(query_embedding)s, model => %(model)s, vector_weight => %(vector_weight)s,"
                    " also => %(also)s, also_embeddings => %(also_embeddings)s) as h) as hits)"
                    " select kb.answer_prompt(%(q)s, hits.hits), coalesce((select jsonb_agg(jsonb_build_object("
                    " 'n', s.ordinality, 'title', s.title, 'heading_path', to_jsonb(s.heading_path),"
                    " 'page', s.metadata -> 'page', 'source_url', s.source_url,"
                    " 'uri', kb.document_uri(s.kb, s.doc_key)) order by s.ordinality)"
                    " from unnest(hits.hits) with ordinality as s), '[]') from hits",
                    {"q": question, "k": top_k, "kb": kb, "also": also, "also_embeddings": None,
                     **embedded.sql_arguments()},
                ))  # fmt: skip
        return messages, sources, embedded.failure or ""

    def knowledge_bases(self, user: str | None) -> list[dict]:
        with (
            self.connection() as conn,
            _db_errors(self.config.options.statement_timeout_ms, "list_knowledge_bases"),
            self.metrics.timed("list_knowledge_bases", "sql"),
            self.acting(conn, user),
        ):
            rows = conn.execute(
                "select name, visibility, description, document_count, chunk_count, last_updated, languages,"
                " can_manage from kb.list_knowledge_bases()"
            ).fetchall()
        return [
            {
                "name": n,
                "visibility": v,
                "description": desc,
                "document_count": int(docs),
                "chunk_count": int(chunks),
                "last_updated": last.isoformat() if last else None,
                "languages": languages,
                "can_manage": manages,
            }
            for n, v, desc, docs, chunks, last, languages, manages in rows
        ]

    def knowledge_languages(self, user: str | None) -> dict:
        """kb.knowledge_languages as ``user``: the language profile of everything ``user`` may read."""
        with (
            self.connection() as conn,
            _db_errors(self.config.options.statement_timeout_ms, "knowledge_languages"),
            self.acting(conn, user),
        ):
            return one(conn.execute("select kb.knowledge_languages()"))[0]

    def retrieve(
        self,
        user: str | None,
        query: str,
        top_k: int,
        kb: str | None,
        metadata_condition: dict | None = None,
        score_threshold: float = 0.0,
    ) -> tuple[list[dict], str | None]:
        """kb.retrieve as ``user`` (hits with an absolute 0..1 score, those below ``score_threshold`` left
        out) with the query embedded here; returns the rows (dicts by column) and, when no query embedding
        could be had, why (the relevance is then term coverage alone). BadInput for input the database
        refuses (blank query, a condition it cannot honour), NotFound for an unknown or invisible kb."""
        timeout = self.config.options.statement_timeout_ms
        with self.connection() as conn, _db_errors(timeout, "retrieve"):
            try:
                check_input(conn, query, top_k)
            except ValueError as e:
                raise BadInput(str(e)) from e
            embedded = self._embed(conn, "retrieve", query, user, kb)
            condition = None if metadata_condition is None else json.dumps(metadata_condition)
            with self.acting(conn, user, "dify"), self.metrics.timed("retrieve", "sql"):
                cursor = conn.execute(
                    "select *, kb.document_uri(knowledge_base, doc_key) as uri"
                    " from kb.retrieve(%(q)s, %(k)s, %(kb)s, query_embedding => %(query_embedding)s,"
                    " model => %(model)s, metadata_condition => %(condition)s::jsonb,"
                    " score_threshold => %(threshold)s, vector_weight => %(vector_weight)s)",
                    {"q": query, "k": top_k, "kb": kb, "condition": condition, "threshold": score_threshold,
                     **embedded.sql_arguments()},
                )  # fmt: skip
                columns = [c.name for c in cursor.description or ()]
                rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        log.info("retrieve user=%s kb=%s top_k=%d: %d records", user, kb, top_k, len(rows))
        return rows, embedded.failure

    def _embed(
        self, conn: psycopg.Connection, call: str, query: str, user: str | None, kb: str | None,
        also: list[str] | None = None,
    ) -> QueryEmbedding:  # fmt: skip
        """The query's embedding by this server's embedder (pgkb.search.embed_query, the offline translation
        as ``user`` sees ``kb``), timed as ``call``'s embed stage; a failure counts as a degraded ``call``."""
        spec, embedder = self.embedder(conn)
        with self.metrics.timed(call, "embed"):
            embedded = embed_query(
                conn, self.config.settings, query, embedder=embedder, spec=spec, also=also, kb=kb, user=user,
                timeout_ms=self.config.options.statement_timeout_ms,
            )  # fmt: skip
        if embedded.failure is not None:
            self.metrics.degraded.labels(call).inc()
        return embedded

    def snippets(self, query: str, contents: list[str], width: int, marks: tuple[str, str]) -> list[str]:
        """kb.snippet for each content: a window around the query's first term, terms wrapped in ``marks``
        (the database's term model decides what is highlighted)."""
        with (
            self.connection() as conn,
            _db_errors(self.config.options.statement_timeout_ms, "snippet"),
            self.metrics.timed("snippet", "sql"),
        ):
            return snippets(conn, query, contents, width, marks)

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


def open_backend(settings, *, command: str, verbose: bool, rerank: bool) -> Backend | None:
    """A server command's Backend: logging to stderr set up (INFO with ``verbose``), configuration read
    from the environment, the reranker loaded (``rerank``), the database role checked. None after printing
    why to stderr (``pgkb: <command>: …``) for a configuration error or a role that bypasses visibility; a
    database that is down is fine (the first call reports it)."""
    import sys

    from pgkb.config import ConfigError
    from pgkb.models.rerank import RerankError, load_reranker

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        config = ServiceConfig.from_env(settings, verbose=verbose)
        reranker = load_reranker() if rerank else None
        backend = Backend(config, reranker=reranker, server=command)
        backend.check_role()
    except (ConfigError, RerankError, EmbeddingError, PrivilegedRoleError) as e:
        print(f"pgkb: {command}: {e}", file=sys.stderr)
        return None
    return backend


@contextlib.contextmanager
def _db_errors(timeout_ms: int, what: str) -> Iterator[None]:
    """Database failures as ServiceError messages a model (and a person) can act on."""
    try:
        yield
    except psycopg.errors.QueryCanceled as e:
        raise ServiceError(
            f"{what} timed out after {timeout_ms} ms (PGKB_STATEMENT_TIMEOUT_MS); try a more specific query or a kb"
        ) from e
    except psycopg.errors.ProgramLimitExceeded as e:  # a refusal (class 54), though psycopg files it as operational
        raise BadInput(_first_line(e)) from e
    except psycopg.OperationalError as e:
        raise ServiceError(f"the knowledge base database is unavailable ({_first_line(e)}); try again") from e
    except psycopg.Error as e:
        diag = getattr(e, "diag", None)
        message = (diag.message_primary if diag else None) or _first_line(e)
        hint = diag.message_hint if diag else None
        if isinstance(e, psycopg.errors.NoDataFound) and "knowledge base" in message:
            hint = "list_knowledge_bases shows the ones you can see"
        kind = ServiceError
        if isinstance(e, psycopg.errors.NoDataFound):
            kind = NotFound
        elif isinstance(e, psycopg.errors.UndefinedFunction):
            kind, hint = Unsupported, "this database lacks a function the call needs: run `pgkb db migrate`"
        elif isinstance(e, psycopg.errors.DataError):
            kind = BadInput  # class 22: a bad value (invalid_parameter_value, a malformed interval, ...)
        elif isinstance(e, psycopg.errors.InsufficientPrivilege):
            kind = Forbidden
        raise kind(message + (f" ({hint})" if hint else "")) from e
