"""The leak matrix: what every kind of caller can see and change, through every entry point.

Users alice, bob, carol map to their login roles; alice and bob are in team 'eng', carol is not.
mallory is a login role granted pgkb_user but mapped to no pgkb user (sees public KBs only); svc is a
member of pgkb_service and either acts for bob (`set pgkb.acting_user = 'bob'`) or for nobody.
Each knowledge base holds one document whose chunks contain a unique marker word plus 'sharedword';
chunk 0 carries an explicit embedding (vector leg), chunk 1 none (so it sits in kb.embedding_queue).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import psycopg
import pytest
from chunk_terms import CHUNK_TERMS
from pgkb.migrate import SCHEMAS
from pgvector import Vector
from term_dictionary import TERM_DICTIONARY

DIM = 384  # the default model, multilingual-e5-small

# name -> (visibility, owner, team, marker)
KBS = {
    "alice-private": ("private", "alice", None, "zebramarker"),
    "eng-team": ("team", "alice", "eng", "teammarker"),
    "bob-private": ("private", "bob", None, "bobmarker"),
    "public-kb": ("public", "carol", None, "publicmarker"),
}
MARKER = {name: spec[3] for name, spec in KBS.items()}
ALL = set(MARKER.values())

# principal -> markers it must see (read access)
VISIBLE = {
    "admin": ALL,
    "alice": {"zebramarker", "teammarker", "publicmarker"},
    "bob": {"teammarker", "bobmarker", "publicmarker"},
    "carol": {"publicmarker"},
    "mallory": {"publicmarker"},
    "svc-as-bob": {"teammarker", "bobmarker", "publicmarker"},
    "svc-as-nobody": {"publicmarker"},
}
PRINCIPALS = list(VISIBLE)
# rows of kb.users / kb.teams / kb.memberships a principal must see (admin: at least these)
USERS = {
    "alice": {"alice"},
    "bob": {"bob"},
    "carol": {"carol"},
    "mallory": set(),
    "svc-as-bob": {"bob"},
    "svc-as-nobody": set(),
    "admin": {"alice", "bob", "carol"},
}
TEAMS = {
    "alice": {"eng"},
    "bob": {"eng"},
    "carol": set(),
    "mallory": set(),
    "svc-as-bob": {"eng"},
    "svc-as-nobody": set(),
    "admin": {"eng"},
}
MEMBERSHIPS = {
    "alice": {("eng", "alice")},
    "bob": {("eng", "bob")},
    "carol": set(),
    "mallory": set(),
    "svc-as-bob": {("eng", "bob")},
    "svc-as-nobody": set(),
    "admin": {("eng", "alice"), ("eng", "bob")},
}

TABLES = [
    "users",
    "teams",
    "memberships",
    "knowledge_bases",
    "documents",
    "chunks",
    "term_stats",
    "term_blocks",
    "postings",
    "embeddings",
    "embedding_queue",
    "embedding_models",
    "settings",
    "schema_migrations",
    "ingest_failures",
    "image_captions",
    "glossary",
    "api_keys",
    "knowledge_saves",
    "questions",
    "question_kbs",
    "answer_ratings",
]

# tables that hold knowledge: end users have no privilege on them at all (they read through functions)
KNOWLEDGE_TABLES = [t for t in TABLES if t not in ("embedding_models", "schema_migrations")]
CALLABLE_SCHEMAS = ("kb", "kb_service", "kb_admin")  # the rest of SCHEMAS, kb_internal, is its owner's alone
SQL_API_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "sql-api.md"


def documented_api() -> dict[str, set[str]]:
    """The functions docs/sql-api.md's section "Who may call what" names, by schema: kb's (the public API),
    kb_service's (the servers') and kb_admin's (the administrators')."""
    text = SQL_API_GUIDE.read_text(encoding="utf-8")
    section = text[text.index("\n## Who may call what\n") : text.index("\n## Writing documents\n")]
    api: dict[str, set[str]] = {schema: set() for schema in CALLABLE_SCHEMAS}
    for schema, name in re.findall(r"`(kb|kb_service|kb_admin)\.([a-z0-9_]+)`", section):
        api[schema].add(name)
    return api


def schema_functions(db, schema: str) -> set[str]:
    rows = db.execute("select proname from pg_proc where pronamespace = %s::regnamespace", [schema]).fetchall()
    return {name for (name,) in rows}


def unit(i: int) -> list[float]:
    v = [0.0] * DIM
    v[i] = 1.0
    return v


# equally similar (cosine 0.5) to every KB's chunk-0 embedding
QUERY_VEC = Vector(np.array([0.5] * 4 + [0.0] * (DIM - 4), dtype=np.float32))


def chunks_for(i: int, marker: str) -> str:
    return json.dumps(
        [
            {"content": f"{marker} sharedword alpha paragraph", "embedding": unit(i)},
            {"content": f"{marker} sharedword appendix paragraph"},
        ]
    )


@pytest.fixture
def world(db, steady_statistics):
    for user in ("alice", "bob", "carol"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("select kb.create_team('eng')")
    db.execute("select kb.add_team_member('eng', 'alice')")
    db.execute("select kb.add_team_member('eng', 'bob')")
    # role grants are cluster-wide: undone below
    db.execute("grant pgkb_service to svc")
    db.execute("grant pgkb_user to mallory")
    for i, (name, (visibility, owner, team, marker)) in enumerate(KBS.items()):
        db.execute("select kb.create_knowledge_base(%s, %s, team => %s, owner => %s)", [name, visibility, team, owner])
        db.execute(
            "select * from kb.replace_document(%s, %s, %s, %s::jsonb)",
            [name, f"{marker}.md", f"{marker} doc", chunks_for(i, marker)],
        )
    yield db
    db.execute("revoke pgkb_service from svc")
    db.execute("revoke pgkb_user from mallory")


@pytest.fixture
def as_(world, connect_as):
    """as_(principal) -> a connection acting as that principal."""

    def _open(principal: str) -> psycopg.Connection:
        if principal == "admin":
            return world
        if principal.startswith("svc-as-"):
            conn = connect_as("svc")
            if principal == "svc-as-bob":
                conn.execute("set pgkb.acting_user = 'bob'")
            return conn
        return connect_as(principal)

    return _open


def kb_marker_by_id(db) -> dict[int, str]:
    return {kid: MARKER[name] for kid, name in db.execute("select id, name from kb.knowledge_bases")}


def markers_in(texts) -> set[str]:
    return {m for t in texts for m in ALL if m in t}


SEARCHES = {
    "hybrid_search": "select kb, content from kb.hybrid_search('sharedword', top_k => 20{kb}, query_embedding => %s)",
    "vector_search": "select kb, content from kb.vector_search('sharedword', top_k => 20{kb}, query_embedding => %s)",
    "lexical_search": "select kb, content from kb.lexical_search('sharedword', top_k => 20{kb})",
    "fuzzy_search": "select kb, content from kb.fuzzy_search('sharedword', top_k => 20{kb})",
}


def search_markers(conn, fn: str, kb: str | None = None) -> set[str]:
    sql = SEARCHES[fn].format(kb=", kb => %s" if kb else "")
    params = ([kb] if kb else []) + ([QUERY_VEC] if "query_embedding" in sql else [])
    rows = conn.execute(sql, params).fetchall()
    for kb_name, content in rows:  # the kb column agrees with the content's marker
        assert MARKER[kb_name] in content
    return markers_in(content for _, content in rows)


def table_markers(conn, admin, table: str) -> set[str]:
    """Markers of the knowledge bases whose rows of kb.<table> the connection sees."""
    by_id = kb_marker_by_id(admin)
    if table == "chunks":
        return markers_in(r[0] for r in conn.execute("select content from kb.chunks"))
    if table == "documents":
        return markers_in(r[0] + r[1] for r in conn.execute("select doc_key, title from kb.documents"))
    if table == "knowledge_bases":
        return {MARKER[r[0]] for r in conn.execute("select name from kb.knowledge_bases")}
    if table == "term_stats":
        terms = markers_in(r[0] for r in conn.execute("select term from kb.term_stats where term like '%marker'"))
        kbs = {by_id[r[0]] for r in conn.execute("select distinct kb_id from kb.term_stats")}
        assert terms == kbs
        return kbs
    return {by_id[r[0]] for r in conn.execute(f"select kb_id from kb.{table}")}


def read_markers(conn) -> set[str]:
    """Markers of the knowledge bases a connection sees through every read function, which must agree."""
    kbs = {MARKER[r[0]] for r in conn.execute("select name from kb.list_knowledge_bases()")}
    docs, whole = set(), set()
    for name, marker in MARKER.items():
        try:
            keys = [r[0] for r in conn.execute("select doc_key from kb.list_documents(%s)", [name])]
        except psycopg.errors.NoDataFound:
            keys = []
        docs |= markers_in(keys)
        try:
            row = conn.execute(
                "select title, chunks::text from kb.get_document(%s, %s)", [f"{marker}.md", name]
            ).fetchone()
        except psycopg.errors.NoDataFound:
            continue
        whole |= markers_in(row)
    assert kbs == docs == whole
    return kbs


def snapshot(db) -> tuple:
    """Everything a failed write must leave unchanged."""
    return db.execute(
        "select (select count(*) from kb.knowledge_bases), (select count(*) from kb.documents),"
        " (select count(*) from kb.chunks), (select count(*) from kb.embeddings),"
        " (select count(*) from kb.embedding_queue), (select coalesce(sum(df), 0) from kb.term_stats),"
        " (select sum(chunk_count) || '/' || sum(term_total) from kb.knowledge_bases),"
        " (select string_agg(content_hash, ',' order by id) from kb.documents),"
        " (select string_agg(visibility || coalesce(team_id::text, '-') || coalesce(owner_id::text, '-'),"
        "   ',' order by id) from kb.knowledge_bases)"
    ).fetchone()


# ---------------------------------------------------------------------------------------------------
# the matrix: principals x read entry points


def test_setup_is_as_intended(world):
    assert table_markers(world, world, "chunks") == ALL
    assert world.execute("select count(*) from kb.embeddings").fetchone()[0] == 4
    assert world.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 4
    assert search_markers(world, "vector_search") == ALL


@pytest.mark.parametrize(
    "table",
    [
        "chunks",
        "documents",
        "knowledge_bases",
        "embeddings",
        "embedding_queue",
        "term_stats",
        "term_blocks",
        "postings",
    ],
)
def test_admin_direct_select_sees_everything(world, table):
    if table == "term_blocks":  # the world's dictionaries are all rows: fold them into blocks, then undo
        with world.transaction(force_rollback=True):
            world.execute("select kb_internal.compact_terms(id) from kb.knowledge_bases")
            assert table_markers(world, world, table) == ALL
        return
    if table == "postings":  # the world's few postings are all recent ones: move them to blocks, then undo
        with world.transaction(force_rollback=True):
            world.execute(
                "select kb_internal.flush_recent_postings(g.kb_id, g.terms)"
                " from (select kb_id, array_agg(term) as terms from kb.term_stats group by 1) g"
            )
            assert table_markers(world, world, table) == ALL
        return
    assert table_markers(world, world, table) == ALL


@pytest.mark.parametrize("table", KNOWLEDGE_TABLES)
@pytest.mark.parametrize("principal", [p for p in PRINCIPALS if p != "admin"])
def test_end_users_have_no_privilege_on_knowledge_tables(world, as_, principal, table):
    """No SELECT at all (not even RLS-filtered): a user's own predicate next to a policy leaks through
    EXPLAIN ANALYZE, so end users read through the functions of 55_reads.sql."""
    conn = as_(principal)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table"):
        conn.execute(f"select 1 from kb.{table} limit 1")
    assert conn.execute(
        "select has_table_privilege(%s, 'SELECT') or has_any_column_privilege(%s, 'SELECT')",
        [f"kb.{table}", f"kb.{table}"],
    ).fetchone() == (False,)


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_read_functions_see_exactly_visible_kbs(world, as_, principal):
    assert read_markers(as_(principal)) == VISIBLE[principal]


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_whoami_and_embedding_status(world, as_, principal):
    conn = as_(principal)
    user, admin, teams = conn.execute("select * from kb.whoami()").fetchone()
    expected_user = {"svc-as-bob": "bob", "svc-as-nobody": None, "mallory": None}.get(principal, principal)
    if principal == "admin":
        assert admin is True
    else:
        assert (user, admin, set(teams)) == (expected_user, False, TEAMS[principal])
    # every KB holds one embedded and one queued chunk: the counts cover only what the caller sees
    embedded, queued, parked = conn.execute("select embedded, queued, parked from kb.embedding_status()").fetchone()
    assert (embedded, queued, parked) == (len(VISIBLE[principal]), len(VISIBLE[principal]), 0)
    # the model registry is public; settings (embedding_api_key!) are not readable by pgkb users
    assert conn.execute("select count(*) from kb.embedding_models").fetchone()[0] == 1
    if principal != "admin":
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select value from kb.settings")


def _plan(conn, sql: str, value) -> list[str]:
    """EXPLAIN ANALYZE output of ``sql`` with ``value`` as its parameter, without what varies from run to
    run (memory) and with the value itself blanked out of the filter condition that shows it."""
    import re

    plan = [r[0] for r in conn.execute(f"explain (analyze, costs off, timing off, summary off) {sql}", [value])]
    plan = [re.sub(r"Memory(?: Usage)?: \d+kB", "", line) for line in plan]
    return [line.replace(str(value), "<v>") if line.lstrip().startswith("Filter:") else line for line in plan]


@pytest.mark.parametrize("principal", ["alice", "mallory", "svc-as-nobody"])
def test_explain_analyze_probes_learn_nothing(world, as_, principal):
    """Issue 9 L1, the exact probes: leakproof operators in the user's own WHERE clause ran before the RLS
    policy, so EXPLAIN ANALYZE told whether a private name / content prefix exists. Now the tables refuse,
    and over the read and search functions a prefix of another user's private text and a prefix of
    nothing give the same plan, row for row."""
    conn = as_(principal)
    conn.execute("set enable_indexscan = off")
    conn.execute("set enable_bitmapscan = off")
    for sql in [
        "select 1 from kb.knowledge_bases where name ^@ 'bob-p'",
        "select 1 from kb.documents where doc_key ^@ 'bobm'",
        "select 1 from kb.chunks where content ^@ 'bobmarker shared'",
        "select 1 from kb.users where name ^@ 'bo'",
        "select 1 from kb.term_stats where term = 'bobmarker'",
    ]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"explain analyze {sql}")
    probes = [
        ("select 1 from kb.list_knowledge_bases() where name ^@ %s", "bob-p", "zzz-q"),
        ("select 1 from kb.list_knowledge_bases() where name = %s", "bob-private", "zzz-private"),
        ("select 1 from kb.lexical_search('sharedword', 20) where content ^@ %s", "bobmarker shared", "zzzmarker"),
        ("select 1 from kb.hybrid_search('sharedword', 20) where doc_key < %s", "bobmarker.md", "a"),
        ("select 1 from kb.fuzzy_search('sharedword', 20) where content ^@ %s", "bobmarker", "zzzmarker"),
        ("select 1 from kb.list_ingest_failures() where doc_key ^@ %s", "bob", "zzz"),
        ("select 1 from kb.embedding_status() where embedded > %s", 3, 100),
    ]
    for sql, secret, nothing in probes:
        assert _plan(conn, sql, secret) == _plan(conn, sql, nothing), sql
    # and the probe functions never return another user's row
    assert not conn.execute("select 1 from kb.list_knowledge_bases() where name ^@ 'bob-p'").fetchall()


@pytest.mark.parametrize("fn", list(SEARCHES))
@pytest.mark.parametrize("principal", PRINCIPALS)
def test_search_sees_exactly_visible_kbs(world, as_, principal, fn):
    conn = as_(principal)
    assert search_markers(conn, fn) == VISIBLE[principal]
    missing = None
    with pytest.raises(psycopg.errors.NoDataFound) as exc:
        search_markers(conn, fn, kb="no-such-kb")
    missing = str(exc.value).replace("no-such-kb", "<name>")
    for name, marker in MARKER.items():
        if marker in VISIBLE[principal]:
            assert search_markers(conn, fn, kb=name) == {marker}
        else:
            # an invisible KB is indistinguishable from a missing one
            with pytest.raises(psycopg.errors.NoDataFound) as exc:
                search_markers(conn, fn, kb=name)
            assert str(exc.value).replace(name, "<name>") == missing
            assert "unknown knowledge base" in missing


def test_an_invisible_name_reads_what_a_missing_one_reads(world, as_):
    """Naming another user's knowledge base reads the same rows as naming none that exists: equal
    pg_stat_xact_* counters of every kb table and index (the name is looked up among the caller's
    knowledge bases only), so the counters are no oracle for which names exist."""
    conn = as_("alice")
    counters = (
        "select relname, seq_scan, seq_tup_read, idx_scan, idx_tup_fetch from pg_stat_xact_user_tables"
        " where schemaname = 'kb' union all select c.relname, pg_stat_get_xact_numscans(c.oid),"
        " pg_stat_get_xact_tuples_returned(c.oid), pg_stat_get_xact_tuples_fetched(c.oid), 0 from pg_class c"
        " where c.relnamespace = 'kb'::regnamespace and c.relkind = 'i' order by 1"
    )

    def observe(name: str) -> list:
        with conn.transaction():
            before = conn.execute(counters).fetchall()
            with pytest.raises(psycopg.errors.NoDataFound), conn.transaction():  # a savepoint: the error ends it
                conn.execute("select kb.resolve_kb(%s)", [name])
            after = conn.execute(counters).fetchall()
        return [(b[0], *(y - x for x, y in zip(b[1:], a[1:], strict=True))) for b, a in zip(before, after, strict=True)]

    for name in ("bob-private", "no-such-kb"):
        observe(name)  # warm caches and plans alike
    assert observe("bob-private") == observe("no-such-kb")


# ---------------------------------------------------------------------------------------------------
# bypass attempts


@pytest.mark.parametrize("principal", ["alice", "mallory", "svc-as-bob"])
@pytest.mark.parametrize(
    "call",
    [
        "select * from kb_internal.vector_leg(%(v)s, (select m from kb.embedding_models m limit 1), "
        "array[1, 2, 3, 4], 10, null)",
        "select * from kb_internal.lexical_leg('sharedword', array[1, 2, 3, 4], 10, null, 1.2, 0.75)",
        "select * from kb_internal.lexical_leg_scan('sharedword', array[1, 2, 3, 4], 10, null, 1.2, 0.75, 4000)",
        "select kb_internal.fuzzy_expansions('sharedwrd', array[1, 2, 3, 4])",
        "select * from kb_internal.search('sharedword', 10, null, %(v)s, null, 1, 1, 1, 60, 40, null, 1.2, 0.75,"
        " 'dbsf')",
        "select kb_internal.adjust_term_stats(1, array[1::bigint], 1)",
        "select kb_internal.check_chunks('[]', null)",
        "select kb_internal.embed_queries(array['x'], (select m from kb.embedding_models m limit 1))",
        "select * from kb_internal.query_translations('x', array[1, 2, 3, 4])",
        "select * from kb_internal.query_embedding('x', (select m from kb.embedding_models m limit 1))",
        "select kb_internal.writable_kb('public-kb')",
        "select * from kb_admin.doctor()",
        "select * from kb_internal.role_problem('svc')",
    ],
    ids=[
        "vector_leg",
        "lexical_leg",
        "lexical_leg_scan",
        "fuzzy_expansions",
        "search",
        "adjust_term_stats",
        "check_chunks",
        "embed_queries",
        "query_translations",
        "query_embedding",
        "writable_kb",
        "doctor",
        "role_problem",
    ],
)
def test_internal_functions_are_not_executable(world, as_, principal, call):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema kb_(internal|admin)"):
        as_(principal).execute(call, {"v": QUERY_VEC})


def test_the_sql_api_guide_lists_what_each_callable_schema_holds(db):
    """kb, kb_service and kb_admin hold exactly the functions docs/sql-api.md's section "Who may call what"
    names (the one list of them; 90_grants.sql grants by schema): a function added to one of them is callable
    on purpose, or it belongs in kb_internal."""
    api = documented_api()
    assert len(api["kb"]) > 50 and api["kb_service"] and api["kb_admin"]
    for schema in CALLABLE_SCHEMAS:
        assert schema_functions(db, schema) == api[schema], schema


@pytest.mark.parametrize("role", ["alice", "mallory", "svc", "pgkb_admin"])
def test_only_the_public_api_is_executable(world, role):
    """What a role may call, over every pgkb schema (usage of the schema and execute of the function): the
    public API; the servers' role kb_service's calls too; pgkb_admin those and kb_admin's."""
    executable = set(
        world.execute(
            "select n.nspname, p.proname from pg_proc as p join pg_namespace as n on n.oid = p.pronamespace"
            " where n.nspname = any(%s) and has_schema_privilege(%s, n.oid, 'USAGE')"
            " and has_function_privilege(%s, p.oid, 'EXECUTE')",
            [list(SCHEMAS), role, role],
        ).fetchall()
    )
    schemas = {"svc": ("kb", "kb_service"), "pgkb_admin": CALLABLE_SCHEMAS}.get(role, ("kb",))
    assert executable == {(schema, name) for schema in schemas for name in documented_api()[schema]}


def test_kb_internal_grants_nothing(world):
    """kb_internal and its functions: no grant but the owner's own, so no other role (PUBLIC, pgkb_user,
    pgkb_service, pgkb_admin or a login role in them) may use the schema, or even name what is in it."""
    grants = world.execute(
        "select a.grantee, a.privilege_type from pg_namespace as n,"
        " aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) as a"
        " where n.nspname = 'kb_internal' and a.grantee <> n.nspowner"
        " union all select a.grantee, a.privilege_type from pg_proc as p,"
        " aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) as a"
        " where p.pronamespace = 'kb_internal'::regnamespace and a.grantee <> p.proowner"
    ).fetchall()
    assert grants == []
    assert len(schema_functions(world, "kb_internal")) > 50
    for role in ("public", "pgkb_user", "pgkb_service", "pgkb_admin", "alice", "mallory", "svc"):
        assert not world.execute("select has_schema_privilege(%s, 'kb_internal', 'USAGE')", [role]).fetchone()[0]


def test_callable_functions_reach_kb_internal_as_its_owner(db):
    """A function of kb, kb_service or kb_admin that uses kb_internal runs as the owner (SECURITY DEFINER): run
    as its caller it would fail with "permission denied for schema kb_internal"."""
    invokers = db.execute(
        "select p.oid::regprocedure::text from pg_proc as p join pg_namespace as n on n.oid = p.pronamespace"
        " where n.nspname = any(%s) and not p.prosecdef and p.prosrc like '%%kb\\_internal.%%'",
        [list(CALLABLE_SCHEMAS)],
    ).fetchall()
    assert invokers == []
    assert (
        db.execute(  # the check sees the callers of kb_internal there are
            "select count(*) from pg_proc where pronamespace = 'kb'::regnamespace and prosrc like '%kb\\_internal.%'"
        ).fetchone()[0]
        > 10
    )


def test_public_helpers_work_for_users(world, as_):
    """The public functions that ran as their caller and used internal helpers (failing for every user with
    "permission denied for function has_cjk" or "is_blank") run as the owner and answer users."""
    conn = as_("mallory")
    assert conn.execute("select kb.not_found_text('退款'), kb.closest_text('refund')").fetchone() == (
        "知识库中未找到相关信息",
        "No exact answer; these are the closest passages:",
    )
    condition = {"conditions": [{"name": "year", "comparison_operator": ">", "value": 2020}]}
    assert conn.execute("select kb.check_metadata_condition(%s)", [json.dumps(condition)]).fetchone()[0]


def test_embedding_backlog_is_the_servers_totals_only(world, as_):
    """kb_service.embedding_backlog (the servers' /metrics): counts over every knowledge base for the service role,
    whoever it acts for; users, mapped or not, may not call it."""
    for principal in ("alice", "mallory"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema kb_service"):
            as_(principal).execute("select * from kb_service.embedding_backlog()")
    for principal in ("svc-as-nobody", "svc-as-bob"):
        rows = as_(principal).execute("select model, queued, parked from kb_service.embedding_backlog()").fetchall()
        assert rows == [("multilingual-e5-small", len(KBS), 0)]  # every knowledge base's unembedded chunk 1


@pytest.mark.parametrize("target", ["bob", "carol", "pgkb_service", "pgkb_admin", "svc"])
def test_set_role_to_a_role_not_granted_fails(world, as_, target):
    conn = as_("alice")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(f"set role {target}")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(f"set session authorization {target}")


def test_identity_is_session_user_not_current_role(world, as_):
    """alice may SET ROLE pgkb_user (she is a member); she stays alice, not an unmapped role."""
    conn = as_("alice")
    conn.execute("set role pgkb_user")
    assert conn.execute("select current_user, session_user").fetchone() == ("pgkb_user", "alice")
    assert read_markers(conn) == VISIBLE["alice"]
    assert search_markers(conn, "hybrid_search") == VISIBLE["alice"]
    assert conn.execute("select username from kb.whoami()").fetchall() == [("alice",)]


@pytest.mark.parametrize("principal", ["alice", "bob", "carol", "mallory"])
def test_acting_user_by_non_service_role_raises(world, as_, principal):
    conn = as_(principal)
    conn.execute("set pgkb.acting_user = 'bob'" if principal != "bob" else "set pgkb.acting_user = 'alice'")
    for sql, params in [
        ("select count(*) from kb.list_knowledge_bases()", []),
        ("select * from kb.get_document('bobmarker.md')", []),
        ("select * from kb.whoami()", []),
        (SEARCHES["hybrid_search"].format(kb=""), [QUERY_VEC]),
        (SEARCHES["lexical_search"].format(kb=""), []),
        ("select * from kb.replace_document('bob-private', 'x.md', 't', '[{\"content\": \"x\"}]')", []),
        ("select kb.delete_document('bob-private', 'bobmarker.md')", []),
    ]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="pgkb.acting_user may only be set"):
            conn.execute(sql, params)


def test_set_local_acting_user_by_non_service_role_raises(world, as_):
    conn = as_("carol")
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute("set local pgkb.acting_user = 'alice'")
        conn.execute("select count(*) from kb.list_knowledge_bases()")
    # outside the transaction carol is carol again
    assert read_markers(conn) == VISIBLE["carol"]


def test_service_acting_for_unknown_user_raises(world, as_):
    conn = as_("svc-as-nobody")
    conn.execute("set pgkb.acting_user = 'nobody-here'")
    for sql, params in [
        ("select count(*) from kb.list_knowledge_bases()", []),
        (SEARCHES["hybrid_search"].format(kb=""), [QUERY_VEC]),
        ("select * from kb.replace_document('public-kb', 'x.md', 't', '[{\"content\": \"x\"}]')", []),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown pgkb user"):
            conn.execute(sql, params)


def test_service_switching_users_sees_each_users_slice(world, as_):
    conn = as_("svc-as-nobody")
    for user in ("alice", "bob", "carol", ""):
        conn.execute("select set_config('pgkb.acting_user', %s, false)", [user])
        expected = VISIBLE[user] if user else VISIBLE["svc-as-nobody"]
        assert read_markers(conn) == expected
        assert search_markers(conn, "hybrid_search") == expected


UPDATABLE_COLUMN = {
    "users": "name",
    "teams": "name",
    "memberships": "team_id",
    "knowledge_bases": "description",
    "documents": "title",
    "chunks": "content",
    "term_stats": "df",
    "term_blocks": "n",
    "postings": "n",
    "embeddings": "kb_id",
    "embedding_queue": "attempts",
    "embedding_models": "name",
    "settings": "value",
    "schema_migrations": "name",
    "ingest_failures": "error",
    "image_captions": "caption",
    "glossary": "terms",
    "api_keys": "name",
    "knowledge_saves": "doc_key",
    "questions": "question",
    "question_kbs": "found",
    "answer_ratings": "note",
}


def test_the_table_list_is_every_kb_table(db):
    """TABLES (and UPDATABLE_COLUMN) name every table of schema kb, so a new table is checked too."""
    catalog = db.execute(
        "select relname from pg_class where relnamespace = 'kb'::regnamespace and relkind in ('r', 'p')"
    ).fetchall()
    assert sorted(TABLES) == sorted(UPDATABLE_COLUMN) == sorted(name for (name,) in catalog)


@pytest.mark.parametrize("principal", ["alice", "mallory", "svc-as-bob"])
@pytest.mark.parametrize("table", TABLES)
def test_direct_writes_are_denied(world, as_, principal, table):
    conn = as_(principal)
    before = snapshot(world)
    col = UPDATABLE_COLUMN[table]
    for sql in [
        f"insert into kb.{table} default values",
        f"update kb.{table} set {col} = {col}",
        f"delete from kb.{table}",
        f"truncate kb.{table} cascade",
    ]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)
    assert snapshot(world) == before


def test_non_owners_cannot_create_objects_in_public(world, as_):
    """SECURITY DEFINER functions resolve vector / pg_trgm operators in public: nobody may shadow them."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_("alice").execute(
            "create function public.cosine_distance(vector, vector) returns float8 language sql as 'select 0::float8'"
        )


# ---------------------------------------------------------------------------------------------------
# writes through the API

DOC = json.dumps([{"content": "intrudermarker sharedword"}])


@pytest.mark.parametrize(
    ("principal", "kb", "error", "message"),
    [
        ("alice", "bob-private", psycopg.errors.NoDataFound, "unknown knowledge base"),
        ("alice", "public-kb", psycopg.errors.InsufficientPrivilege, "may not write"),
        ("carol", "eng-team", psycopg.errors.NoDataFound, "unknown knowledge base"),
        ("carol", "alice-private", psycopg.errors.NoDataFound, "unknown knowledge base"),
        ("bob", "alice-private", psycopg.errors.NoDataFound, "unknown knowledge base"),
        ("mallory", "public-kb", psycopg.errors.InsufficientPrivilege, "may not write"),
        ("mallory", "eng-team", psycopg.errors.NoDataFound, "unknown knowledge base"),
        ("svc-as-bob", "alice-private", psycopg.errors.NoDataFound, "unknown knowledge base"),
        ("svc-as-nobody", "public-kb", psycopg.errors.InsufficientPrivilege, "may not write"),
    ],
)
def test_writes_into_foreign_kbs_fail_and_change_nothing(world, as_, principal, kb, error, message):
    conn = as_(principal)
    before = snapshot(world)
    marker = MARKER[kb]
    # writing into a name taken by an invisible KB: "not available", as create_knowledge_base says
    invisible = error is psycopg.errors.NoDataFound
    write_error, write_message = (psycopg.errors.UniqueViolation, "is not available") if invisible else (error, message)
    with pytest.raises(write_error, match=write_message):
        conn.execute("select * from kb.replace_document(%s, 'new.md', 't', %s::jsonb)", [kb, DOC])
    with pytest.raises(write_error, match=write_message):  # replacing the existing document
        conn.execute("select * from kb.replace_document(%s, %s, 't', %s::jsonb)", [kb, f"{marker}.md", DOC])
    if invisible and principal not in ("mallory", "svc-as-nobody"):  # unmapped roles may not create at all
        with pytest.raises(psycopg.errors.UniqueViolation) as exc:
            conn.execute("select kb.create_knowledge_base(%s)", [kb])
        assert "not available" in str(exc.value) and "exists" not in str(exc.value)
    with pytest.raises(error, match=message):
        conn.execute("select kb.delete_document(%s, %s)", [kb, f"{marker}.md"])
    chunk_ids = [
        r[0]
        for r in world.execute(
            "select c.id from kb.chunks c join kb.knowledge_bases k on k.id = c.kb_id where k.name = %s", [kb]
        )
    ]
    # chunks the caller may not write are skipped like chunks that do not exist: nothing stored, no oracle
    assert conn.execute(
        "select kb.store_embeddings(null, %s, %s::vector[])",
        [chunk_ids, [str(QUERY_VEC.to_list())] * len(chunk_ids)],
    ).fetchone() == (0,)
    if message == "unknown knowledge base":  # same text as for a KB that does not exist
        with pytest.raises(psycopg.errors.NoDataFound) as exc:
            conn.execute("select kb.delete_document('no-such-kb', 'x.md')")
        with pytest.raises(psycopg.errors.NoDataFound) as exc2:
            conn.execute("select kb.delete_document(%s, 'x.md')", [kb])
        assert str(exc.value).replace("no-such-kb", "<n>") == str(exc2.value).replace(kb, "<n>")
    assert snapshot(world) == before
    assert "intrudermarker" not in str(world.execute("select array_agg(content) from kb.chunks").fetchone())


CACHE_CALLS = [
    "select * from kb.cached_image_captions(%(kb)s, 'm', 'en', array[%(sha)s])",
    "select kb.store_image_caption(%(kb)s, %(sha)s, 'm', 'en', 'intruder caption')",
    "select kb.prune_image_captions(%(kb)s)",
]


@pytest.mark.parametrize(
    ("principal", "kb", "error"),
    [
        ("bob", "alice-private", psycopg.errors.NoDataFound),
        ("carol", "eng-team", psycopg.errors.NoDataFound),
        ("alice", "public-kb", psycopg.errors.InsufficientPrivilege),
        ("mallory", "public-kb", psycopg.errors.InsufficientPrivilege),
        ("svc-as-nobody", "public-kb", psycopg.errors.InsufficientPrivilege),
        ("svc-as-bob", "alice-private", psycopg.errors.NoDataFound),
    ],
)
def test_image_caption_cache_reaches_only_writers_of_its_kb(world, as_, principal, kb, error):
    """A cached caption says what an image of a knowledge base shows: only its writers (the ingest path)
    read or change it, and a hash cached in one knowledge base is unknown in every other."""
    sha = "c" * 64
    for owner_kb in ("alice-private", "eng-team", "public-kb"):
        world.execute(
            "select kb.store_image_caption(%s, %s, 'm', 'en', %s)", [owner_kb, sha, f"{MARKER[owner_kb]} caption"]
        )
    before = world.execute(
        "select count(*), string_agg(caption, ',' order by caption) from kb.image_captions"
    ).fetchone()
    conn = as_(principal)
    for call in CACHE_CALLS:
        with pytest.raises(error):
            conn.execute(call, {"kb": kb, "sha": sha})
    assert (
        world.execute("select count(*), string_agg(caption, ',' order by caption) from kb.image_captions").fetchone()
        == before
    )
    # the same hash in the caller's own knowledge base: nothing from the others
    own = {"bob": "bob-private", "svc-as-bob": "bob-private", "carol": "public-kb"}.get(principal)
    if own:
        rows = conn.execute("select caption from kb.cached_image_captions(%s, 'm', 'en', array[%s])", [own, sha])
        assert [r[0] for r in rows] == ([f"{MARKER[own]} caption"] if own == "public-kb" else [])
    # a fellow writer of a team knowledge base shares its cache
    if principal == "bob":
        rows = conn.execute("select caption from kb.cached_image_captions('eng-team', 'm', 'en', array[%s])", [sha])
        assert [r[0] for r in rows] == ["teammarker caption"]


@pytest.mark.parametrize("principal", ["bob", "svc-as-bob"])
def test_team_member_writes_into_team_kb(world, as_, principal):
    conn = as_(principal)
    doc_id, n, changed, queued = conn.execute(
        "select * from kb.replace_document('eng-team', 'bob.md', 'bob note', %s::jsonb)",
        [json.dumps([{"content": "bobnotemarker sharedword", "embedding": unit(7)}])],
    ).fetchone()
    assert (n, changed, queued) == (1, True, 0)
    alice = as_("alice")
    doc = alice.execute("select chunks::text from kb.get_document('bob.md', 'eng-team')").fetchone()[0]
    assert "bobnotemarker" in doc
    with pytest.raises(psycopg.errors.NoDataFound, match="unknown knowledge base"):
        as_("carol").execute("select * from kb.get_document('bob.md', 'eng-team')")
    with pytest.raises(psycopg.errors.NoDataFound, match="unknown document"):
        as_("carol").execute("select * from kb.get_document('bob.md')")
    # team members may also store embeddings and delete documents there (including alice's)
    chunk_ids = [
        r[0]
        for r in world.execute(
            "select c.id from kb.chunks c join kb.documents d on d.id = c.document_id where d.doc_key = 'teammarker.md'"
        )
    ]
    assert (
        conn.execute(
            "select kb.store_embeddings(null, %s, %s::vector[])", [chunk_ids, [str(unit(9))] * len(chunk_ids)]
        ).fetchone()[0]
        == 2
    )
    assert conn.execute("select kb.delete_document('eng-team', 'teammarker.md')").fetchone()[0] is True
    assert world.execute("select count(*) from kb.chunks where content like 'teammarker%'").fetchone()[0] == 0
    # the BM25 statistics stayed consistent
    stats = set(world.execute(f"select kb_id, term, df from {TERM_DICTIONARY} as d where df > 0").fetchall())
    recomputed = set(
        world.execute(f"select x.kb_id, x.term, count(*) from {CHUNK_TERMS} as x group by x.kb_id, x.term").fetchall()
    )
    assert stats == recomputed


def test_user_creates_own_private_kb(world, as_):
    carol = as_("carol")
    carol.execute(
        "select * from kb.replace_document('carol-notes', 'n.md', 'n', %s::jsonb)",
        [json.dumps([{"content": "carolnotesmarker sharedword"}])],
    )
    visibility, owner = world.execute(
        "select k.visibility, u.name from kb.knowledge_bases k join kb.users u on u.id = k.owner_id"
        " where k.name = 'carol-notes'"
    ).fetchone()
    assert (visibility, owner) == ("private", "carol")
    assert {r[0] for r in carol.execute("select name from kb.list_knowledge_bases()")} == {"public-kb", "carol-notes"}
    assert "carolnotesmarker" in str(
        carol.execute("select content from kb.lexical_search('sharedword', 20)").fetchall()
    )
    for other in ("alice", "bob", "mallory", "svc-as-bob"):
        conn = as_(other)
        assert "carol-notes" not in {r[0] for r in conn.execute("select name from kb.list_knowledge_bases()")}
        assert "carolnotesmarker" not in str(
            conn.execute("select content from kb.lexical_search('sharedword', 20)").fetchall()
        )
        with pytest.raises(psycopg.errors.NoDataFound, match="unknown knowledge base"):
            conn.execute("select * from kb.lexical_search('sharedword', kb => 'carol-notes')")
    assert world.execute("select count(*) from kb.chunks where content like 'carolnotes%'").fetchone()[0] == 1


@pytest.mark.parametrize("principal", ["mallory", "svc-as-nobody"])
def test_unmapped_role_cannot_create_kb(world, as_, principal):
    before = snapshot(world)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not a pgkb user"):
        as_(principal).execute("select * from kb.replace_document('mallory-kb', 'm.md', 'm', %s::jsonb)", [DOC])
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not a pgkb user"):
        as_(principal).execute("select kb.create_knowledge_base('mallory-kb')")
    assert snapshot(world) == before


@pytest.mark.parametrize(
    "call",
    [
        "select kb.create_user('eve', 'mallory', true)",
        "select kb.create_team('evil')",
        "select kb.add_team_member('eng', 'carol')",
        "select kb.create_knowledge_base('x', owner => 'bob')",
        "select kb.register_embedding_model('m2', 8)",
        "select kb.use_embedding_model('multilingual-e5-small', true)",
    ],
)
@pytest.mark.parametrize("principal", ["alice", "carol", "svc-as-bob"])
def test_admin_api_needs_admin(world, as_, principal, call):
    before = snapshot(world)
    users = world.execute("select count(*) from kb.users").fetchone()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only pgkb administrators"):
        as_(principal).execute(call)
    assert snapshot(world) == before
    assert world.execute("select count(*) from kb.users").fetchone() == users


def test_unmapped_role_without_pgkb_user_cannot_use_the_schema(world, connect_as):
    world.execute("revoke pgkb_user from mallory")
    conn = connect_as("mallory")
    for sql in ["select count(*) from kb.chunks", "select * from kb.lexical_search('sharedword')"]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="schema kb"):
            conn.execute(sql)


@pytest.mark.parametrize("visibility", ["public", "private"])
def test_team_member_cannot_change_visibility_of_team_kb(world, as_, visibility):
    """Writing documents into a team KB is not the right to publish it (or to take it from the team):
    only its owner or an administrator may change visibility / team."""
    before = snapshot(world)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_("bob").execute("select kb.create_knowledge_base('eng-team', %s)", [visibility])
    assert snapshot(world) == before
    assert search_markers(as_("carol"), "lexical_search") == VISIBLE["carol"]


def test_the_vector_legs_reads_ignore_the_callers_planner_settings(db, connect_as):
    """Issue 32, finding 3: with enable_seqscan, enable_sort and enable_bitmapscan off, alice's vector search
    took the HNSW index, which returned bob's private rows near her vector to be filtered out: kb.embeddings
    fetched 70 rows while bob's 30 chunks lay near it, 40 once they were moved away. The leg pins its plan."""
    rng = np.random.default_rng(32)
    near = rng.normal(size=DIM)

    def around(center, n: int, spread: float) -> list[list[float]]:
        return [list(map(float, center + spread * rng.normal(size=DIM))) for _ in range(n)]

    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.create_user('bob', 'bob')")
    db.execute("select kb.create_knowledge_base('open', 'public')")
    db.execute("select kb.create_knowledge_base('bobs', 'private', owner => 'bob')")
    far = rng.normal(size=DIM)
    for kb, center, n in (("open", far, 40), ("bobs", near, 30)):
        chunks = [{"content": f"{kb} chunk {i}", "embedding": v} for i, v in enumerate(around(center, n, 0.2))]
        db.execute("select kb.replace_document(%s, 'd.md', 'd', %s::jsonb)", [kb, json.dumps(chunks)])
    db.execute("analyze kb.embeddings")
    alice = connect_as("alice")
    for setting in ("enable_seqscan", "enable_sort", "enable_bitmapscan"):
        alice.execute(f"set {setting} = off")
    alice.execute("set cpu_operator_cost = 100")  # a distance computed for each row looks dear
    counters = (
        "select coalesce(sum(seq_tup_read), 0), coalesce(sum(idx_tup_fetch), 0) from pg_stat_xact_user_tables"
        " where schemaname = 'kb' and relname = 'embeddings'"
    )
    query = Vector(np.array(near, dtype=np.float32))

    calls = (
        "select kb from kb.vector_search('x', 10, query_embedding => %s)",
        "select kb from kb.hybrid_search('x', 10, query_embedding => %s)",
        "select knowledge_base from kb.retrieve('x', 10, query_embedding => %s)",
        "select 'open' from kb.ask('x', 10, query_embedding => %s)",
    )

    def reads() -> list[tuple]:
        seen = []
        for sql in calls:
            with alice.transaction():
                before = alice.execute(counters).fetchone()
                hits = alice.execute(sql, [query]).fetchall()
                after = alice.execute(counters).fetchone()
            assert {h[0] for h in hits} <= {"open"}, sql
            seen.append(tuple(b - a for a, b in zip(before, after, strict=True)))
        return seen

    reads()  # warm caches and plans alike
    while_near = reads()
    away = Vector(np.array(-near, dtype=np.float32))
    bobs = "(select id from kb.knowledge_bases where name = 'bobs')"
    db.execute(f"update kb.embeddings set embedding = %s where kb_id = {bobs}", [away])
    assert reads() == while_near


def test_the_hnsw_scan_reads_only_the_searched_knowledge_bases(db, connect_as):
    """Issue 32, finding 3, second half: with one HNSW index for every knowledge base, a scan large enough
    for the planner to take it (default settings) returned bob's private rows near alice's vector, to be
    filtered out: kb.embeddings' fetches and buffers told how much of bob's text lay near any vector. Each
    knowledge base now has its own index, and the leg scans only those of the knowledge bases searched."""
    rng = np.random.default_rng(321)
    near, far = rng.normal(size=DIM), rng.normal(size=DIM)
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")  # HNSW at any size

    def rows(center, n: int) -> str:
        vectors = center + 0.3 * rng.normal(size=(n, DIM))
        return json.dumps([{"content": f"chunk {i}", "embedding": list(map(float, v))} for i, v in enumerate(vectors)])

    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.create_user('bob', 'bob')")
    db.execute("select kb.create_knowledge_base('open', 'public')")
    db.execute("select kb.create_knowledge_base('bobs', 'private', owner => 'bob')")
    for d in range(6):  # 1,800 open chunks far from the query, 600 of bob's near it
        db.execute("select kb.replace_document('open', %s, 'd', %s::jsonb)", [f"o{d}.md", rows(far, 300)])
    for d in range(2):
        db.execute("select kb.replace_document('bobs', %s, 'd', %s::jsonb)", [f"b{d}.md", rows(near, 300)])
    db.execute("vacuum analyze kb.embeddings")
    db.execute("update kb.settings set value = '40' where key = 'hnsw_ef_search'")  # HNSW beats a sort at this size
    alice = connect_as("alice")
    counters = (
        "select (select coalesce(sum(seq_tup_read), 0) + coalesce(sum(idx_tup_fetch), 0)"
        " from pg_stat_xact_user_tables where schemaname = 'kb' and relname = 'embeddings'),"
        " (select sum(pg_stat_get_xact_numscans(c.oid)) from pg_class as c"
        " where c.relnamespace = 'kb'::regnamespace and c.relname like 'embeddings\\_hnsw\\_%')"
    )
    query = Vector(np.array(near, dtype=np.float32))

    def reads() -> tuple[int, int]:
        with alice.transaction():
            before = alice.execute(counters).fetchone()
            hits = alice.execute("select kb from kb.vector_search('x', 10, query_embedding => %s)", [query]).fetchall()
            after = alice.execute(counters).fetchone()
        assert {h[0] for h in hits} == {"open"}
        return after[0] - before[0], after[1] - before[1]

    reads()
    while_near = reads()
    assert while_near[1] == 1, "the leg scanned one HNSW index"
    bobs = "(select id from kb.knowledge_bases where name = 'bobs')"
    db.execute(
        f"update kb.embeddings set embedding = %s where kb_id = {bobs}", [Vector(np.array(-near, dtype=np.float32))]
    )
    db.execute("vacuum analyze kb.embeddings")
    assert reads() == while_near


def test_another_users_chunk_id_reads_like_a_missing_one(world, as_):
    """Issue 32, finding 6d: kb.answer_evidence and kb.store_embeddings fetched another user's chunk row by
    primary key before dropping it, where a missing id fetched none: a chunk-id existence oracle. Both now
    look ids up among the caller's knowledge bases only, and read the same rows for either."""
    bobs = world.execute(
        "select max(c.id) from kb.chunks as c join kb.knowledge_bases as k on k.id = c.kb_id"
        " where k.name = 'bob-private'"
    ).fetchone()[0]
    many = json.dumps([{"content": f"filler chunk {i}"} for i in range(1000)])  # enough for index lookups to pay
    world.execute("select kb.replace_document('public-kb', 'filler.md', 'filler', %s::jsonb)", [many])
    world.execute("analyze kb.chunks")
    missing = world.execute("select max(id) + 1000 from kb.chunks").fetchone()[0]
    carol = as_("carol")
    counters = (
        "select relname, seq_scan, seq_tup_read, idx_scan, idx_tup_fetch from pg_stat_xact_user_tables"
        " where schemaname = 'kb' order by 1"
    )
    vector = Vector(np.ones(DIM, dtype=np.float32))
    # a hit as the owner sees it, with its chunk id put in by the caller
    hit = (
        "select jsonb_populate_record(r, jsonb_build_object('chunk_id', %s))::text"
        " from kb.lexical_search('bobmarker', 1) as r"
    )
    rows = {chunk_id: world.execute(hit, [chunk_id]).fetchone()[0] for chunk_id in (bobs, missing)}
    calls = {
        "answer_evidence": "select kb.answer_evidence('bobmarker', array[%s::kb.search_result])",
        "store_embeddings": "select kb.store_embeddings(null, array[%s]::bigint[], array[%s]::vector[])",
    }

    def observe(sql: str, chunk_id: int) -> tuple:
        params = [chunk_id, vector] if "store_embeddings" in sql else [rows[chunk_id]]
        with carol.transaction():
            before = carol.execute(counters).fetchall()
            answer = carol.execute(sql, params).fetchone()[0]
            after = carol.execute(counters).fetchall()
        moved = [
            (b[0], *(y - x for x, y in zip(b[1:], a[1:], strict=True)))
            for b, a in zip(before, after, strict=True)
            if any(y != x for x, y in zip(b[1:], a[1:], strict=True))
        ]
        return answer, moved

    for name, sql in calls.items():
        observe(sql, missing)  # plans and caches alike
        assert observe(sql, bobs) == observe(sql, missing), name
    stored = "select count(*) from kb.embeddings where chunk_id = %s and embedding = %s"
    assert world.execute(stored, [bobs, vector]).fetchone()[0] == 0


def test_a_team_one_is_not_in_reads_like_a_missing_one(world, as_):
    """Issue 32, finding 6g: creating a knowledge base for team eng said "not a member", for a missing team
    "unknown team": team names were an oracle. Now one error, and the same rows read."""
    conn = as_("carol")  # not in eng
    counters = (
        "select relname, seq_tup_read, idx_scan, idx_tup_fetch from pg_stat_xact_user_tables"
        " where schemaname = 'kb' order by 1"
    )

    def observe(team: str) -> tuple:
        with conn.transaction():
            before = conn.execute(counters).fetchall()
            with pytest.raises(psycopg.Error) as e, conn.transaction():
                conn.execute("select kb.create_knowledge_base('carols', 'team', team => %s)", [team])
            after = conn.execute(counters).fetchall()
        reads = [
            (b[0], *(y - x for x, y in zip(b[1:], a[1:], strict=True))) for b, a in zip(before, after, strict=True)
        ]
        return type(e.value), str(e.value).replace(team, "T"), reads

    observe("eng")
    seen = observe("eng"), observe("no-such-team")
    assert seen[0] == seen[1], [[r for r in s[2] if any(r[1:])] for s in seen]
    alice = as_("alice")  # a member still can
    assert alice.execute("select kb.create_knowledge_base('alices-eng', 'team', team => 'eng')").fetchone()[0]
