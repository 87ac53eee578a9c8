"""Reliability 5a: hostile input to the SQL API, fuzzed with hypothesis -- kb.hybrid_search, the single legs,
kb.replace_document, kb.delete_document and metadata filters, called as a pgkb user (alice) through the
real database. Every call either succeeds or fails with a clear error of an input class (22 data
exception, 23 integrity, 42501 privilege, 54 limit, P0002 unknown name) -- never an internal error, a lost
connection, a server crash or a NaN score -- and a rejected call changes nothing (a fingerprint of every kb
table before and after). The defects found this way (zero-norm vectors, NaN parameters, long words,
multi-byte doc_keys; fixed on main since) keep targeted tests below.

Fast: a few hundred examples in all; long (PGKB_SOAK=1): thousands.
"""

from __future__ import annotations

import hashlib
import json
import math
import time

import numpy as np
import psycopg
import pytest
import relhelpers as rh
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgvector import Vector

pytestmark = pytest.mark.reliability

ACCEPTED_CLASSES = ("22", "23", "42501", "54", "P0002")
FUZZ = settings(
    max_examples=rh.scale(150, 3000),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not rh.SOAK,  # the fast variant is reproducible; the long one explores
    database=None,
)

# text that stresses tokenizers and encodings: CJK, emoji, combining marks, controls, RTL, long words
texts = st.one_of(
    st.text(max_size=60),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
    st.sampled_from(["", " ", "\u3000", "退款", "a" * 3000, "\u0000x", "'; drop table kb.chunks; --", "%_\\", "*:&|!"]),
    st.builds(lambda w, n: " ".join([w] * n), st.text(min_size=1, max_size=20), st.integers(1, 400)),
)
names = st.one_of(st.none(), st.sampled_from(["fz", "other", "no-such-kb", "", "FZ"]), st.text(max_size=30))
contents = st.one_of(st.text(min_size=1, max_size=80).filter(str.strip), texts)
floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1.0, 1e308]))
ints = st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, 100, 101, 1000, 1001]))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def vectors():
    """Query embeddings: the right dimension (random directions at tiny, unit and huge scales, zero), wrong
    dimensions (up to pgvector's 16000), one NaN or infinity inside, none."""
    dims = st.sampled_from([rh.DIM, rh.DIM, rh.DIM, 1, 2, rh.DIM + 1, 16000])
    scales = st.sampled_from([1e-30, 1.0, 1.0, 1e30])

    def build(d: int, seed: int, scale: float, poison: float | None) -> list[float]:
        v = [float(x) * scale for x in np.random.default_rng(seed).standard_normal(d)]
        if poison is not None:
            v[seed % d] = poison
        return v

    poison = st.one_of(st.none(), st.none(), st.none(), st.sampled_from([math.nan, math.inf, -math.inf]))
    return st.one_of(st.none(), st.builds(build, dims, st.integers(0, 2**32), scales, poison))


def mostly_valid(valid: dict, hostile: dict):
    """Keyword arguments that are valid except for 0, 1, 2 or all of them drawn from ``hostile`` -- so the
    fuzzing reaches past the first check (a call with everything hostile is rejected at once)."""

    @st.composite
    def build(draw):
        keys = list(valid)
        n = draw(st.sampled_from([0, 1, 1, 1, 2, 2, len(keys)]))
        bad = set(draw(st.permutations(keys))[:n])
        return {k: draw(hostile[k] if k in bad else valid[k]) for k in keys}

    return build()


def chunk_lists():
    chunk = st.fixed_dictionaries(
        {"content": contents},
        optional={
            "heading_path": st.one_of(st.lists(st.text(max_size=20), max_size=4), json_values),
            "chunk_type": st.one_of(st.sampled_from(["text", "table", "code", "faq", "image_caption"]), json_values),
            "metadata": json_values,
            "ordinal": st.one_of(st.integers(-2, 5), json_values),
            "embedding": st.one_of(vectors(), json_values),
        },
    )
    return st.one_of(st.lists(chunk, max_size=5), json_values)


@pytest.fixture
def world(rdb, connect_as):
    rdb.execute("select kb.create_knowledge_base('fz', 'private', owner => 'alice')")
    rdb.execute("select kb.create_knowledge_base('other', 'private', owner => 'bob')")
    for kb, word in (("fz", "fuzzword"), ("other", "bobword")):
        content = f"{word} 退款 审核通过后三个工作日内原路退回 {kb}"
        rdb.execute(
            "select * from kb.replace_document(%s, 'seed.md', 'T', %s, metadata => '{\"lang\": \"zh\"}')",
            [kb, json.dumps([{"content": content, "embedding": rh.fake_vector(content)}])],
        )
    rdb.execute("update kb.settings set value = %s where key = 'embedding_url'", [rh.dead_url()])
    alice = connect_as("alice")
    alice.execute("set statement_timeout = '20s'")
    return rdb, alice


class Outcomes:
    def __init__(self) -> None:
        self.ok = 0
        self.rejected: dict[str, int] = {}
        self.started = time.monotonic()

    def figures(self) -> dict:
        return {
            "calls": self.ok + sum(self.rejected.values()),
            "succeeded": self.ok,
            "rejected_by_sqlstate": dict(sorted(self.rejected.items())),
            "seconds": round(time.monotonic() - self.started, 1),
        }


def call(admin, conn, outcomes: Outcomes, sql: str, params, *, write: bool):
    """Run one fuzzed call; return its rows, or None when it was rejected (checked to be clean)."""
    before = rh.snapshot(admin) if write else None
    try:
        rows = conn.execute(sql, params).fetchall()
    except psycopg.Error as e:
        if conn.broken or (e.sqlstate or "").startswith("08"):  # the server crashed or killed us
            raise AssertionError(f"connection lost: {e}") from e
        state = e.sqlstate or "client"
        assert state == "client" or state.startswith(ACCEPTED_CLASSES), f"{state}: {e}"
        assert state != "client" or isinstance(e, psycopg.DataError), repr(e)  # e.g. NUL in a string
        outcomes.rejected[state] = outcomes.rejected.get(state, 0) + 1
        if write:
            assert rh.snapshot(admin) == before, f"a rejected call changed something: {e}"
        return None
    outcomes.ok += 1
    return rows


def finite_scores(rows) -> None:
    for row in rows:
        for x in row:
            assert not (isinstance(x, float) and (math.isnan(x) or math.isinf(x))), row


SEARCH_SQL = (
    "select score, vector_score, lexical_score, fuzzy_score from kb.hybrid_search(%s, top_k => %s, kb => %s,"
    " query_embedding => %s, vector_weight => %s, lexical_weight => %s, fuzzy_weight => %s, rrf_k => %s,"
    " candidates => %s, filter => %s, bm25_k1 => %s, bm25_b => %s, fusion => %s)"
)


def vec(v):
    return None if v is None else Vector(v)


def test_fuzz_hybrid_search(world):
    admin, alice = world
    outcomes = Outcomes()
    before = rh.snapshot(admin)

    valid = {
        "query": st.one_of(
            st.sampled_from(["fuzzword", "退款", "fuzzword 退款 审核"]), st.text(min_size=1, max_size=40)
        ),
        "top_k": st.integers(1, 100),
        "kb": st.sampled_from([None, "fz"]),
        "emb": st.one_of(st.none(), st.builds(rh.fake_vector, st.text(max_size=10))),
        "vector_weight": st.floats(0, 2),
        "lexical_weight": st.floats(0.01, 2),
        "fuzzy_weight": st.floats(0, 2),
        "rrf_k": st.floats(0.1, 1000),
        "candidates": st.integers(1, 1000),
        "filter": st.sampled_from([None, {}, {"lang": "zh"}, {"lang": "en"}]),
        "bm25_k1": st.floats(0, 3),
        "bm25_b": st.floats(0, 1),
        "fusion": st.sampled_from(["dbsf", "rrf"]),
    }
    hostile = {
        "query": texts,
        "top_k": ints,
        "kb": names,
        "emb": vectors(),
        "vector_weight": floats,
        "lexical_weight": floats,
        "fuzzy_weight": floats,
        "rrf_k": floats,
        "candidates": ints,
        "filter": json_values,
        "bm25_k1": floats,
        "bm25_b": floats,
        "fusion": names,
    }

    @FUZZ
    @given(p=mostly_valid(valid, hostile))
    def fuzz(p):
        params = [p["query"], p["top_k"], p["kb"], vec(p["emb"]), p["vector_weight"], p["lexical_weight"]]
        params += [p["fuzzy_weight"], p["rrf_k"], p["candidates"], _json(p["filter"]), p["bm25_k1"], p["bm25_b"]]
        rows = call(admin, alice, outcomes, SEARCH_SQL, params + [p["fusion"]], write=False)
        if rows is not None:
            finite_scores(rows)

    fuzz()
    assert rh.snapshot(admin) == before  # searching changes nothing
    rh.publish("fuzz-sql-hybrid_search", **outcomes.figures())
    assert outcomes.ok > 0 and outcomes.rejected


def _json(value):
    return None if value is None else json.dumps(value)


def test_fuzz_single_legs(world):
    admin, alice = world
    outcomes = Outcomes()

    valid = {
        "leg": st.sampled_from(["vector", "lexical", "fuzzy"]),
        "query": st.one_of(st.sampled_from(["fuzzword", "退款", "fuzzwrd"]), st.text(min_size=1, max_size=40)),
        "top_k": st.integers(1, 100),
        "kb": st.sampled_from([None, "fz"]),
        "emb": st.one_of(st.none(), st.builds(rh.fake_vector, st.text(max_size=10))),
        "filter": st.sampled_from([None, {}, {"lang": "zh"}]),
        "bm25": st.tuples(st.floats(0, 3), st.floats(0, 1)),
    }
    hostile = {
        "leg": valid["leg"],
        "query": texts,
        "top_k": ints,
        "kb": names,
        "emb": vectors(),
        "filter": json_values,
        "bm25": st.tuples(floats, floats),
    }

    @FUZZ
    @given(p=mostly_valid(valid, hostile))
    def fuzz(p):
        leg, query, top_k, kb, emb, filter_, bm25 = (p[k] for k in valid)
        f = _json(filter_)
        if leg == "vector":
            sql, params = (
                "select score from kb.vector_search(%s, %s, %s, %s, null, %s)",
                [query, top_k, kb, vec(emb), f],
            )
        elif leg == "lexical":
            sql, params = "select score from kb.lexical_search(%s, %s, %s, %s, %s, %s)", [query, top_k, kb, f, *bm25]
        else:
            sql, params = "select score from kb.fuzzy_search(%s, %s, %s, %s)", [query, top_k, kb, f]
        rows = call(admin, alice, outcomes, sql, params, write=False)
        if rows is not None:
            finite_scores(rows)

    fuzz()
    rh.publish("fuzz-sql-legs", **outcomes.figures())
    assert outcomes.ok > 0 and outcomes.rejected


def test_fuzz_replace_and_delete_document(world):
    admin, alice = world
    outcomes = Outcomes()

    valid = {
        "kb": st.just("fz"),
        "doc_key": st.one_of(st.sampled_from(["a.md", "dir/b.md", "文档.md"]), st.text(min_size=1, max_size=40)),
        "title": st.one_of(st.none(), st.text(max_size=40)),
        "chunks": st.lists(
            st.fixed_dictionaries(
                {"content": st.text(min_size=1, max_size=80).filter(str.strip)},
                optional={
                    "heading_path": st.lists(st.text(max_size=20), max_size=3),
                    "chunk_type": st.sampled_from(["text", "table", "code", "faq", "image_caption"]),
                    "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
                    "embedding": st.builds(rh.fake_vector, st.text(max_size=10)),
                },
            ),
            min_size=1,
            max_size=5,
        ),
        "source_url": st.one_of(st.none(), st.text(max_size=50)),
        "metadata": st.one_of(st.just({}), st.dictionaries(st.text(max_size=8), json_values, max_size=3)),
        "source_type": st.sampled_from(["markdown", "pdf", "html"]),
        "content_hash": st.one_of(st.none(), st.text(max_size=70)),
        "model": st.sampled_from([None, rh.MODEL]),
        "delete": st.booleans(),
    }
    hostile = {
        "kb": names,
        "doc_key": st.one_of(texts, names),
        "title": st.one_of(st.none(), texts),
        "chunks": chunk_lists(),
        "source_url": st.one_of(st.none(), texts),
        "metadata": json_values,
        "source_type": names,
        "content_hash": st.one_of(st.none(), texts),
        "model": st.one_of(st.none(), st.sampled_from([rh.MODEL, "nope"]), st.text(max_size=10)),
        "delete": st.booleans(),
    }

    @FUZZ
    @given(p=mostly_valid(valid, hostile))
    def fuzz(p):
        kb, doc_key, title, chunks, source_url, metadata, source_type, content_hash, model, delete = (
            p[k] for k in valid
        )
        sql = (
            "select document_id, chunk_count, changed, queued from kb.replace_document(%s, %s, %s, %s, %s, %s,"
            " %s, %s, %s)"
        )
        params = [kb, doc_key, title, _json(chunks), source_url, _json(metadata), source_type, content_hash, model]
        call(admin, alice, outcomes, sql, params, write=True)
        if delete:
            call(admin, alice, outcomes, "select kb.delete_document(%s, %s)", [kb, doc_key], write=True)
        problems = rh.integrity_problems(admin)
        assert problems == [], problems

    fuzz()
    # bob's knowledge base was never writable for alice: untouched
    assert (
        admin.execute(
            "select count(*) from kb.documents d join kb.knowledge_bases k on k.id = d.kb_id where k.name = 'other'"
        ).fetchone()[0]
        == 1
    )
    rh.publish("fuzz-sql-replace-delete", **outcomes.figures())
    assert outcomes.ok > 0 and outcomes.rejected


# ------------------------------------------------------------------- defects found by fuzzing, targeted


def test_zero_norm_query_embedding(world):
    """A zero vector has no direction: a clear error (or the lexical legs only), never NaN scores."""
    admin, alice = world
    zero = Vector([0.0] * rh.DIM)
    for sql in (
        "select score, vector_score from kb.hybrid_search('fuzzword', query_embedding => %s)",
        "select score, vector_score from kb.vector_search('fuzzword', query_embedding => %s)",
    ):
        try:
            rows = alice.execute(sql, [zero]).fetchall()
        except psycopg.Error as e:
            assert e.sqlstate.startswith("22"), e
            continue
        finite_scores(rows)


def test_zero_norm_stored_embedding(world):
    admin, alice = world
    before = rh.snapshot(admin)
    chunks = json.dumps([{"content": "zero vector chunk", "embedding": [0.0] * rh.DIM}])
    try:
        alice.execute("select * from kb.replace_document('fz', 'zero.md', 'T', %s)", [chunks])
    except psycopg.Error as e:
        assert e.sqlstate.startswith("22") and rh.snapshot(admin) == before, e
        return
    finite_scores(
        alice.execute(
            "select score, vector_score from kb.hybrid_search('zero vector chunk', query_embedding => %s)",
            [Vector(rh.fake_vector("q"))],
        ).fetchall()
    )


@pytest.mark.parametrize("param", ["vector_weight", "lexical_weight", "fuzzy_weight", "rrf_k", "bm25_k1", "bm25_b"])
def test_nan_parameters_are_rejected(world, param):
    admin, alice = world
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        alice.execute(
            f"select score from kb.hybrid_search('fuzzword', {param} => 'NaN', query_embedding => %s)",
            [Vector(rh.fake_vector("q"))],
        ).fetchall()


def test_a_very_long_word_does_not_make_a_document_unstorable(world):
    """A 5000-character identifier (a minified line, a base64 blob) must not exceed an index's row size."""
    admin, alice = world
    content = "blob " + "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(80))  # 5120 chars
    alice.execute("select * from kb.replace_document('fz', 'long.md', 'T', %s)", [json.dumps([{"content": content}])])
    assert alice.execute("select count(*) from kb.lexical_search('blob', kb => 'fz')").fetchone()[0] == 1
    assert rh.integrity_problems(admin) == []


def test_doc_key_limit_counts_what_the_index_can_hold(world):
    """A doc_key within the documented 1000 characters is stored, or refused with the doc_key message --
    not with an index row size error (1000 CJK characters are 3000 bytes)."""
    admin, alice = world
    before = rh.snapshot(admin)
    key = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1000))  # 3000 bytes, incompressible
    try:
        alice.execute("select * from kb.replace_document('fz', %s, 'T', '[{\"content\": \"x\"}]')", [key])
    except psycopg.Error as e:
        assert isinstance(e, psycopg.errors.InvalidParameterValue) and "doc_key" in str(e), e
        assert rh.snapshot(admin) == before
        return
    assert alice.execute("select kb.delete_document('fz', %s)", [key]).fetchone()[0]
