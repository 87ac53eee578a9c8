"""`pgkb db doctor` (pgkb.doctor, kb_admin.doctor()): each broken state is made for real in a test database, the
doctor names it with its fix, and the fix (the SQL statement, `pgkb db migrate`, `pgkb worker`) heals it; a
healthy database exits 0, problems exit 1, no usable connection exits 2."""

from __future__ import annotations

import json
import re
import shutil
import socket
import tempfile
from pathlib import Path

import psycopg
import pytest
from chunk_terms import CHUNK_TERMS
from migration_files import add_migration
from pgkb.cli import main
from pgkb.cluster import EmbeddedCluster
from pgkb.config import Settings
from pgkb.migrate import migrate
from term_dictionary import TERM_DICTIONARY

pytestmark = pytest.mark.slow  # runs `pgkb db doctor` and servers of its own

DIM = 384  # the default model, multilingual-e5-small
AREAS = {
    "migrations",
    "functions",
    "extensions",
    "numpy",
    "indexes",
    "row security",
    "privileges",
    "service roles",
    "settings",
    "query embedding",
    "embeddings",
    "chunks",
    "terms",
    "embedder",
}


def dsn(db, user: str | None = None) -> str:
    info = db.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user={user or info.user}"


def unit_vectors(dim: int):
    return lambda texts: [[1.0] + [0.0] * (dim - 1) for _ in texts]


@pytest.fixture
def endpoint(fake_embeddings):
    """An embedding endpoint answering 384-d vectors, as `pgkb embed-server` does for the default model."""
    return fake_embeddings(unit_vectors(DIM))


@pytest.fixture
def healthy(db, monkeypatch, endpoint):
    """The test database made healthy in what a fresh one lacks: the database's query embedding and the
    client's embedder both reach a live endpoint."""
    db.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
    monkeypatch.setenv("PGKB_DATABASE_URL", dsn(db))
    monkeypatch.setenv("PGKB_EMBED_PROVIDER", "http")
    monkeypatch.setenv("PGKB_EMBED_URL", endpoint.url)
    monkeypatch.delenv("PGKB_EMBED_MODEL", raising=False)
    return db


def doctor(capsys) -> tuple[int, dict]:
    """`pgkb db doctor --json`: exit code and the findings."""
    capsys.readouterr()
    code = main(["db", "doctor", "--json"])
    return code, json.loads(capsys.readouterr().out)


def problems(report: dict, check: str | None = None) -> list[dict]:
    return [c for c in report["checks"] if c["status"] == "problem" and check in (None, c["check"])]


def assert_healthy(capsys) -> None:
    code, report = doctor(capsys)
    assert (code, problems(report)) == (0, []) and report["healthy"]


def run_sql_fixes(db, found: list[dict]) -> None:
    """Run each fix, which for these problems is one SQL statement."""
    for problem in found:
        db.execute(problem["fix"])


# --------------------------------------------------------------------------------------------- healthy


def test_a_healthy_database_exits_0_and_says_so(healthy, capsys):
    capsys.readouterr()
    assert main(["db", "doctor"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "pgkb: healthy" and "PROBLEM" not in out
    code, report = doctor(capsys)
    assert code == 0 and report == {"healthy": True, "problems": 0, "checks": report["checks"]}
    assert {c["check"] for c in report["checks"]} == AREAS
    assert {c["status"] for c in report["checks"]} == {"ok"}
    assert all(set(c) == {"check", "status", "detail", "fix"} and c["fix"] is None for c in report["checks"])


def test_the_offline_embedder_is_checked_by_loading_it(healthy, monkeypatch, capsys):
    monkeypatch.setenv("PGKB_EMBED_PROVIDER", "offline")
    code, report = doctor(capsys)
    assert code == 0
    assert [c["detail"] for c in report["checks"] if c["check"] == "embedder"] == [
        "offline embeds for multilingual-e5-small: 384-d vectors"
    ]


# --------------------------------------------------------------------------------------------- indexes


def test_dropped_and_invalid_indexes_are_named_and_migrate_heals_them(healthy, capsys):
    """The term GIN index, the bigram index and a knowledge base's HNSW index of each model (the default's and
    a second model's) dropped, one index left invalid: each is named with `pgkb db migrate`, which re-creates them. A
    primary key's index left invalid (what a failed REINDEX does) is named with its REINDEX."""
    db = healthy
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")  # every knowledge base its HNSW
    kb_id = db.execute("select kb.create_knowledge_base('docs')").fetchone()[0]
    db.execute("select kb.register_embedding_model('tiny-8d', 8)")
    hnsw = [r[0] for r in db.execute("select kb.hnsw_index_name(id, %s) from kb.embedding_models order by id", [kb_id])]
    assert len(hnsw) == 2
    for name in ("chunks_kb_chunk_idx", "term_stats_bigram_end_idx", *hnsw):
        db.execute(f"drop index kb.{name}")
    for name in ("embeddings_model_kb_idx", "chunks_pkey"):
        db.execute(f"update pg_index set indisvalid = false where indexrelid = 'kb.{name}'::regclass")
    capsys.readouterr()
    assert main(["db", "doctor"]) == 1
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("PROBLEM  indexes: kb.chunks_kb_chunk_idx is missing: searches that need it scan sequentially")
    assert lines[at + 1] == "         fix: pgkb db migrate" and lines[-1] == "pgkb: 6 problems found"
    code, report = doctor(capsys)
    assert code == 1 and not report["healthy"]
    found = {c["detail"].split(" ")[0]: c for c in problems(report, "indexes")}
    expected = {"chunks_kb_chunk_idx", "term_stats_bigram_end_idx", "embeddings_model_kb_idx", *hnsw}
    assert set(found) == {f"kb.{name}" for name in (*expected, "chunks_pkey")}
    assert "is invalid" in found["kb.embeddings_model_kb_idx"]["detail"]
    assert "is missing: searches that need it scan sequentially" in found["kb.chunks_kb_chunk_idx"]["detail"]
    assert {found[f"kb.{name}"]["fix"] for name in expected} == {"pgkb db migrate"}
    assert found["kb.chunks_pkey"]["fix"].startswith("reindex index kb.chunks_pkey (or drop it")
    assert main(["db", "migrate"]) == 0
    code, report = doctor(capsys)
    assert [c["detail"] for c in problems(report)] == ["kb.chunks_pkey is invalid"]
    db.execute("reindex index kb.chunks_pkey")
    assert_healthy(capsys)


# --------------------------------------------------------------------------------- row security, grants


def test_row_security_turned_off_or_forced_is_named_with_the_statement(healthy, capsys):
    healthy.execute("alter table kb.chunks disable row level security")
    healthy.execute("alter table kb.image_captions disable row level security")
    healthy.execute("alter table kb.documents force row level security")
    code, report = doctor(capsys)
    found = problems(report, "row security")
    assert code == 1 and {c["fix"] for c in found} == {
        "alter table kb.chunks enable row level security",
        "alter table kb.image_captions enable row level security",
        "alter table kb.documents no force row level security",
    }
    assert "row-level security is off on kb.chunks" in {c["detail"] for c in found}
    run_sql_fixes(healthy, found)
    assert_healthy(capsys)


def test_end_user_grants_on_internal_tables_are_named_and_revoked(healthy, capsys):
    """SELECT on kb.chunks to a user's login role, a column of kb.documents to pgkb_user, a write on
    kb.settings to PUBLIC, a privilege reached through a role an end user is in, one granted to a user that
    bypasses row security, and a kb function left executable by PUBLIC: each named with its REVOKE. SELECT on
    the model registry stays allowed, and so do grants to administrators."""
    db = healthy
    db.execute("select kb.create_user('alice', 'alice')")
    for role, attributes in (("doctor_readers", ""), ("doctor_bypassing_user", "login bypassrls")):
        db.execute(f"drop role if exists {role}")
        db.execute(f"create role {role} {attributes}")
    try:
        db.execute("grant doctor_readers to alice")
        db.execute("grant pgkb_user to doctor_bypassing_user")
        db.execute("grant select on kb.chunks to alice")
        db.execute("grant select on kb.users to doctor_bypassing_user")
        db.execute("grant select on kb.chunks to pgkb_admin")
        db.execute("grant select (title) on kb.documents to pgkb_user")
        db.execute("grant update on kb.settings to public")
        db.execute("grant select, delete on kb.postings to doctor_readers")
        db.execute("grant select on kb.embedding_models to public")
        db.execute("create function kb.left_open() returns integer language sql as 'select 1'")
        code, report = doctor(capsys)
        found = problems(report, "privileges")
        assert code == 1 and {c["fix"] for c in found} == {
            "revoke select on kb.chunks from alice",
            "revoke select (title) on kb.documents from pgkb_user",
            "revoke update on kb.settings from public",
            "revoke delete, select on kb.postings from doctor_readers",
            "revoke select on kb.users from doctor_bypassing_user",
            "revoke execute on function kb.left_open() from public",
        }
        assert "SELECT on kb.chunks is granted to alice, so end users have it" in " ".join(c["detail"] for c in found)
        run_sql_fixes(db, found)
        db.execute("drop function kb.left_open()")
        assert_healthy(capsys)
    finally:
        for role in ("doctor_readers", "doctor_bypassing_user"):
            db.execute(f"drop owned by {role}")
            db.execute(f"drop role {role}")


def test_grants_beyond_a_schemas_callers_are_named_and_revoked(healthy, capsys):
    """90_grants.sql grants by schema: kb_internal to nobody, kb_admin to pgkb_admin, kb_service to
    pgkb_service and pgkb_admin. A grant beyond those, on the schema or one of its functions, is named with
    its REVOKE."""
    db = healthy
    db.execute("grant usage on schema kb_internal to pgkb_admin")
    db.execute("grant execute on function kb_internal.has_cjk(text) to public")
    db.execute("grant usage on schema kb_admin to pgkb_user")
    db.execute("grant execute on function kb_service.embedding_backlog() to pgkb_user")
    code, report = doctor(capsys)
    found = problems(report, "privileges")
    assert code == 1 and {c["fix"] for c in found} == {
        "revoke usage on schema kb_internal from pgkb_admin",
        "revoke execute on function kb_internal.has_cjk(text) from public",
        "revoke usage on schema kb_admin from pgkb_user",
        "revoke execute on function kb_service.embedding_backlog() from pgkb_user",
    }
    details = " ".join(c["detail"] for c in found)
    assert "USAGE on schema kb_internal is granted to pgkb_admin, but kb_internal is its owner's alone" in details
    run_sql_fixes(db, found)
    assert_healthy(capsys)


def test_a_privileged_member_of_pgkb_service_is_named(healthy, capsys):
    """A role the servers could log in as that bypasses row security, or is a superuser (roles are
    cluster-wide: made and dropped here)."""
    db = healthy
    for role, attributes in (("doctor_bypasser", "bypassrls"), ("doctor_super", "superuser")):
        db.execute(f"drop role if exists {role}")
        db.execute(f"create role {role} login {attributes}")
    try:
        db.execute("grant pgkb_service to doctor_bypasser, doctor_super")
        code, report = doctor(capsys)
        found = problems(report, "service roles")
        assert code == 1 and {c["fix"] for c in found} == {
            "alter role doctor_bypasser nobypassrls",
            "alter role doctor_super nosuperuser",
        }
        assert any(
            c["detail"].startswith("role doctor_bypasser has BYPASSRLS, and it is in pgkb_service") for c in found
        )
        run_sql_fixes(db, found)
        code, report = doctor(capsys)
        assert code == 0
        # roles are cluster-wide: other tests' service roles (pgkb_bench_mcp) may be members too
        [detail] = [c["detail"] for c in report["checks"] if c["check"] == "service roles"]
        assert detail.startswith("members of pgkb_service, none privileged: ")
        assert {"doctor_bypasser", "doctor_super"} <= set(detail.split(": ", 1)[1].split(", "))
    finally:
        for role in ("doctor_bypasser", "doctor_super"):
            db.execute(f"drop role {role}")


# ---------------------------------------------------------------------------------- migrations, functions


def test_a_deleted_migration_record_and_an_altered_checksum_are_named(healthy, capsys):
    db = healthy
    recorded = dict(db.execute("select version, checksum from kb.schema_migrations").fetchall())
    db.execute("delete from kb.schema_migrations where version = '005'")
    db.execute("update kb.schema_migrations set checksum = repeat('0', 64) where version = '003'")
    code, report = doctor(capsys)
    found = {c["detail"].split(" ")[1]: c for c in problems(report, "migrations")}
    assert code == 1 and set(found) == {"005_ingest_failures.sql", "003_embeddings.sql"}
    assert "not recorded as applied, though later ones are" in found["005_ingest_failures.sql"]["detail"]
    assert "differs from the one applied" in found["003_embeddings.sql"]["detail"]
    insert = re.search(r"insert into kb\.schema_migrations .*?\)(?=;)", found["005_ingest_failures.sql"]["fix"])
    update = re.search(r"update kb\.schema_migrations .*?'003'", found["003_embeddings.sql"]["fix"])
    assert f"'{recorded['005']}'" in insert.group(0) and f"'{recorded['003']}'" in update.group(0)
    db.execute(insert.group(0))
    db.execute(update.group(0))
    assert_healthy(capsys)


def test_pending_and_unknown_migrations_are_named(healthy, monkeypatch, capsys, tmp_path: Path):
    """db/ with a migration the database lacks, and the database recording one db/ lacks."""
    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    later = add_migration(db_dir, "later", "select 1;\n")
    newer = f"{int(later[:3]) + 1:03d}"
    healthy.execute("insert into kb.schema_migrations (version, name, checksum) values (%s, 'x.sql', 'x')", [newer])
    monkeypatch.setenv("PGKB_DB_DIR", str(db_dir))
    code, report = doctor(capsys)
    found = problems(report, "migrations")
    assert code == 1 and [(c["detail"], c["fix"]) for c in found if later in c["detail"]] == [
        ("not applied yet: " + later, "pgkb db migrate")
    ]
    assert any(c["detail"].startswith(f"kb.schema_migrations records {newer}, which") for c in found)


def test_a_dropped_function_is_named_and_migrate_restores_it(healthy, capsys):
    healthy.execute("drop function kb.search_defaults()")
    code, report = doctor(capsys)
    assert code == 1 and [(c["detail"], c["fix"]) for c in problems(report)] == [
        (
            "missing from the database: kb.search_defaults",
            "pgkb db migrate (it applies db/functions again when one is missing)",
        )
    ]
    assert main(["db", "migrate"]) == 0
    assert_healthy(capsys)


def test_without_plpython3u_the_doctor_says_what_is_lost_and_migrate_brings_it_back(healthy, capsys):
    healthy.execute("drop extension plpython3u cascade")
    code, report = doctor(capsys)
    assert code == 1
    [extension] = problems(report, "extensions")
    assert extension["detail"].startswith("the language plpython3u (in-database query embedding")
    assert extension["detail"].endswith("is not installed")
    assert extension["fix"].startswith("pgkb db migrate")
    skipped = {c["check"] for c in report["checks"] if c["status"] == "skipped"}
    assert skipped == {"numpy", "query embedding"}
    assert "kb_internal.numpy_available" in problems(report, "functions")[0]["detail"]
    assert main(["db", "migrate"]) == 0
    assert_healthy(capsys)


# ------------------------------------------------------------------------------------------- settings


def test_settings_out_of_range_missing_or_unknown_are_named(healthy, capsys):
    """Written straight into kb.settings, as an administrator can: nothing validates them on the way in."""
    db = healthy
    for key, value in [
        ("hnsw_ef_search", "5000"),
        ("lexical_leg", "fastest"),
        ("user_statement_timeout", "soon"),
        ("answer_vector_floor", "0.95"),
        ("relevance_cosine_floor", "1.5"),
        ("chat_url", "ftp://example.com"),
        ("chat_api_key", "sk-do-not-show-me"),
    ]:
        db.execute("update kb.settings set value = %s where key = %s", [value, key])
    db.execute("delete from kb.settings where key = 'fuzzy_max_terms'")
    db.execute("insert into kb.settings (key, value) values ('hnsw_ef_serach', '100')")
    capsys.readouterr()
    assert main(["db", "doctor"]) == 1
    assert "sk-do-not-show-me" not in capsys.readouterr().out
    code, report = doctor(capsys)
    found = {c["detail"].split(" ")[0]: c for c in problems(report, "settings")}
    assert set(found) == {
        "hnsw_ef_search",
        "lexical_leg",
        "user_statement_timeout",
        "answer_vector_floor",
        "relevance_cosine_floor",
        "chat_url",
        "fuzzy_max_terms",
        "hnsw_ef_serach",
    }
    assert found["hnsw_ef_search"]["detail"] == "hnsw_ef_search = '5000': must be an integer in 1..1000"
    assert found["hnsw_ef_search"]["fix"] == (
        "update kb.settings set value = '<an integer in 1..1000>' where key = 'hnsw_ef_search'"
    )
    assert "must be one of auto, numpy, blocks, scan" in found["lexical_leg"]["detail"]
    assert 'invalid value for parameter "statement_timeout"' in found["user_statement_timeout"]["detail"]
    assert "must be below answer_vector_ceiling (0.92)" in found["answer_vector_floor"]["detail"]
    assert found["fuzzy_max_terms"]["fix"].startswith("insert into kb.settings (key, value) values ('fuzzy_max_terms'")
    assert found["hnsw_ef_serach"]["fix"] == "delete from kb.settings where key = 'hnsw_ef_serach'"
    assert "sk-do-not-show-me" not in json.dumps(report)
    for key, value in [
        ("hnsw_ef_search", "300"),
        ("lexical_leg", "auto"),
        ("user_statement_timeout", "30s"),
        ("answer_vector_floor", "0.75"),
        ("relevance_cosine_floor", "0.76"),
        ("chat_url", ""),
    ]:
        db.execute("update kb.settings set value = %s where key = %s", [value, key])
    db.execute("insert into kb.settings (key, value) values ('fuzzy_max_terms', '8')")
    db.execute(found["hnsw_ef_serach"]["fix"])
    assert_healthy(capsys)


def test_a_broken_setting_an_area_needs_is_reported_not_raised(healthy, capsys):
    """hnsw_m unreadable: the index check cannot list the HNSW definitions; it says so and the rest runs."""
    healthy.execute("select kb.create_knowledge_base('docs')")  # one knowledge base: one HNSW definition to list
    healthy.execute("update kb.settings set value = 'sixteen' where key = 'hnsw_m'")
    code, report = doctor(capsys)
    assert code == 1 and {c["check"] for c in report["checks"]} == AREAS
    [indexes] = problems(report, "indexes")
    assert indexes["detail"] == 'could not be checked: setting "hnsw_m" must be an integer, not "sixteen"'
    assert [c["fix"] for c in problems(report, "settings")] == [
        "update kb.settings set value = '<an integer in 2..100>' where key = 'hnsw_m'"
    ]


# ------------------------------------------------------------------------------------------ embeddings


def write(db, doc_key: str, *texts: str) -> None:
    """A document written without embeddings (SQL, dbt, ETL): its chunks wait in the queue."""
    chunks = json.dumps([{"content": t} for t in texts])
    db.execute("select kb.replace_document('docs', %s, %s, %s::jsonb)", [doc_key, doc_key, chunks])


def test_unembedded_parked_and_lost_chunks_are_named_and_their_fixes_heal(healthy, capsys):
    """Half the default model's chunks unembedded: some queued, one parked after failures, one neither
    (its queue entry gone). The fixes -- retry the parked, queue the lost, `pgkb worker --once` -- heal it."""
    db = healthy
    write(db, "a.md", "first text", "second text")
    write(db, "b.md", "third text", "fourth text")
    assert main(["worker", "--once"]) == 0
    write(db, "c.md", "fifth text", "sixth text", "seventh text", "eighth text")
    ids = [r[0] for r in db.execute("select chunk_id from kb.embedding_queue order by chunk_id")]
    db.execute("update kb.embedding_queue set parked = true, attempts = 5 where chunk_id = %s", [ids[0]])
    db.execute("delete from kb.embedding_queue where chunk_id = %s", [ids[1]])
    code, report = doctor(capsys)
    found = problems(report, "embeddings")
    assert code == 1 and [c["detail"] for c in found] == [
        "multilingual-e5-small (default): 2 of 8 chunks wait in the embedding queue",
        "multilingual-e5-small (default): 1 of 8 chunks are parked after repeated failures "
        "(kb.parked_embeddings says why)",
        "multilingual-e5-small (default): 1 of 8 chunks have no embedding and are not queued for one",
    ]
    assert found[0]["fix"] == "pgkb worker --once"
    for problem in found[1:]:
        statement, then = problem["fix"].split("; then ")
        assert then == "pgkb worker --once"
        db.execute(statement)
    assert main(["worker", "--once"]) == 0
    assert_healthy(capsys)


def test_stale_heading_scripts_are_named_and_their_fix_heals(healthy, capsys):
    """A chunk whose stored heading script is not what kb_internal.heading_script gives for its title and
    headings (as after a change to the rule without a refill) is counted; the fix refills it."""
    db = healthy
    write(db, "a.md", "first text", "second text")
    write(db, "b.md", "third text")
    db.execute(
        "update kb.chunks set heading_script = case heading_script when 'latin' then 'nonlatin' else 'latin' end"
        " where id = (select min(id) from kb.chunks)"
    )
    code, report = doctor(capsys)
    found = problems(report, "chunks")
    assert code == 1 and [c["detail"] for c in found] == [
        "1 of 3 chunks store a heading script that kb_internal.heading_script no longer gives for their title "
        "and headings: the cross-script rule of fusion reads them"
    ]
    assert found[0]["fix"] == "select kb_admin.refill_heading_scripts()"
    # the fix, run by an administrator who is not the tables' owner (roles are cluster-wide: made and dropped)
    db.execute("drop role if exists doctor_chunks_admin")
    db.execute("create role doctor_chunks_admin login in role pgkb_admin")
    try:
        with psycopg.connect(dsn(db, "doctor_chunks_admin"), autocommit=True) as admin:
            assert admin.execute(found[0]["fix"]).fetchone() == (1,)
            assert admin.execute(found[0]["fix"]).fetchone() == (0,)
    finally:
        db.execute("drop role doctor_chunks_admin")
    assert main(["worker", "--once"]) == 0  # the documents' chunks, written without embeddings
    assert_healthy(capsys)


def test_chunks_that_give_other_terms_and_an_old_term_model_are_named_and_their_fixes_heal(healthy, capsys):
    """Writes undo a chunk's statistics from its text, so the doctor samples the newest chunks: one whose text
    was edited by hand (its terms are not the counted ones) is named with kb_admin.recount_terms, which counts
    its knowledge base again, as an administrator who is not the owner; a knowledge base counted with an older
    term model is named with `pgkb db migrate`, which counts it again."""
    db = healthy
    write(db, "a.md", "refund policy text", "second text")
    write(db, "b.md", "third text")
    db.execute("update kb.chunks set content = 'quasar nebula' where id = (select min(id) from kb.chunks)")
    code, report = doctor(capsys)
    found = problems(report, "terms")
    assert code == 1 and [c["detail"] for c in found] == [
        "1 of the 3 newest chunks give other terms than they were counted with (in docs): deletes and replaces "
        "would leave their statistics wrong"
    ]
    assert found[0]["fix"] == "select kb_admin.recount_terms('docs') (for each knowledge base named)"
    db.execute("drop role if exists doctor_terms_admin")
    db.execute("create role doctor_terms_admin login in role pgkb_admin")
    try:
        with psycopg.connect(dsn(db, "doctor_terms_admin"), autocommit=True) as admin:
            admin.execute("select kb_admin.recount_terms('docs')")
            with pytest.raises(psycopg.errors.NoDataFound, match='unknown knowledge base "nope"'):
                admin.execute("select kb_admin.recount_terms('nope')")
    finally:
        db.execute("drop role doctor_terms_admin")
    counted = f"select x.kb_id, x.term, count(*) from {CHUNK_TERMS} as x group by 1, 2 order by 1, 2"
    assert (
        db.execute(f"select kb_id, term, df from {TERM_DICTIONARY} as d order by 1, 2").fetchall()
        == db.execute(counted).fetchall()
    )
    assert db.execute("select doc_key from kb.lexical_search('nebula', 5, 'docs')").fetchall() == [("a.md",)]
    db.execute("update kb.knowledge_bases set terms_version = 0 where name = 'docs'")
    code, report = doctor(capsys)
    found = problems(report, "terms")
    assert code == 1 and [(c["detail"], c["fix"]) for c in found] == [
        ("1 knowledge bases were counted with an older term model: docs", "pgkb db migrate (it counts them again)")
    ]
    assert main(["db", "migrate"]) == 0
    assert db.execute("select terms_version from kb.knowledge_bases where name = 'docs'").fetchone() == (1,)
    assert main(["worker", "--once"]) == 0  # the documents' chunks, written without embeddings
    assert_healthy(capsys)


def test_a_model_without_a_default_is_named(healthy, capsys):
    healthy.execute("update kb.embedding_models set is_default = false")
    code, report = doctor(capsys)
    assert code == 1
    assert "no default embedding model" in problems(report, "embeddings")[0]["detail"]


# ------------------------------------------------------------------------------------ embedding endpoints


def test_a_dead_embedding_endpoint_is_named_for_the_client_and_the_database(
    healthy, monkeypatch, dead_embedding_url, capsys
):
    healthy.execute("update kb.settings set value = %s where key = 'embedding_url'", [dead_embedding_url])
    monkeypatch.setenv("PGKB_EMBED_URL", dead_embedding_url)
    code, report = doctor(capsys)
    [client] = problems(report, "embedder")
    [database] = problems(report, "query embedding")
    assert code == 1
    assert client["detail"].startswith(f"http {dead_embedding_url} cannot embed for multilingual-e5-small (384-d)")
    assert "unreachable" in client["detail"]
    assert client["fix"].startswith("start the endpoint (pgkb embed-server, or make run), or set PGKB_EMBED_URL")
    assert "unreachable" in database["detail"] and "run lexical-only" in database["detail"]
    assert "update kb.settings set value = '<url>' where key = 'embedding_url'" in database["fix"]


def test_an_endpoint_of_the_wrong_dimension_is_named(healthy, monkeypatch, fake_embeddings, capsys):
    wrong = fake_embeddings(unit_vectors(8))
    healthy.execute("update kb.settings set value = %s where key = 'embedding_url'", [wrong.url])
    monkeypatch.setenv("PGKB_EMBED_URL", wrong.url)
    code, report = doctor(capsys)
    assert code == 1
    assert "expected 1 of 384" in problems(report, "embedder")[0]["detail"]
    assert (
        "returned 8 dimensions; model multilingual-e5-small has 384" in problems(report, "query embedding")[0]["detail"]
    )


# ----------------------------------------------------------------------------------------------- numpy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_numpy_missing_for_the_servers_python_is_named(monkeypatch, capsys):
    """A cluster of its own whose server finds a numpy that fails to import first on its PYTHONPATH: what a
    server without python3-numpy sees. The doctor names it with the install command."""
    base = Path(tempfile.mkdtemp(prefix="pgkb-doctor-", dir="/tmp"))
    base.chmod(0o755)
    shadow = base / "python" / "numpy"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no numpy for this server (pgkb test)')\n")
    for path in (base / "python", shadow):
        path.chmod(0o755)
    (shadow / "__init__.py").chmod(0o644)
    monkeypatch.setenv("PYTHONPATH", str(base / "python"))
    cluster = EmbeddedCluster(base / "data", _free_port(), "pgkb")
    try:
        cluster.start()
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            migrate(conn, Settings.from_env().db_dir)
        monkeypatch.setenv("PGKB_DATABASE_URL", cluster.url())
        code, report = doctor(capsys)
        [numpy] = problems(report, "numpy")
        assert code == 1
        assert numpy["detail"] == (
            "the server's Python cannot import numpy: the BM25 leg runs in SQL, several times slower"
        )
        assert "apt-get install python3-numpy" in numpy["fix"]
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------- usage and connections


def test_an_end_user_may_not_run_the_doctor(healthy, monkeypatch, connect_as, capsys):
    healthy.execute("select kb.create_user('alice', 'alice')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        connect_as("alice").execute("select * from kb_admin.doctor()")
    monkeypatch.setenv("PGKB_DATABASE_URL", dsn(healthy, "alice"))
    capsys.readouterr()
    assert main(["db", "doctor"]) == 2
    assert "role alice may not run kb_admin.doctor(): connect as a pgkb administrator" in capsys.readouterr().err


def test_an_unreachable_database_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("PGKB_DATABASE_URL", f"host=127.0.0.1 port={_free_port()} dbname=pgkb connect_timeout=5")
    capsys.readouterr()
    assert main(["db", "doctor", "--json"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("pgkb: db doctor: ")


def test_a_database_without_the_pgkb_schema_needs_migrate(db, monkeypatch, capsys):
    db.execute("drop database if exists pgkb_doctor_empty")
    db.execute("create database pgkb_doctor_empty")
    try:
        info = db.info
        monkeypatch.setenv(
            "PGKB_DATABASE_URL", f"host={info.host} port={info.port} dbname=pgkb_doctor_empty user={info.user}"
        )
        code, report = doctor(capsys)
        assert code == 1 and [(c["check"], c["detail"], c["fix"]) for c in problems(report)] == [
            ("migrations", "this database has no pgkb schema", "pgkb db migrate")
        ]
    finally:
        db.execute("drop database pgkb_doctor_empty with (force)")
