"""Migration 028, the schema split, on a database of the release before it (tests/releases.py "issue-22":
its db/ and migrator from this repository's history, 001-027 and its functions), holding data written
through that release's API: `pgkb db migrate` keeps every row and ends with the catalog of a fresh install --
the same functions in the same schemas, with the same bodies, settings and grants, the same schema grants,
policies and table grants."""

from __future__ import annotations

import json

import psycopg
import pytest
from pgkb.config import Settings
from pgkb.migrate import SCHEMAS, migrate
from psycopg.conninfo import make_conninfo
from releases import release_database
from term_dictionary import TERM_DICTIONARY

pytestmark = pytest.mark.slow  # builds a database of the release before the split

DIM = 384  # the default model, multilingual-e5-small

# (schema, signature, security definer, volatility, SET clauses, body, grants as "role=privilege")
FUNCTIONS = """
    select n.nspname, p.oid::regprocedure::text, p.prosecdef, p.provolatile, p.proconfig, md5(p.prosrc),
        array(
            select format('%%s=%%s', coalesce(r.rolname, 'public'), a.privilege_type)
            from aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) as a
            left join pg_roles as r on r.oid = a.grantee order by 1
        )
    from pg_proc as p join pg_namespace as n on n.oid = p.pronamespace
    where n.nspname = any(%(schemas)s)
"""
SCHEMA_GRANTS = """
    select n.nspname, array(
        select format('%%s=%%s', coalesce(r.rolname, 'public'), a.privilege_type)
        from aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) as a
        left join pg_roles as r on r.oid = a.grantee order by 1
    )
    from pg_namespace as n where n.nspname = any(%(schemas)s)
"""
RELATIONS = """
    select c.relname, c.relkind, c.relrowsecurity, array(
        select format('%%s=%%s', coalesce(r.rolname, 'public'), a.privilege_type)
        from aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) as a
        left join pg_roles as r on r.oid = a.grantee order by 1
    )
    from pg_class as c where c.relnamespace = 'kb'::regnamespace and c.relkind in ('r', 'v')
"""
POLICIES = "select tablename, policyname, cmd, roles::text[], qual from pg_policies where schemaname = 'kb'"
ROWS = {  # what the data is, read the same way before and after
    "chunks": "select id, document_id, ordinal, content, term_count from kb.chunks",
    # the release before the split has no term blocks (migration 049): its dictionary is its rows
    "term_stats": "select kb_id, term, df, tiers, recent_ids from kb.term_stats",
    "postings": "select kb_id, term, tier, first_chunk, n, payload from kb.postings",
    "embeddings": "select chunk_id, model_id, embedding::text from kb.embeddings",
    "queue": "select chunk_id, model_id from kb.embedding_queue",
    "documents": "select id, kb_id, doc_key, title, status from kb.documents",
}


def catalog(conn: psycopg.Connection) -> dict[str, list]:
    return {
        name: sorted(conn.execute(sql, {"schemas": list(SCHEMAS)}).fetchall())
        for name, sql in (
            ("functions", FUNCTIONS),
            ("schema grants", SCHEMA_GRANTS),
            ("relations", RELATIONS),
            ("policies", POLICIES),
        )
    }


def rows(conn: psycopg.Connection, instead: dict[str, str] | None = None) -> dict[str, list]:
    return {name: sorted(conn.execute(sql).fetchall()) for name, sql in (ROWS | (instead or {})).items()}


@pytest.fixture
def pre_split_db(db, tmp_path):
    """A new database migrated by the pre-split release (its db/ and migrator) and loaded through its API:
    alice's private knowledge base with a document of an embedded and an unembedded chunk, a public one with
    enough documents of one term that its postings reach the blocks. Dropped afterwards."""
    with release_database(db, "issue-22", tmp_path) as conn:
        conn.execute("select kb.create_user('alice', 'alice')")
        conn.execute("select kb.create_knowledge_base('notes', owner => 'alice')")
        chunks = [
            {"content": "退款会在三个工作日内原路退回", "embedding": [1.0] + [0.0] * (DIM - 1)},
            {"content": "Refunds go back within three business days"},
        ]
        conn.execute("select kb.replace_document('notes', 'refund.md', '退款', %s)", [json.dumps(chunks)])
        conn.execute("select kb.create_knowledge_base('handbook', 'public')")
        for i in range(70):  # more than kb.recent_postings_limit() chunks of 'common': blocks
            conn.execute(
                "select kb.replace_document('handbook', %s, 't', %s)",
                [f"d{i}.md", json.dumps([{"content": f"common word{i}"}])],
            )
        yield conn


def test_the_release_before_the_split_upgrades_to_a_fresh_install(pre_split_db, db):
    conn = pre_split_db
    assert conn.execute("select to_regprocedure('kb.search_defaults()') is not null").fetchone() == (True,)
    assert conn.execute("select to_regnamespace('kb_internal')").fetchone() == (None,)  # it is that release
    before = rows(conn)
    assert before["postings"] and before["embeddings"] and before["queue"]

    report = migrate(conn, Settings.from_env().db_dir)
    assert "028_schema_split.sql" in report.applied and report.functions_applied

    # after it, the dictionary may be in blocks (the rebuilds of migrations 030 and 031 compact it)
    after = rows(conn, {"term_stats": f"select kb_id, term, df, tiers, recent_ids from {TERM_DICTIONARY} as d"})
    # migrations 030 and 031 rewrite the posting lists (full blocks from each list's start, ids as gaps): the
    # same postings, cut and encoded differently; test_upgrades compares them with a fresh install's
    rebuilt = ("postings", "term_stats")
    assert {k: v for k, v in after.items() if k not in rebuilt} == {k: v for k, v in before.items() if k not in rebuilt}
    assert [r[:4] for r in after["term_stats"]] == [r[:4] for r in before["term_stats"]]  # terms, df, tiers
    upgraded, fresh = catalog(conn), catalog(db)
    for part in fresh:
        assert upgraded[part] == fresh[part], part
    assert {schema for schema, *_ in fresh["functions"]} == set(SCHEMAS)
    # and it works as that release did, through the public API, as the user
    alice = psycopg.connect(make_conninfo(conn.info.dsn, user="alice"), autocommit=True)
    with alice:
        found = alice.execute("select distinct kb, doc_key from kb.lexical_search('退款', 5)").fetchall()
        assert found == [("notes", "refund.md")]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema kb_internal"):
            alice.execute("select kb_internal.setting('lexical_leg')")
