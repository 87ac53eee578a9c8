"""Upgrades from real releases: a database built by an earlier release (tests/releases.py: its own db/ and
migrator from this repository's history), loaded through that release's SQL API, then migrated to HEAD by
today's `pgkb db migrate`, holds the same data, answers every search the same, and grants the same
privileges as a fresh HEAD database loaded with the same data through HEAD's API.

The comparisons read the catalogs by schema (every schema pgkb made, whatever its name), never a list of
HEAD's functions, so moving functions between schemas changes nothing here."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import psycopg
import pytest
from pgkb.config import Settings
from pgkb.migrate import migrate
from pgvector.psycopg import register_vector
from psycopg.conninfo import make_conninfo
from releases import RELEASES, release_database
from term_dictionary import TERM_DICTIONARY

pytestmark = pytest.mark.slow  # builds databases of four past releases

DIM = 384  # the default model's, in every release
USERS = ("alice", "bob")  # login roles conftest creates; alice is in team ops, bob in no team
KNOWLEDGE_BASES = (
    ("handbook", "public", None, None),
    ("ops", "team", "ops", None),
    ("notes", "private", None, "alice"),
)
DOCUMENTS = {
    ("handbook", "refund.md", "退款政策"): [
        ("退款会在三个工作日内原路退回，节假日顺延。", ["退款政策", "时效"], "text"),
        ("Refunds go back to the original payment method within three business days.", ["Refund policy"], "text"),
    ],
    ("handbook", "login.md", "登录问题"): [
        ("登录态失效时，请清除浏览器缓存后重新登录。getUserToken 返回 401 表示令牌过期。", ["登录", "排查"], "text"),
    ],
    ("ops", "db-pool.md", "数据库连接池满了怎么办"): [
        ("连接池满了先看慢查询，再调大 max_connections。", ["数据库", "连接池"], "text"),
        ("select pid, state, query from pg_stat_activity where state <> 'idle';", ["数据库", "排查步骤"], "code"),
    ],
    ("ops", "deploy.md", "发布流程"): [("发布前在预发环境跑一遍回归测试。", ["发布"], "text")],
    ("notes", "todo.md", "Alice's notes"): [("Remember the connection pool review and the refund FAQ.", [], "text")],
    # enough chunks sharing terms (at least 64) that those terms' postings move into posting blocks
    ("handbook", "glossary.md", "术语表"): [
        (f"术语 {i}：错误码 E{i:03d} 的含义见监控面板。", ["术语表"], "text") for i in range(80)
    ],
}
REPLACED = (
    "handbook",
    "login.md",
    "登录问题",
    [("令牌过期时 getUserToken 返回 401，重新登录即可。", ["登录"], "text")],
)
DELETED = ("ops", "deploy.md")
QUERIES = ("退款多久到账", "错误码 E042", "连接池满了", "getUserToken 401", "refund payment", "conection pool", "登陆")
QUERY_NEAR = "连接池满了先看慢查询，再调大 max_connections。"  # the fixed query embedding lies next to this chunk's


def vector(text: str, noise: float = 0.0) -> np.ndarray:
    """A unit vector fixed by the text (a stand-in embedding: the same in every database and run)."""
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    v = rng.standard_normal(DIM) + noise * np.random.default_rng(7).standard_normal(DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


def chunks_json(chunks) -> str:
    return json.dumps([{"content": c, "heading_path": h, "chunk_type": t} for c, h, t in chunks], ensure_ascii=False)


def load(conn: psycopg.Connection) -> None:
    """The data set, through the SQL API every release has (the same calls for an old release and HEAD):
    users, a team, knowledge bases of each visibility, documents, one replaced and one deleted, and the
    embeddings the worker would store."""
    for user in USERS:
        conn.execute("select kb.create_user(%s, %s)", [user, user])
    conn.execute("select kb.create_team('ops')")
    conn.execute("select kb.add_team_member('ops', 'alice')")
    for name, visibility, team, owner in KNOWLEDGE_BASES:
        conn.execute("select kb.create_knowledge_base(%s, %s, %s, %s)", [name, visibility, team, owner])
    write = "select * from kb.replace_document(%s, %s, %s, %s::jsonb, metadata => %s::jsonb)"
    for (kb, doc_key, title), chunks in DOCUMENTS.items():
        conn.execute(write, [kb, doc_key, title, chunks_json(chunks), json.dumps({"kb": kb})])
    kb, doc_key, title, chunks = REPLACED
    conn.execute(write, [kb, doc_key, title, chunks_json(chunks), json.dumps({"kb": kb, "v": 2})])
    conn.execute("select kb.delete_document(%s, %s)", list(DELETED))
    model = conn.execute("select name from kb.embedding_models where is_default").fetchone()[0]
    queued = conn.execute(
        "select c.id, c.content from kb.embedding_queue as q join kb.chunks as c on c.id = q.chunk_id order by c.id"
    ).fetchall()
    conn.execute(
        "select kb.store_embeddings(%s, %s, %s)", [model, [i for i, _ in queued], [vector(c) for _, c in queued]]
    )


def rows(conn: psycopg.Connection, sql: str, params=None, *, ordered: bool = False) -> list[str]:
    """The query's rows as JSON texts, without a chunk_id column and with floats rounded (sums taken in
    another order may differ in the last bits); sorted unless ``ordered`` (a ranking)."""

    def rounded(value):
        if isinstance(value, float):
            return round(value, 9) if math.isfinite(value) else str(value)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    found = [
        json.dumps(rounded(r[0]), ensure_ascii=False, sort_keys=True)
        for r in conn.execute(f"select to_jsonb(x) - 'chunk_id' from ({sql}) as x", params)
    ]
    return found if ordered else sorted(found)


def data(conn: psycopg.Connection) -> dict[str, list]:
    """What the knowledge base holds, by natural keys (knowledge base, document key, chunk ordinal) and without
    times. Postings name chunks by id: both databases get the same ids, loaded by the same calls in order."""
    chunk = (
        "(select jsonb_build_array(k.name, d.doc_key, o.ordinal) from kb.chunks as o"
        " join kb.documents as d on d.id = o.document_id join kb.knowledge_bases as k on k.id = o.kb_id"
        " where o.id = {})"
    )
    return {
        "knowledge_bases": rows(
            conn,
            "select k.name, k.visibility, t.name as team, u.name as owner, k.chunk_count, k.term_total"
            " from kb.knowledge_bases as k left join kb.teams as t on t.id = k.team_id"
            " left join kb.users as u on u.id = k.owner_id",
        ),
        "documents": rows(
            conn,
            "select k.name, to_jsonb(d) - 'id' - 'kb_id' - 'created_at' - 'updated_at' as d from kb.documents as d"
            " join kb.knowledge_bases as k on k.id = d.kb_id",
        ),
        "chunks": rows(
            conn,
            f"select {chunk.format('c.id')} as key, to_jsonb(c) - 'id' - 'kb_id' - 'document_id' - 'created_at' as c"
            " from kb.chunks as c",
        ),
        "embeddings": rows(
            conn,
            f"select {chunk.format('e.chunk_id')} as key, m.name, e.embedding::text from kb.embeddings as e"
            " join kb.embedding_models as m on m.id = e.model_id",
        ),
        "queue": rows(conn, f"select {chunk.format('q.chunk_id')} as key from kb.embedding_queue as q"),
        "term_stats": rows(
            conn,
            "select k.name, to_jsonb(s) - 'kb_id' - 'recent_ids' - 'recent_tfs' - 'recent_dls' as s,"
            " (select jsonb_agg(jsonb_build_array(x.id, x.tf, x.dl) order by x.id)"  # a set: kept in no order
            " from unnest(s.recent_ids, s.recent_tfs, s.recent_dls) as x (id, tf, dl)) as recent"
            # the whole dictionary, in rows or in blocks: the upgrade's posting rebuilds compact it
            f" from {TERM_DICTIONARY} as s join kb.knowledge_bases as k on k.id = s.kb_id",
        ),
        "postings": rows(
            conn,
            "select k.name, to_jsonb(p) - 'kb_id' as p from kb.postings as p join kb.knowledge_bases as k"
            " on k.id = p.kb_id",
        ),
        "settings": rows(conn, "select * from kb.settings"),
        "ledger": rows(conn, "select version, name, checksum from kb.schema_migrations"),
        "users": rows(conn, "select u.name, u.db_role, u.is_admin from kb.users as u"),
        "memberships": rows(
            conn,
            "select t.name as team, u.name from kb.memberships as m join kb.teams as t on t.id = m.team_id"
            " join kb.users as u on u.id = m.user_id",
        ),
    }


def searches(url: str, query_embedding: np.ndarray) -> dict[str, list]:
    """Every search API's results for QUERIES, for the administrator and each user (visibility), without
    chunk ids: hybrid and the vector leg with a fixed query embedding, each lexical leg alone."""
    calls = {
        "hybrid": "select * from kb.hybrid_search(%(q)s, 10, query_embedding => %(e)s)",
        "vector": "select * from kb.vector_search(%(q)s, 10, query_embedding => %(e)s)",
        "lexical": "select * from kb.lexical_search(%(q)s, 10)",
        "fuzzy": "select * from kb.fuzzy_search(%(q)s, 10)",
    }
    found = {}
    for role in (None, *USERS):
        with psycopg.connect(make_conninfo(url, **({"user": role} if role else {})), autocommit=True) as conn:
            register_vector(conn)
            for mode, sql in calls.items():
                for query in QUERIES:
                    params = {"q": query, "e": query_embedding}
                    found[f"{role or 'admin'} {mode} {query}"] = rows(conn, sql, params, ordered=True)
    return found


def catalog(conn: psycopg.Connection) -> dict[str, list]:
    """Schema and privileges of every schema pgkb made (not the system's, not an extension's objects):
    functions with their grants, security and settings; relations with their grants, RLS and policies;
    columns, indexes and constraints; the schemas' grants."""
    ours = (
        "n.nspname not in ('pg_catalog', 'information_schema', 'pg_toast') and n.nspname not like 'pg_temp%'"
        " and not exists (select from pg_depend as e where e.objid = {}.oid and e.deptype = 'e')"
    )
    acl = (
        "(select coalesce(jsonb_agg(jsonb_build_array(coalesce(r.rolname, 'PUBLIC'), a.privilege_type,"
        " a.is_grantable)"
        " order by r.rolname nulls first, a.privilege_type), '[]')"
        " from aclexplode(coalesce({}, acldefault('{}', {}))) as a"
        " left join pg_roles as r on r.oid = a.grantee)"
    )
    return {
        "schemas": rows(
            conn,
            "select n.nspname, " + acl.format("n.nspacl", "n", "n.nspowner") + " as acl from pg_namespace as n"
            " where n.nspname not like 'pg\\_%' and n.nspname <> 'information_schema'",
        ),
        "functions": rows(
            conn,
            "select n.nspname, p.proname, pg_get_function_identity_arguments(p.oid) as args,"
            " pg_get_function_result(p.oid) as result, p.prokind, p.prosecdef, p.provolatile, p.proconfig,"
            " md5(p.prosrc) as src, " + acl.format("p.proacl", "f", "p.proowner") + " as acl"
            " from pg_proc as p join pg_namespace as n on n.oid = p.pronamespace where " + ours.format("p"),
        ),
        "relations": rows(
            conn,
            "select n.nspname, c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity, "
            + acl.format("c.relacl", "r", "c.relowner")
            + " as acl from pg_class as c join pg_namespace as n on n.oid = c.relnamespace"
            " where c.relkind in ('r', 'p', 'v', 'm', 'S', 'f') and " + ours.format("c"),
        ),
        "columns": rows(
            conn,
            "select n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod) as type, a.attnotnull,"
            " pg_get_expr(d.adbin, d.adrelid) as default, a.attgenerated, a.attcompression, a.attacl::text[]"
            " from pg_attribute as a join pg_class as c on c.oid = a.attrelid"
            " join pg_namespace as n on n.oid = c.relnamespace"
            " left join pg_attrdef as d on d.adrelid = a.attrelid and d.adnum = a.attnum"
            " where a.attnum > 0 and not a.attisdropped and c.relkind in ('r', 'v', 'c') and " + ours.format("c"),
        ),
        "indexes": rows(
            conn,
            "select n.nspname, c.relname, pg_get_indexdef(c.oid) from pg_index as i"
            " join pg_class as c on c.oid = i.indexrelid join pg_namespace as n on n.oid = c.relnamespace"
            " where " + ours.format("c"),
        ),
        "constraints": rows(
            conn,
            "select n.nspname, t.relname, k.conname, pg_get_constraintdef(k.oid) from pg_constraint as k"
            " join pg_class as t on t.oid = k.conrelid join pg_namespace as n on n.oid = t.relnamespace"
            " where " + ours.format("t"),
        ),
        "policies": rows(conn, "select * from pg_policies"),
    }


def assert_same(upgraded: dict[str, list], fresh: dict[str, list]) -> None:
    """Fail naming, per key, what only the upgraded database holds and what only the fresh one holds."""
    found = {}
    for key in sorted(set(upgraded) | set(fresh)):
        old, new = upgraded.get(key, []), fresh.get(key, [])
        if old != new:
            only_old, only_new = [r for r in old if r not in new], [r for r in new if r not in old]
            found[key] = (
                {"upgraded only": only_old, "fresh only": only_new}
                if only_old or only_new
                else {"upgraded (another order)": old, "fresh": new}
            )
    assert not found, json.dumps(found, indent=1, ensure_ascii=False)


@pytest.fixture
def fresh(db):
    """A fresh HEAD database (the test template) loaded with the data set through HEAD's API."""
    load(db)
    return db


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_an_old_release_upgrades_to_what_a_fresh_install_holds(release, fresh, tmp_path):
    with release_database(fresh, release, tmp_path) as old:
        load(old)
        migrate(old, Settings.from_env().db_dir)

        expected = data(fresh)
        assert expected["postings"] and expected["embeddings"]  # the data set reaches posting blocks and vectors
        assert_same(data(old), expected)
        query_embedding = vector(QUERY_NEAR, noise=0.3)
        ranked = searches(fresh.info.dsn, query_embedding)
        assert_same(searches(old.info.dsn, query_embedding), ranked)
        seen = {
            role: {json.loads(r)["kb"] for key, found in ranked.items() if key.startswith(f"{role} ") for r in found}
            for role in ("admin", *USERS)
        }
        assert seen == {
            "admin": {"handbook", "ops", "notes"},
            "alice": {"handbook", "ops", "notes"},
            "bob": {"handbook"},
        }
        assert_same(catalog(old), catalog(fresh))
