"""Plain text: the recursive splitter, no sections."""

from __future__ import annotations

from pgkb.chunking.blocks import _Block, _chunks_from_blocks
from pgkb.chunking.markdown import _stem
from pgkb.chunking.model import ChunkedDocument, ChunkingOptions, _check_text


def chunk_text(text: str, name: str = "", options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Chunk plain text: paragraphs (blank lines), then lines, sentences, words."""
    opts = options or ChunkingOptions()
    text = _check_text(text, name or "text")
    blocks = [_Block("text", text)] if text.strip() else []
    return ChunkedDocument(_stem(name), {}, _chunks_from_blocks(blocks, opts), "text")
