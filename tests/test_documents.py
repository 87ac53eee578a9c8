"""kb.replace_document / delete_document / store_embeddings and the model registry."""

from __future__ import annotations

import json
import threading

import numpy as np
import psycopg
import pytest
from pgvector import Vector


def replace(conn, doc_key="a.md", chunks=None, kb="docs", **kw):
    chunks = chunks if chunks is not None else [{"content": "第一段内容"}, {"content": "第二段内容"}]
    extra = "".join(f", {k} => %s" for k in kw)
    return conn.execute(
        f"select * from kb.replace_document(kb => %s, doc_key => %s, title => 'T', chunks => %s{extra})",
        [kb, doc_key, json.dumps(chunks), *kw.values()],
    ).fetchone()


def snapshot(conn):
    return (
        conn.execute("select doc_key, content_hash, chunk_count from kb.documents order by 1").fetchall(),
        conn.execute("select document_id, ordinal, content from kb.chunks order by 1, 2").fetchall(),
        conn.execute("select chunk_id, model_id from kb.embedding_queue order by 1, 2").fetchall(),
        conn.execute("select kb_id, term, df from kb.term_stats order by 1, 2").fetchall(),
    )


def test_replace_creates_kb_queues_chunks_and_reports(db):
    doc_id, n, changed, queued = replace(db)
    assert (n, changed, queued) == (2, True, 2)
    assert db.execute("select visibility from kb.knowledge_bases where name = 'docs'").fetchone()[0] == "private"
    assert db.execute("select status from kb.documents where id = %s", [doc_id]).fetchone()[0] == "embedding"
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 2


def test_unchanged_content_is_a_noop(db):
    first = replace(db)
    before = snapshot(db)
    again = replace(db)
    assert again == (first[0], 2, False, 0)
    assert snapshot(db) == before


def test_explicit_content_hash_decides_noop(db):
    replace(db, content_hash="v1")
    assert replace(db, chunks=[{"content": "别的内容"}], content_hash="v1")[2] is False
    assert replace(db, chunks=[{"content": "别的内容"}], content_hash="v2")[2] is True


def test_replacement_swaps_all_chunks_and_keeps_document_id(db):
    doc_id = replace(db)[0]
    new = replace(
        db,
        chunks=[
            {
                "content": "只有一段",
                "heading_path": ["部署指南", "配置 TLS"],
                "chunk_type": "faq",
                "metadata": {"page": 3},
            }
        ],
    )
    assert new[0] == doc_id and new[1] == 1
    row = db.execute(
        "select ordinal, content, heading_path, chunk_type, metadata, char_count from kb.chunks"
    ).fetchall()
    assert row == [(0, "只有一段", ["部署指南", "配置 TLS"], "faq", {"page": 3}, 4)]


def test_readers_never_see_a_mix_of_versions(db, connect_as):
    replace(db, chunks=[{"content": f"版本0 第{i}段"} for i in range(20)])
    stop = threading.Event()
    mixed = []
    reads = [0]

    def reader():
        conn = psycopg.connect(db.info.dsn, autocommit=True)
        while not stop.is_set():
            versions = {r[0].split()[0] for r in conn.execute("select content from kb.chunks").fetchall()}
            reads[0] += 1
            if len(versions) != 1:
                mixed.append(versions)
        conn.close()

    thread = threading.Thread(target=reader)
    thread.start()
    for v in range(1, 40):
        replace(db, chunks=[{"content": f"版本{v} 第{i}段"} for i in range(20 + v % 3)])
    stop.set()
    thread.join()
    assert reads[0] > 10
    assert mixed == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunks": {"content": "x"}}, "chunks must be a JSON array"),
        ({"chunks": ["text"]}, "must be a JSON object"),
        ({"chunks": [{"text": "x"}]}, 'needs a non-empty "content"'),
        ({"chunks": [{"content": "   "}]}, 'needs a non-empty "content"'),
        ({"chunks": [{"content": 5}]}, 'needs a non-empty "content"'),
        ({"chunks": [{"content": "a", "ordinal": 1}, {"content": "b", "ordinal": 1}]}, "duplicate chunk ordinal 1"),
        ({"chunks": [{"content": "a", "ordinal": -1}]}, "non-negative integer"),
        ({"chunks": [{"content": "a", "ordinal": 1.5}]}, "non-negative integer"),
        ({"chunks": [{"content": "a", "heading_path": "x"}]}, "heading_path"),
        ({"chunks": [{"content": "a", "heading_path": [1]}]}, "heading_path"),
        ({"chunks": [{"content": "a", "chunk_type": "poem"}]}, 'unknown chunk_type "poem"'),
        ({"chunks": [{"content": "a", "metadata": [1]}]}, '"metadata" must be an object'),
        ({"chunks": [{"content": "a", "embedding": [0.1, 0.2]}]}, "embedding dimension does not match"),
        ({"chunks": [{"content": "a", "embedding": ["x"]}]}, "array of numbers"),
        ({"doc_key": ""}, "doc_key must be a non-empty"),
        ({"doc_key": "x" * 1001}, "doc_key must be a non-empty"),
        ({"kb": "bad name!"}, "invalid knowledge base name"),
        ({"metadata": json.dumps([1])}, "metadata must be a JSON object"),
        ({"model": "no-such-model"}, 'unknown embedding model "no-such-model"'),
    ],
)
def test_bad_document_input_is_rejected_and_changes_nothing(db, kwargs, message):
    replace(db)
    before = snapshot(db)
    with pytest.raises(psycopg.Error, match=message):
        replace(db, **kwargs)
    assert snapshot(db) == before


def test_embeddings_in_chunks_are_stored_not_queued(db):
    vec = np.zeros(384)
    vec[0] = 1
    doc_id, n, changed, queued = replace(
        db, chunks=[{"content": "有向量", "embedding": vec.tolist()}, {"content": "没有向量"}]
    )
    assert (n, queued) == (2, 1)
    assert db.execute("select count(*) from kb.embeddings").fetchone()[0] == 1


def test_store_embeddings_empties_queue_and_marks_document_ready(db):
    doc_id = replace(db)[0]
    ids = [r[0] for r in db.execute("select chunk_id from kb.embedding_queue order by 1").fetchall()]
    vecs = [Vector(np.eye(384, dtype=np.float32)[i]) for i in range(len(ids))]
    assert db.execute("select kb.store_embeddings('multilingual-e5-small', %s, %s)", [ids, vecs]).fetchone()[0] == 2
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    assert db.execute("select status from kb.documents where id = %s", [doc_id]).fetchone()[0] == "ready"
    with pytest.raises(psycopg.Error, match="dimension does not match"):
        db.execute("select kb.store_embeddings('multilingual-e5-small', %s, %s)", [ids[:1], [Vector([1.0, 0.0])]])


def test_delete_document_removes_everything(db):
    replace(db)
    assert db.execute("select kb.delete_document('docs', 'a.md')").fetchone()[0] is True
    assert db.execute("select kb.delete_document('docs', 'a.md')").fetchone()[0] is False
    assert db.execute("select count(*) from kb.chunks").fetchone()[0] == 0
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    assert db.execute("select coalesce(sum(df), 0) from kb.term_stats").fetchone()[0] == 0
    with pytest.raises(psycopg.Error, match='unknown knowledge base "nope"'):
        db.execute("select kb.delete_document('nope', 'a.md')")


def test_switching_to_a_model_of_another_dimension_needs_no_drop(db):
    """A new 8-d model backfills while the 384-d default keeps serving, then becomes the default."""
    old = np.zeros(384, dtype=np.float32)
    old[1] = 1
    replace(db, chunks=[{"content": "模型切换测试", "embedding": old.tolist()}])
    db.execute("select kb.register_embedding_model('tiny-8d', 8, 'q: ', 'p: ')")
    queued = db.execute(
        "select q.chunk_id from kb.embedding_queue q join kb.embedding_models m on m.id = q.model_id"
        " where m.name = 'tiny-8d'"
    ).fetchall()
    assert len(queued) == 1
    # the old model still serves while the new one backfills
    rows = db.execute("select doc_key from kb.vector_search('x', 1, query_embedding => %s)", [Vector(old)]).fetchall()
    assert rows == [("a.md",)]
    with pytest.raises(psycopg.Error, match="1 chunks have no"):
        db.execute("select kb.use_embedding_model('tiny-8d')")
    new = np.ones(8, dtype=np.float32) / np.sqrt(8)
    db.execute("select kb.store_embeddings('tiny-8d', %s, %s)", [[queued[0][0]], [Vector(new)]])
    assert db.execute("select kb.use_embedding_model('tiny-8d')").fetchone()[0] == 0
    rows = db.execute(
        "select doc_key, vector_rank from kb.vector_search('x', 1, query_embedding => %s)", [Vector(new)]
    ).fetchall()
    assert rows == [("a.md", 1)]
    # both HNSW indexes exist side by side
    assert (
        db.execute("select count(*) from pg_indexes where indexname like 'embeddings_hnsw_model_%'").fetchone()[0] == 2
    )
    with pytest.raises(psycopg.Error, match="has 384 dimensions"):
        db.execute("select * from kb.vector_search('x', 1, query_embedding => %s)", [Vector(old)])


def test_concurrent_first_writes_create_the_knowledge_base_once(db):
    barrier = threading.Barrier(4)
    errors = []

    def write(i):
        with psycopg.connect(db.info.dsn, autocommit=True) as conn:
            barrier.wait()
            try:
                replace(conn, doc_key=f"doc{i}.md", kb="fresh-kb")
            except psycopg.Error as e:
                errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert db.execute(
        "select count(*) from kb.documents d join kb.knowledge_bases k on k.id = d.kb_id where k.name = 'fresh-kb'"
    ).fetchone()[0] == 4
