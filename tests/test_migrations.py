"""Migrations: from empty, re-run is a no-op, an edited applied migration is refused, locale is right."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pgkb.config import Settings
from pgkb.migrate import MigrationError, migrate


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
    search = db_dir / "functions" / "50_search.sql"
    search.write_text(search.read_text() + "\n-- touched\n")
    assert migrate(db, db_dir).functions_applied
    assert not migrate(db, db_dir).functions_applied


def test_failed_migration_leaves_database_unchanged(db, tmp_path: Path):
    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    (db_dir / "migrations" / "999_broken.sql").write_text(
        "create table kb.half_done (id int);\nselect no_such_function();\n"
    )
    with pytest.raises(MigrationError, match="999_broken"):
        migrate(db, db_dir)
    assert db.execute("select to_regclass('kb.half_done')").fetchone()[0] is None
    assert db.execute("select count(*) from kb.schema_migrations where version = '999'").fetchone()[0] == 0


def test_default_model_and_its_hnsw_index_exist(db):
    name, dim = db.execute("select name, dimension from kb.embedding_models where is_default").fetchone()
    assert (name, dim) == ("multilingual-e5-small", 384)
    indexdef = db.execute(
        "select indexdef from pg_indexes where schemaname = 'kb' and indexname like 'embeddings_hnsw_model_%'"
    ).fetchone()[0]
    assert "hnsw" in indexdef and "vector(384)" in indexdef and "vector_cosine_ops" in indexdef
    assert "m='16'" in indexdef.replace(" ", "") and "ef_construction='64'" in indexdef.replace(" ", "")


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
