"""Synthetic data for ``pgkb bench``: sentence pools from the shared BEIR-layout sets, deterministic
documents made of those sentences, random unit embeddings, and the default embedding model.

Document ``i`` is a pure function of ``i`` (seeded), so every load path writes the same text and vectors.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

SEED = 20240611
QUERY_SEED = SEED + 1  # query vectors: default_rng([QUERY_SEED, k]); document i's are default_rng([SEED, i]),
# so no query vector is a stored vector (the first benchmark runs drew queries from documents 2 and 7)
DOC_CHUNKS = 50  # chunks per synthetic document
MIN_CHARS, MAX_CHARS = 300, 800  # chunk length range (characters)
ZH_SHARE = 0.7  # share of Chinese documents / queries
ZH_SETS = ("cmrc2018-trial", "drcd-dev-zh_hans")
EN_SETS = ("covid-faq-en", "cisi")

_ZH_SENTENCE_END = re.compile(r"(?<=[。！？；])")
_EN_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_SPACES = re.compile(r"\s+")


def log(message: str) -> None:
    """Progress line on stderr."""
    print(f"pgkb bench: {message}", file=sys.stderr, flush=True)


@dataclass
class Pools:
    """Sentences (title, sentence) per language and query strings per language."""

    zh: list[tuple[str, str]] = field(default_factory=list)
    en: list[tuple[str, str]] = field(default_factory=list)
    zh_queries: list[str] = field(default_factory=list)
    en_queries: list[str] = field(default_factory=list)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _split_sentences(text: str, chinese: bool) -> list[str]:
    text = _SPACES.sub(" ", text).strip()
    if chinese:
        return [s.strip() for s in _ZH_SENTENCE_END.split(text) if len(s.strip()) >= 8]
    return [s.strip() for s in _EN_SENTENCE_END.split(text) if len(s.strip()) >= 20]


def load_pools(datasets: Path) -> Pools:
    """Read the corpora and query sets; raises FileNotFoundError naming what is missing."""
    pools = Pools()
    for names, chinese in ((ZH_SETS, True), (EN_SETS, False)):
        sentences = pools.zh if chinese else pools.en
        queries = pools.zh_queries if chinese else pools.en_queries
        for name in names:
            folder = datasets / name
            for part in ("corpus.jsonl", "queries.jsonl"):
                if not (folder / part).is_file():
                    raise FileNotFoundError(f"{folder / part} not found (pass --datasets)")
            for doc in _read_jsonl(folder / "corpus.jsonl"):
                title = str(doc.get("title") or "")
                sentences.extend((title, s) for s in _split_sentences(str(doc.get("text") or ""), chinese))
            queries.extend(
                str(q["text"]).strip() for q in _read_jsonl(folder / "queries.jsonl") if str(q["text"]).strip()
            )
    if not (pools.zh and pools.en and pools.zh_queries and pools.en_queries):
        raise ValueError(f"no usable sentences or queries under {datasets}")
    return pools


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """n random unit vectors (float32), uniform on the sphere."""
    v = rng.standard_normal((n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def _make_chunk(rng: random.Random, pool: Sequence[tuple[str, str]], chinese: bool) -> tuple[str, str]:
    """One chunk of whole sentences (the last may be cut) of MIN_CHARS..MAX_CHARS characters."""
    target = rng.randint(MIN_CHARS, MAX_CHARS)
    sep = "" if chinese else " "
    parts: list[str] = []
    total = 0
    title = ""
    while total < target:
        t, s = pool[rng.randrange(len(pool))]
        title = title or t
        extra = len(s) + (len(sep) if parts else 0)
        if total + extra > MAX_CHARS:
            if total >= MIN_CHARS:
                break
            s = s[: MAX_CHARS - total - (len(sep) if parts else 0)]
            extra = len(s) + (len(sep) if parts else 0)
        parts.append(s)
        total += extra
    return title, sep.join(parts)


@dataclass
class Document:
    """Synthetic document ``i``: key, title, chunk texts and their embeddings (one row per chunk)."""

    doc_key: str
    title: str
    contents: list[str]
    embeddings: np.ndarray


def make_document(i: int, pools: Pools, dim: int, n_chunks: int) -> Document:
    """Document i (deterministic in i); embeddings rounded to 6 decimals as they travel as JSON."""
    rng = random.Random(SEED * 1_000_003 + i)
    chinese = rng.random() < ZH_SHARE
    pool = pools.zh if chinese else pools.en
    vectors = np.round(unit_vectors(np.random.default_rng([SEED, i]), n_chunks, dim), 6)
    contents = []
    title = ""
    for _ in range(n_chunks):
        t, content = _make_chunk(rng, pool, chinese)
        title = title or t
        contents.append(content)
    return Document(f"bench-{i:07d}", title, contents, vectors)


def document_sizes(chunks: int) -> list[int]:
    """Chunks per document: DOC_CHUNKS each, the last one holding the remainder."""
    return [DOC_CHUNKS] * (chunks // DOC_CHUNKS) + ([chunks % DOC_CHUNKS] if chunks % DOC_CHUNKS else [])


def query_vectors(stream: int, n: int, dim: int) -> np.ndarray:
    """n random unit query vectors of one stream (distinct streams for distinct purposes)."""
    return unit_vectors(np.random.default_rng([QUERY_SEED, stream]), n, dim)


def sample_queries(pools: Pools, n: int, seed: int = SEED + 1) -> list[str]:
    """n query strings (seeded), ZH_SHARE of them Chinese."""
    rng = random.Random(seed)
    return [rng.choice(pools.zh_queries) if rng.random() < ZH_SHARE else rng.choice(pools.en_queries) for _ in range(n)]


@dataclass
class Model:
    """The embedding model the benchmark writes and searches."""

    id: int
    name: str
    dimension: int


def default_model(conn: psycopg.Connection) -> Model:
    row = conn.execute("select id, name, dimension from kb.embedding_models where is_default").fetchone()
    if row is None:
        raise RuntimeError("no default embedding model registered (run `pgkb db migrate`)")
    return Model(*row)
