"""Synthetic data for ``pgkb bench``: sentence pools from the shared BEIR-layout sets, deterministic
documents made of those sentences, their embeddings, and the default embedding model.

Document ``i`` is a pure function of ``i`` (seeded), so every load path writes the same text and vectors.

Two kinds of chunk embeddings (``--vectors``):

* ``uniform`` -- random unit vectors, uniform on the sphere. All pairwise distances concentrate around the
  same value, which is the worst case for a graph index (HNSW recall@10 was 0.115 at 100k chunks, ef_search
  100): a measure of cost, useless for recall.
* ``anchored`` -- vectors with the structure of real embeddings. ``ANCHORS`` real passages (consecutive
  sentences of one corpus document from the same pools, truncated to ``ANCHOR_CHARS``) are embedded with
  the real embedder and the registry's passage prefix; chunk vector j of document i is
  ``normalize(anchor_k + sigma * g)``, k drawn uniformly and g standard Gaussian (both seeded by i).
  ``sigma = sqrt((1 / c**2 - 1) / dim)`` makes the expected cosine to the anchor ``c = ANCHOR_COSINE``
  (0.9): ``|sigma * g|**2 ~ sigma**2 * dim``, so ``cos ~ 1 / sqrt(1 + sigma**2 * dim)``. Query vectors are
  the real query embeddings (registry query prefix) of real query strings, not perturbed: queries are not
  near-copies of stored chunks in practice either, and their neighbourhoods are then those of real
  queries among clusters of real passages. The embedder's output is deterministic, so the data is too.
  The copies of one centre are structureless (isotropic noise in 384 dimensions): a query's true top 10
  among them is decided by the noise alone, and a graph index finds it only by visiting most of the
  cluster. So the clusters keep the density of the 100k set (about ``CHUNKS_PER_CENTRE`` chunks per
  centre) at every size: above that, each anchor gets ``round(chunks / (anchors * CHUNKS_PER_CENTRE))``
  sub-centres ``normalize(anchor + sigma * g)`` and chunks are drawn around those (at 1M, ten per anchor;
  with 1,500 centres the 1M set put ~670 near-tied copies around each and recall@10 at ef_search 300 fell
  to 0.76, docs/benchmarks.md). Up to 1.5 * CHUNKS_PER_CENTRE chunks per anchor (~157k chunks with
  1,500 anchors) the centres are the anchors themselves.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

SEED = 20240611
QUERY_SEED = SEED + 1  # query vectors: default_rng([QUERY_SEED, k]); document i's are default_rng([SEED, i]),
# so no query vector is a stored vector (the first benchmark runs drew queries from documents 2 and 7)
VECTOR_KINDS = ("uniform", "anchored")
ANCHORS = 1500  # real passages embedded for --vectors anchored
ANCHOR_CHARS = 200  # anchor passages are truncated to this many characters
ANCHOR_COSINE = 0.9  # expected cosine of an anchored chunk vector to its anchor
CHUNKS_PER_CENTRE = 70  # cluster density held at every size (100k chunks / 1500 anchors ~ 67)
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


def anchor_sigma(dim: int, cosine: float = ANCHOR_COSINE) -> float:
    """Gaussian scale whose perturbation leaves an expected cosine of `cosine` to the anchor."""
    return float(np.sqrt((1.0 / cosine**2 - 1.0) / dim))


def anchored_vectors(rng: np.random.Generator, anchors: np.ndarray, n: int | None, sigma: float) -> np.ndarray:
    """n unit vectors normalize(anchor_k + sigma * gaussian), k uniform over the anchors (float32); n None:
    one around each anchor, in order."""
    picks = rng.integers(0, len(anchors), size=n) if n is not None else np.arange(len(anchors))
    v = anchors[picks].astype(np.float64) + sigma * rng.standard_normal((len(picks), anchors.shape[1]))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v.astype(np.float32)


def anchor_passages(pools: Pools, n: int, seed: int = SEED + 5, max_chars: int = ANCHOR_CHARS) -> list[str]:
    """n distinct real passages (seeded), ZH_SHARE of them Chinese: consecutive sentences of one corpus
    document (same title) from a random start, truncated to max_chars."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    for _ in range(n * 20):
        if len(out) == n:
            break
        chinese = rng.random() < ZH_SHARE
        pool = pools.zh if chinese else pools.en
        sep = "" if chinese else " "
        k = rng.randrange(len(pool))
        title, text = pool[k]
        while len(text) < max_chars and k + 1 < len(pool) and pool[k + 1][0] == title:
            k += 1
            text += sep + pool[k][1]
        text = text[:max_chars]
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def sample_distinct_queries(pools: Pools, n: int, seed: int) -> list[str]:
    """Up to n distinct query strings (seeded), about ZH_SHARE of them Chinese."""
    rng = random.Random(seed)
    zh, en = sorted(set(pools.zh_queries)), sorted(set(pools.en_queries))
    n_zh = min(len(zh), round(n * ZH_SHARE))
    n_en = min(len(en), n - n_zh)
    picked = rng.sample(zh, n_zh) + rng.sample(en, n_en)
    rng.shuffle(picked)
    return picked


@dataclass
class VectorSource:
    """Where chunk and query embeddings come from: ``uniform`` random, or ``anchored`` on real embeddings
    (see the module docstring). ``queries`` maps query strings to their real query embeddings."""

    kind: str = "uniform"
    anchors: np.ndarray | None = None
    sigma: float = 0.0
    queries: dict[str, np.ndarray] = field(default_factory=dict)
    model: str = ""
    per_anchor: int = 1  # sub-centres per anchor (1: the anchors are the centres)
    centres: np.ndarray | None = None

    def describe(self) -> str:
        if self.kind == "uniform":
            return "uniform"
        n = 0 if self.anchors is None else len(self.anchors)
        subs = f", {self.per_anchor} sub-centres each" if self.per_anchor > 1 else ""
        return f"anchored ({n} {self.model} passage embeddings{subs}, sigma {self.sigma:.5f})"

    def sized_for(self, chunks: int) -> VectorSource:
        """This source with the cluster density of CHUNKS_PER_CENTRE for a knowledge base of `chunks`."""
        if self.kind == "uniform" or self.anchors is None:
            return self
        per_anchor = max(1, round(chunks / (len(self.anchors) * CHUNKS_PER_CENTRE)))
        centres = self.anchors
        if per_anchor > 1:
            # (seeded like uniform document 3's vectors; the two never meet in one knowledge base)
            centres = anchored_vectors(
                np.random.default_rng([SEED, 3]), np.repeat(self.anchors, per_anchor, axis=0), None, self.sigma
            )
        return replace(self, per_anchor=per_anchor, centres=centres)

    def chunk_vectors(self, i: int, n: int, dim: int) -> np.ndarray:
        """The n chunk vectors of document i (deterministic in i)."""
        if self.kind == "uniform":
            return unit_vectors(np.random.default_rng([SEED, i]), n, dim)
        centres = self.anchors if self.centres is None else self.centres
        assert centres is not None and centres.shape[1] == dim
        return anchored_vectors(np.random.default_rng([SEED, i, 1]), centres, n, self.sigma)

    def query_vectors(self, texts: Sequence[str], stream: int, dim: int) -> np.ndarray:
        """Query embeddings of texts: the real ones (anchored), or random unit vectors of `stream`."""
        if self.kind == "uniform":
            return query_vectors(stream, len(texts), dim)
        return np.stack([self.queries[t] for t in texts])


def anchored_source(
    pools: Pools, embed: Any, spec: Any, query_texts: Sequence[str], n_anchors: int = ANCHORS, batch: int = 32
) -> VectorSource:
    """An ``anchored`` VectorSource: n_anchors real passages and the distinct `query_texts` embedded with
    `embed` (an Embedder) and the prefixes of `spec` (a pgkb.models.embedding.ModelSpec)."""
    from pgkb.models.embedding import prefixed

    def run(texts: list[str], query: bool) -> np.ndarray:
        texts = prefixed(spec, texts, query=query)
        out = []
        for b in range(0, len(texts), batch):
            out.append(np.asarray(embed.embed(texts[b : b + batch]), dtype=np.float32))
            log(f"embedded {min(b + batch, len(texts))}/{len(texts)} {'queries' if query else 'anchor passages'}")
        return np.concatenate(out) if out else np.empty((0, spec.dimension), np.float32)

    passages = anchor_passages(pools, n_anchors)
    anchors = run(passages, query=False)
    distinct = sorted(set(query_texts))
    q = run(distinct, query=True)
    return VectorSource(
        kind="anchored",
        anchors=anchors,
        sigma=anchor_sigma(spec.dimension),
        queries=dict(zip(distinct, q, strict=True)),
        model=spec.name,
    )


def doc_key(i: int) -> str:
    """The doc_key of bench document i."""
    return f"bench-{i:07d}"


def document_vectors(i: int, n_chunks: int, dim: int, vectors: VectorSource | None = None) -> np.ndarray:
    """The chunk embeddings of document i as they are stored: rounded to 6 decimals (they travel as JSON
    through kb.replace_document)."""
    return np.round((vectors or VectorSource()).chunk_vectors(i, n_chunks, dim), 6)


def make_document(i: int, pools: Pools, dim: int, n_chunks: int, vectors: VectorSource | None = None) -> Document:
    """Document i (deterministic in i); embeddings rounded to 6 decimals as they travel as JSON."""
    rng = random.Random(SEED * 1_000_003 + i)
    chinese = rng.random() < ZH_SHARE
    pool = pools.zh if chinese else pools.en
    vectors_ = document_vectors(i, n_chunks, dim, vectors)
    contents = []
    title = ""
    for _ in range(n_chunks):
        t, content = _make_chunk(rng, pool, chinese)
        title = title or t
        contents.append(content)
    return Document(doc_key(i), title, contents, vectors_)


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
    """The embedding model the benchmark writes and searches: storage is how kb.embeddings holds its vectors
    (``vector`` in column embedding, ``halfvec`` in column half: kb.register_embedding_model); column and cast
    are its stored column as its HNSW index reads it and the type a query is cast to, as
    kb_internal.vector_expression gives them."""

    id: int
    name: str
    dimension: int
    storage: str = "vector"
    column: str = ""
    cast: str = ""


def model_named(conn: psycopg.Connection, name: str | None = None) -> Model:
    """The registered model of that name (None: the default)."""
    row = conn.execute(
        "select id, name, dimension, storage, kb_internal.vector_expression(storage, dimension, 'column'),"
        " kb_internal.vector_expression(storage, dimension, 'cast') from kb.embedding_models"
        " where name = %s or (%s::text is null and is_default)",
        [name, name],
    ).fetchone()
    if row is None:
        missing = f"no embedding model {name!r} registered" if name else "no default embedding model registered"
        raise RuntimeError(missing + " (run `pgkb db migrate`)")
    return Model(*row)


def default_model(conn: psycopg.Connection) -> Model:
    return model_named(conn)
