"""Migrations: from empty, re-run is a no-op, an edited applied migration is refused, locale is right."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from migration_files import add_migration
from pgkb.config import Settings
from pgkb.migrate import MigrationError, maintain_vector_indexes, migrate
from releases import release_database
from term_dictionary import TERM_DICTIONARY


def test_database_lc_ctype_is_utf8_and_chinese_trigrams_work(db):
    ctype = db.execute("select datctype from pg_database where datname = current_database()").fetchone()[0]
    assert ctype.lower().replace("-", "").endswith("utf8")
    assert db.execute("select show_trgm('数据库')").fetchone()[0] != []


def test_migrations_applied_once_with_checksums(db):
    rows = db.execute("select version, name, length(checksum) from kb.schema_migrations order by 1").fetchall()
    versions = [r[0] for r in rows]
    assert versions[:4] == ["001", "002", "003", "004"]
    assert "functions" in versions
    assert all(r[2] == 64 for r in rows)


def test_rerunning_migrate_changes_nothing(db):
    before = db.execute("select version, checksum, applied_at from kb.schema_migrations order by 1").fetchall()
    report = migrate(db, Settings.from_env().db_dir)
    assert report.applied == [] and not report.functions_applied
    after = db.execute("select version, checksum, applied_at from kb.schema_migrations order by 1").fetchall()
    assert before == after


def test_editing_an_applied_migration_is_an_error(db, tmp_path: Path):
    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    first = sorted((db_dir / "migrations").glob("001_*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(db, db_dir)


def test_changed_function_files_are_reapplied(db, tmp_path: Path):
    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    search = db_dir / "functions" / "54_search_api.sql"
    search.write_text(search.read_text() + "\n-- touched\n")
    assert migrate(db, db_dir).functions_applied
    assert not migrate(db, db_dir).functions_applied


def test_failed_migration_leaves_database_unchanged(db, tmp_path: Path):
    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    name = add_migration(db_dir, "broken", "create table kb.half_done (id int);\nselect no_such_function();\n")
    with pytest.raises(MigrationError, match=name):
        migrate(db, db_dir)
    assert db.execute("select to_regclass('kb.half_done')").fetchone()[0] is None
    assert db.execute("select count(*) from kb.schema_migrations where version = %s", [name[:3]]).fetchone()[0] == 0


def test_default_model_and_its_hnsw_index_exist(db):
    """The default model is registered. A knowledge base gets its own HNSW index for it once it holds
    vector_exact_chunks chunks (below, it is searched exactly): at once when that is 0."""
    name, dim = db.execute("select name, dimension from kb.embedding_models where is_default").fetchone()
    assert (name, dim) == ("multilingual-e5-small", 384)
    hnsw = "select indexdef from pg_indexes where schemaname = 'kb' and indexname like 'embeddings_hnsw_model_%'"
    db.execute("select kb.create_knowledge_base('small')")
    assert db.execute(hnsw).fetchall() == []
    assert db.execute("select count(*) from kb_admin.index_problems()").fetchone()[0] == 0
    db.execute("delete from kb.knowledge_bases")
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")
    kb_id = db.execute("select kb.create_knowledge_base('first')").fetchone()[0]
    (indexdef,) = (r[0] for r in db.execute(hnsw).fetchall())
    assert "hnsw" in indexdef and "vector(384)" in indexdef and "vector_cosine_ops" in indexdef
    assert "m='16'" in indexdef.replace(" ", "") and "ef_construction='64'" in indexdef.replace(" ", "")
    assert f"WHERE ((model_id = 1) AND (kb_id = {kb_id}))" in indexdef


def test_function_file_needing_an_unavailable_extension_is_skipped_with_a_reason(db, tmp_path: Path):
    """What a managed PostgreSQL without plpython3u sees: the file is skipped, the reason is reported."""
    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    (db_dir / "functions" / "41_needs_extension.sql").write_text(
        "-- requires: no_such_extension\ncreate function kb.never_created() returns int language sql as 'select 1';\n"
    )
    report = migrate(db, db_dir)
    assert ("41_needs_extension.sql", "extension no_such_extension is not available on this server") in report.skipped
    assert any("skipped 41_needs_extension.sql" in line for line in report.lines())
    assert db.execute("select to_regproc('kb.never_created')").fetchone()[0] is None


@pytest.mark.slow
def test_chunk_term_migrations_upgrade_existing_chunks(db, tmp_path: Path):
    """009, 042 and 047 on a database the first release (001-007) made and filled: 009 added a terms array with
    a GIN index beside term_freqs, 042 dropped the array, 047 drops term_freqs (the posting lists are the one
    stored copy; a chunk's terms are computed from its text). The statistics still equal what the chunks' text
    gives (a knowledge base whose stored terms differ from its text's is counted again, the others are kept),
    lexical search finds the chunks, and a delete after the upgrade undoes exactly what was counted."""
    write = "select kb.replace_document('upgrade', %s, %s, jsonb_build_array(jsonb_build_object('content', %s::text)))"
    with release_database(db, "issues-2-4", tmp_path) as conn:
        conn.execute(write, ["a.md", "A", "退款会在三个工作日内原路退回"])
        many_terms = " ".join(f"word{i:04d}" for i in range(600))
        conn.execute(write, ["b.md", "B", many_terms + " 退款"])
        conn.execute(
            "select kb.replace_document('clean', 'c.md', 'C', jsonb_build_array(jsonb_build_object('content', 'kept')))"
        )
        # what an older tokenizer would have left: a stored term the text does not give, counted
        conn.execute(
            "update kb.chunks set term_freqs = term_freqs || '{\"ghostterm\": 1}'"
            " where document_id = (select id from kb.documents where doc_key = 'a.md')"
        )
        conn.execute(
            "insert into kb.term_stats (kb_id, term, df)"
            " select id, 'ghostterm', 1 from kb.knowledge_bases where name = 'upgrade'"
        )

        report = migrate(conn, Settings.from_env().db_dir)
        assert report.recounted == ["upgrade"]  # 'clean' keeps its statistics
        assert {"009_term_array.sql", "042_one_copy_of_chunk_terms.sql", "047_chunk_terms_from_text.sql"} <= set(
            report.applied
        )
        columns = {
            r[0]
            for r in conn.execute("select attname from pg_attribute where attrelid = 'kb.chunks'::regclass")
            if not r[0].startswith("........pg.dropped")
        }
        assert "term_freqs" not in columns and "terms" not in columns
        assert conn.execute("select to_regclass('kb.chunks_terms_idx')").fetchone()[0] is None
        assert conn.execute("select to_regprocedure('kb.term_freqs(text[])')").fetchone()[0] is None
        stats = f"select term, df from {TERM_DICTIONARY} as d order by term"  # the recount compacts it
        from_text = (
            "select t.term, count(*) from kb.chunks as c join kb.documents as d on d.id = c.document_id,"
            " kb.chunk_terms(d.title, c.heading_path, c.content) as t group by t.term order by t.term"
        )
        assert conn.execute(stats).fetchall() == conn.execute(from_text).fetchall()
        found = conn.execute("select doc_key from kb.lexical_search('退款', 5, 'upgrade')").fetchall()
        assert sorted(found) == [("a.md",), ("b.md",)]
        assert conn.execute("select doc_key from kb.lexical_search('word0599', 5, 'upgrade')").fetchall() == [("b.md",)]
        conn.execute("select kb.delete_document('upgrade', 'b.md')")
        assert conn.execute(stats).fetchall() == conn.execute(from_text).fetchall()
        assert conn.execute(f"select count(*) from {TERM_DICTIONARY} as d where term = 'word0599'").fetchone()[0] == 0
        assert conn.execute(f"select count(*) from {TERM_DICTIONARY} as d where term = 'ghostterm'").fetchone()[0] == 0
        assert conn.execute("select count(distinct terms_version) from kb.knowledge_bases").fetchone()[0] == 1


@pytest.mark.slow
def test_heading_script_migration_fills_existing_chunks_as_writes_do(db, tmp_path: Path):
    """043 on a database of the release before (001-032) with chunks: each chunk's heading_script is what a
    write stores now (kb_internal.heading_script of its title and headings), for English, Chinese, mixed and
    letterless titles; a chunk written after the upgrade gets it too."""
    write = (
        "select kb.replace_document('upgrade', %s, %s, jsonb_build_array(jsonb_build_object("
        "'content', %s::text, 'heading_path', %s::jsonb)))"
    )
    documents = [
        ("en.md", "Refund policy", "退款会在三个工作日内原路退回", "[]"),
        ("zh.md", "退款政策", "Refunds take three days", '["概述"]'),
        ("mixed.md", "部署 deploy", "内容", '["Kubernetes 集群配置说明"]'),
        ("digits.md", "2024-01", "12345", "[]"),
        ("blank.md", "", "只有正文", "[]"),
        ("quotes.md", "—“”…", "正文", '["…"]'),
        ("latin.md", "Deploy guide 指南", "正文", "[]"),
    ]
    with release_database(db, "issue-32-part", tmp_path) as conn:
        for doc in documents:
            conn.execute(write, list(doc))
        report = migrate(conn, Settings.from_env().db_dir)
        assert "043_chunk_heading_script.sql" in report.applied
        conn.execute(write, ["after.md", "Deploy guide", "部署说明", '["Step one"]'])
        rows = conn.execute(
            "select d.doc_key, c.heading_script, kb_internal.heading_script(d.title, c.heading_path)"
            " from kb.chunks as c join kb.documents as d on d.id = c.document_id order by 1"
        ).fetchall()
    assert [(key, stored) for key, stored, _ in rows] == [
        ("after.md", "latin"), ("blank.md", None), ("digits.md", None), ("en.md", "latin"), ("latin.md", "latin"),
        ("mixed.md", "nonlatin"), ("quotes.md", None), ("zh.md", "nonlatin"),
    ]  # fmt: skip
    assert all(stored == computed for _, stored, computed in rows)


def test_migration_waits_for_table_locks_without_queueing(db, tmp_path: Path):
    """A transaction holding a kb table (a long search) makes a pending migration retry its NOWAIT
    locks and then fail cleanly, changing nothing; once the table is free it applies."""
    import psycopg

    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    name = add_migration(db_dir, "extra", "create table kb.extra_table (id int);\n")
    info = db.info
    with psycopg.connect(host=info.host, port=info.port, user=info.user, dbname=info.dbname) as reader:
        reader.execute("select count(*) from kb.chunks").fetchone()  # holds ACCESS SHARE until rollback
        with pytest.raises(MigrationError, match="could not lock the kb tables within 0.5 s"):
            migrate(db, db_dir, lock_wait_s=0.5)
        assert db.execute("select to_regclass('kb.extra_table')").fetchone()[0] is None
        reader.rollback()
        assert migrate(db, db_dir, lock_wait_s=0.5).applied == [name]


def kb_indexes(db) -> dict[str, str]:
    """Every index of schema kb that backs no constraint: name -> pg_get_indexdef."""
    return dict(
        db.execute(
            "select c.relname, pg_get_indexdef(c.oid) from pg_index as i join pg_class as c on c.oid = i.indexrelid"
            " where c.relnamespace = 'kb'::regnamespace"
            " and not exists (select from pg_constraint as k where k.conindid = i.indexrelid)"
        ).fetchall()
    )


def test_expected_indexes_are_the_ones_the_migrations_create(db):
    """kb_internal.expected_indexes lists exactly the indexes a fresh `pgkb db migrate` made (the migrations' and, for
    each knowledge base, the default model's HNSW index), and kb_internal.restore_indexes (the HNSW ones:
    pgkb.migrate.maintain_vector_indexes, CONCURRENTLY) re-creates each one as it was."""
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")  # every knowledge base its HNSW
    db.execute("select kb.create_knowledge_base('first')")
    db.execute("select kb.create_knowledge_base('second')")
    created = kb_indexes(db)
    assert sum(name.startswith("embeddings_hnsw_model_1_kb_") for name in created) == 2
    expected = {r[0] for r in db.execute("select index_name from kb_internal.expected_indexes()").fetchall()}
    assert expected == set(created)
    for name in created:
        db.execute(f"drop index kb.{name}")
    assert {r[0] for r in db.execute("select index_name from kb_admin.index_problems()").fetchall()} == expected
    restored = dict(db.execute("select index_name, action from kb_internal.restore_indexes()").fetchall())
    assert not any(name.startswith("embeddings_hnsw_") for name in restored)  # those are built CONCURRENTLY:
    restored.update(maintain_vector_indexes(db))
    assert restored == dict.fromkeys(expected, "created (was missing)")
    assert kb_indexes(db) == created
    assert db.execute("select count(*) from kb_admin.index_problems()").fetchone()[0] == 0


def test_the_hnsw_index_of_a_knowledge_base_that_is_gone_is_dropped_by_migrate(db):
    """A knowledge base deleted (here by hand) leaves its HNSW indexes behind: index_problems names them
    'stale' and pgkb.migrate.maintain_vector_indexes drops them (CONCURRENTLY); a new model gets one in every
    knowledge base. A knowledge base that falls below vector_exact_chunks makes its index stale too."""
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")  # every knowledge base its HNSW
    kept = db.execute("select kb.create_knowledge_base('kept')").fetchone()[0]
    gone = db.execute("select kb.create_knowledge_base('gone')").fetchone()[0]
    db.execute("select kb.register_embedding_model('tiny-8d', 8, hnsw_m => 8, hnsw_ef_construction => 32)")
    names = [r[0] for r in db.execute("select kb.hnsw_index_name(m.id, %s) from kb.embedding_models as m", [gone])]
    assert len(names) == 2 and all(name in kb_indexes(db) for name in names)
    tiny = kb_indexes(db)[names[1]].replace(" ", "")
    assert "vector(8)" in tiny and "m='8'" in tiny and "ef_construction='32'" in tiny
    db.execute("delete from kb.knowledge_bases where id = %s", [gone])
    assert db.execute("select index_name, problem from kb_admin.index_problems()").fetchall() == [
        (name, "stale") for name in sorted(names)
    ]
    assert db.execute("select * from kb_internal.restore_indexes()").fetchall() == []
    assert maintain_vector_indexes(db) == [(name, "dropped (no longer expected)") for name in sorted(names)]
    assert not any(name in kb_indexes(db) for name in names)
    assert db.execute("select count(*) from kb_admin.index_problems()").fetchone()[0] == 0
    # the model keeps its own HNSW parameters for knowledge bases made later
    later = db.execute("select kb.create_knowledge_base('later')").fetchone()[0]
    tiny_later = db.execute(
        "select pg_get_indexdef(to_regclass('kb.' || kb.hnsw_index_name(m.id, %s))) from kb.embedding_models as m"
        " where m.name = 'tiny-8d'",
        [later],
    ).fetchone()[0]
    assert "m='8'" in tiny_later.replace(" ", "")
    db.execute("update kb.settings set value = '1' where key = 'vector_exact_chunks'")  # 'kept' holds no chunk
    small = {r[0] for r in db.execute("select kb.hnsw_index_name(m.id, %s) from kb.embedding_models as m", [kept])}
    assert {
        r[0] for r in db.execute("select index_name from kb_admin.index_problems() where problem = 'stale'")
    } >= small


def test_db_status_reports_missing_and_invalid_indexes_and_migrate_recreates_them(db, monkeypatch, capsys):
    """The index a bulk load drops (the model's HNSW) and the vocabulary's bigram index gone and
    one left invalid: `pgkb db status` names each and exits 4; `pgkb db migrate` re-creates or rebuilds
    them (issue 20)."""
    from pgkb.cli import main

    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")
    kb_id = db.execute("select kb.create_knowledge_base('first')").fetchone()[0]
    hnsw = db.execute(
        "select kb.hnsw_index_name(id, %s) from kb.embedding_models where is_default", [kb_id]
    ).fetchone()[0]
    before = kb_indexes(db)
    for name in ("chunks_kb_chunk_idx", "term_stats_bigram_end_idx", hnsw):
        db.execute(f"drop index kb.{name}")
    db.execute(
        "update pg_index set indisvalid = false where indexrelid = 'kb.embeddings_model_kb_idx'::regclass"
    )  # what a failed CREATE INDEX CONCURRENTLY leaves
    info = db.info
    monkeypatch.setenv("PGKB_DATABASE_URL", f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}")
    capsys.readouterr()
    assert main(["db", "status"]) == 4
    out = capsys.readouterr().out
    for name, problem in (
        ("chunks_kb_chunk_idx", "missing"),
        ("term_stats_bigram_end_idx", "missing"),
        ("embeddings_model_kb_idx", "invalid"),
        (hnsw, "missing"),
    ):
        assert f"index kb.{name}: {problem} " in out, out
    assert main(["db", "migrate"]) == 0
    out = capsys.readouterr().out
    assert "index kb.term_stats_bigram_end_idx created (was missing)" in out
    assert "index kb.embeddings_model_kb_idx rebuilt (was invalid)" in out
    assert kb_indexes(db) == before
    assert main(["db", "status"]) == 0
    assert "every index pgkb expects is present and valid" in capsys.readouterr().out


def test_db_status_names_the_bm25_leg_that_serves(db, monkeypatch, capsys):
    """`pgkb db status` says which BM25 leg serves: numpy here (plpython3u with numpy), the SQL leg with
    the reason when plpython3u is gone (a managed server), and the setting when it picks one."""
    from pgkb.cli import main

    info = db.info
    monkeypatch.setenv("PGKB_DATABASE_URL", f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}")
    capsys.readouterr()
    assert main(["db", "status"]) == 0
    assert "BM25 leg: numpy" in capsys.readouterr().out
    db.execute("update kb.settings set value = 'scan' where key = 'lexical_leg'")
    assert main(["db", "status"]) == 0
    assert "BM25 leg: scan in SQL (kb.settings.lexical_leg chooses it)" in capsys.readouterr().out
    db.execute("update kb.settings set value = 'auto' where key = 'lexical_leg'")
    db.execute("drop extension plpython3u cascade")
    assert main(["db", "status"]) == 0
    assert "BM25 leg: blocks in SQL (this server has no plpython3u)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("missing", ["the folder", "both", "migrations", "functions"])
def test_migrate_without_sql_files_fails_loudly_and_changes_nothing(
    empty_database, tmp_path: Path, monkeypatch, capsys, missing
):
    """A wrong PGKB_DB_DIR or an install without its SQL is an error, never "nothing to apply"."""
    import psycopg
    from pgkb.cli import main

    db_dir = tmp_path / "db"
    if missing != "the folder":
        shutil.copytree(Settings.from_env().db_dir, db_dir)
        for kind in ("migrations", "functions"):
            if missing in (kind, "both"):
                for path in (db_dir / kind).glob("*.sql"):
                    path.unlink()
    empty = "migrations" if missing != "functions" else "functions"
    monkeypatch.setenv("PGKB_DATABASE_URL", empty_database)
    monkeypatch.setenv("PGKB_DB_DIR", str(db_dir))
    assert main(["db", "migrate"]) == 1
    assert f"pgkb: error: no SQL files in {db_dir / empty}" in capsys.readouterr().err
    with psycopg.connect(empty_database) as conn:
        with pytest.raises(MigrationError, match="no SQL files"):
            migrate(conn, db_dir)
        assert conn.execute("select 1 from pg_namespace where nspname = 'kb'").fetchone() is None
    if empty == "migrations":  # the check before every command reads the migrations only
        assert main(["search", "退款"]) == 1
        assert f"pgkb: error: no SQL files in {db_dir / empty}" in capsys.readouterr().err


def _gap_in_the_folder(db_dir: Path, conn) -> tuple[str, ...]:
    name = add_migration(db_dir, "after_gap", "create table kb.out_of_order (id int);\n")
    later = f"{int(name[:3]) + 1:03d}_after_gap.sql"
    (db_dir / "migrations" / name).rename(db_dir / "migrations" / later)
    return (f"has a gap in its numbering: {name[:3]} missing before {later[:3]}",)


def _record_deleted(db_dir: Path, conn) -> tuple[str, ...]:
    add_migration(db_dir, "after_gap", "create table kb.out_of_order (id int);\n")
    conn.execute("delete from kb.schema_migrations where version = '005'")
    highest = conn.execute("select max(version) from kb.schema_migrations where version <> 'functions'").fetchone()[0]
    return (f"records {highest} but lacks 005 below it, so 005_ingest_failures.sql would run after later",)


def _newer_one_applied(db_dir: Path, conn) -> tuple[str, ...]:
    """A migration arrives (a merge) numbered below one a newer pgkb already applied."""
    name = add_migration(db_dir, "after_gap", "create table kb.out_of_order (id int);\n")
    newer = f"{int(name[:3]) + 1:03d}"
    conn.execute("insert into kb.schema_migrations (version, name, checksum) values (%s, 'x.sql', 'x')", [newer])
    return (f"records {newer} but lacks {name[:3]} below it, so {name} would run after later migrations",)


@pytest.mark.parametrize("break_order", [_gap_in_the_folder, _record_deleted, _newer_one_applied])
def test_migrations_out_of_order_are_refused_and_change_nothing(
    empty_database, tmp_path: Path, monkeypatch, capsys, break_order
):
    """Migrations run in their numbered order only: a gap in the folder, a version missing from the ledger
    below the highest recorded, a pending migration below an applied one; `pgkb db migrate` names the
    versions, exits 1 and changes nothing (no table made, the ledger as it was)."""
    import psycopg
    from pgkb.cli import main

    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    monkeypatch.setenv("PGKB_DATABASE_URL", empty_database)
    monkeypatch.setenv("PGKB_DB_DIR", str(db_dir))
    with psycopg.connect(empty_database, autocommit=True) as conn:
        migrate(conn, db_dir)
        expected = break_order(db_dir, conn)
        ledger = conn.execute("select * from kb.schema_migrations order by version").fetchall()
        capsys.readouterr()
        assert main(["db", "migrate"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("pgkb: error: ") and all(part in err for part in expected), err
        with pytest.raises(MigrationError, match="nothing was changed"):
            migrate(conn, db_dir)
        assert conn.execute("select to_regclass('kb.out_of_order')").fetchone() == (None,)
        assert conn.execute("select * from kb.schema_migrations order by version").fetchall() == ledger


def test_default_sql_is_the_packaged_one(monkeypatch):
    """Without PGKB_DB_DIR the SQL comes with the package (pgkb/sql: the repository's db/ in a checkout)."""
    import pgkb

    monkeypatch.delenv("PGKB_DB_DIR", raising=False)
    db_dir = Settings.from_env().db_dir
    assert db_dir == Path(pgkb.__file__).parent / "sql"
    assert db_dir.resolve() == Path(__file__).resolve().parents[2] / "db"


def test_the_implicit_migrate_leaves_vector_indexes_to_the_explicit_one(db):
    """Issue 32's re-review: the migrate every command runs first on the embedded cluster (pgkb.db.database_url)
    waited up to 5 s per problem HNSW index whenever a transaction was left open. It now leaves those indexes to
    `pgkb db migrate` (and `pgkb ingest`, `pgkb kb delete`)."""
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")
    kb_id = db.execute("select kb.create_knowledge_base('first')").fetchone()[0]
    name = db.execute("select kb.hnsw_index_name(1, %s)", [kb_id]).fetchone()[0]
    db.execute(f"drop index kb.{name}")
    report = migrate(db, Settings.from_env().db_dir, vector_indexes=False)
    assert name not in dict(report.indexes) and name not in kb_indexes(db)
    report = migrate(db, Settings.from_env().db_dir)
    assert dict(report.indexes)[name] == "created (was missing)" and name in kb_indexes(db)
