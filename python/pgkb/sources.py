"""What the ingest engine (pgkb.ingest) reads: documents, each with a key, a content hash and a way to chunk it.

* :class:`FileDocument` -- a file under the folder `pgkb ingest PATH` syncs (found by pgkb.folder.discover,
  read without leaving the folder), keyed by its path relative to PATH, hashed on its bytes and chunked by
  its type (pgkb.chunking), with its images as ``image`` chunks (pgkb.images: the image files a Markdown
  document references, an image file, the images of PDF pages);
* :class:`TextDocument` -- a title and a plain text given by the caller (`pgkb eval` loads BEIR corpora
  this way), hashed on title, text and metadata, chunked with ``chunk_text``.

Both hash the chunker version and the chunking options too, so a change of either re-chunks the document;
``TextDocument.version`` adds whatever else its caller's documents depend on (``pgkb eval``: the model). A
file's hash also covers the image files it references and the vision model, so a changed image or a newly
configured endpoint re-indexes it; a file some of whose captions failed is stored with a hash that makes the
next run take it again (:attr:`Chunked.content_hash`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pgkb.chunking import ChunkedDocument, ChunkingError, ChunkingOptions, chunk_bytes, chunk_text
from pgkb.folder import FolderError, Found, TooLarge, read_inside
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

__all__ = [
    "CHUNKER_VERSION",
    "DEFAULT_EXCLUDE",
    "DEFAULT_INCLUDE",
    "IMAGE_SUFFIXES",
    "MAX_FILE_BYTES",
    "Chunked",
    "DocumentTaken",
    "DocumentUnreadable",
    "FileDocument",
    "SourceDocument",
    "TextDocument",
    "content_hash",
]

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
CHUNKER_VERSION = "1"  # bump when chunking output changes, so unchanged files are re-chunked


class DocumentUnreadable(Exception):
    """A document cannot be read; the message is the reason the engine records for it."""


class DocumentTaken(Exception):
    """Not a document of its own: another one took it (an image file a Markdown document references)."""


@dataclass
class Chunked:
    """A chunked document, as the engine writes it."""

    doc: ChunkedDocument
    content_hash: str  # stored with it (may differ from the one compared: a retry marker)
    side_failures: list[tuple[str, str]] = field(default_factory=list)  # (key, reason): bad images, recorded
    images: ImageStats | None = None  # its image chunks by caption state
    failed: str | None = None  # the whole document failed (a bad image file): the reason


class SourceDocument(Protocol):
    """One document offered to the ingest engine."""

    source_url: str | None

    @property
    def doc_key(self) -> str: ...

    def content_hash(self, options: ChunkingOptions) -> str:
        """What decides whether the stored version is current. DocumentUnreadable or ChunkingError: it cannot
        be read (recorded); DocumentTaken: it is not a document of its own."""
        ...

    def chunk(self, options: ChunkingOptions, content_hash: str) -> Chunked:
        """The document's title, metadata and chunks; ChunkingError if it cannot be chunked."""
        ...


def content_hash(data: bytes, options: ChunkingOptions, source_url: str | None = None) -> str:
    """The content hash of a file's bytes under the chunking options and, when one was given, its source URL
    (so that a new --base-url reaches documents whose bytes did not change; without one the hash is what it
    was before URLs counted)."""
    h = hashlib.sha256()
    h.update(f"pgkb-chunker-{CHUNKER_VERSION}|{options.fingerprint()}|".encode())
    if source_url is not None:
        h.update(f"url:{source_url}|".encode())
    h.update(data)
    return h.hexdigest()


@dataclass
class FileDocument:
    """A found file: read once when hashed (at most ``max_file_bytes``, from inside its folder), chunked by
    its name's type, with its images (captioned through ``captioning``). ``referenced`` is shared by the
    files of one run: the image files the Markdown documents reference, which are taken with them (so take
    documents before image files)."""

    found: Found
    source_url: str | None
    captioning: Captioning = field(default_factory=lambda: Captioning(None, None))
    referenced: set[str] = field(default_factory=set)
    max_file_bytes: int = MAX_FILE_BYTES
    _data: bytes | None = field(default=None, repr=False)
    _doc: ChunkedDocument | None = field(default=None, repr=False)
    _local: list[LocalImage] | None = field(default=None, repr=False)

    @property
    def doc_key(self) -> str:
        return self.found.doc_key

    @property
    def path(self) -> Path:
        return self.found.path

    def content_hash(self, options: ChunkingOptions) -> str:
        if self.doc_key in self.referenced:
            raise DocumentTaken(self.doc_key)
        try:
            self._data = read_inside(self.found.root, self.found.parts, self.max_file_bytes)
        except TooLarge as e:
            raise DocumentUnreadable(
                f"file is {e.size / 1e6:.1f} MB; the limit is {self.max_file_bytes / 1e6:.0f} MB"
            ) from e
        except FolderError as e:
            raise DocumentUnreadable(str(e)) from e
        except OSError as e:
            raise DocumentUnreadable(f"cannot read: {e.strerror or e}") from e
        # a URL from --base-url counts; the file's own path (the default) does not, so moving the folder or
        # upgrading pgkb rewrites nothing
        given_url = self.source_url if self.source_url != str(self.path) else None
        digest = content_hash(self._data, options, given_url)
        if may_have_images(self.path.name, self._data):
            if self.path.suffix.lower() in _MARKDOWN_SUFFIXES:  # which files it references: known after parsing
                self._doc = chunk_bytes(self._data, self.path.name, options, images=True)
                self._local = resolve_references(self.found.root, self.path, self._doc.images)
                self.referenced.update(image.rel for image in self._local)
            digest = image_digest(digest, self.captioning, self._local or [])
        return digest

    def chunk(self, options: ChunkingOptions, content_hash: str) -> Chunked:
        if self._data is None:
            raise ChunkingError(f"{self.doc_key}: chunked before it was read")
        doc = self._doc or chunk_bytes(self._data, self.path.name, options, images=True)
        self._data = self._doc = None  # chunked once; the bytes are not kept
        if not doc.images:
            return Chunked(doc, content_hash)
        found = image_chunks(self.doc_key, doc, self.captioning, self._local)
        if doc.source_type == "image" and found.failures:  # a bad image file is a failed document
            return Chunked(doc, content_hash, images=found.stats, failed=found.failures[0][1])
        doc = dataclasses.replace(doc, chunks=[*doc.chunks, *found.chunks])
        digest = incomplete_digest(content_hash) if found.incomplete else content_hash
        return Chunked(doc, digest, found.failures, found.stats)


@dataclass
class TextDocument:
    """A plain text with a title: the title is the document title (so every chunk's breadcrumb carries it);
    a document with no text but a title is its title."""

    doc_key: str
    title: str
    text: str
    metadata: dict = field(default_factory=dict)
    version: str = ""  # more hash input: what else the stored version depends on
    source_url: str | None = None

    def content_hash(self, options: ChunkingOptions) -> str:
        h = hashlib.sha256()
        h.update(f"pgkb-text-{CHUNKER_VERSION}|{options.fingerprint()}|{self.version}|".encode())
        h.update(json.dumps([self.title, self.text, self.metadata], ensure_ascii=False, default=str).encode())
        return h.hexdigest()

    def chunk(self, options: ChunkingOptions, content_hash: str) -> Chunked:
        title = self.title.strip()
        text = self.text if self.text.strip() else title
        chunked = chunk_text(text, "", options) if text.strip() else ChunkedDocument("", {}, [], "text")
        return Chunked(dataclasses.replace(chunked, title=title, metadata=dict(self.metadata)), content_hash)
