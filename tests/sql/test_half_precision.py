"""Models above 512 dimensions are stored and indexed as halfvec (issue 33): registration chooses, every write
path stores in the model's column, the vector leg and kb.retrieve read it through its HNSW index, and bad
vectors for half precision are refused without a change."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest
from pgvector import Vector

DIM = 1024


def unit(seed: int, dim: int = DIM) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def replace(conn, doc_key, chunks, model="big-1024"):
    return conn.execute(
        "select * from kb.replace_document(kb => 'docs', doc_key => %s, title => 'T', chunks => %s, model => %s)",
        [doc_key, json.dumps(chunks), model],
    ).fetchone()


@pytest.fixture
def big(db):
    """A 1024-d model registered with the default storage, as the default model; every knowledge base its HNSW."""
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")
    db.execute("select kb.register_embedding_model('big-1024', %s, make_default => true)", [DIM])
    return db


def test_registration_chooses_halfvec_above_512_dimensions_unless_told(db):
    db.execute("select kb.register_embedding_model('small-512', 512)")
    db.execute("select kb.register_embedding_model('big-1024', 1024)")
    db.execute("select kb.register_embedding_model('big-full', 1024, storage => 'vector')")
    db.execute("select kb.register_embedding_model('huge-3072', 3072)")
    rows = dict(db.execute("select model, storage from kb.embedding_status()").fetchall())
    assert rows["small-512"] == "vector" and rows["multilingual-e5-small"] == "vector"
    assert rows["big-1024"] == "halfvec" and rows["huge-3072"] == "halfvec"
    assert rows["big-full"] == "vector"
    # idempotent with the same settings; another storage for a registered model is refused
    db.execute("select kb.register_embedding_model('big-1024', 1024)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="stored as halfvec, not vector"):
        db.execute("select kb.register_embedding_model('big-1024', 1024, storage => 'vector')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="1..2000 \\(vector\\)"):
        db.execute("select kb.register_embedding_model('too-big', 3072, storage => 'vector')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='invalid storage "float8"'):
        db.execute("select kb.register_embedding_model('odd', 8, storage => 'float8')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid dimension 4001"):
        db.execute("select kb.register_embedding_model('odd', 4001)")


def test_every_write_path_stores_half_precision_and_search_reads_it_through_its_index(big):
    db = big
    vecs = [unit(i) for i in range(3)]
    replace(db, "a.md", [{"content": "第一段", "embedding": vecs[0].tolist()}, {"content": "第二段"}])
    queued = db.execute(
        "select q.chunk_id from kb.embedding_queue as q join kb.embedding_models as m on m.id = q.model_id"
        " where m.name = 'big-1024'"
    ).fetchall()
    assert len(queued) == 1  # the chunk written without an embedding
    db.execute("select kb.store_embeddings('big-1024', %s, %s)", [[queued[0][0]], [Vector(vecs[1])]])
    stored = db.execute(
        "select count(*) filter (where half is not null), count(*) filter (where embedding is not null)"
        " from kb.embeddings as e join kb.embedding_models as m on m.id = e.model_id where m.name = 'big-1024'"
    ).fetchone()
    assert stored == (2, 0)
    # the half-precision column is half the size of the full one
    half_bytes, full_bytes = db.execute(
        "select pg_column_size(e.half), pg_column_size(e.half::vector) from kb.embeddings as e"
        " where e.half is not null limit 1"
    ).fetchone()
    assert half_bytes < 0.55 * full_bytes
    # storing again (the upsert) replaces the half-precision vector
    db.execute("select kb.store_embeddings('big-1024', %s, %s)", [[queued[0][0]], [Vector(vecs[2])]])
    again = db.execute(
        "select e.half::vector from kb.embeddings as e where e.chunk_id = %s", [queued[0][0]]
    ).fetchone()[0]
    assert np.allclose(again.to_numpy(), vecs[2], atol=1e-3)

    rows = db.execute(
        "select content, vector_rank, vector_score from kb.vector_search('x', 2, query_embedding => %s)",
        [Vector(vecs[0])],
    ).fetchall()
    assert rows[0][:2] == ("第一段", 1)
    assert rows[0][2] == pytest.approx(1.0, abs=1e-3)
    rows = db.execute("select content from kb.retrieve('x', 1, query_embedding => %s)", [Vector(vecs[2])]).fetchall()
    assert rows == [("第二段",)]

    # the knowledge base's HNSW index is over the halfvec column, and the leg's plan uses it
    definition = db.execute(
        "select indexdef from pg_indexes where indexname = kb.hnsw_index_name("
        "(select id from kb.embedding_models where name = 'big-1024'), (select id from kb.knowledge_bases))"
    ).fetchone()[0]
    assert "(half)::halfvec(1024)" in definition and "halfvec_cosine_ops" in definition
    model_id, kb_id, index = db.execute(
        "select m.id, k.id, kb.hnsw_index_name(m.id, k.id) from kb.embedding_models as m, kb.knowledge_bases as k"
        " where m.name = 'big-1024'"
    ).fetchone()
    db.execute("set enable_seqscan = off")
    db.execute("set enable_sort = off")
    plan = "\n".join(
        r[0]
        for r in db.execute(
            f"explain select chunk_id from kb.embeddings where model_id = {model_id} and kb_id = {kb_id}"
            f" order by half::halfvec({DIM}) <=> %s::halfvec({DIM}) limit 5",
            [Vector(vecs[0])],
        ).fetchall()
    )
    assert index in plan


def test_vectors_half_precision_cannot_hold_are_refused_and_change_nothing(big):
    db = big
    replace(db, "a.md", [{"content": "第一段", "embedding": unit(0).tolist()}])
    before = db.execute("select count(*), sum(chunk_count) from kb.documents").fetchone()
    beyond = unit(1)
    beyond[0] = 70000.0  # past halfvec's largest value, 65504
    tiny = (unit(2) * 1e-9).astype(np.float32)  # every component rounds to 0 in half precision
    for bad in (beyond, tiny):
        with pytest.raises(psycopg.errors.DataException, match="beyond half precision"):
            replace(db, "b.md", [{"content": "第二段", "embedding": bad.tolist()}])
        chunk = db.execute("select id from kb.chunks limit 1").fetchone()[0]
        with pytest.raises(psycopg.errors.DataException, match="beyond half precision"):
            db.execute("select kb.store_embeddings('big-1024', %s, %s)", [[chunk], [Vector(bad)]])
    assert db.execute("select count(*), sum(chunk_count) from kb.documents").fetchone() == before
    # nor is such a query vector searched (every score would be NaN)
    with pytest.raises(psycopg.errors.DataException, match="beyond half precision"):
        db.execute("select * from kb.vector_search('x', 1, query_embedding => %s)", [Vector(tiny)])
    # kb.retrieve with vector_weight 0 neither checks nor scores the embedding: no NaN relevance passes a threshold
    rows = db.execute(
        "select score from kb.retrieve('第一段', 1, query_embedding => %s, vector_weight => 0)", [Vector(tiny)]
    ).fetchall()
    assert rows and all(0 <= r[0] <= 1 for r in rows)
    # the same vectors are fine for a model of full precision: the rule is the storage's
    db.execute("select kb.register_embedding_model('big-full', %s, storage => 'vector')", [DIM])
    replace(db, "c.md", [{"content": "第三段", "embedding": tiny.tolist()}], model="big-full")


def test_a_model_registered_before_keeps_full_precision(db):
    """The offline default (and any model registered before migration 041) stays vector: nothing rewritten."""
    storage = db.execute("select storage from kb.embedding_models where is_default").fetchone()[0]
    assert storage == "vector"
    replace(db, "a.md", [{"content": "第一段", "embedding": unit(0, 384).tolist()}], model=None)
    assert (
        db.execute("select count(*) from kb.embeddings where embedding is not null and half is null").fetchone()[0] == 1
    )
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("update kb.embeddings set half = embedding::halfvec")


@pytest.mark.slow
def test_a_large_model_registered_before_041_keeps_full_precision_through_the_upgrade(db, tmp_path):
    """A database of the release before (issue 32, part) with a 1024-d model already registered and used:
    `pgkb db migrate` leaves it 'vector' (no row or index rewritten), and it searches as before."""
    from pgkb.config import Settings
    from pgkb.migrate import migrate
    from releases import release_database

    vec = unit(7)
    with release_database(db, "issue-32-part", tmp_path) as old:
        old.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")
        old.execute("select kb.register_embedding_model('old-1024', 1024)")
        replace(old, "a.md", [{"content": "第一段", "embedding": vec.tolist()}], model="old-1024")
        migrate(old, Settings.from_env().db_dir)
        assert old.execute("select storage from kb.embedding_models where name = 'old-1024'").fetchone() == ("vector",)
        stored = old.execute(
            "select count(*) filter (where e.embedding is not null), count(*) filter (where e.half is not null)"
            " from kb.embeddings as e join kb.embedding_models as m on m.id = e.model_id where m.name = 'old-1024'"
        ).fetchone()
        assert stored == (1, 0)
        assert old.execute("select count(*) from kb_admin.index_problems()").fetchone()[0] == 0
        rows = old.execute(
            "select content, vector_rank from kb.vector_search('x', 1, query_embedding => %s, model => 'old-1024')",
            [Vector(vec)],
        ).fetchall()
        assert rows == [("第一段", 1)]
