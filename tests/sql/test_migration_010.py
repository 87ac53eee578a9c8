"""Migration 010 (input hardening) on a database that holds what the older functions could store: terms
longer than 64 characters, document keys in NFD (alone, and next to their NFC twin), term statistics at
df = 0, an all-zero embedding."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import psycopg
import pytest
from pgkb.config import Settings
from pgkb.migrate import migrate
from psycopg.conninfo import make_conninfo

NFC_CAFE, NFD_CAFE = "caf\u00e9.md", "cafe\u0301.md"
NFC_NAIVE, NFD_NAIVE = "na\u00efve.md", "nai\u0308ve.md"
LONG = "q" * 100


@pytest.fixture
def old_db(db, tmp_path: Path):
    """A new database migrated up to 009 (with the current db/functions), then dropped again."""
    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    (db_dir / "migrations" / "010_input_hardening.sql").unlink()
    name = f"pgkb_mig010_{uuid.uuid4().hex[:8]}"
    db.execute(f"create database {name} template template0")
    conn = psycopg.connect(make_conninfo(db.info.dsn, dbname=name), autocommit=True)
    try:
        migrate(conn, db_dir)
        yield conn
    finally:
        conn.close()
        db.execute(f"drop database {name}")


def write(conn, doc_key, *contents):
    conn.execute(
        "select kb.replace_document('legacy', %s, 'T', %s)", [doc_key, json.dumps([{"content": c} for c in contents])]
    )


def stats(conn):
    return (
        sorted(conn.execute("select kb_id, term, df from kb.term_stats").fetchall()),
        sorted(conn.execute("select id, chunk_count, term_total from kb.knowledge_bases").fetchall()),
    )


def recomputed(conn):
    return (
        sorted(
            conn.execute(
                "select kb_id, t, count(*)::integer from kb.chunks, unnest(terms) as t group by 1, 2"
            ).fetchall()
        ),
        sorted(
            conn.execute(
                "select k.id, count(c.id), coalesce(sum(c.term_count), 0) from kb.knowledge_bases k"
                " left join kb.chunks c on c.kb_id = k.id group by k.id"
            ).fetchall()
        ),
    )


@pytest.mark.slow
def test_migration_010_brings_stored_data_in_line(old_db):
    conn = old_db
    # what the current functions store: the reference for the long-term chunk after the migration
    write(conn, "long.md", f"前言 {LONG} 结尾")
    long_chunk, *reference = conn.execute("select id, term_freqs, term_count from kb.chunks").fetchone()
    # ... and what the old ones stored: the whole 100-character term
    conn.execute("update kb.term_stats set term = %s where term = %s", [LONG, LONG[:64]])
    conn.execute(
        "update kb.chunks set term_freqs = term_freqs - %s::text || jsonb_build_object(%s::text, 1)", [LONG[:64], LONG]
    )
    assert conn.execute("select max(length(t)) from kb.chunks, unnest(terms) t").fetchone()[0] == 100
    # a key in NFC and its NFD twin (older), and a lone NFD key
    write(conn, NFC_CAFE, "新版内容")
    write(conn, "twin.md", "旧版内容")
    conn.execute(
        "update kb.documents set doc_key = %s, updated_at = now() - interval '1 day' where doc_key = 'twin.md'",
        [NFD_CAFE],
    )
    write(conn, "naive-tmp.md", "天真")
    conn.execute("update kb.documents set doc_key = %s where doc_key = 'naive-tmp.md'", [NFD_NAIVE])
    kb_id = conn.execute("select id from kb.knowledge_bases where name = 'legacy'").fetchone()[0]
    conn.execute("insert into kb.ingest_failures (kb_id, doc_key, error) values (%s, %s, 'x')", [kb_id, NFD_NAIVE])
    # a term nobody uses any more, and a zero vector stored for a chunk that was then marked done
    conn.execute("insert into kb.term_stats (kb_id, term, df) values (%s, 'ghost', 0)", [kb_id])
    zero_chunk = conn.execute("select max(id) from kb.chunks").fetchone()[0]
    conn.execute("delete from kb.embedding_queue where chunk_id = %s", [zero_chunk])
    conn.execute(
        "insert into kb.embeddings (chunk_id, model_id, kb_id, embedding)"
        " select %s, id, %s, array_fill(0, array[dimension])::real[]::vector from kb.embedding_models",
        [zero_chunk, kb_id],
    )
    conn.execute("update kb.documents set status = 'ready'")

    report = migrate(conn, Settings.from_env().db_dir)
    assert report.applied == ["010_input_hardening.sql"]

    assert list(
        conn.execute("select term_freqs, term_count from kb.chunks where id = %s", [long_chunk]).fetchone()
    ) == reference
    assert conn.execute("select max(length(t)) from kb.chunks, unnest(terms) t").fetchone()[0] == 64
    docs = dict(
        conn.execute(
            "select d.doc_key, string_agg(c.content, '') from kb.documents d"
            " join kb.chunks c on c.document_id = d.id group by 1"
        ).fetchall()
    )
    assert docs == {"long.md": f"前言 {LONG} 结尾", NFC_CAFE: "新版内容", NFC_NAIVE: "天真"}
    assert conn.execute("select doc_key from kb.ingest_failures").fetchall() == [(NFC_NAIVE,)]
    assert stats(conn) == recomputed(conn)
    assert conn.execute("select count(*) from kb.term_stats where df <= 0").fetchone()[0] == 0
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
