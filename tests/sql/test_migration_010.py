"""Migration 010 (input hardening) on a database the release before it made and filled through its own
functions: terms longer than 64 characters, document keys in NFD (alone, and next to their NFC twin), term
statistics at df = 0, an all-zero embedding. Then migrated to HEAD, 010 and every later migration in order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from chunk_terms import CHUNK_TERMS
from pgkb.config import Settings
from pgkb.migrate import migrate
from releases import release_database
from term_dictionary import TERM_DICTIONARY

NFC_CAFE, NFD_CAFE = "caf\u00e9.md", "cafe\u0301.md"
NFC_NAIVE, NFD_NAIVE = "na\u00efve.md", "nai\u0308ve.md"
LONG = "q" * 100


@pytest.fixture
def old_db(db, tmp_path: Path):
    """A database the last release before 010 made (issue 5's: 001-009, tests/releases.py)."""
    with release_database(db, "issue-5", tmp_path) as conn:
        yield conn


def write(conn, doc_key, *contents):
    conn.execute(
        "select kb.replace_document('legacy', %s, 'T', %s)", [doc_key, json.dumps([{"content": c} for c in contents])]
    )


def stats(conn):
    return (
        # after the migration the dictionary may be in blocks: the upgrade recounts and compacts it
        sorted(conn.execute(f"select kb_id, term, df from {TERM_DICTIONARY} as d").fetchall()),
        sorted(conn.execute("select id, chunk_count, term_total from kb.knowledge_bases").fetchall()),
    )


def recomputed(conn):
    return (
        sorted(
            conn.execute(f"select x.kb_id, x.term, count(*)::integer from {CHUNK_TERMS} as x group by 1, 2").fetchall()
        ),
        sorted(
            conn.execute(
                "select k.id, count(c.id), coalesce(sum(c.term_count), 0) from kb.knowledge_bases k"
                " left join kb.chunks c on c.kb_id = k.id group by k.id"
            ).fetchall()
        ),
    )


@pytest.mark.slow
def test_migration_010_brings_stored_data_in_line(old_db, db):
    conn = old_db
    # what that release's functions store: the whole 100-character term ...
    write(conn, "long.md", f"前言 {LONG} 结尾")
    long_chunk = conn.execute("select id from kb.chunks").fetchone()[0]
    assert conn.execute("select max(length(t)) from kb.chunks, unnest(terms) t").fetchone()[0] == 100
    # ... a key in NFD next to its NFC twin, and a lone NFD key with an ingest failure
    write(conn, NFD_CAFE, "旧版内容")
    write(conn, NFC_CAFE, "新版内容")
    write(conn, NFD_NAIVE, "天真")
    conn.execute("select kb.record_ingest_failure('legacy', %s, 'x')", [NFD_NAIVE])
    # ... a term nobody uses any more (df = 0 once its document is gone) ...
    write(conn, "ghost.md", "ghost")
    conn.execute("select kb.delete_document('legacy', 'ghost.md')")
    assert conn.execute("select df from kb.term_stats where term = 'ghost'").fetchone() == (0,)
    # ... and a zero vector stored for a chunk, its document then ready
    zero_chunk = conn.execute(
        "select c.id from kb.chunks c join kb.documents d on d.id = c.document_id where d.doc_key = %s", [NFD_NAIVE]
    ).fetchone()[0]
    model, dimension = conn.execute("select name, dimension from kb.embedding_models where is_default").fetchone()
    conn.execute("select kb.store_embeddings(%s, %s, %s)", [model, [zero_chunk], [np.zeros(dimension, np.float32)]])
    assert conn.execute("select status from kb.documents where doc_key = %s", [NFD_NAIVE]).fetchone() == ("ready",)

    db_dir = Settings.from_env().db_dir
    report = migrate(conn, db_dir)
    assert report.applied == sorted(p.name for p in (db_dir / "migrations").glob("*.sql") if p.name >= "010")

    # the long chunk as HEAD's functions store it (in a fresh HEAD database)
    write(db, "long.md", f"前言 {LONG} 结尾")
    stored = "select term_count from kb.chunks where id = coalesce(%s, id)"
    assert conn.execute(stored, [long_chunk]).fetchone() == db.execute(stored, [None]).fetchone()
    assert conn.execute(f"select max(length(term)) from {TERM_DICTIONARY} as d").fetchone()[0] == 64
    docs = dict(
        conn.execute(
            "select d.doc_key, string_agg(c.content, '') from kb.documents d"
            " join kb.chunks c on c.document_id = d.id group by 1"
        ).fetchall()
    )
    assert docs == {"long.md": f"前言 {LONG} 结尾", NFC_CAFE: "新版内容", NFC_NAIVE: "天真"}
    assert conn.execute("select doc_key from kb.ingest_failures").fetchall() == [(NFC_NAIVE,)]
    assert stats(conn) == recomputed(conn)
    assert conn.execute("select count(*) from kb.term_stats where df <= 0").fetchone()[0] == 0  # nor in blocks
    assert conn.execute("select count(*) from kb.term_blocks where 0 >= any(dfs)").fetchone()[0] == 0
    # the zero vector is gone and its chunk queued again
    assert conn.execute("select count(*) from kb.embeddings").fetchone()[0] == 0
    assert conn.execute("select chunk_id from kb.embedding_queue where chunk_id = %s", [zero_chunk]).fetchone()
    assert conn.execute(
        "select d.status from kb.documents d join kb.chunks c on c.document_id = d.id where c.id = %s", [zero_chunk]
    ).fetchone() == ("embedding",)
    constraints = {
        r[0]
        for r in conn.execute(
            "select conname from pg_constraint"
            " where conrelid in ('kb.documents'::regclass, 'kb.ingest_failures'::regclass)"
        )
    }
    assert {"documents_doc_key_nfc", "documents_doc_key_bytes", "ingest_failures_doc_key_nfc"} <= constraints
    # and the functions work on the result
    write(conn, NFD_CAFE, "第三版")
    assert conn.execute("select count(*) from kb.documents where doc_key = %s", [NFC_CAFE]).fetchone()[0] == 1
    assert stats(conn) == recomputed(conn)
