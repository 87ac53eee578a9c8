"""`pgkb worker`: embed the chunks waiting in kb.embedding_queue.

Chunks written without embeddings (kb.replace_document from SQL, dbt, ETL, `pgkb ingest --defer-embedding`,
or a backfill after `pgkb model add`) are queued per model. The worker loads the embedder once, then loops:
claim a batch (kb.claim_embedding_batch: a short transaction that leases the entries, FOR UPDATE SKIP
LOCKED, so any number of workers can run side by side), embed it, store it (kb.store_embeddings, which
dequeues the entries and marks documents ready). A failed batch is reported (kb.fail_embedding_batch:
exponential backoff, parked after ``max_attempts`` claims) and the worker carries on; a failed batch of several
chunks is retried one chunk at a time first, so one poison input does not take its batch mates down.

With ``once`` the worker exits when nothing is due (entries backing off after a failure are left for a
later run). Otherwise it waits: LISTEN pgkb_embedding_queue (kb.replace_document and
kb_admin.retry_parked_embeddings NOTIFY), waking at the latest when a backed-off entry becomes due or after
``idle_timeout`` seconds. SIGINT / SIGTERM stop it after the current batch (a second signal: at once).
Work happens on one autocommit connection, LISTEN on a second; when the database goes away (a restart)
the worker logs it and reconnects with backoff instead of exiting.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import psycopg

from pgkb.chunking import Chunk
from pgkb.config import ConfigError, Settings
from pgkb.db import connect, database_url
from pgkb.models.embedding import Embedder, EmbeddingError, ModelSpec, check_dimension, load_embedder, model_spec

log = logging.getLogger("pgkb.worker")
DEFAULT_RECONNECT_TIMEOUT = 60.0  # seconds a `--once` run keeps reconnecting before it gives up
MAX_RECONNECT_DELAY = 5.0  # longest wait between reconnection attempts (so recovery takes seconds)

CHANNEL = "pgkb_embedding_queue"
DEFAULT_LEASE = timedelta(minutes=5)
DEFAULT_IDLE_TIMEOUT = 30.0
MAX_ATTEMPTS = 5
MAX_BATCH = 1000  # kb.claim_embedding_batch's limit
ISOLATION_FAILURES = 3  # single-chunk failures in a row that end the one-by-one retry of a failed batch
_PROGRESS_EVERY = 5.0  # seconds between progress lines


@dataclass
class WorkerStats:
    batches: int = 0
    embedded: int = 0  # embeddings stored
    failed: int = 0  # queue entries whose batch failed (retried later unless parked)
    parked: int = 0  # of those, entries given up on (kb.parked_embeddings)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.embedded / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        out = f"embedded {self.embedded} chunks in {self.batches} batches ({self.rate:.1f} chunks/s)"
        if self.failed:
            out += f"; {self.failed} failed, {self.parked} parked"
        return out


def embedding_text(spec: ModelSpec, title: str | None, heading_path: Sequence[str] | None, content: str) -> str:
    """The passage text embedded for a chunk: the registry's passage prefix, the ``"title > h1 > h2"``
    breadcrumb line, then the content; the same text ingestion embeds (``Chunk.embedding_text``)."""
    chunk = Chunk(content=content, heading_path=tuple(heading_path or ()))
    return spec.passage_prefix + chunk.embedding_text(title or "")


def run_worker(
    settings: Settings,
    *,
    model: str | None = None,
    batch: int | None = None,
    once: bool = False,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    stop_event: threading.Event | None = None,
    lease: timedelta = DEFAULT_LEASE,
    max_attempts: int = MAX_ATTEMPTS,
    embedder: Embedder | None = None,
    reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT,
) -> WorkerStats:
    """Embed queued chunks for ``model`` (default: PGKB_EMBED_MODEL, else the database's default model).

    ``batch``: chunks per claim (default PGKB_EMBED_BATCH, the provider's batch size). ``once``: return
    when nothing is due. ``idle_timeout``: longest wait for a notification before polling the queue
    anyway. ``stop_event``: set it to stop after the current batch (SIGINT / SIGTERM set it too when
    running in the main thread). ``lease``: how long a claim is reserved for this worker; keep it well
    above the time one batch takes. ``embedder``: an already loaded embedder (else ``load_embedder``).
    A lost database connection (a restart, a network cut) is not fatal: the worker reconnects with backoff
    (1 s doubling to MAX_RECONNECT_DELAY), for ever when serving, for ``reconnect_timeout`` seconds with
    ``once`` (then the error is raised).
    """
    batch = settings.embed_batch if batch is None else batch
    if not 1 <= batch <= MAX_BATCH:
        raise ConfigError(f"batch must be between 1 and {MAX_BATCH}, got {batch}")
    if idle_timeout <= 0:
        raise ConfigError("idle_timeout must be positive")
    stop = stop_event or threading.Event()
    restore_signals = _handle_signals(stop)
    stats = WorkerStats()
    url = database_url(settings, writable=True)
    started = time.monotonic()
    lost_since: float | None = None  # the current database outage began (monotonic), if any
    attempt = 0

    def connected() -> None:
        nonlocal lost_since, attempt
        if lost_since is not None:
            log.info("reconnected after %.1f s", time.monotonic() - lost_since)
        lost_since, attempt = None, 0

    try:
        while not stop.is_set():
            try:
                embedder = _session(url, settings, model, embedder, batch, once, idle_timeout, stop, stats, lease,
                                    max_attempts, connected)  # fmt: skip
                break
            except psycopg.OperationalError as e:  # the connection was lost (restart, network): reconnect
                now = time.monotonic()
                lost_since = lost_since if lost_since is not None else now
                if once and now - lost_since > reconnect_timeout:
                    raise
                attempt += 1
                delay = min(2.0 ** (attempt - 1), MAX_RECONNECT_DELAY)
                log.warning("database connection lost (%s); reconnecting in %.0f s", _first_line(e), delay)
                stop.wait(delay)
                continue
        log.info("stopped: %s; ran %.1f s", stats.line(), time.monotonic() - started)
    finally:
        restore_signals()
    return stats


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _session(url, settings, model, embedder, batch, once, idle_timeout, stop, stats, lease, max_attempts, connected):
    """One connection's worth of work: returns the embedder when stopped (or, with ``once``, when nothing is
    due); a lost connection raises psycopg.OperationalError, after which run_worker reconnects. Entries
    claimed by a batch whose store was lost stay leased until the lease runs out, then are claimed again."""
    listener: psycopg.Connection | None = None
    try:
        with connect(url) as conn:
            connected()
            spec = model_spec(conn, model or settings.embed_model)
            if embedder is None:
                embedder = load_embedder(settings, spec)
            check_dimension(embedder, spec)
            if not once:
                # listen before the first claim, so a document written in between still wakes us
                listener = connect(url, vector=False)
                listener.execute(f"listen {CHANNEL}")
            log.info(
                "model %s (%d-d, %s), batches of %d%s",
                spec.name,
                spec.dimension,
                embedder.name,
                batch,
                "" if once else f", waiting on {CHANNEL}",
            )
            worker = _Worker(conn, spec, embedder, stats, lease, max_attempts)
            busy_before = stats.seconds
            failures_in_a_row = 0
            while not stop.is_set():
                rows = worker.claim(batch)
                if not rows:
                    stats.seconds = busy_before + worker.busy
                    if once:
                        break
                    worker.progress(idle=True)
                    _wait(listener, conn, spec, idle_timeout, stop)
                    continue
                if worker.process(rows):
                    failures_in_a_row = 0
                else:
                    failures_in_a_row += 1
                    if not once:  # e.g. the endpoint is down: don't burn every entry's attempts at once
                        stop.wait(min(2.0 ** (failures_in_a_row - 1), idle_timeout))
                stats.seconds = busy_before + worker.busy
                worker.progress()
            stats.seconds = busy_before + worker.busy
    finally:
        if listener is not None:
            listener.close()
    return embedder


def run_cli(settings: Settings, *, once: bool = False, batch: int | None = None, model: str | None = None) -> int:
    """`pgkb worker [--once] [--batch N] [--model NAME]`: progress on stderr. Exit status 1 when --once
    left failed entries behind."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="pgkb worker: %(message)s")
    stats = run_worker(settings, model=model, batch=batch, once=once)
    return 1 if once and stats.failed else 0


class _Worker:
    def __init__(self, conn, spec: ModelSpec, embedder: Embedder, stats: WorkerStats, lease, max_attempts) -> None:
        self.conn, self.spec, self.embedder, self.stats = conn, spec, embedder, stats
        self.lease, self.max_attempts = lease, max_attempts
        self.busy = 0.0  # seconds spent claiming, embedding and storing (not waiting)
        self._logged_at = time.monotonic()
        self._logged = (0, 0)

    def claim(self, batch: int) -> list[tuple]:
        t0 = time.monotonic()
        rows = self.conn.execute(
            "select chunk_id, title, heading_path, content from kb.claim_embedding_batch(%s, %s, %s, %s)",
            [self.spec.name, batch, self.lease, self.max_attempts],
        ).fetchall()
        self.busy += time.monotonic() - t0
        return rows

    def process(self, rows: list[tuple]) -> bool:
        """Embed and store one claimed batch. When a batch of several fails, its chunks are tried one by
        one, so that one poison input (a text the endpoint always rejects) fails -- and is parked --
        alone; after ISOLATION_FAILURES single failures in a row the endpoint is taken to be down and the
        rest of the batch is reported failed together. True if everything was stored."""
        t0 = time.monotonic()
        self.stats.batches += 1
        try:
            error = self._embed_and_store(rows)
            if error is None:
                return True
            if len(rows) == 1:
                self._fail(rows, error)
                return False
            log.info("batch of %d failed (%s); trying its chunks one by one", len(rows), error)
            in_a_row, all_stored = 0, True
            for i, row in enumerate(rows):
                single = self._embed_and_store([row])
                if single is None:
                    in_a_row = 0
                    continue
                all_stored = False
                in_a_row += 1
                if in_a_row >= ISOLATION_FAILURES:
                    self._fail(rows[i:], single)  # this one and the rest: one failure each, as always
                    break
                self._fail([row], single)
            return all_stored
        finally:
            self.busy += time.monotonic() - t0

    def _embed_and_store(self, rows: list[tuple]) -> str | None:
        """Embed the rows' texts and store the vectors; the embedder's error message, or None when stored."""
        t0 = time.monotonic()
        ids = [r[0] for r in rows]
        texts = [embedding_text(self.spec, title, path, content) for _, title, path, content in rows]
        try:
            vectors = self.embedder.embed(texts)
            if len(vectors) != len(ids):
                raise EmbeddingError(f"embedder returned {len(vectors)} vectors for {len(ids)} texts")
        except Exception as e:  # any embedder failure is recorded on the entries, never fatal
            message = str(e) if isinstance(e, EmbeddingError) else f"{type(e).__name__}: {e}"
            return message or type(e).__name__
        elapsed = time.monotonic() - t0
        if elapsed > self.lease.total_seconds():
            log.warning(
                "a batch took %.0f s, longer than the %.0f s lease: other workers may redo it; use smaller batches",
                elapsed,
                self.lease.total_seconds(),
            )
        try:
            stored = self.conn.execute(
                "select kb.store_embeddings(%s, %s, %s)", [self.spec.name, ids, list(vectors)]
            ).fetchone()[0]
        except psycopg.errors.DataError as e:  # an unusable vector (zero norm, NaN): that input's failure
            return f"the embedder returned an unusable vector: {e.diag.message_primary or e}"
        self.stats.embedded += stored
        return None

    def _fail(self, rows: list[tuple], message: str) -> None:
        """Report failed entries (kb.fail_embedding_batch: backoff, parked after max_attempts claims)."""
        ids = [r[0] for r in rows]
        retrying, parked = self.conn.execute(
            "select * from kb.fail_embedding_batch(%s, %s, %s, %s)",
            [self.spec.name, ids, message, self.max_attempts],
        ).fetchone()
        self.stats.failed += retrying + parked
        self.stats.parked += parked
        log.warning("%d failed (%d will be retried, %d parked): %s", len(ids), retrying, parked, message)

    def progress(self, *, idle: bool = False) -> None:
        """A progress line every few seconds while busy, and when the queue runs empty after work."""
        now = time.monotonic()
        if (self.stats.embedded, self.stats.failed) == self._logged:
            return
        if not idle and now - self._logged_at < _PROGRESS_EVERY:
            return
        if idle:
            log.info("%s; queue empty, waiting", self.stats.line())
        else:
            recent = (self.stats.embedded - self._logged[0]) / max(now - self._logged_at, 1e-9)
            log.info("%s; %.1f chunks/s over the last %.0f s", self.stats.line(), recent, now - self._logged_at)
        self._logged_at, self._logged = now, (self.stats.embedded, self.stats.failed)


def _wait(listener, conn, spec: ModelSpec, idle_timeout: float, stop: threading.Event) -> None:
    """Sleep until a queue notification, the next backed-off entry's due time, idle_timeout, or stop."""
    due_in = conn.execute("select next_due_in from kb.embedding_status(%s)", [spec.name]).fetchone()[0]
    timeout = idle_timeout if due_in is None else min(idle_timeout, max(due_in, 0.1))
    deadline = time.monotonic() + timeout
    while not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        # short slices so that stop_event is noticed promptly
        if any(True for _ in listener.notifies(timeout=min(remaining, 0.5), stop_after=1)):
            for _ in listener.notifies(timeout=0):  # drain: one wake-up per burst of writes
                pass
            return


def _handle_signals(stop: threading.Event) -> Callable[[], None]:
    """SIGINT / SIGTERM: stop after the current batch; a second one: at once. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.info("%s: stopping after the current batch (again to stop at once)", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
