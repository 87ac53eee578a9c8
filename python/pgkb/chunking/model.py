"""Chunks, documents, options and the error of the chunkers; text checks shared by every format."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any


class ChunkingError(ValueError):
    """The input cannot be chunked (unsupported type, invalid encoding, binary data, corrupt PDF...)."""


@dataclass(frozen=True)
class ChunkingOptions:
    max_chars: int = 800
    overlap: int = 0
    min_chars: int = 80
    heading_levels: int = 3
    # Embed the "title > h1 > h2" breadcrumb line before the content. Only `pgkb eval` turns it off (to
    # measure it); `pgkb ingest` and the worker always embed it.
    heading_prefix: bool = True

    def __post_init__(self) -> None:
        if self.max_chars < 20:
            raise ValueError("max_chars must be at least 20")
        if not 0 <= self.overlap <= self.max_chars // 2:
            raise ValueError("overlap must be between 0 and max_chars / 2")
        if not 0 <= self.min_chars < self.max_chars:
            raise ValueError("min_chars must be between 0 and max_chars - 1")
        if not 1 <= self.heading_levels <= 6:
            raise ValueError("heading_levels must be between 1 and 6")

    def fingerprint(self) -> str:
        """The options as they enter content hashes; the same text as before heading_prefix existed, so
        adding it did not make every stored document look changed."""
        base = (
            f"ChunkingOptions(max_chars={self.max_chars}, overlap={self.overlap}, min_chars={self.min_chars}, "
            f"heading_levels={self.heading_levels})"
        )
        return base if self.heading_prefix else base + "+no-heading-prefix"


def breadcrumb(title: str, heading_path: tuple[str, ...] | list[str]) -> str:
    """``"title > h1 > h2"``, skipping empty parts and a heading that repeats the part before it."""
    parts: list[str] = []
    for p in (title, *heading_path):
        if p and (not parts or parts[-1] != p):
            parts.append(p)
    return " > ".join(parts)


@dataclass(frozen=True)
class Chunk:
    content: str
    heading_path: tuple[str, ...] = ()
    chunk_type: str = "text"
    metadata: dict = field(default_factory=dict)

    def breadcrumb(self, title: str = "") -> str:
        return breadcrumb(title, self.heading_path)

    def embedding_text(self, title: str = "") -> str:
        """The text to embed: ``"title > h1 > h2"`` breadcrumb line, then the content."""
        crumb = self.breadcrumb(title)
        return f"{crumb}\n{self.content}" if crumb else self.content

    def to_json(self) -> dict:
        """The chunk as kb.replace_document expects it."""
        return {
            "content": self.content,
            "heading_path": list(self.heading_path),
            "chunk_type": self.chunk_type,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class ImageRef:
    """An image of a document, found by its chunker; pgkb.images turns it into an ``image`` chunk.

    ``source``: the reference as written (Markdown/HTML ``src``), or ``page-N-K`` (the K-th image of PDF page
    N) or the file name (an image file). ``data``: the image's bytes when they come with the document (PDF,
    image file); None for a reference to a file. ``error``: why an embedded image could not be extracted."""

    source: str
    alt: str = ""
    caption: str = ""  # title attribute, <figcaption>, or a "Figure 1: …" line near it
    heading_path: tuple[str, ...] = ()
    page: int | None = None
    data: bytes | None = None
    error: str = ""


@dataclass(frozen=True)
class ChunkedDocument:
    title: str
    metadata: dict
    chunks: list[Chunk]
    source_type: str
    images: list[ImageRef] = field(default_factory=list)

    def chunks_json(self) -> list[dict]:
        return [c.to_json() for c in self.chunks]

    def embedding_texts(self, heading_prefix: bool = True) -> list[str]:
        if not heading_prefix:
            return [c.content for c in self.chunks]
        return [c.embedding_text(self.title) for c in self.chunks]


def _normalize_newlines(text: str) -> str:
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _check_text(text: str, what: str) -> str:
    if "\x00" in text:
        raise ChunkingError(f"{what}: contains NUL bytes (binary data, not text)")
    return _normalize_newlines(text)


def _jsonable(value: Any) -> Any:
    """Front matter values as JSON-safe data (dates as ISO strings, other objects as strings)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    return str(value)
