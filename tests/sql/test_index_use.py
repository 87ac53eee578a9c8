"""The search legs use their indexes when a non-owner role searches (EXPLAIN via auto_explain), the vector
leg is ORDER BY ... LIMIT over HNSW, and a filtered vector search still fills top_k on a small slice
(pgvector iterative scan; notes/postgres-findings.md pitfalls 1, 4, 5).

Plans of the statements inside the SECURITY DEFINER search functions are captured with auto_explain,
configured per (role, test database) with ALTER ROLE ... IN DATABASE and sent to the client as NOTICEs.
"""

from __future__ import annotations

import json
import random
import re

import numpy as np
import psycopg
import pytest
from pgvector import Vector
from pgvector.psycopg import register_vector

pytestmark = pytest.mark.slow  # the planner needs a corpus large enough to prefer the indexes

DIM = 384
N_KBS = 30
ROWS_PER_KB = 1000
ALICE_ROWS = 600  # alice sees 600 of 29600 chunks (2%); bob sees kb-01..kb-20 (68%)
NEEDLE = "quasarneedle"  # a rare word: in 3 chunks of every KB
DBNAME = "pgkb_index_use"

AUTO_EXPLAIN = {
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_level": "notice",
    "auto_explain.log_analyze": "off",
}


@pytest.fixture(scope="module")
def server(pg_server):
    """A database of its own for this module, cloned from the migrated template and loaded once
    (the corpus takes seconds to build), dropped at the end."""
    info = {"host": pg_server.host, "port": pg_server.port, "user": pg_server.user}
    with psycopg.connect(dbname="postgres", autocommit=True, **info) as maint:
        maint.execute(f"drop database if exists {DBNAME} with (force)")
        maint.execute(f"create database {DBNAME} template {pg_server.template_dbname}")
    try:
        with psycopg.connect(dbname=DBNAME, autocommit=True, **info) as admin:
            register_vector(admin)
            load_corpus(admin)
        yield info
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **info) as maint:
            # also removes the ALTER ROLE ... IN DATABASE settings made below
            maint.execute(f"drop database if exists {DBNAME} with (force)")


@pytest.fixture
def connect(server):
    """connect(role) -> autocommit connection to the module's database; closed after the test."""
    opened: list[psycopg.Connection] = []

    def _connect(role: str | None = None) -> psycopg.Connection:
        kw = dict(server)
        if role:
            kw["user"] = role
        conn = psycopg.connect(dbname=DBNAME, autocommit=True, **kw)
        register_vector(conn)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


@pytest.fixture
def admin(connect):
    return connect()


def load_corpus(db: psycopg.Connection) -> None:
    """30 knowledge bases of 1000 chunks (alice's: 600) with random text and random unit embeddings.
    alice owns 'kb-00' (private); bob is in team 'big', to which kb-01..kb-20 are visible; the rest
    are private to the administrator.

    Loaded in bulk as the administrator rather than through kb.replace_document (which tokenises at
    ~10 ms a chunk): chunk term counts are computed here (lower-case a-z words, for which
    kb.lexical_terms is just the word list; checked below), statistics with kb_internal.adjust_term_stats, and
    the HNSW index is rebuilt after the embeddings are in."""
    rng = random.Random(7)
    vocabulary = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(5, 9))) for _ in range(5000)
    ]
    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.create_user('bob', 'bob')")
    db.execute("select kb.create_team('big')")
    # every knowledge base its HNSW index, however small (test_small_knowledge_bases_... below)
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")
    db.execute("select kb.add_team_member('big', 'bob')")
    for k in range(N_KBS):
        name = f"kb-{k:02d}"
        if k == 0:
            kb_id = db.execute("select kb.create_knowledge_base(%s, owner => 'alice')", [name]).fetchone()[0]
        elif k <= 20:
            kb_id = db.execute("select kb.create_knowledge_base(%s, 'team', team => 'big')", [name]).fetchone()[0]
        else:
            kb_id = db.execute("select kb.create_knowledge_base(%s)", [name]).fetchone()[0]
        n = ALICE_ROWS if k == 0 else ROWS_PER_KB
        doc_id = db.execute(
            "insert into kb.documents (kb_id, doc_key, content_hash, chunk_count)"
            " values (%s, 'doc.md', 'x', %s) returning id",
            [kb_id, n],
        ).fetchone()[0]
        rows = []
        for i in range(n):
            # 5 of 50 common words (~100 chunks each per knowledge base: posting blocks), 25 of all 5000
            terms = rng.choices(vocabulary[:50], k=5) + rng.choices(vocabulary, k=25) + ([NEEDLE] if i < 3 else [])
            rows.append(
                {
                    "ordinal": i,
                    "content": " ".join(terms),
                    "term_count": len(terms),
                }
            )
        db.execute(
            "insert into kb.chunks (document_id, kb_id, ordinal, content, char_count, term_count)"
            " select %s, %s, r.ordinal, r.content, length(r.content), r.term_count"
            " from jsonb_to_recordset(%s::jsonb) as r (ordinal int, content text, term_count int)",
            [doc_id, kb_id, json.dumps(rows)],
        )
        db.execute(
            "select kb_internal.adjust_term_stats(%s, array(select id from kb.chunks where kb_id = %s), 1)",
            [kb_id, kb_id],
        )
    assert db.execute(
        "select bool_and(term_count = cardinality(kb.lexical_terms(content)))"
        " from (select * from kb.chunks order by id limit 50) as c"
    ).fetchone()[0]
    # random unit embeddings, then the model's HNSW index of each knowledge base rebuilt in bulk (same definition)
    indexes = db.execute(
        "select indexname, indexdef from pg_indexes where schemaname = 'kb'"
        " and indexname like 'embeddings_hnsw_model_%'"
    ).fetchall()
    assert len(indexes) == N_KBS
    for name, _ in indexes:
        db.execute(f"drop index kb.{name}")
    db.execute("select setseed(0.42)")
    db.execute(
        "insert into kb.embeddings (chunk_id, model_id, kb_id, embedding)"
        " select c.id, m.id, c.kb_id, l2_normalize(v.a::vector)"
        " from kb.chunks as c, kb.embedding_models as m,"
        " lateral (select array_agg(random() - 0.5) as a from generate_series(1, %s) where c.id is not null) as v"
        " where m.is_default",
        [DIM],
    )
    db.execute("set maintenance_work_mem = '256MB'")
    db.execute("set max_parallel_maintenance_workers = 4")
    for _, definition in indexes:
        db.execute(definition)
    db.execute("analyze")


@pytest.fixture
def explained(admin, connect):
    """explained(role) -> (connection, notices): a connection whose statements' plans, nested ones
    included, arrive as NOTICEs in the list."""
    configured: list[str] = []

    def _open(role: str):
        for key, value in AUTO_EXPLAIN.items():
            admin.execute(f"alter role {role} in database {DBNAME} set {key} = '{value}'")
        configured.append(role)
        conn = connect(role)
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        return conn, notices

    yield _open
    for role in configured:  # pg_db_role_setting is cluster-wide (dropping the database clears it too)
        admin.execute(f"alter role {role} in database {DBNAME} reset all")


def unit_vector(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).tolist()


def query_vec(seed: int = 1) -> Vector:
    return Vector(np.array(unit_vector(np.random.default_rng(seed)), dtype=np.float32))


def plans(notices: list[str]) -> list[str]:
    return [n for n in notices if "plan:" in n]


def plan_of(notices: list[str], marker: str) -> str:
    """The auto_explain plan whose query text contains marker."""
    found = [p for p in plans(notices) if marker in p]
    assert found, f"no plan mentioning {marker!r} among:\n" + "\n----\n".join(plans(notices))
    return found[0]


def vector_plan(notices):
    return plan_of(notices, "<=> $1::vector(")


def lexical_plan(notices):
    """The plans of the BM25 leg's reads of its statistics and posting blocks (any engine), as one text."""
    found = [p for p in plans(notices) if "kb.postings as p" in p or "kb_internal.term_entries(" in p]
    assert found, "no BM25 leg plan among:\n" + "\n----\n".join(plans(notices))
    return "\n----\n".join(found)


def assert_lexical_plan_uses_postings_index(plan: str) -> None:
    assert "Index Scan using postings_pkey on postings" in plan, plan
    assert "Seq Scan on postings" not in plan and "Seq Scan on chunks" not in plan, plan
    assert "Index Scan using term_stats_pkey on term_stats" in plan and "Seq Scan on term_stats" not in plan, plan
    assert "using term_blocks_pkey on term_blocks" in plan and "Seq Scan on term_blocks" not in plan, plan


def fuzzy_plan(notices):
    """The plans of kb_internal.fuzzy_expansions, as one text: its check of the query's terms against the
    vocabulary, and (when one is to be corrected) its lookups of corrections there."""
    plan_of(notices, "as known from kb_internal.term_counts")  # asserts the check ran
    return "\n".join(
        p for p in plans(notices) if "as known from kb_internal.term_counts" in p or "with suspects as" in p
    )


def assert_fuzzy_plan_reads_the_vocabulary_by_index(plan: str) -> None:
    assert "Scan using term_stats_pkey on term_stats" in plan, plan  # an index scan, or an index-only one
    assert "using term_blocks_pkey on term_blocks" in plan, plan  # forward or backward
    assert "Seq Scan" not in plan, plan


def assert_vector_plan_uses_hnsw(plan: str) -> None:
    """Each knowledge base's HNSW ordered scan sits directly under its Limit; no embeddings are read otherwise."""
    lines = plan.splitlines()
    scans = [i for i, line in enumerate(lines) if "Index Scan using embeddings_hnsw_model_" in line]
    assert scans, plan
    for scan in scans:
        assert lines[scan - 1].lstrip().startswith(("->  Limit", "Limit")), plan
    assert "Seq Scan on embeddings" not in plan and "Bitmap Heap Scan on embeddings" not in plan, plan
    assert "Order By: ((embedding)::vector(384) <=>" in plan, plan


def assert_vector_plan_uses_an_index(plan: str, *, small_slice: bool) -> None:
    """HNSW; on a small visible slice the planner may rightly read the slice through btree(model_id, kb_id)
    and sort it (an exact top-n), never a seq scan of every knowledge base's embeddings."""
    if small_slice and "Index Scan using embeddings_model_kb_idx" in plan:
        assert "Seq Scan on embeddings" not in plan, plan
        return
    assert_vector_plan_uses_hnsw(plan)


@pytest.mark.parametrize("role", ["alice", "bob"])
def test_hybrid_search_legs_use_their_indexes_for_non_owner(explained, role):
    """bob sees 68% of the rows, alice 2%. Every leg is an index scan for both (the BM25 leg reads its
    posting blocks by (kb_id, term, tier))."""
    conn, notices = explained(role)
    assert conn.execute("select current_user, session_user").fetchone() == (role, role)
    # bob: enough candidates for all 60 needle chunks; alice: the defaults (with 100 candidates on a 2%
    # slice the planner rightly estimates 5000 HNSW tuples and prefers a seq scan of 30k rows + top-N sort)
    candidates = 100 if role == "bob" else 40
    rows = conn.execute(
        "select kb, content, vector_rank, lexical_rank, fuzzy_rank"
        " from kb.hybrid_search(%s, top_k => 100, candidates => %s, query_embedding => %s)",
        [NEEDLE, candidates, query_vec()],
    ).fetchall()
    visible = {"kb-00"} if role == "alice" else {f"kb-{k:02d}" for k in range(1, 21)}
    assert rows and {r[0] for r in rows} <= visible
    assert all(r[4] is None for r in rows)  # nothing to correct: no fuzzy leg beside the BM25 leg
    # the BM25 leg finds every needle chunk (hybrid's top rows are mostly the vector leg's)
    lexical = conn.execute("select count(*) from kb.lexical_search(%s, 100)", [NEEDLE]).fetchone()[0]
    assert lexical == 3 * len(visible)
    assert any(r[2] is not None for r in rows)

    assert_vector_plan_uses_an_index(vector_plan(notices), small_slice=role == "alice")
    assert_lexical_plan_uses_postings_index(lexical_plan(notices))
    assert_fuzzy_plan_reads_the_vocabulary_by_index(fuzzy_plan(notices))


def test_fusion_finds_a_hits_copies_by_its_content_hash(explained):
    """also_in: the other candidates holding a hit's text are found through (kb_id, content_hash) -- an index
    that holds id and document_id, so each copy is read from the index alone --, one lookup per hit; the
    candidates' ids only filter what it finds, above the lookup (as an index condition they made the generic
    plan of the 100k bench probe the primary key once per candidate for every hit: 1.5 ms a hybrid search)."""
    conn, notices = explained("bob")
    rows = conn.execute(
        "select also_in from kb.hybrid_search(%s, top_k => 20, candidates => 100, query_embedding => %s)",
        [NEEDLE, query_vec()],
    ).fetchall()
    assert len(rows) == 20
    lines = plan_of(notices, "with phrasing as").splitlines()
    copies = [i for i, line in enumerate(lines) if re.search(r" on chunks o(_\d+)?( |$)", line)]
    assert copies, lines
    for i in copies:
        assert "using chunks_kb_content_hash_idx" in lines[i] and "chunks_pkey" not in lines[i], lines[i]
        conds = [line for line in lines[i + 1 : i + 3] if "Index Cond" in line]
        assert conds and not any(re.search(r"\(id = ANY", line) for line in conds), lines[i : i + 3]
    # the ids' filter sits on the subquery above the lookup
    above = [i for i, line in enumerate(lines) if line.strip().startswith("->  Subquery Scan on o ")]
    assert any("Filter: (o.id = ANY" in lines[i + 1] for i in above), "\n".join(lines)


@pytest.mark.parametrize("fn", ["vector_search", "lexical_search", "fuzzy_search"])
def test_single_leg_functions_use_their_index(explained, fn):
    conn, notices = explained("bob")
    # the fuzzy leg is asked for the needle misspelt: it finds it through a correction
    params = [NEEDLE if fn != "fuzzy_search" else NEEDLE[:-2] + NEEDLE[-1:]]
    params += [query_vec()] if fn == "vector_search" else []
    extra = ", query_embedding => %s" if fn == "vector_search" else ""
    rows = conn.execute(f"select kb from kb.{fn}(%s, top_k => 5{extra})", params).fetchall()
    assert len(rows) == 5 and {r[0] for r in rows} <= {f"kb-{k:02d}" for k in range(1, 21)}
    if fn == "vector_search":
        assert_vector_plan_uses_hnsw(vector_plan(notices))
    elif fn == "lexical_search":
        assert_lexical_plan_uses_postings_index(lexical_plan(notices))
    else:
        assert_fuzzy_plan_reads_the_vocabulary_by_index(fuzzy_plan(notices))
        # the needle is misspelt: the corrections' own lookups ran, each read by an index keyed by kb_ids
        corrections = plan_of(notices, "with suspects as")
        assert "Index" in corrections and "Seq Scan" not in corrections, corrections
        assert_lexical_plan_uses_postings_index(lexical_plan(notices))


def test_vector_leg_uses_hnsw_for_the_owner_too(admin):
    notices: list[str] = []
    admin.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    admin.execute("load 'auto_explain'")
    for key, value in AUTO_EXPLAIN.items():
        if key != "session_preload_libraries":
            admin.execute(f"set {key} = '{value}'")
    rows = admin.execute(
        "select kb from kb.vector_search('x', top_k => 10, query_embedding => %s)", [query_vec()]
    ).fetchall()
    assert len(rows) == 10
    assert_vector_plan_uses_hnsw(vector_plan(notices))
    admin.execute("reset auto_explain.log_min_duration")


def test_filtered_vector_search_fills_top_k_on_a_small_slice(admin, connect):
    alice = connect("alice")
    assert alice.execute("select embedded from kb.embedding_status()").fetchone()[0] == ALICE_ROWS
    assert admin.execute("select count(*) from kb.embeddings").fetchone()[0] == ALICE_ROWS + (N_KBS - 1) * ROWS_PER_KB
    for seed in range(5):
        rows = alice.execute(
            "select kb, vector_rank from kb.vector_search('x', top_k => 20, query_embedding => %s)", [query_vec(seed)]
        ).fetchall()
        assert len(rows) == 20
        assert {r[0] for r in rows} == {"kb-00"}
        assert [r[1] for r in rows] == list(range(1, 21))
    # the hybrid search's vector leg fills its default candidates too
    rows = alice.execute(
        "select vector_rank from kb.hybrid_search('x', top_k => 100, query_embedding => %s,"
        " lexical_weight => 0, fuzzy_weight => 0)",
        [query_vec()],
    ).fetchall()
    default = alice.execute("select candidates from kb.search_defaults()").fetchone()[0]
    assert len(rows) == max(default, 100)  # candidates left NULL: the default, at least top_k


def test_small_knowledge_bases_are_searched_exactly_in_one_scan(admin, explained):
    """Below kb.settings.vector_exact_chunks chunks a knowledge base is searched exactly, with the other small ones,
    in one scan: bob's 20 knowledge bases of 1,000 chunks cost one scan, not 20 HNSW scans, and give the true
    nearest chunks."""
    conn, notices = explained("bob")
    admin.execute("update kb.settings set value = '10000' where key = 'vector_exact_chunks'")
    try:
        q = query_vec(7)
        rows = conn.execute("select chunk_id from kb.vector_search('x', top_k => 10, query_embedding => %s)", [q])
        found = [r[0] for r in rows.fetchall()]
        plan = vector_plan(notices)
    finally:
        admin.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")
    exact = admin.execute(
        "select e.chunk_id from kb.embeddings as e join kb.knowledge_bases as k on k.id = e.kb_id"
        " where k.name between 'kb-01' and 'kb-20' order by e.embedding <=> %s, e.chunk_id limit 10",
        [q],
    ).fetchall()
    assert found == [r[0] for r in exact]
    # one scan of the slice btree (plain or bitmap), never of the whole table
    scans = [line for line in plan.splitlines() if "Heap Scan on embeddings" in line or "Index Scan using" in line]
    assert len(scans) == 1 and "embeddings_model_kb_idx" in plan, plan
    assert "Seq Scan on embeddings" not in plan and "embeddings_hnsw_model_" not in plan, plan


def test_without_iterative_scan_a_filtered_hnsw_scan_comes_up_short(admin):
    """Why kb_internal.vector_leg sets hnsw.iterative_scan: a knowledge base's own HNSW index holds only its rows,
    but a document filter still drops most of what the scan returns, and the plain filtered ORDER BY ... LIMIT
    then returns fewer rows than asked for (here the filter keeps 5% of the rows)."""
    kb_id = admin.execute("select id from kb.knowledge_bases where name = 'kb-01'").fetchone()[0]
    sql = (
        "select e.chunk_id from kb.embeddings as e where e.model_id = 1 and e.kb_id = %s and e.chunk_id %% 20 = 0"
        " order by e.embedding::vector(384) <=> %s::vector(384) limit 40"
    )
    q = query_vec()
    with admin.transaction():  # without the slice btree the planner takes HNSW (rolled back below)
        admin.execute("drop index kb.embeddings_model_kb_idx")
        admin.execute("set local hnsw.ef_search = 40")
        plan = "\n".join(r[0] for r in admin.execute("explain " + sql, [kb_id, q]))
        assert f"Index Scan using embeddings_hnsw_model_1_kb_{kb_id}" in plan, plan
        admin.execute("set local hnsw.iterative_scan = off")
        short = len(admin.execute(sql, [kb_id, q]).fetchall())
        admin.execute("set local hnsw.iterative_scan = relaxed_order")
        full = len(admin.execute(sql, [kb_id, q]).fetchall())
        raise psycopg.Rollback
    assert short < 40
    assert full == 40


def test_direct_select_by_non_owner_is_filtered_by_rls(admin, connect):
    """End users hold no table privilege (they read through functions); RLS is the second line: a role
    given SELECT on kb.chunks by hand still sees only its visible rows. No index assertion: RLS keeps
    non-leakproof && from becoming an index condition (pitfall 1), which is why search goes through the
    SECURITY DEFINER functions. The result is still right."""
    alice, bob = connect("alice"), connect("bob")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        alice.execute("select count(*) from kb.chunks")
    admin.execute("grant select on kb.chunks to alice, bob")
    try:
        holding = "select count(*) from kb.chunks where strpos(content, %s) > 0"
        assert alice.execute(holding, [NEEDLE]).fetchone()[0] == 3
        assert bob.execute(holding, [NEEDLE]).fetchone()[0] == 60
    finally:
        admin.execute("revoke select on kb.chunks from alice, bob")
    assert admin.execute("select count(*) from kb.chunks where strpos(content, %s) > 0", [NEEDLE]).fetchone()[0] == (
        3 * N_KBS
    )


@pytest.mark.parametrize("engine", ["numpy", "blocks"])
def test_bm25_leg_reads_its_lists_by_index_with_either_engine(admin, explained, engine):
    """bob (68% of the rows visible): the numpy leg and the SQL blocks leg both read term_stats and the
    posting blocks through their primary keys, starting from the visible kb_ids, never by a scan."""
    admin.execute("update kb.settings set value = %s where key = 'lexical_leg'", [engine])
    try:
        conn, notices = explained("bob")
        rows = conn.execute("select kb from kb.lexical_search(%s, top_k => 5)", [NEEDLE]).fetchall()
        assert len(rows) == 5
        assert_lexical_plan_uses_postings_index(lexical_plan(notices))
    finally:
        admin.execute("update kb.settings set value = 'auto' where key = 'lexical_leg'")
