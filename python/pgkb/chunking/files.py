"""Choosing the chunker by file name and decoding bytes."""

from __future__ import annotations

from pathlib import Path

from pgkb.chunking.html import chunk_html
from pgkb.chunking.markdown import _stem, chunk_markdown
from pgkb.chunking.model import ChunkedDocument, ChunkingError, ChunkingOptions, ImageRef
from pgkb.chunking.office import chunk_docx, chunk_pdf
from pgkb.chunking.text import chunk_text

_MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd", ".mdx"}
_TEXT_SUFFIXES = {".txt", ".text", ".rst", ".log", ""}
_HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif"}


def _decode(data: bytes, name: str) -> str:
    if b"\x00" in data:
        raise ChunkingError(f"{name}: contains NUL bytes (binary data, not text)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ChunkingError(f"{name}: not valid UTF-8 (byte offset {e.start}: {e.reason})") from e


def chunk_bytes(
    data: bytes, name: str, options: ChunkingOptions | None = None, *, images: bool = False
) -> ChunkedDocument:
    """Chunk a file's bytes; the type comes from ``name``'s suffix (.md, .txt, .html, .pdf, .docx).
    ``images``: also take a PDF's embedded images, and accept image files (.png, .jpg, .jpeg, .webp, .gif):
    a document without text chunks whose one ImageRef carries the file's bytes (for pgkb.images)."""
    suffix = Path(name).suffix.lower()
    if images and suffix in IMAGE_SUFFIXES:
        return ChunkedDocument(_stem(name), {}, [], "image", [ImageRef(name, data=data)])
    if suffix == ".pdf":
        return chunk_pdf(data, name, options, images=images)
    if suffix == ".docx":
        return chunk_docx(data, name, options)
    if suffix in _MARKDOWN_SUFFIXES:
        return chunk_markdown(_decode(data, name), name, options)
    if suffix in _HTML_SUFFIXES:
        return chunk_html(_decode(data, name), name, options)
    if suffix in _TEXT_SUFFIXES:
        return chunk_text(_decode(data, name), name, options)
    raise ChunkingError(f"{name}: unsupported file type {suffix!r} (supported: .md, .txt, .html, .pdf, .docx)")


def chunk_file(path: Path | str, options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Read and chunk a file, by suffix. Raises ChunkingError for unsupported or invalid input."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ChunkingError(f"{path}: cannot read ({e.strerror or e})") from e
    return chunk_bytes(data, path.name, options)
