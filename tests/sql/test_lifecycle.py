"""The lifecycle after creation (db/functions/14_lifecycle.sql): deleting a knowledge base with everything in it,
changing its visibility, team, owner and name, removing team members and users, listing users and teams.

Each change is tried as the knowledge base's owner, as a member of its team, as another user (the same error as
for a missing object, and the same rows read: pg_stat_xact_* counters), and as an administrator; bad input is a
clear error that changes nothing. BM25 statistics and the doctor stay right after each change.

Users alice, bob, carol map to their login roles; alice and bob are in team 'eng', carol in team 'ops'.
"""

from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest
from chunk_terms import CHUNK_TERMS
from pgkb.migrate import maintain_vector_indexes
from term_dictionary import TERM_DICTIONARY

DIM = 384  # the default model, multilingual-e5-small

# name -> (visibility, owner, team)
KBS = {
    "alice-private": ("private", "alice", None),
    "eng-team": ("team", "alice", "eng"),
    "bob-private": ("private", "bob", None),
    "public-kb": ("public", "carol", None),
}
ZERO_WIDTH = "\u200b\u2060"
COUNTERS = (
    "select relname, seq_scan, seq_tup_read, idx_scan, idx_tup_fetch from pg_stat_xact_user_tables"
    " where schemaname = 'kb' union all select c.relname, pg_stat_get_xact_numscans(c.oid),"
    " pg_stat_get_xact_tuples_returned(c.oid), pg_stat_get_xact_tuples_fetched(c.oid), 0 from pg_class c"
    " where c.relnamespace = 'kb'::regnamespace and c.relkind = 'i' order by 1"
)


def unit(i: int) -> list[float]:
    v = [0.0] * DIM
    v[i % DIM] = 1.0
    return v


def chunks_for(kb_index: int, doc: int) -> str:
    """Chunks that all hold 'sharedword', of lengths that differ by knowledge base (so BM25's N and avgdl
    matter), each with its embedding (nothing queued: the doctor stays clean)."""
    n = kb_index + doc + 1
    return json.dumps(
        [
            {
                "content": f"sharedword kb{kb_index} doc{doc} part{i} " + "filler " * (i + kb_index),
                "embedding": unit(100 * kb_index + 10 * doc + i),
            }
            for i in range(n)
        ]
    )


@pytest.fixture
def world(db, steady_statistics):
    # every knowledge base gets its HNSW index per model, however small (the default spares small ones)
    db.execute("update kb.settings set value = '0' where key = 'vector_exact_chunks'")
    for user in ("alice", "bob", "carol"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    for team, members in (("eng", ("alice", "bob")), ("ops", ("carol",))):
        db.execute("select kb.create_team(%s)", [team])
        for member in members:
            db.execute("select kb.add_team_member(%s, %s)", [team, member])
    for i, (name, (visibility, owner, team)) in enumerate(KBS.items()):
        db.execute("select kb.create_knowledge_base(%s, %s, team => %s, owner => %s)", [name, visibility, team, owner])
        for doc in range(2):
            db.execute("select kb.replace_document(%s, %s, 'doc', %s::jsonb)", [name, f"d{doc}.md", chunks_for(i, doc)])
    db.execute("grant pgkb_user to mallory")  # a login role that is no pgkb user
    yield db
    db.execute("revoke pgkb_user from mallory")


@pytest.fixture
def as_(world, connect_as):
    """as_(principal) -> a connection acting as alice, bob, carol, mallory or (admin) the administrator."""
    return lambda principal: world if principal == "admin" else connect_as(principal)


def fill_everything(db, kb: str) -> None:
    """Give knowledge base kb a row in every table a knowledge base has: a queued chunk, block postings (a term
    in more chunks than kb_internal.recent_postings_limit()), term blocks (its dictionary compacted) and rows
    written after them, an ingest failure, an image caption, a glossary entry, a saved note, a logged question
    and a rating, besides its documents, chunks and embeddings."""
    db.execute("select kb.replace_document(%s, 'queued.md', 'q', %s::jsonb)", [kb, json.dumps([{"content": "queued"}])])
    db.execute("select kb.record_ingest_failure(%s, 'broken.pdf', 'boom')", [kb])
    db.execute("select kb.store_image_caption(%s, %s, 'vl', 'en', 'a cat')", [kb, "ab" * 32])
    db.execute("select kb.glossary_add(%s, array['sharedword', 'commonword'])", [kb])
    db.execute("select kb.save_knowledge(%s, 'note', 'noteword', '[{\"content\": \"noteword\"}]')", [kb])
    db.execute("select kb.set_question_log(%s, 30)", [kb])
    db.execute("select count(*) from kb.lexical_search('noteword', 5, %s)", [kb])  # a logged question
    db.execute(
        "insert into kb.answer_ratings (kb_id, question, helpful) select id, 'why', false"
        " from kb.knowledge_bases where name = %s",
        [kb],
    )  # a rating kept alone
    many = json.dumps([{"content": f"blockword {i}", "embedding": unit(i)} for i in range(70)])
    db.execute("select kb.replace_document(%s, 'many.md', 'm', %s::jsonb)", [kb, many])  # 70 postings: a block
    db.execute("select kb_internal.compact_terms(id) from kb.knowledge_bases where name = %s", [kb])
    db.execute("select kb.replace_document(%s, 'later.md', 'l', %s::jsonb)", [kb, json.dumps([{"content": "later"}])])


def kb_tables(db) -> list[str]:
    """The tables of schema kb with a kb_id column: everything a knowledge base holds."""
    return [
        name
        for (name,) in db.execute(
            "select c.relname from pg_class c join pg_attribute a on a.attrelid = c.oid"
            " where c.relnamespace = 'kb'::regnamespace and c.relkind = 'r' and a.attname = 'kb_id' order by 1"
        )
    ]


def rows_of(db, kb_id: int) -> dict[str, int]:
    return {
        t: db.execute(f"select count(*) from kb.{t} where kb_id = %s", [kb_id]).fetchone()[0] for t in kb_tables(db)
    }


def kb_id(db, name: str) -> int:
    return db.execute("select id from kb.knowledge_bases where name = %s", [name]).fetchone()[0]


def state(db) -> tuple:
    """Everything a refused call must leave as it was."""
    tables = [
        name
        for (name,) in db.execute(
            "select relname from pg_class where relnamespace = 'kb'::regnamespace and relkind = 'r' order by 1"
        )
    ]
    counts = tuple(db.execute(f"select count(*) from kb.{t}").fetchone()[0] for t in tables)
    return (
        counts,
        db.execute(
            "select array_agg((id, name, visibility, owner_id, team_id, chunk_count, term_total)::text order by id)"
            " from kb.knowledge_bases"
        ).fetchone()[0],
        db.execute("select array_agg((id, name, db_role)::text order by id) from kb.users").fetchone()[0],
        db.execute("select array_agg((team_id, user_id)::text order by 1) from kb.memberships").fetchone()[0],
        db.execute(
            "select array_agg(relname::text order by 1) from pg_class where relnamespace = 'kb'::regnamespace"
            " and relkind = 'i'"
        ).fetchone()[0],
        db.execute(f"select string_agg(term || df, ',' order by kb_id, term) from {TERM_DICTIONARY} as d").fetchone()[
            0
        ],
    )


def listed(conn) -> dict[str, tuple]:
    return {
        r[0]: r[1:]
        for r in conn.execute("select name, visibility, owner, team, can_write from kb.list_knowledge_bases()")
    }


def observe(conn, sql: str, params: list, name: str) -> tuple:
    """The error a refused call gives (its name replaced) and the rows it read, in a transaction of its own."""
    with conn.transaction():
        before = conn.execute(COUNTERS).fetchall()
        with pytest.raises(psycopg.Error) as e, conn.transaction():  # a savepoint: the error ends it
            conn.execute(sql, params)
        after = conn.execute(COUNTERS).fetchall()
    reads = [(b[0], *(y - x for x, y in zip(b[1:], a[1:], strict=True))) for b, a in zip(before, after, strict=True)]
    return type(e.value), str(e.value).replace(name, "<name>"), [r for r in reads if any(r[1:])]


def assert_reads_alike(conn, sql: str, params_of, hidden: str, missing: str) -> None:
    """``sql`` naming a hidden object errs and reads exactly as naming a missing one."""
    for name in (hidden, missing):  # caches and plans alike
        observe(conn, sql, params_of(name), name)
    seen_hidden = observe(conn, sql, params_of(hidden), hidden)
    seen_missing = observe(conn, sql, params_of(missing), missing)
    assert seen_hidden == seen_missing


def lexical_scores(conn, kb: str | None = None) -> dict[tuple, float]:
    rows = conn.execute(
        "select kb, doc_key, chunk_index, lexical_score from kb.lexical_search('sharedword filler', 100, kb => %s)",
        [kb],
    ).fetchall()
    return {(k, d, i): s for k, d, i, s in rows}


def assert_bm25_statistics_consistent(db) -> None:
    """The term dictionary (kb_internal.term_dictionary) and each knowledge base's N and total length are what
    its chunks say."""
    stats = set(db.execute(f"select kb_id, term, df from {TERM_DICTIONARY} as d where df > 0").fetchall())
    recomputed = set(db.execute(f"select x.kb_id, x.term, count(*) from {CHUNK_TERMS} as x group by x.kb_id, x.term"))
    assert stats == recomputed
    totals = db.execute(
        "select k.id, k.chunk_count, k.term_total, count(c.id), coalesce(sum(c.term_count), 0)"
        " from kb.knowledge_bases k left join kb.chunks c on c.kb_id = k.id group by k.id"
    ).fetchall()
    assert all(n == counted and total == summed for _, n, total, counted, summed in totals), totals


# ------------------------------------------------------------------------------------------ delete


@pytest.mark.parametrize("principal", ["alice", "admin"])
def test_deleting_a_knowledge_base_leaves_nothing_of_it_in_any_table(world, as_, principal):
    fill_everything(world, "eng-team")
    world.execute("select kb.register_embedding_model('second-model', 8)")  # a second HNSW index per kb
    target = kb_id(world, "eng-team")
    before = rows_of(world, target)
    assert all(before.values()), before  # every table held something of it
    others = {name: rows_of(world, kb_id(world, name)) for name in KBS if name != "eng-team"}
    indexes = "select relname from pg_class where relnamespace = 'kb'::regnamespace and relname ~ %s"
    assert len(world.execute(indexes, [f"^embeddings_hnsw_model_\\d+_kb_{target}$"]).fetchall()) == 2

    documents, chunks = as_(principal).execute("select * from kb.delete_knowledge_base('eng-team')").fetchone()
    assert (documents, chunks) == (6, before["chunks"])

    assert set(rows_of(world, target).values()) == {0}
    assert world.execute("select count(*) from kb.knowledge_bases where id = %s", [target]).fetchone()[0] == 0
    assert world.execute("select count(*) from kb.documents where kb_id = %s", [target]).fetchone()[0] == 0
    # its HNSW indexes are left stale (no lock in the caller's transaction), then dropped CONCURRENTLY
    assert {p for _, p in world.execute("select index_name, problem from kb_admin.index_problems()")} == {"stale"}
    assert len(maintain_vector_indexes(world)) == 2
    assert world.execute(indexes, [f"^embeddings_hnsw_model_\\d+_kb_{target}$"]).fetchall() == []
    assert world.execute("select * from kb_admin.index_problems()").fetchall() == []
    assert {name: rows_of(world, kb_id(world, name)) for name in others} == others
    assert "eng-team" not in listed(as_("bob"))
    assert_bm25_statistics_consistent(world)
    # the name is free again, and a new knowledge base of that name starts empty, with indexes of its own
    as_("bob").execute("select kb.create_knowledge_base('eng-team')")
    assert world.execute("select chunk_count from kb.knowledge_bases where name = 'eng-team'").fetchone() == (0,)
    assert world.execute("select * from kb_admin.index_problems()").fetchall() == []


def test_the_doctor_is_clean_after_a_deletion(world, fake_embeddings):
    """Before: the deleted knowledge base's queued chunk is a doctor problem. After: only its HNSW index, left
    stale for pgkb.migrate.maintain_vector_indexes, which drops it CONCURRENTLY: then no problem at all."""
    endpoint = fake_embeddings(lambda texts: [unit(0) for _ in texts])
    world.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
    fill_everything(world, "bob-private")
    problems = "select \"check\", detail from kb_admin.doctor() where status = 'problem'"
    assert [c for c, _ in world.execute(problems)] == ["embeddings"]  # bob's queued chunk
    world.execute("select kb.delete_knowledge_base('bob-private')")
    [(check, detail)] = world.execute(problems).fetchall()
    assert check == "indexes" and "is no longer expected" in detail
    assert world.execute("select * from kb_internal.restore_indexes()").fetchall() == []
    assert [action for _, action in maintain_vector_indexes(world)] == ["dropped (no longer expected)"]
    assert world.execute(problems).fetchall() == []


def test_a_deletion_never_locks_the_searches_out(world, connect_as):
    """Issue 32's review (M2): dropping the HNSW index inside kb.delete_knowledge_base held kb.embeddings' ACCESS
    EXCLUSIVE lock to the end of the caller's transaction, and every search waited. The deletion now leaves the
    index (stale, never scanned); pgkb.migrate.maintain_vector_indexes drops it CONCURRENTLY, and a search
    running meanwhile neither waits nor fails."""
    target = kb_id(world, "bob-private")
    index = world.execute("select kb.hnsw_index_name(id, %s) from kb.embedding_models", [target]).fetchone()[0]
    assert world.execute("select to_regclass(%s) is not null", [f"kb.{index}"]).fetchone() == (True,)
    deleter, searcher = connect_as(world.info.user), connect_as(world.info.user)
    searcher.execute("set lock_timeout = '1s'")
    with deleter.transaction():  # the deleting transaction stays open: searches go on
        deleter.execute("select * from kb.delete_knowledge_base('bob-private')")
        locks = deleter.execute(
            "select mode from pg_locks where relation = 'kb.embeddings'::regclass and pid = pg_backend_pid()"
        ).fetchall()
        assert ("AccessExclusiveLock",) not in locks
        vector = "[" + ",".join(map(str, unit(1))) + "]"
        found = searcher.execute(
            "select count(*) from kb.vector_search('x', 3, query_embedding => %s::vector)", [vector]
        )
        assert found.fetchone()[0] >= 0
    assert set(rows_of(world, target).values()) == {0}
    assert world.execute("select index_name, problem from kb_admin.index_problems()").fetchall() == [(index, "stale")]
    with searcher.transaction():  # a search still running: DROP INDEX CONCURRENTLY waits for it, no search for it
        searcher.execute("select count(*) from kb.embeddings").fetchone()
        started = time.monotonic()
        left = maintain_vector_indexes(world)
        waited = time.monotonic() - started
    assert left == [(index, left[0][1])] and left[0][1].startswith("not dropped: left for the next"), left
    assert 4 <= waited < 30
    assert world.execute("show lock_timeout").fetchone() == ("0",)  # the caller's, again
    assert maintain_vector_indexes(world) == [(index, "dropped (no longer expected)")]
    assert world.execute("select * from kb_admin.index_problems()").fetchall() == []


def test_bm25_scores_of_the_other_knowledge_bases_stay_as_they_were(world, as_):
    """BM25's N, average length and document frequencies are summed over the knowledge bases searched: deleting
    one the searcher cannot see changes none of their scores, and once it is gone an administrator's search of
    every knowledge base scores exactly as alice's of hers (the deleted one no longer counts)."""
    alice = as_("alice")
    mine = lexical_scores(alice)
    one_by_one = {name: lexical_scores(world, name) for name in KBS if name != "bob-private"}
    everything = lexical_scores(world)
    assert {k for k, *_ in everything} == set(KBS)
    assert {key: everything[key] for key in mine} != mine  # bob's chunks count in the administrator's search

    world.execute("select kb.delete_knowledge_base('bob-private')")

    assert lexical_scores(alice) == mine
    assert {name: lexical_scores(world, name) for name in one_by_one} == one_by_one
    assert lexical_scores(world) == mine
    assert_bm25_statistics_consistent(world)


def test_scores_stay_through_renames_and_changes_of_visibility_and_owner(world, as_):
    before = lexical_scores(world, "eng-team")
    world.execute("select kb.set_knowledge_base_visibility('eng-team', 'public')")
    world.execute("select kb.set_knowledge_base_owner('eng-team', 'carol')")
    world.execute("select kb.rename_knowledge_base('eng-team', 'renamed')")
    after = lexical_scores(world, "renamed")
    assert {(d, i): s for (_, d, i), s in after.items()} == {(d, i): s for (_, d, i), s in before.items()}
    assert lexical_scores(as_("carol"), "renamed") == after
    assert_bm25_statistics_consistent(world)
    assert world.execute("select * from kb_admin.index_problems()").fetchall() == []


# ------------------------------------------------------------------- owner, team member, other user

CHANGES = {
    "delete": ("select * from kb.delete_knowledge_base(%s)", []),
    "visibility": ("select kb.set_knowledge_base_visibility(%s, 'public')", []),
    "team": ("select kb.set_knowledge_base_visibility(%s, 'team', 'eng')", []),
    "owner": ("select kb.set_knowledge_base_owner(%s, %s)", ["bob"]),
    "rename": ("select kb.rename_knowledge_base(%s, 'renamed')", []),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_team_member_may_write_but_not_change_or_delete(world, as_, change):
    sql, extra = CHANGES[change]
    before = state(world)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='only the owner of knowledge base "eng-team"'):
        as_("bob").execute(sql, ["eng-team", *extra])
    assert state(world) == before
    assert listed(as_("bob"))["eng-team"][-1] is True  # bob still writes there


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_reader_who_is_not_the_owner_may_not_change_it(world, as_, change):
    sql, extra = CHANGES[change]
    before = state(world)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='only the owner of knowledge base "public-kb"'):
        as_("alice").execute(sql, ["public-kb", *extra])
    assert state(world) == before


@pytest.mark.parametrize("principal", ["carol", "mallory"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_another_users_knowledge_base_reads_like_a_missing_one(world, as_, principal, change):
    sql, extra = CHANGES[change]
    conn = as_(principal)
    before = state(world)
    with pytest.raises(psycopg.errors.NoDataFound, match='unknown knowledge base "eng-team"'):
        conn.execute(sql, ["eng-team", *extra])
    assert_reads_alike(conn, sql, lambda name: [name, *extra], "eng-team", "no-such-kb")
    assert state(world) == before


def test_the_owner_changes_visibility_team_owner_and_name(world, as_):
    alice, bob, carol = as_("alice"), as_("bob"), as_("carol")
    alice.execute("select kb.set_knowledge_base_visibility('alice-private', 'team', 'eng')")
    assert listed(bob)["alice-private"] == ("team", "alice", "eng", True)
    alice.execute("select kb.set_knowledge_base_visibility('alice-private', 'public')")  # keeps its team
    assert listed(carol)["alice-private"] == ("public", "alice", "eng", False)
    alice.execute("select kb.set_knowledge_base_visibility('alice-private', 'private')")  # taken back
    assert "alice-private" not in listed(carol) and "alice-private" not in listed(bob)
    alice.execute("select kb.set_knowledge_base_visibility('alice-private', 'team')")  # its team again
    assert listed(bob)["alice-private"][:3] == ("team", "alice", "eng")

    alice.execute("select kb.rename_knowledge_base('alice-private', 'alice-notes')")
    assert "alice-notes" in listed(alice) and "alice-private" not in listed(alice)
    alice.execute("select kb.rename_knowledge_base('alice-notes', 'alice-notes')")  # the same name: nothing to do

    alice.execute("select kb.set_knowledge_base_owner('alice-notes', 'bob')")  # a member of her team
    assert listed(bob)["alice-notes"] == ("team", "bob", "eng", True)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # no longer hers: she is only in its team
        alice.execute("select kb.rename_knowledge_base('alice-notes', 'x')")
    bob.execute("select kb.set_knowledge_base_visibility('alice-notes', 'private')")
    assert "alice-notes" not in listed(alice)
    bob.execute("select * from kb.delete_knowledge_base('alice-notes')")
    assert "alice-notes" not in listed(world)


def test_an_owner_hands_over_only_to_members_of_their_teams(world, as_):
    alice = as_("alice")
    before = state(world)
    with pytest.raises(psycopg.errors.NoDataFound, match='no member of your teams is called "carol"'):
        alice.execute("select kb.set_knowledge_base_owner('alice-private', 'carol')")
    assert_reads_alike(
        alice, "select kb.set_knowledge_base_owner('alice-private', %s)", lambda name: [name], "carol", "nobody"
    )
    assert state(world) == before
    alice.execute("select kb.set_knowledge_base_owner('alice-private', 'alice')")  # to herself: nothing changes
    assert state(world) == before


def test_an_owner_shares_only_with_their_own_teams(world, as_):
    carol = as_("carol")  # owns public-kb, is in ops, not in eng
    before = state(world)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='you are not a member of a team "eng"'):
        carol.execute("select kb.set_knowledge_base_visibility('public-kb', 'team', 'eng')")
    assert_reads_alike(
        carol,
        "select kb.set_knowledge_base_visibility('public-kb', 'team', %s)",
        lambda name: [name],
        "eng",
        "no-such-team",
    )
    assert state(world) == before
    carol.execute("select kb.set_knowledge_base_visibility('public-kb', 'team', 'ops')")
    assert listed(carol)["public-kb"][:3] == ("team", "carol", "ops")
    assert "public-kb" not in listed(as_("alice"))


def test_an_administrator_changes_anyones_knowledge_base(world, as_):
    world.execute("select kb.set_knowledge_base_visibility('bob-private', 'team', 'ops')")  # bob is not in ops
    assert listed(as_("carol"))["bob-private"] == ("team", "bob", "ops", True)
    world.execute("select kb.set_knowledge_base_owner('bob-private', 'carol')")  # to anyone
    world.execute("select kb.rename_knowledge_base('bob-private', 'ops-notes')")
    assert listed(as_("carol"))["ops-notes"] == ("team", "carol", "ops", True)
    assert "ops-notes" not in listed(as_("bob"))
    with pytest.raises(psycopg.errors.NoDataFound, match='unknown pgkb user "nobody"'):
        world.execute("select kb.set_knowledge_base_owner('ops-notes', 'nobody')")
    with pytest.raises(psycopg.errors.NoDataFound, match='unknown team "nope"'):
        world.execute("select kb.set_knowledge_base_visibility('ops-notes', 'team', 'nope')")


def test_create_knowledge_base_keeps_the_same_rule(world, as_):
    """kb.create_knowledge_base on an existing name changes visibility and team by the same rule: the owner and
    administrators, not the team's members."""
    before = state(world)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only the owner"):
        as_("bob").execute("select kb.create_knowledge_base('eng-team', 'public')")
    assert state(world) == before
    as_("alice").execute("select kb.create_knowledge_base('eng-team', 'public')")
    assert listed(as_("carol"))["eng-team"][:2] == ("public", "alice")


# --------------------------------------------------------------------------------------- bad input

LONG = "k" * 101


@pytest.mark.parametrize(
    ("sql", "params", "error", "message"),
    [
        (
            "select * from kb.delete_knowledge_base(%s)",
            [None],
            "InvalidParameterValue",
            "a knowledge base name is needed",
        ),
        ("select * from kb.delete_knowledge_base(%s)", [""], "InvalidParameterValue", "got a blank one"),
        ("select * from kb.delete_knowledge_base(%s)", [ZERO_WIDTH], "InvalidParameterValue", "got a blank one"),
        ("select * from kb.delete_knowledge_base(%s)", [LONG], "InvalidParameterValue", "101 characters long"),
        ("select * from kb.delete_knowledge_base(%s)", ["nope"], "NoDataFound", 'unknown knowledge base "nope"'),
        (
            "select kb.set_knowledge_base_visibility('eng-team', %s)",
            [None],
            "InvalidParameterValue",
            "invalid visibility",
        ),
        ("select kb.set_knowledge_base_visibility('eng-team', %s)", ["secret"], "InvalidParameterValue", '"secret"'),
        (
            "select kb.set_knowledge_base_visibility('eng-team', 'team', %s)",
            [" "],
            "InvalidParameterValue",
            "team name",
        ),
        (
            "select kb.set_knowledge_base_visibility('eng-team', 'team', %s)",
            [LONG],
            "InvalidParameterValue",
            "team name",
        ),
        (
            "select kb.set_knowledge_base_visibility(%s, 'team')",
            ["alice-private"],
            "InvalidParameterValue",
            "needs a team",
        ),
        ("select kb.set_knowledge_base_owner('eng-team', %s)", [None], "InvalidParameterValue", "a pgkb user name"),
        ("select kb.set_knowledge_base_owner('eng-team', %s)", [ZERO_WIDTH], "InvalidParameterValue", "blank"),
        ("select kb.set_knowledge_base_owner('eng-team', %s)", ["nobody"], "NoDataFound", '"nobody"'),
        (
            "select kb.rename_knowledge_base('eng-team', %s)",
            [None],
            "InvalidParameterValue",
            "invalid knowledge base name",
        ),
        (
            "select kb.rename_knowledge_base('eng-team', %s)",
            ["has space"],
            "InvalidParameterValue",
            "invalid knowledge",
        ),
        ("select kb.rename_knowledge_base('eng-team', %s)", [LONG], "InvalidParameterValue", "invalid knowledge base"),
        ("select kb.rename_knowledge_base('eng-team', %s)", ["bob-private"], "UniqueViolation", "is not available"),
        ("select kb.rename_knowledge_base(%s, 'x')", [""], "InvalidParameterValue", "a knowledge base name is needed"),
        ("select kb.remove_team_member(%s, 'bob')", [None], "InvalidParameterValue", "a team name is needed"),
        ("select kb.remove_team_member('eng', %s)", [ZERO_WIDTH], "InvalidParameterValue", "a pgkb user name"),
        ("select kb.remove_team_member(%s, 'bob')", ["nope"], "NoDataFound", 'unknown team "nope"'),
        ("select kb.remove_team_member('eng', %s)", ["nobody"], "NoDataFound", 'unknown pgkb user "nobody"'),
        ("select kb.remove_user(%s)", [None], "InvalidParameterValue", "a pgkb user name is needed"),
        ("select kb.remove_user(%s)", [LONG], "InvalidParameterValue", "101 characters long"),
        ("select kb.remove_user(%s)", ["nobody"], "NoDataFound", 'unknown pgkb user "nobody"'),
        ("select kb.remove_user('alice', %s)", [""], "InvalidParameterValue", "got a blank one"),
        ("select kb.remove_user('alice', %s)", ["nobody"], "NoDataFound", '"nobody" (transfer_to)'),
        ("select kb.remove_user('alice', %s)", ["alice"], "InvalidParameterValue", "the user being removed"),
        ("select kb.remove_user(%s)", ["alice"], "DependentObjectsStillExist", "owns 2 knowledge base(s)"),
    ],
)
def test_bad_input_is_a_clear_error_that_changes_nothing(world, sql, params, error, message):
    before = state(world)
    with pytest.raises(getattr(psycopg.errors, error)) as e:
        world.execute(sql, params)
    assert message in str(e.value)
    assert state(world) == before


# ------------------------------------------------------------------------------ teams and users


def test_remove_team_member(world, as_):
    bob, carol = as_("bob"), as_("carol")
    assert "eng-team" in listed(bob)
    assert world.execute("select kb.remove_team_member('eng', 'bob')").fetchone() == (True,)
    assert world.execute("select kb.remove_team_member('eng', 'bob')").fetchone() == (False,)  # not in it any more
    assert "eng-team" not in listed(bob)
    with pytest.raises(psycopg.errors.UniqueViolation, match="is not available"):  # as for any name not his
        bob.execute("select kb.replace_document('eng-team', 'x.md', 'x', '[{\"content\": \"x\"}]'::jsonb)")
    # the owner keeps what she owns in the team
    world.execute("select kb.remove_team_member('eng', 'alice')")
    assert listed(as_("alice"))["eng-team"] == ("team", "alice", "eng", True)
    # a user may leave a team of their own, and nothing else
    before = state(world)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only pgkb administrators may remove other users"):
        carol.execute("select kb.remove_team_member('ops', 'alice')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only pgkb administrators"):
        as_("mallory").execute("select kb.remove_team_member('ops', 'carol')")
    assert state(world) == before
    assert carol.execute("select kb.remove_team_member('ops', 'carol')").fetchone() == (True,)
    assert carol.execute("select * from kb.whoami()").fetchone()[2] == []


def test_a_team_or_user_one_may_not_name_reads_like_a_missing_one(world, as_):
    carol = as_("carol")  # in ops, not in eng
    leave = "select kb.remove_team_member(%s, 'carol')"
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='you are not a member of a team "eng"'):
        carol.execute(leave, ["eng"])
    assert_reads_alike(carol, leave, lambda name: [name], "eng", "no-such-team")
    assert_reads_alike(carol, "select kb.remove_team_member('eng', %s)", lambda name: [name], "alice", "nobody")
    assert_reads_alike(carol, "select kb.remove_user(%s)", lambda name: [name], "alice", "nobody")


@pytest.fixture
def dave(world):
    """A pgkb user of their own login role (made and dropped here: role grants are cluster-wide), with a team,
    an API key and a knowledge base."""
    role = f"lifecycle_{uuid.uuid4().hex[:8]}"
    world.execute(f"create role {role} login")
    world.execute("select kb.create_user('dave', %s)", [role])
    world.execute("select kb.add_team_member('ops', 'dave')")
    world.execute("select kb.create_api_key('dave', 'laptop', now() + interval '1 day')")
    world.execute("select kb.create_knowledge_base('dave-kb', 'team', team => 'ops', owner => 'dave')")
    world.execute("select kb.replace_document('dave-kb', 'd.md', 'd', %s::jsonb)", [chunks_for(5, 0)])
    info = world.info
    with psycopg.connect(host=info.host, port=info.port, user=role, dbname=info.dbname, autocommit=True) as conn:
        conn.execute("select kb.glossary_add('dave-kb', array['sharedword', 'davesword'])")  # created_by dave
    yield role
    world.execute(f"drop role {role}")


def test_removing_a_user_is_refused_while_they_own_knowledge_bases(world, dave):
    before = state(world)
    with pytest.raises(psycopg.errors.DependentObjectsStillExist, match='"dave" owns 1 knowledge base') as e:
        world.execute("select kb.remove_user('dave')")
    assert "transfer_to" in e.value.diag.message_hint
    assert state(world) == before


def test_removing_a_user_hands_their_knowledge_bases_over_and_takes_their_keys_and_teams(world, dave, connect_as):
    assert world.execute("select pg_has_role(%s, 'pgkb_user', 'member')", [dave]).fetchone() == (True,)
    scores = lexical_scores(world, "dave-kb")
    assert world.execute("select kb.remove_user('dave', transfer_to => 'carol')").fetchone() == (1,)
    assert world.execute("select count(*) from kb.users where name = 'dave'").fetchone() == (0,)
    assert world.execute("select count(*) from kb.api_keys").fetchone() == (0,)
    assert world.execute(
        "select t.name, u.name from kb.memberships m join kb.teams t on t.id = m.team_id"
        " join kb.users u on u.id = m.user_id where t.name = 'ops'"
    ).fetchall() == [("ops", "carol")]
    assert listed(world)["dave-kb"] == ("team", "carol", "ops", True)
    assert world.execute("select created_by from kb.glossary").fetchall() == [(None,)]
    assert lexical_scores(world, "dave-kb") == scores
    # the login role stays but is no pgkb user any more: it reaches nothing
    assert world.execute("select pg_has_role(%s, 'pgkb_user', 'member')", [dave]).fetchone() == (False,)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="schema kb"):
        connect_as(dave).execute("select * from kb.list_knowledge_bases()")


def test_only_administrators_remove_users_and_not_themselves(world, as_, dave):
    before = state(world)
    for principal in ("alice", "carol", "mallory"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only pgkb administrators may remove users"):
            as_(principal).execute("select kb.remove_user('bob', transfer_to => 'alice')")
    admin_user = world.execute("select name from kb.users where db_role = current_user").fetchone()[0]
    with pytest.raises(psycopg.errors.ObjectInUse, match="the one this session acts as"):
        world.execute("select kb.remove_user(%s)", [admin_user])
    assert state(world) == before


def test_list_users_and_teams_show_what_the_caller_may_see(world, as_):
    users = {r[0]: r[1:5] for r in world.execute("select * from kb.list_users()")}
    assert users["alice"] == ("alice", False, ["eng"], ["alice-private", "eng-team"])
    assert users["carol"] == ("carol", False, ["ops"], ["public-kb"])
    assert {r[0] for r in world.execute("select * from kb.list_users()")} >= {"alice", "bob", "carol"}
    assert as_("bob").execute("select name, teams, knowledge_bases from kb.list_users()").fetchall() == [
        ("bob", ["eng"], ["bob-private"])
    ]
    assert as_("mallory").execute("select * from kb.list_users()").fetchall() == []
    teams = {r[0]: r[1] for r in world.execute("select name, members from kb.list_teams()")}
    assert teams == {"eng": ["alice", "bob"], "ops": ["carol"]}
    assert as_("alice").execute("select name, members from kb.list_teams()").fetchall() == [("eng", None)]
    assert as_("mallory").execute("select * from kb.list_teams()").fetchall() == []
