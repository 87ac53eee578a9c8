"""Ingestion throughput benchmark: `pgkb bench --ingest DIR`.

In one run, with one model instance: chunk every file under DIR, time the raw encode throughput of the
embedder on exactly the texts ingestion embeds (registry passage prefix + breadcrumb + content, in
batches of PGKB_EMBED_BATCH), then time `pgkb ingest` end to end (read, hash, chunk, embed, write through
kb.replace_document) into a fresh knowledge base. Goal: end-to-end chunks/s >= 0.9 x raw encode chunks/s,
i.e. the model is the only bottleneck.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pgkb.bench.data import log as _log
from pgkb.bench.machine import machine_info
from pgkb.chunking import ChunkingError, chunk_bytes
from pgkb.config import Settings
from pgkb.db import connect, database_url
from pgkb.folder import FolderError, read_inside
from pgkb.ingest import IngestOptions, discover, ingest
from pgkb.models.embedding import load_embedder, model_spec, prefixed


@dataclass
class IngestBench:
    files: int
    chunks: int
    chunk_seconds: float
    raw_seconds: float
    ingest_seconds: float
    summary: str
    machine: dict[str, str]

    @property
    def raw_rate(self) -> float:
        return self.chunks / self.raw_seconds

    @property
    def ingest_rate(self) -> float:
        return self.chunks / self.ingest_seconds

    def report(self, docs: Path, model: str, batch: int) -> str:
        ratio = self.ingest_rate / self.raw_rate
        lines = [
            f"### Ingestion throughput: `{docs.name}` ({time.strftime('%Y-%m-%d')})",
            "",
            f"Model `{model}` (batch {batch}), one instance for both measurements.",
            "",
            "| measurement | value |",
            "|---|---:|",
            f"| files | {self.files} |",
            f"| chunks | {self.chunks} |",
            f"| chunking all files (s) | {self.chunk_seconds:.2f} |",
            f"| raw encode, mean of a run before and after the ingest (s) | {self.raw_seconds:.1f} |",
            f"| raw encode (chunks/s) | {self.raw_rate:.2f} |",
            f"| `pgkb ingest` end to end (s) | {self.ingest_seconds:.1f} |",
            f"| `pgkb ingest` end to end (chunks/s) | {self.ingest_rate:.2f} |",
            f"| end-to-end / raw | **{ratio:.2f}** (goal >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'}) |",
            "",
            f"Ingest summary: {self.summary}",
            "",
            "| machine | |",
            "|---|---|",
            *[f"| {k} | {v} |" for k, v in self.machine.items()],
            "",
        ]
        return "\n".join(lines)


def run_ingest_bench(docs: str, kb_name: str, out: str | None) -> IngestBench:
    """Measure raw encode vs end-to-end ingestion of ``docs`` into knowledge base ``kb_name`` (recreated)."""
    root = Path(docs).resolve()
    settings = Settings.from_env()
    options = IngestOptions()
    url = database_url(settings)
    with connect(url) as conn:
        spec = model_spec(conn, settings.embed_model)
        embedder = load_embedder(settings, spec)
        t0 = time.perf_counter()
        texts: list[str] = []
        files = [f for f in discover(root, options.include, options.exclude) if not f.refused]
        for f in files:
            try:
                doc = chunk_bytes(read_inside(f.root, f.parts, options.max_file_bytes), f.path.name, options.chunking)
            except (ChunkingError, FolderError):
                continue
            texts += prefixed(spec, doc.embedding_texts(), query=False)
        chunk_seconds = time.perf_counter() - t0
        _log(f"{len(files)} files, {len(texts)} chunks, chunked in {chunk_seconds:.2f} s; raw encode ...")
        embedder.embed(texts[:4])  # warm-up

        def raw_encode() -> float:
            t0 = time.perf_counter()
            for i in range(0, len(texts), settings.embed_batch):
                embedder.embed(texts[i : i + settings.embed_batch])
            return time.perf_counter() - t0

        # raw encode before and after the ingest, averaged, so load drift on the machine hits both sides
        before = raw_encode()
        _log(f"raw encode {len(texts) / before:.2f} chunks/s; ingesting ...")
        conn.execute("delete from kb.knowledge_bases where name = %s", [kb_name])
        t0 = time.perf_counter()
        summary = ingest(conn, url, root, kb_name, spec, embedder, options)
        ingest_seconds = time.perf_counter() - t0
        _log(f"ingest {summary.chunks / ingest_seconds:.2f} chunks/s; raw encode again ...")
        after = raw_encode()
        raw_seconds = (before + after) / 2
        _log(f"raw encode {len(texts) / after:.2f} chunks/s")
        result = IngestBench(
            len(files), summary.chunks, chunk_seconds, raw_seconds, ingest_seconds, summary.line(), machine_info(conn)
        )
    text = result.report(root, spec.name, settings.embed_batch)
    print(text)
    if out:
        with open(out, "a", encoding="utf-8") as report:
            report.write("\n" + text)
    return result
