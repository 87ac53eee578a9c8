"""Saving a note into a knowledge base (kb.save_knowledge), as the MCP tool `save_knowledge` does: the Markdown
body with a line saying where it came from, chunked like an ingested Markdown file, its chunks embedded with
the registry's passage prefix so that it is searchable at once, written as the acting user. Every rule (who may
write where, the size and rate bounds, the doc_key, the metadata) is the database's."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass

from pgkb.chunking import ChunkingError, ChunkingOptions, chunk_markdown
from pgkb.models.embedding import Embedder, EmbeddingError, ModelSpec, prefixed
from pgkb.search import acting

__all__ = ["SavedNote", "note_text", "save_note"]

ORIGINS = {"mcp": "an MCP client (save_knowledge)", "cli": "the pgkb command", "http": "the HTTP API", "sql": "SQL"}


@dataclass(frozen=True)
class SavedNote:
    kb: str
    doc_key: str
    uri: str  # kb.document_uri
    chunk_count: int
    changed: bool
    embedded: bool  # False: the chunks wait in the embedding queue (the embedder failed or is absent)
    note: str = ""  # why they were not embedded


def note_text(body: str, origin: str, today: dt.date | None = None) -> str:
    """The body as stored: the Markdown as given, then one line saying where it came from."""
    day = (today or dt.date.today()).isoformat()
    return f"{body.rstrip()}\n\n---\n\n*Saved through {ORIGINS.get(origin, origin)} on {day}.*\n"


def save_note(
    conn,
    kb: str,
    title: str,
    body: str,
    *,
    user: str | None,
    doc_key: str | None = None,
    tags: Sequence[str] = (),
    origin: str = "sql",
    embedder: Embedder | None = None,
    spec: ModelSpec | None = None,
    timeout_ms: int = 0,
) -> SavedNote:
    """kb.save_knowledge as ``user`` (None: the connection's own pgkb user). psycopg errors are the database's
    refusals (unknown knowledge base, bounds: they apply to ``body`` as given); ChunkingError for a body the
    chunker cannot read."""
    text = note_text(body, origin)
    chunked = chunk_markdown(text, doc_key or title, ChunkingOptions())
    if not chunked.chunks:
        raise ChunkingError("the body holds no text to search")
    chunks = chunked.chunks_json()
    embedded, why = False, "no embedder"
    if embedder is not None and spec is not None:
        try:
            vectors = embedder.embed(prefixed(spec, [c.embedding_text(title) for c in chunked.chunks], query=False))
            for chunk, vector in zip(chunks, vectors, strict=True):
                chunk["embedding"] = [float(x) for x in vector]
            embedded, why = True, ""
        except (EmbeddingError, OSError, ValueError) as e:
            why = f"embedding failed ({e}); the worker embeds it later"
    with acting(conn, user, timeout_ms):
        row = conn.execute(
            "select s.note_key, kb.document_uri(%s, s.note_key), s.chunk_count, s.changed from kb.save_knowledge("
            "kb => %s, title => %s, body => %s, chunks => %s, doc_key => %s, tags => %s, origin => %s,"
            " model => %s) as s",
            [kb, kb, title, body, json.dumps(chunks, ensure_ascii=False), doc_key, list(tags), origin,
             spec.name if embedded and spec is not None else None],
        ).fetchone()  # fmt: skip
    return SavedNote(kb, row[0], row[1], row[2], row[3], embedded, why)
