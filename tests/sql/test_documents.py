"""kb.replace_document / delete_document / store_embeddings and the model registry."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import psycopg
import pytest
from chunk_terms import CHUNK_TERMS
from pgvector import Vector
from term_dictionary import TERM_DICTIONARY


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
        conn.execute(f"select kb_id, term, df from {TERM_DICTIONARY} as d order by 1, 2").fetchall(),
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
        # issue 9: empty arrays, invisible content, unusable vectors, keys too long in bytes
        ({"chunks": []}, "chunks must not be empty"),
        ({"chunks": [{"content": "\u3000\u3000"}]}, 'chunk 0 needs a non-empty "content"'),
        ({"chunks": [{"content": "\u00a0 \u00a0\n"}]}, 'chunk 0 needs a non-empty "content"'),
        ({"chunks": [{"content": "正文"}, {"content": "\u200b\u200c\u200d\u2060\ufeff"}]}, "chunk 1 needs a"),
        ({"chunks": [{"content": "a", "embedding": [0.0] * 384}]}, "zero or degenerate norm"),
        ({"chunks": [{"content": "a", "embedding": [1e-30] * 384}]}, "zero or degenerate norm"),
        ({"chunks": [{"content": "a", "embedding": [1e20] + [0.0] * 383}]}, "zero or degenerate norm"),
        ({"chunks": [{"content": "a", "embedding": [1e39] + [0.0] * 383}]}, "beyond float4"),
        ({"doc_key": ""}, "doc_key must be a non-empty"),
        ({"doc_key": "\u200b\u00a0\u3000"}, "doc_key must be a non-empty"),
        ({"doc_key": "x" * 1001}, "doc_key must be a non-empty string of at most 1000 characters"),
        ({"doc_key": "文" * 1000}, "at most 1000 characters and 2000 bytes, got 1000 characters and 3000 bytes"),
        ({"doc_key": "文" * 667}, "2000 bytes"),
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


def test_store_embeddings_rejects_zero_and_degenerate_vectors(db):
    """Issue 9: a zero vector has no direction; cosine distances to it are NaN, and one NaN vector score
    made every fused DBSF score NaN."""
    replace(db)
    ids = [r[0] for r in db.execute("select chunk_id from kb.embedding_queue order by 1").fetchall()]
    good = Vector(np.eye(384, dtype=np.float32)[0])
    before = snapshot(db)
    for bad in (np.zeros(384), np.full(384, 1e-25), np.r_[1e20, np.zeros(383)]):
        with pytest.raises(psycopg.errors.DataException, match=r"embeddings\[2\] has a zero or degenerate norm"):
            db.execute("select kb.store_embeddings('multilingual-e5-small', %s, %s)", [ids, [good, Vector(bad)]])
    with pytest.raises(psycopg.errors.DataException, match="NaN not allowed"):
        db.execute("select kb.store_embeddings(null, %s, %s)", [ids[:1], [Vector(np.full(384, np.nan))]])
    for args, message in [
        ((ids + ids[:1], [good] * 3), "must be distinct"),
        ((ids, [good]), "same length"),
        ((ids, None), "same length"),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            db.execute("select kb.store_embeddings(null, %s, %s)", list(args))
    assert snapshot(db) == before
    assert db.execute("select count(*) from kb.embeddings").fetchone()[0] == 0


def test_long_unbroken_runs_are_indexed_and_found(db):
    """Issue 9: a 2.7 KB alphanumeric run failed with "index row size ... exceeds maximum 2712 for index
    chunks_terms_idx" (a GIN index migration 042 dropped). Word terms are cut to 64 characters, in documents
    and queries alike."""
    run = "a1b2" * 750  # 3000 characters, one word
    camel = "partOf" * 16_000  # 96 KB, one word with camelCase parts (chunks hold at most 100,000 characters)
    replace(db, chunks=[{"content": f"前言 {run} 结尾"}, {"content": camel}, {"content": "z" * 100_000}])
    longest = db.execute(f"select max(length(x.term)) from {CHUNK_TERMS} as x").fetchone()[0]
    assert longest == 64
    assert db.execute(f"select max(length(term)) from {TERM_DICTIONARY} as d").fetchone()[0] == 64
    rows = db.execute("select chunk_index from kb.lexical_search(%s, 3)", [run]).fetchall()
    assert rows[0] == (0,)
    assert db.execute("select chunk_index from kb.lexical_search(%s, 1)", ["partOf" * 100]).fetchall() == [(1,)]


def test_nfc_and_nfd_keys_name_one_document(db):
    """Issue 9: 'café.md' composed (NFC) and decomposed (NFD) were two documents."""
    nfc, nfd = "caf\u00e9.md", "cafe\u0301.md"
    first = replace(db, doc_key=nfc, chunks=[{"content": "第一版"}])
    second = replace(db, doc_key=nfd, chunks=[{"content": "第二版"}])
    assert second[0] == first[0] and second[2] is True
    assert db.execute("select doc_key from kb.documents").fetchall() == [(nfc,)]
    assert replace(db, doc_key=nfd, chunks=[{"content": "第二版"}])[2] is False  # unchanged, whichever form
    db.execute("select kb.record_ingest_failure('docs', %s, 'boom')", [nfd])
    assert db.execute("select doc_key from kb.ingest_failures").fetchall() == [(nfc,)]
    replace(db, doc_key=nfd, chunks=[{"content": "第三版"}])
    assert db.execute("select count(*) from kb.ingest_failures").fetchone()[0] == 0  # cleared by the write
    assert db.execute("select kb.delete_document('docs', %s)", [nfd]).fetchone()[0] is True
    assert db.execute("select count(*) from kb.documents").fetchone()[0] == 0
    with pytest.raises(psycopg.errors.CheckViolation):  # the table itself holds only NFC keys
        db.execute(
            "insert into kb.documents (kb_id, doc_key, content_hash)"
            " select id, %s, 'x' from kb.knowledge_bases where name = 'docs'",
            [nfd],
        )


def test_doc_keys_are_limited_in_bytes_everywhere(db):
    """Issue 9: doc_key was limited to 1000 characters but indexed in bytes: 1000 CJK characters
    (3000 bytes) failed with a raw btree row-size error."""
    assert replace(db, doc_key="文" * 666)[2] is True  # 1998 bytes
    before = snapshot(db)
    for sql in [
        "select kb.delete_document('docs', %s)",
        "select kb.record_ingest_failure('docs', %s, 'boom')",
        "select * from kb.replace_document('docs', %s, 't', '[{\"content\": \"x\"}]')",
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 1000 characters and 2000 bytes"):
            db.execute(sql, ["文" * 1000])
    assert snapshot(db) == before


def test_term_statistics_keep_no_zero_rows(db):
    """Issue 9: kb.term_stats kept a row with df = 0 for every term that ever occurred."""
    replace(db, chunks=[{"content": "独有词甲 uniqueAlpha"}])
    replace(db, chunks=[{"content": "独有词乙 uniqueBeta"}])
    terms = {r[0] for r in db.execute(f"select term from {TERM_DICTIONARY} as d")}
    assert "uniquebeta" in terms and "uniquealpha" not in terms and "词甲" not in terms
    assert db.execute("select count(*) from kb.term_stats where df <= 0").fetchone()[0] == 0  # no block holds them
    db.execute("select kb.delete_document('docs', 'a.md')")
    assert db.execute(f"select count(*) from {TERM_DICTIONARY} as d").fetchone()[0] == 0


def assert_terms_counted_from_text(db) -> None:
    """The term dictionary's document frequencies and every posting (recent or in a block, with its tf and length) are
    what the chunks' text gives (kb.chunk_terms)."""
    stats = f"select term, df from {TERM_DICTIONARY} as d order by term"
    counted = f"select x.term, count(*) from {CHUNK_TERMS} as x group by x.term order by x.term"
    assert db.execute(stats).fetchall() == db.execute(counted).fetchall()
    postings = (
        f"select s.term, x.id, x.tf, x.dl from {TERM_DICTIONARY} as s,"
        " unnest(s.recent_ids, s.recent_tfs, s.recent_dls) as x (id, tf, dl)"
        " union all select p.term, d.chunk_id, d.tf, d.dl from kb.postings as p,"
        " kb_internal.decode_postings(p.tier, p.first_chunk, p.n, p.payload) as d order by 1, 2"
    )
    in_chunks = f"select x.term, x.id, x.tf, x.term_count from {CHUNK_TERMS} as x order by 1, 2"
    assert db.execute(postings).fetchall() == db.execute(in_chunks).fetchall()


def test_a_new_title_is_counted_in_and_the_old_one_out(db):
    """A chunk's terms are computed from its text and its document's title (kb.chunk_terms; kb.chunks keeps no
    copy): a replace that changes only the title counts the old title's terms out and the new title's in, the
    posting lists follow, and a delete leaves nothing behind."""
    write = (
        "select * from kb.replace_document(kb => 'docs', doc_key => 'a.md', title => %s,"
        ' chunks => \'[{"content": "退款流程 refundFlow", "heading_path": ["Payments"]}]\')'
    )
    db.execute(write, ["Old Handbook 旧手册"])
    db.execute(write, ["New Guide 新指南"])
    terms = {r[0] for r in db.execute(f"select term from {TERM_DICTIONARY} as d")}
    assert {"guide", "新指", "指南", "payments", "refundflow", "退款"} <= terms
    assert not {"old", "handbook", "旧手", "手册"} & terms
    assert_terms_counted_from_text(db)
    assert db.execute("select doc_key from kb.lexical_search('指南', 5, 'docs')").fetchall() == [("a.md",)]
    assert db.execute("select doc_key from kb.lexical_search('handbook', 5, 'docs')").fetchall() == []
    db.execute("select kb.delete_document('docs', 'a.md')")
    assert db.execute(f"select count(*) from {TERM_DICTIONARY} as d").fetchone()[0] == 0
    assert db.execute("select count(*) from kb.postings").fetchone()[0] == 0


def test_a_document_of_more_chunks_than_a_slice_is_counted_exactly(db):
    """kb_internal.adjust_term_stats computes the postings of 5,000 chunks at a time (its memory stays bounded):
    a document of 12,000 chunks, its common terms moved to blocks across the slices, is counted as its text
    says, replaced by a shorter version and deleted without a trace."""
    chunks = [{"content": f"common{i % 7} 共有词{i % 3} word{i}"} for i in range(12_000)]
    replace(db, chunks=chunks)
    assert db.execute("select count(*) from kb.postings").fetchone()[0] > 0  # blocks, not only recent postings
    assert_terms_counted_from_text(db)
    replace(db, chunks=chunks[:5_500])
    assert_terms_counted_from_text(db)
    assert db.execute("select chunk_count from kb.knowledge_bases where name = 'docs'").fetchone() == (5_500,)
    db.execute("select kb.delete_document('docs', 'a.md')")
    assert db.execute(f"select count(*) from {TERM_DICTIONARY} as d").fetchone()[0] == 0
    assert db.execute("select count(*) from kb.postings").fetchone()[0] == 0
    # the delete gave 12,000 terms df 0: the dictionary was compacted, neither rows nor blocks are left
    assert (
        db.execute("select (select count(*) from kb.term_stats) + (select count(*) from kb.term_blocks)").fetchone()[0]
        == 0
    )


def test_chunk_validation_is_linear(db):
    """Issue 9: validating the chunks of kb.replace_document was quadratic (10k chunks 0.66 s, 20k 2.3 s,
    about a minute at 100k). A document whose last chunk is bad is checked to the end and refused, so the
    timing is validation alone; 4x the chunks must cost well under the 16x of a quadratic check."""

    def seconds(n):
        chunks = json.dumps([{"content": f"段落 {i}", "heading_path": ["H"]} for i in range(n)] + [{"content": " "}])
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"chunk {n} needs"):
                db.execute("select * from kb.replace_document('docs', 'big.md', 't', %s)", [chunks])
            best = min(best, time.perf_counter() - t0)
        return best

    small, large = seconds(10_000), seconds(40_000)
    assert large < 8 * small, (small, large)
    assert large < 10, large


def test_delete_document_removes_everything(db):
    replace(db)
    assert db.execute("select kb.delete_document('docs', 'a.md')").fetchone()[0] is True
    assert db.execute("select kb.delete_document('docs', 'a.md')").fetchone()[0] is False
    assert db.execute("select count(*) from kb.chunks").fetchone()[0] == 0
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    assert db.execute(f"select coalesce(sum(df), 0) from {TERM_DICTIONARY} as d").fetchone()[0] == 0
    with pytest.raises(psycopg.Error, match='unknown knowledge base "nope"'):
        db.execute("select kb.delete_document('nope', 'a.md')")


def test_switching_to_a_model_of_another_dimension_needs_no_drop(db):
    """A new 8-d model backfills while the 384-d default keeps serving, then becomes the default."""
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")  # every knowledge base its HNSW
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
    assert (
        db.execute(
            "select count(*) from kb.documents d join kb.knowledge_bases k on k.id = d.kb_id where k.name = 'fresh-kb'"
        ).fetchone()[0]
        == 4
    )


@pytest.mark.parametrize(
    "url, shown",
    [
        ("https://wiki.example.com/a b", None),
        ("javascript://%0Aalert(document.domain)", None),
        ("JAVASCRIPT://x", None),
        ("data:text/html,<script>alert(1)</script>", None),
        ("vbscript://x", None),
        ("file:///etc/passwd", None),
        ("/srv/docs/a.md", None),
        ("https://", None),
        ("https://wiki.example.com/x\n", None),
        ("http://[::1]:8080/a", "http://[::1]:8080/a"),
        ("HTTPS://wiki.example.com/a?b=c#d", "HTTPS://wiki.example.com/a?b=c#d"),
    ],
)
def test_only_web_addresses_reach_readers(db, url, shown):
    """Issue 32, finding 6f: source_url 'javascript://%0Aalert(document.domain)' passed the web-address rule and
    reached readers as the source of search results, MCP, citations and Dify records."""
    db.execute("select kb.create_knowledge_base('links', 'public')")
    chunks = '[{"content": "linkprobe text"}]'
    db.execute("select kb.replace_document('links', 'a.md', 'a', %s::jsonb, source_url => %s)", [chunks, url])
    assert db.execute("select source_url from kb.hybrid_search('linkprobe')").fetchone()[0] == shown
    assert db.execute("select source_url from kb.get_document('a.md', 'links')").fetchone()[0] == shown
