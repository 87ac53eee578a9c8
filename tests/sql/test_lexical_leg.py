"""The posting-block BM25 legs (kb_internal.lexical_leg in SQL, kb_internal.lexical_leg_numpy with numpy) against
exact BM25 (kb_internal.lexical_leg_scan without a probe budget), the engine choice, and the posting blocks kept
exact by kb.replace_document / kb.delete_document."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import psycopg
import pytest
from chunk_terms import CHUNK_TERMS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgkb.config import Settings
from pgkb.migrate import migrate
from term_dictionary import TERM_DICTIONARY

EXACT_BUDGET = 1_000_000_000
# a Zipf-like vocabulary: a few words in most chunks, many in few; CJK text gives bigrams
WORDS = [f"w{i}" for i in range(60)]
CJK = "缓存击穿数据库连接超时退款政策登录态失效排查网关限流"
LEG = "select chunk_id, score from kb_internal.lexical_leg(%s, %s, %s, null, %s, %s)"
LEG_BUDGET = "select chunk_id, score from kb_internal.lexical_leg(%s, %s, %s, null, %s, %s, %s)"
NUMPY = "select chunk_id, score from kb_internal.lexical_leg_numpy(%s, %s, %s, null, %s, %s)"
SCAN = f"select chunk_id, score from kb_internal.lexical_leg_scan(%s, %s, %s, null, %s, %s, {EXACT_BUDGET})"


def chunk_text(rnd: random.Random) -> str:
    words = [WORDS[min(int(rnd.paretovariate(0.8)) - 1, len(WORDS) - 1)] for _ in range(rnd.randint(1, 60))]
    if rnd.random() < 0.5:
        start = rnd.randrange(len(CJK) - 2)
        words.append(CJK[start : start + rnd.randint(2, 8)])
    return " ".join(words)


def write_doc(conn, kb: str, key: str, rnd: random.Random, chunks: int | None = None) -> None:
    n = chunks or rnd.randint(1, 6)
    conn.execute(
        "select kb.replace_document(%s, %s, 'title', %s::jsonb)",
        [kb, key, json.dumps([{"content": chunk_text(rnd)} for _ in range(n)])],
    )


def kb_ids(conn, *names: str) -> list[int]:
    return [
        r[0] for r in conn.execute("select id from kb.knowledge_bases where name = any(%s) order by id", [list(names)])
    ]


def assert_same_ranking(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    """Equal up to float rounding: the same scores rank by rank, every chunk with its exact score, and the
    same chunks except among those tying (within 1e-9) with the last one returned; the order among tying
    chunks (by id) may differ in the last bits of the sums."""
    assert len(got) == len(want)
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-9, abs=1e-12)
    exact = dict(want)
    for chunk, score in got:
        if chunk in exact:
            assert score == pytest.approx(exact[chunk], rel=1e-9, abs=1e-12)
    if want:
        last = want[-1][1]
        assert {c for c, s in got if s > last + 1e-9} == {c for c, s in want if s > last + 1e-9}
        assert all(s == pytest.approx(last, rel=1e-9) for c, s in got if c not in exact)


@pytest.fixture
def corpus(db):
    rnd = random.Random(12)
    for d in range(40):
        write_doc(db, "kb-a" if d % 4 else "kb-b", f"doc{d}.md", rnd, rnd.randint(1, 12))
    db.execute("analyze kb.postings")
    return db


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.sampled_from([*WORDS, "absentword"]), min_size=1, max_size=12),
    cjk=st.one_of(st.none(), st.tuples(st.integers(0, len(CJK) - 3), st.integers(2, 12))),
    n=st.integers(1, 100),
    both=st.booleans(),
    params=st.sampled_from([(1.2, 0.75), (1.2, 0.75), (0.0, 0.0), (2.0, 1.0), (0.5, 0.3)]),
    # the fuzzy leg's corrections: terms (some also in the query, some absent) with weights
    expansions=st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from([*WORDS, "absentword", *(CJK[i : i + 2] for i in range(len(CJK) - 1))]),
            st.floats(0.5, 1.0),
            max_size=6,
        ),
    ),
)
@pytest.mark.parametrize("leg", ["lexical_leg", "lexical_leg_numpy"], ids=["sql", "numpy"])
def test_blocks_legs_equal_exact_bm25(corpus, leg, words, cjk, n, both, params, expansions):
    """Both posting-block engines return exact BM25's top n (the scan leg without a probe budget), with
    and without weighted corrections (the fuzzy leg)."""
    query = " ".join(words) + (f" {CJK[cjk[0] : cjk[0] + cjk[1]]}" if cjk else "")
    ids = kb_ids(corpus, "kb-a", "kb-b") if both else kb_ids(corpus, "kb-a")
    extra = json.dumps(expansions) if expansions is not None else None
    got = corpus.execute(
        f"select chunk_id, score from kb_internal.{leg}(%s, %s, %s, null, %s, %s, expansions => %s)",
        [query, ids, n, *params, extra],
    ).fetchall()
    want = corpus.execute(
        f"select chunk_id, score from kb_internal.lexical_leg_scan(%s, %s, %s, null, %s, %s, {EXACT_BUDGET}, %s)",
        [query, ids, n, *params, extra],
    ).fetchall()
    assert_same_ranking(got, want)


def test_a_corrections_weight_scales_its_terms_bm25(corpus):
    """A correction of weight w adds w times the BM25 its term would add as a query term; a correction
    that is also a query term keeps weight 1."""
    ids = kb_ids(corpus, "kb-a")
    scan = (
        f"select chunk_id, score from kb_internal.lexical_leg_scan(%s, %s, 1000, null, 1.2, 0.75, {EXACT_BUDGET}, %s)"
    )
    alone = dict(corpus.execute(scan, ["w7", ids, None]).fetchall())
    both = dict(corpus.execute(scan, ["w3 w7", ids, None]).fetchall())
    w3 = dict(corpus.execute(scan, ["w3", ids, None]).fetchall())
    corrected = dict(corpus.execute(scan, ["w3", ids, json.dumps({"w7": 0.5})]).fetchall())
    assert alone and set(corrected) == set(both)
    for chunk, score in corrected.items():
        assert score == pytest.approx(w3.get(chunk, 0) + 0.5 * alone.get(chunk, 0), rel=1e-9)
    assert dict(corpus.execute(scan, ["w3 w7", ids, json.dumps({"w7": 0.5})]).fetchall()) == pytest.approx(both)


def test_common_terms_lists_are_not_read(db):
    """The point of the blocks: one rare and three common words, top 3: the leg reads the rare word's
    postings (from its kb.term_stats row), not the common words' lists (no block row fetched through
    kb.postings' index, counted by the executor in this transaction), and answers exact BM25."""
    for d in range(12):
        db.execute(
            "select kb.replace_document('zipf', %s, '', %s::jsonb)",
            [
                f"d{d}.md",
                json.dumps(
                    [
                        {"content": f"common1 common2 common3 filler{i % 7}" + (" rareword" if i == d else "")}
                        for i in range(50)
                    ]
                ),
            ],
        )
    ids = kb_ids(db, "zipf")
    query = "rareword common1 common2 common3"
    blocks = dict(
        db.execute(
            "select term, count(*) from kb.postings where term = any(%s) group by term",
            [["rareword", "common1", "common2", "common3"]],
        ).fetchall()
    )
    assert blocks["common1"] >= 3  # 600 postings: several blocks per list
    assert "rareword" not in blocks  # 12 postings: all recent, in its kb.term_stats row
    with db.transaction():
        fetched = "select pg_stat_get_xact_tuples_fetched('kb.postings_pkey'::regclass)"
        before = db.execute(fetched).fetchone()[0]
        got = db.execute(LEG, [query, ids, 3, 1.2, 0.75]).fetchall()
        read = db.execute(fetched).fetchone()[0] - before
    assert read == 0
    assert_same_ranking(got, db.execute(SCAN, [query, ids, 3, 1.2, 0.75]).fetchall())


def postings_of(conn) -> set[tuple]:
    """Every posting, from the blocks and from the terms' recent postings; each one in one place only."""
    rows = conn.execute(
        "select p.kb_id, p.term, p.tier, x.id, x.tf, x.dl from kb.postings p,"
        " kb_internal.decode_postings(p.tier, p.first_chunk, p.n, p.payload) x (id, tf, dl)"
        " union all"
        f" select s.kb_id, s.term, kb_internal.posting_tier(x.tf, x.dl), x.id, x.tf, x.dl from {TERM_DICTIONARY} as s,"
        " unnest(s.recent_ids, s.recent_tfs, s.recent_dls) x (id, tf, dl)"
    ).fetchall()
    assert len(rows) == len(set(rows))
    return set(rows)


def postings_from_chunks(conn) -> set[tuple]:
    return set(
        conn.execute(
            "select x.kb_id, x.term, kb_internal.posting_tier(x.tf, x.term_count), x.id, x.tf, x.term_count"
            f" from {CHUNK_TERMS} as x"
        ).fetchall()
    )


def assert_postings_exact(conn) -> None:
    assert postings_of(conn) == postings_from_chunks(conn)
    # blocks: 1..block size postings, ids ascending from first_chunk (their lowest id), payload length a
    # whole number of postings, disjoint and in id order within a list
    bad = conn.execute(
        "select count(*) from kb.postings p cross join lateral ("
        "  select count(*) as n, min(d.chunk_id) as lo, bool_and(d.chunk_id > coalesce(d.prev, -1)) as ascending"
        "  from (select x.chunk_id, lag(x.chunk_id) over () as prev"
        "        from kb_internal.decode_postings(p.tier, p.first_chunk, p.n, p.payload) x) d) x"
        " where p.n not between 1 and kb_internal.posting_block_size() or x.n <> p.n or x.lo <> p.first_chunk"
        "  or not x.ascending or octet_length(p.payload) % p.n <> 0"
    ).fetchone()[0]
    assert bad == 0
    overlapping = conn.execute(
        "select count(*) from (select (select max(x.chunk_id)"
        "   from kb_internal.decode_postings(p.tier, p.first_chunk, p.n, p.payload) x) as hi,"
        " lead(first_chunk) over (partition by kb_id, term, tier order by first_chunk) as next_lo"
        " from kb.postings p) b where hi >= next_lo"
    ).fetchone()[0]
    assert overlapping == 0
    tiers = conn.execute(
        "select count(*) from (select kb_id, term, bit_or(1::bigint << tier) as t from kb.postings group by 1, 2) p"
        f" join {TERM_DICTIONARY} as s using (kb_id, term) where p.t & ~s.tiers <> 0"
    ).fetchone()[0]
    assert tiers == 0  # term_stats.tiers holds every tier with postings
    # recent postings: aligned, fewer than the limit, all newer than the term's blocks, whose
    # highest id blocked_to covers
    bad = conn.execute(
        f"select count(*) from {TERM_DICTIONARY} as s"
        " where cardinality(recent_ids) >= kb_internal.recent_postings_limit()"
        " or cardinality(recent_ids) <> cardinality(recent_tfs) or cardinality(recent_tfs) <> cardinality(recent_dls)"
        " or (tiers & (select coalesce(bit_or(1::bigint << kb_internal.posting_tier(x.tf, x.dl)), 0)"
        "     from unnest(recent_tfs, recent_dls) x (tf, dl))) <>"
        "    (select coalesce(bit_or(1::bigint << kb_internal.posting_tier(x.tf, x.dl)), 0)"
        "     from unnest(recent_tfs, recent_dls) x (tf, dl))"
        " or exists (select from kb.postings p, kb_internal.decode_postings(p.tier, p.first_chunk, p.n, p.payload) x"
        "     where p.kb_id = s.kb_id and p.term = s.term"
        "     and (x.chunk_id >= s.recent_ids[1] or s.blocked_to is null or x.chunk_id > s.blocked_to))"
    ).fetchone()[0]
    assert bad == 0


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["replace", "delete"]), st.integers(0, 9), st.integers(1, 40)), min_size=1, max_size=8
    ),
    seed=st.integers(0, 10_000),
)
def test_writes_keep_postings_exact(db, ops, seed):
    rnd = random.Random(seed)
    for op, doc, chunks in ops:
        kb = "kb-w" if doc % 3 else "kb-v"
        if op == "replace":
            write_doc(db, kb, f"d{doc}.md", rnd, chunks)
        elif kb_ids(db, kb):
            db.execute("select kb.delete_document(%s, %s)", [kb, f"d{doc}.md"])
    assert_postings_exact(db)
    # and the leg over the written state is exact BM25
    ids = kb_ids(db, "kb-w", "kb-v")
    for _ in range(5):
        query = chunk_text(rnd)
        want = db.execute(SCAN, [query, ids, 10, 1.2, 0.75]).fetchall()
        assert_same_ranking(db.execute(LEG, [query, ids, 10, 1.2, 0.75]).fetchall(), want)
        assert_same_ranking(db.execute(NUMPY, [query, ids, 10, 1.2, 0.75]).fetchall(), want)


@pytest.mark.slow
def test_large_lists_split_into_blocks_and_stay_exact(db):
    """More chunks with one term than a block holds: appends fill the last block, then open a new one; deleting a
    document in the middle leaves the other blocks' postings alone."""
    for d in range(12):
        db.execute(
            "select kb.replace_document('big', %s, '', %s::jsonb)",
            [f"d{d}.md", json.dumps([{"content": f"common word{d} x{i}"} for i in range(50)])],
        )
    blocks = db.execute("select count(*), max(n) from kb.postings where term = 'common'").fetchone()
    assert blocks[0] >= 2 and blocks[1] == 256
    db.execute("select kb.delete_document('big', 'd2.md')")
    db.execute("select kb.replace_document('big', 'd4.md', '', %s::jsonb)", [json.dumps([{"content": "common again"}])])
    assert_postings_exact(db)
    assert db.execute(f"select df from {TERM_DICTIONARY} as d where term = 'common'").fetchone()[0] == 50 * 10 + 1


@pytest.mark.slow
def test_migration_rebuild_matches_maintained_postings(db):
    rnd = random.Random(3)
    for d in range(8):
        write_doc(db, "kb-r", f"d{d}.md", rnd)
    db.execute("select kb.delete_document('kb-r', 'd3.md')")
    before = postings_of(db)
    tiers = db.execute(f"select term, tiers from {TERM_DICTIONARY} as d order by 1").fetchall()
    db.execute("select kb_internal.build_postings(id) from kb.knowledge_bases")
    assert postings_of(db) == before == postings_from_chunks(db)
    # rebuilt masks are exact; maintained ones may only be supersets after deletes
    for (term, kept), (term2, rebuilt) in zip(
        tiers, db.execute(f"select term, tiers from {TERM_DICTIONARY} as d order by 1").fetchall(), strict=True
    ):
        assert term == term2 and kept & rebuilt == rebuilt


def test_migrate_rebuilds_the_lists_of_an_older_format(db, tmp_path: Path):
    """A knowledge base whose lists are in an older format (migration 030 empties kb.postings) is rebuilt
    by the next `pgkb db migrate` that applies the functions: its postings again those of its chunks, in
    full blocks, format kb_internal.postings_format()."""
    rnd = random.Random(17)
    for d in range(10):
        write_doc(db, "kb-o", f"d{d}.md", rnd, 30)
    before = postings_of(db)
    db.execute("truncate kb.postings")
    db.execute("update kb.knowledge_bases set postings_format = 1")
    db_dir = tmp_path / "db"
    shutil.copytree(Settings.from_env().db_dir, db_dir)
    touched = db_dir / "functions" / "31_postings.sql"
    touched.write_text(touched.read_text() + "\n-- touched\n")
    assert migrate(db, db_dir).functions_applied
    assert postings_of(db) == before == postings_from_chunks(db)
    assert db.execute(
        "select bool_and(postings_format = kb_internal.postings_format()) from kb.knowledge_bases"
    ).fetchone()[0]
    assert_lists_are_full_blocks(db)


def alice_bob_and_a_public_kb(db, connect_as, seed: int, docs: int):
    """Users alice and bob, a public knowledge base 'shared' of random documents; their connections."""
    db.execute("select kb.create_user('alice', 'alice'), kb.create_user('bob', 'bob')")
    rnd = random.Random(seed)
    for d in range(docs):
        write_doc(db, "shared", f"d{d}.md", rnd)
    db.execute("update kb.knowledge_bases set visibility = 'public' where name = 'shared'")
    return connect_as("alice"), connect_as("bob")


def test_private_kb_changes_neither_results_nor_scores_of_others(db, connect_as):
    """df / N / avgdl are per visible knowledge base: bob's private knowledge base full of alice's query
    terms moves nothing alice sees, through the blocks leg."""
    alice, bob = alice_bob_and_a_public_kb(db, connect_as, seed=5, docs=10)
    queries = ["w0 w1 w7", "w3 缓存", "w12 w2 w0 数据库连接"]
    sql = "select chunk_id, score from kb.lexical_search(%s, 30)"
    before = [alice.execute(sql, [q]).fetchall() for q in queries]
    assert any(before)
    for d in range(5):
        bob.execute(
            "select kb.replace_document('bob-private', %s, '', %s::jsonb)",
            [f"b{d}.md", json.dumps([{"content": "w0 w1 w7 w3 缓存 w12 w2 数据库连接 " * 3}])],
        )
    assert [alice.execute(sql, [q]).fetchall() for q in queries] == before
    assert bob.execute(sql, [queries[0]]).fetchall() != before[0]


def test_lexical_leg_setting_switches_and_checks(db):
    rnd = random.Random(9)
    for d in range(5):
        write_doc(db, "kb-s", f"d{d}.md", rnd)
    sql = "select chunk_id, score from kb.lexical_search('w0 w1 w2', 20)"
    assert db.execute("select kb_admin.lexical_engine()").fetchone()[0] == "numpy"  # auto, numpy installed
    auto = db.execute(sql).fetchall()
    for method in ("numpy", "blocks", "scan"):
        db.execute("update kb.settings set value = %s where key = 'lexical_leg'", [method])
        assert db.execute("select kb_admin.lexical_engine()").fetchone()[0] == method
        got = db.execute(sql).fetchall()
        assert auto and [c for c, _ in got] == [c for c, _ in auto]
        assert [s for _, s in got] == pytest.approx([s for _, s in auto], rel=1e-9)
    db.execute("update kb.settings set value = 'fast' where key = 'lexical_leg'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="lexical_leg"):
        db.execute(sql)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=12),
    n=st.integers(1, 60),
    budget=st.integers(1, 400),
)
def test_posting_budget_bounds_the_work_and_every_score_is_exact(corpus, words, n, budget):
    """Within a posting budget the leg may stop before the bounds settle the top n: it then returns the
    best candidates it has, each with its exact BM25 score, never more than n, only chunks holding a
    query term; with the budget large enough it is the exact top n."""
    query = " ".join(words)
    ids = kb_ids(corpus, "kb-a", "kb-b")
    exact_all = dict(corpus.execute(SCAN, [query, ids, 100_000, 1.2, 0.75]).fetchall())
    got = corpus.execute(LEG_BUDGET, [query, ids, n, 1.2, 0.75, budget]).fetchall()
    assert len(got) <= n and (got or not exact_all)
    for chunk, score in got:
        assert score == pytest.approx(exact_all[chunk], rel=1e-9, abs=1e-12)
    assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    assert_same_ranking(
        corpus.execute(LEG_BUDGET, [query, ids, n, 1.2, 0.75, 10**9]).fetchall(),
        corpus.execute(SCAN, [query, ids, n, 1.2, 0.75]).fetchall(),
    )


def test_posting_budget_setting_is_checked(db):
    rnd = random.Random(4)
    write_doc(db, "kb-p", "d.md", rnd)
    db.execute("update kb.settings set value = 'blocks' where key = 'lexical_leg'")
    db.execute("update kb.settings set value = '0' where key = 'lexical_posting_budget'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="lexical_posting_budget"):
        db.execute("select * from kb.lexical_search('w0 w1', 5)")


def test_numpy_leg_applies_the_document_filter(db):
    """With a metadata filter, the numpy leg returns the best chunks of the matching documents only (the
    filter is checked best first, in batches), the same as the exact scan with the filter."""
    rnd = random.Random(21)
    for d in range(30):
        db.execute(
            "select kb.replace_document('kb-f', %s, 't', %s::jsonb, null, %s::jsonb)",
            [
                f"d{d}.md",
                json.dumps([{"content": chunk_text(rnd)} for _ in range(8)]),
                json.dumps({"team": "a" if d % 5 == 0 else "b"}),
            ],
        )
    ids = kb_ids(db, "kb-f")
    doc_filter = db.execute(
        "select kb_internal.document_filter(%s::jsonb, null)", [json.dumps({"team": "a"})]
    ).fetchone()[0]
    for query in ("w0 w1 w2 w3", "w5 w9", "w0"):
        for n in (1, 7, 40):
            got = db.execute(
                "select chunk_id, score from kb_internal.lexical_leg_numpy(%s, %s, %s, %s, 1.2, 0.75)",
                [query, ids, n, json.dumps(doc_filter)],
            ).fetchall()
            want = db.execute(
                f"select chunk_id, score from kb_internal.lexical_leg_scan(%s, %s, %s, %s, 1.2, 0.75, {EXACT_BUDGET})",
                [query, ids, n, json.dumps(doc_filter)],
            ).fetchall()
            assert_same_ranking(got, want)
            assert got


def test_search_works_without_plpython(db):
    """On a server without plpython3u (managed PostgreSQL), 'auto' picks the SQL blocks leg and every
    search still works; 'numpy' is refused with a hint."""
    rnd = random.Random(5)
    for d in range(6):
        write_doc(db, "kb-n", f"d{d}.md", rnd)
    sql = "select chunk_id, score from kb.lexical_search('w0 w1 w2', 10)"
    with_numpy = db.execute(sql).fetchall()
    db.execute("drop extension plpython3u cascade")
    assert db.execute("select kb_admin.lexical_engine()").fetchone()[0] == "blocks"
    without = db.execute(sql).fetchall()
    assert with_numpy and [c for c, _ in without] == [c for c, _ in with_numpy]
    assert [s for _, s in without] == pytest.approx([s for _, s in with_numpy], rel=1e-9)
    assert db.execute("select count(*) from kb.hybrid_search('w0 w1', 5, vector_weight => 0)").fetchone()[0] > 0
    assert db.execute("select count(*) from kb.fuzzy_search('w0', 5)").fetchone()[0] > 0
    db.execute("update kb.settings set value = 'numpy' where key = 'lexical_leg'")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="numpy"):
        db.execute(sql)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tier=st.integers(0, 59),
    gaps=st.lists(st.one_of(st.integers(1, 255), st.integers(1, 300_000), st.just(2**33)), min_size=0, max_size=300),
    seed=st.integers(0, 10_000),
)
def test_payload_round_trips_in_every_tier(db, tier, gaps, seed):
    """kb_internal.encode_postings then kb_internal.decode_postings gives the postings back, in every tier and id gap
    width (gaps below 256, 65536, 2^32 and above), with the widest tf and length classes (17+, 724+)."""
    rnd = random.Random(seed)
    tf_lo, tf_hi = [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 100_000)][tier // 10]
    floors = [0, 45, 64, 91, 128, 181, 256, 362, 512, 724, 10**6]
    ids = [rnd.randint(1, 10**12)]
    for gap in gaps[:255]:
        ids.append(ids[-1] + gap)
    tfs = [rnd.randint(tf_lo, tf_hi) for _ in ids]
    dls = [rnd.randint(floors[tier % 10], floors[tier % 10 + 1] - 1) for _ in ids]
    payload = db.execute("select kb_internal.encode_postings(%s, %s, %s, %s)", [tier, ids, tfs, dls]).fetchone()[0]
    assert all(
        kb_tier == tier
        for (kb_tier,) in db.execute(
            "select kb_internal.posting_tier(tf, dl) from unnest(%s::int[], %s::int[]) x (tf, dl)", [tfs, dls]
        ).fetchall()
    )
    assert db.execute(
        "select array_agg(chunk_id), array_agg(tf), array_agg(dl) from kb_internal.decode_postings(%s, %s, %s, %s)",
        [tier, ids[0], len(ids), payload],
    ).fetchone() == (ids, tfs, dls)


def test_ids_take_the_width_of_their_widest_gap(db):
    """A block stores id gaps in the fewest bytes its widest gap needs (format 3): 1 byte for ids at most 255
    apart, although they span far more than 255; 2 for gaps up to 65535, although the block spans more."""
    dense = [1_000_000 + 200 * i for i in range(256)]  # gaps 200, span 51,000
    sparse = [1_000_000 + 60_000 * i for i in range(40)]  # gaps 60,000, span 2.3 million
    for ids, width in ((dense, 1), (sparse, 2)):
        payload = db.execute(
            "select kb_internal.encode_postings(0, %s, %s, %s)", [ids, [1] * len(ids), [10] * len(ids)]
        ).fetchone()[0]
        # tier 0: tf implied, length 1 byte
        assert len(payload) == len(ids) * (width + 1)
        decoded = db.execute(
            "select array_agg(chunk_id order by chunk_id) from kb_internal.decode_postings(0, %s, %s, %s)",
            [ids[0], len(ids), payload],
        ).fetchone()[0]
        assert decoded == ids


@pytest.mark.slow
def test_numpy_and_sql_legs_read_wide_blocks_alike(db):
    """Blocks whose ids lie more than 65536 apart (4-byte gaps), terms repeated 17+ times and chunks of 724+
    terms: both legs equal exact BM25."""
    rnd = random.Random(8)
    for d in range(20):
        chunks = [{"content": chunk_text(rnd)} for _ in range(6)]
        chunks.append({"content": "wide " * rnd.randint(17, 40) + " ".join(WORDS[:20])})
        chunks.append({"content": " ".join(f"long{i % 300} wide" for i in range(800))})
        # 20 per document: 400 postings of 'wide' in the widest tier (tf 17+, 724+ terms), a full block
        chunks += [{"content": "wide " * rnd.randint(17, 30) + "pad " * 760} for _ in range(20)]
        db.execute("select kb.replace_document('kb-wide', %s, 't', %s::jsonb)", [f"d{d}.md", json.dumps(chunks)])
        # the next document's chunk ids lie 70,000 further (5 billion once): a list's block has gaps wider
        # than 65536 ids (4-byte gaps), one wider than 2^32 (8-byte gaps)
        gap = 5_000_000_000 if d == 10 else 70000
        db.execute(
            "select setval(pg_get_serial_sequence('kb.chunks', 'id'), (select max(id) from kb.chunks) + %s)", [gap]
        )
        # another knowledge base's chunks in the gap, holding the same term
        db.execute("select kb.replace_document('kb-other', %s, 't', %s::jsonb)", [f"o{d}.md", json.dumps(chunks[-3:])])
    assert (
        db.execute(
            "select count(*) from kb.postings where octet_length(payload) / n"
            " > (select tf_bytes + dl_bytes from kb_internal.posting_fields(tier)) + 2"
        ).fetchone()[0]
        > 0
    )
    assert (
        db.execute(
            "select count(*) from kb.postings where tier = 59 and n = kb_internal.posting_block_size()"
        ).fetchone()[0]
        > 0
    )
    assert (
        db.execute(
            "select count(*) from kb.postings where octet_length(payload) / n"
            " = (select tf_bytes + dl_bytes from kb_internal.posting_fields(tier)) + 8"
        ).fetchone()[0]
        > 0
    )
    ids = kb_ids(db, "kb-wide")
    for query in ("wide w0 w1", "long7 wide w3", "w0 w1 w2 w3 w4 long1"):
        want = db.execute(SCAN, [query, ids, 20, 1.2, 0.75]).fetchall()
        assert_same_ranking(db.execute(LEG, [query, ids, 20, 1.2, 0.75]).fetchall(), want)
        assert_same_ranking(db.execute(NUMPY, [query, ids, 20, 1.2, 0.75]).fetchall(), want)


@pytest.mark.slow
def test_another_users_private_match_moves_no_counter_or_plan(db, connect_as):
    """As alice, a BM25 search for a term only bob's private knowledge base holds and one for a term no
    one holds read the same: equal pg_stat_xact_* counters of every kb table and index, and equal
    EXPLAIN (ANALYZE, BUFFERS) of the search, through every engine. So do fuzzy and hybrid searches for a
    misspelling of bob's term (one edit away) and for a word as long that corrects to nothing: the fuzzy
    leg looks corrections up in alice's vocabulary only."""
    alice, bob = alice_bob_and_a_public_kb(db, connect_as, seed=14, docs=8)
    for d in range(70):  # enough for a block of its own in bob's lists (each text its own: no copies)
        bob.execute(
            "select kb.replace_document('bob-private', %s, '', %s::jsonb)",
            [f"b{d}.md", json.dumps([{"content": "zqxbobsecret w0 w1 " * (d % 3 + 1) + f"doc{d}"}])],
        )
    counters = (
        "select relname, seq_scan, seq_tup_read, idx_scan, idx_tup_fetch, n_tup_ins, n_tup_upd, n_tup_del"
        " from pg_stat_xact_user_tables where schemaname = 'kb' order by relname"
    )
    index_counters = (  # PostgreSQL 15 has no pg_stat_xact_user_indexes: its functions, per index
        "select c.relname, pg_stat_get_xact_numscans(c.oid), pg_stat_get_xact_tuples_returned(c.oid),"
        " pg_stat_get_xact_tuples_fetched(c.oid) from pg_class c"
        " where c.relnamespace = 'kb'::regnamespace and c.relkind = 'i' order by c.relname"
    )

    def observe(query: str, search: str = "kb.lexical_search(%s, 10)") -> tuple:
        # pending counters of earlier transactions may not be flushed yet: this search's own share is
        # the difference inside its transaction
        with alice.transaction():
            before = (alice.execute(counters).fetchall(), alice.execute(index_counters).fetchall())
            alice.execute(f"select * from {search}", [query]).fetchall()
            after = (alice.execute(counters).fetchall(), alice.execute(index_counters).fetchall())
        seen = [
            [tuple(y - x for x, y in zip(b[1:], a[1:], strict=True)) for b, a in zip(bs, as_, strict=True)]
            for bs, as_ in zip(before, after, strict=True)
        ]
        # buffer counts: the fewest of three runs (a run now and then also reads catalog pages again)
        plans = [
            alice.execute(
                f"explain (analyze, buffers, costs off, timing off, summary off) select * from {search}",
                [query],
            ).fetchall()
            for _ in range(3)
        ]
        return seen, min(plans, key=lambda p: int(p[-1][0].rsplit("=", 1)[1]))

    for engine in ("numpy", "blocks", "scan"):
        db.execute("update kb.settings set value = %s where key = 'lexical_leg'", [engine])
        # words of one shape: the lexicon looks an English word up under its forms (a plural as its singular
        # too), so a word of another shape reads another number of the lexicon's pages
        observe("zqxbobsecret")  # warm caches and plans alike
        observe("zqxnonsecret")
        assert observe("zqxbobsecret") == observe("zqxnonsecret"), engine
        for search in ("kb.fuzzy_search(%s, 10)", "kb.hybrid_search(%s, 10, vector_weight => 0)"):
            observe("zqxbobsecrex", search)
            observe("yqxbobsecrex", search)
            assert observe("zqxbobsecrex", search) == observe("yqxbobsecrex", search), (engine, search)
    # bob himself finds his chunks through the correction; alice finds nothing
    fuzzy = "select count(*) from kb.fuzzy_search('zqxbobsecrex', 10)"
    assert bob.execute(fuzzy).fetchone()[0] == 10 and alice.execute(fuzzy).fetchone()[0] == 0


def test_numpy_leg_work_is_bounded_by_its_posting_budget(corpus):
    """With lexical_numpy_posting_budget below a query's postings, the numpy leg scores the rarest terms
    whose postings fit and leaves the most common out: its answer is exact BM25 of those terms; with the
    default budget it is exact BM25 of the whole query."""
    ids = kb_ids(corpus, "kb-a", "kb-b")
    query = "w0 w1 w2 w40 w41"
    ranked = corpus.execute(
        "select term, df from kb_internal.lexical_query_terms(%s, %s) order by df, term", [query, ids]
    ).fetchall()
    assert len(ranked) >= 3 and ranked[0][1] < ranked[-1][1]
    assert_same_ranking(
        corpus.execute(NUMPY, [query, ids, 10, 1.2, 0.75]).fetchall(),
        corpus.execute(SCAN, [query, ids, 10, 1.2, 0.75]).fetchall(),
    )
    budget = ranked[0][1] + ranked[1][1]  # the two rarest fit, the third does not
    corpus.execute("update kb.settings set value = %s where key = 'lexical_numpy_posting_budget'", [str(budget)])
    kept = " ".join(t for t, _ in ranked[:2])
    got = corpus.execute(NUMPY, [query, ids, 10, 1.2, 0.75]).fetchall()
    want = corpus.execute(SCAN, [kept, ids, 10, 1.2, 0.75]).fetchall()
    assert [c for c, _ in got] == [c for c, _ in want]
    corpus.execute("update kb.settings set value = %s where key = 'lexical_numpy_posting_budget'", [str(ranked[0][1])])
    got = corpus.execute(NUMPY, [query, ids, 10, 1.2, 0.75]).fetchall()
    assert [c for c, _ in got] == [c for c, _ in corpus.execute(SCAN, [ranked[0][0], ids, 10, 1.2, 0.75]).fetchall()]


def test_numpy_leg_after_clear_and_when_no_term_fits_its_budget(corpus):
    """A knowledge base between kb_internal.clear_postings and its build (df > 0, no posting) answers nothing rather
    than an error; when not even the rarest query term fits lexical_numpy_posting_budget, the SQL leg
    answers within its own budget."""
    ids = kb_ids(corpus, "kb-a", "kb-b")
    query = "w0 w1 w2"
    corpus.execute("update kb.settings set value = '1' where key = 'lexical_numpy_posting_budget'")
    want = corpus.execute(
        "select chunk_id, score from kb_internal.lexical_leg(%s, %s, 10, null, 1.2, 0.75, 40000)", [query, ids]
    ).fetchall()
    assert want and corpus.execute(NUMPY, [query, ids, 10, 1.2, 0.75]).fetchall() == want
    corpus.execute("update kb.settings set value = '2000000' where key = 'lexical_numpy_posting_budget'")
    corpus.execute("select kb_internal.clear_postings(id) from kb.knowledge_bases where name in ('kb-a', 'kb-b')")
    assert corpus.execute(NUMPY, [query, ids, 10, 1.2, 0.75]).fetchall() == []


# glibc's view of this backend's heap after a 16 MB block was allocated, written and freed: the bytes free
# inside its heap (mallinfo2().fordblks); with a trim threshold above 16 MB the block stays there
HEAP_KEPT = """
create function pg_temp.heap_kept() returns bigint language plpython3u as $$
import ctypes

libc = ctypes.CDLL(None)
fields = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
info = type("mallinfo2", (ctypes.Structure,), {"_fields_": [(f, ctypes.c_size_t) for f in fields]})
libc.mallinfo2.restype = info
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
block = libc.malloc(16 << 20)
ctypes.memset(block, 1, 16 << 20)
libc.free(block)
return libc.mallinfo2().fordblks
$$"""


@pytest.mark.parametrize("heap_mb", [64, 0])
def test_numpy_leg_keeps_freed_memory_in_its_backend_as_set(corpus, heap_mb):
    """After its first search a backend keeps lexical_numpy_heap_mb of freed memory (glibc malloc's trim
    threshold, arrays below 32 MB from the heap): a freed 16 MB block stays in its heap; at 0 malloc is
    left as it was and the block goes back to the operating system."""
    corpus.execute("update kb.settings set value = %s where key = 'lexical_numpy_heap_mb'", [str(heap_mb)])
    info = corpus.info
    with psycopg.connect(host=info.host, port=info.port, user=info.user, dbname=info.dbname, autocommit=True) as fresh:
        assert fresh.execute(NUMPY, ["w0 w1", kb_ids(fresh, "kb-a"), 10, 1.2, 0.75]).fetchall()
        fresh.execute(HEAP_KEPT)
        kept = fresh.execute("select pg_temp.heap_kept()").fetchone()[0]
    assert (kept >= 16 << 20) == (heap_mb > 0)


@pytest.mark.parametrize("engine", ["numpy", "blocks", "scan"])
def test_both_bm25_legs_from_one_call_equal_each_leg_alone(corpus, engine):
    """kb_internal.lexical_hits with corrections and plain: its 'lexical' rows are the query's BM25 ranking, its
    'fuzzy' rows the ranking with the corrections, as each leg alone gives them (numpy ranks both from one
    read of the postings)."""
    corpus.execute("update kb.settings set value = %s where key = 'lexical_leg'", [engine])
    ids = kb_ids(corpus, "kb-a", "kb-b")
    both = "select leg, chunk_id, score from kb_internal.lexical_hits(%s, %s, 20, null, 1.2, 0.75, %s, true)"
    alone = f"select chunk_id, score from kb_internal.lexical_leg_scan(%s, %s, 20, null, 1.2, 0.75, {EXACT_BUDGET}, %s)"
    for query, extra in (("w0 w5 w9", {"w1": 0.6, "w30": 0.9}), ("absentword 缓存", {"w2": 0.5, "数据": 0.5})):
        rows = corpus.execute(both, [query, ids, json.dumps(extra)]).fetchall()
        assert {leg for leg, _, _ in rows} == {"lexical", "fuzzy"}
        for leg, terms in (("lexical", None), ("fuzzy", json.dumps(extra))):
            got = [(c, s) for g, c, s in rows if g == leg]
            assert_same_ranking(got, corpus.execute(alone, [query, ids, terms]).fetchall())
        only_fuzzy = corpus.execute(both.replace("true)", "false)"), [query, ids, json.dumps(extra)]).fetchall()
        assert {leg for leg, _, _ in only_fuzzy} == {"fuzzy"}


def built_rows(conn) -> tuple[list, list]:
    """Every posting block (payload bytes included) and every term's tiers, recent postings (as a set:
    their order is not part of the format) and blocked_to."""
    blocks = conn.execute(
        "select kb_id, term, tier, first_chunk, n, payload from kb.postings order by 1, 2, 3, 4"
    ).fetchall()
    stats = conn.execute(
        "select kb_id, term, df, tiers, blocked_to,"
        " (select coalesce(array_agg(row(x.i, x.t, x.d)::text order by x.i), '{}')"
        "  from unnest(recent_ids, recent_tfs, recent_dls) as x (i, t, d))"
        f" from {TERM_DICTIONARY} as d order by 1, 2"
    ).fetchall()
    return blocks, stats


def assert_lists_are_full_blocks(conn) -> None:
    """Every (term, tier) list is cut into full blocks from its start: only its last block has room."""
    assert (
        conn.execute(
            "select count(*) from (select n, lead(n) over (partition by kb_id, term, tier order by first_chunk)"
            " as next from kb.postings) as b where next is not null and n <> kb_internal.posting_block_size()"
        ).fetchone()[0]
        == 0
    )


def build_in_sql_steps(conn, kb: int, chunks: int) -> None:
    """kb_internal.build_postings's SQL path, `chunks` chunks a step."""
    conn.execute("select kb_internal.clear_postings(%s)", [kb])
    done_to = 0
    step = "select kb_internal.build_postings_batch(%s, %s, %s)"
    while done_to := conn.execute(step, [kb, done_to, chunks]).fetchone()[0]:
        pass


@pytest.mark.slow
def test_builders_agree_at_every_gap_width(db):
    """Lists whose chunk ids lie exactly 255, 256, 65535, 65536, 2^32 - 1 and 2^32 apart: both builders write
    the same bytes, a full block of each list in the width of its gap (1, 2, 2, 4, 4, 8 bytes) and the
    postings exact; after a delete in every list (gaps merge and widen) the writes keep them exact, and the
    numpy and SQL legs rank as exhaustive BM25."""
    gaps = {"alpha": 255, "bravo": 256, "charlie": 65535, "delta": 65536, "echo": 2**32 - 1, "foxtrot": 2**32}
    for word, g in gaps.items():
        for d in range(258):  # a full block and a last one per list (one tier: tf 1, lengths below 45)
            db.execute(
                "select kb.replace_document('kb-gaps', %s, 't', %s::jsonb)",
                [f"{word}{d}.md", json.dumps([{"content": f"every {word} " + "pad " * (d % 3)}])],
            )
            db.execute(
                "select setval(pg_get_serial_sequence('kb.chunks', 'id'), (select max(id) from kb.chunks) + %s - 1)",
                [g],
            )
    kb = kb_ids(db, "kb-gaps")[0]
    db.execute("select kb_internal.build_postings_numpy(%s)", [kb])
    with_numpy = built_rows(db)
    build_in_sql_steps(db, kb, 100000)
    assert built_rows(db) == with_numpy
    widths = db.execute(
        "select p.term, octet_length(p.payload) / p.n - f.tf_bytes - f.dl_bytes from kb.postings as p,"
        " kb_internal.posting_fields(p.tier) as f where p.term = any(%s) and p.n = kb_internal.posting_block_size()",
        [list(gaps)],
    ).fetchall()
    assert dict(widths) == dict(zip(gaps, (1, 2, 2, 4, 4, 8), strict=True))
    assert_postings_exact(db)
    for word in gaps:
        db.execute("select kb.delete_document('kb-gaps', %s)", [f"{word}100.md"])
    assert_postings_exact(db)
    for query in ("alpha delta", "every bravo pad", "echo foxtrot charlie"):
        want = db.execute(SCAN, [query, [kb], 30, 1.2, 0.75]).fetchall()
        assert_same_ranking(db.execute(LEG, [query, [kb], 30, 1.2, 0.75]).fetchall(), want)
        assert_same_ranking(db.execute(NUMPY, [query, [kb], 30, 1.2, 0.75]).fetchall(), want)


@pytest.mark.slow
def test_numpy_and_sql_builders_write_the_same_rows(db):
    """kb.build_postings with numpy (kb.build_postings_numpy) and in SQL (the function hidden, as on a server
    without plpython3u) write the same blocks byte for byte and the same term statistics, over lists in
    every tier, longer than a block and shorter than the recent-postings limit, in two knowledge bases; so
    do both when their steps are a few chunks (lists continued across steps: refilled in SQL, merged by
    numpy), and every list is cut into full blocks from its start."""
    rnd = random.Random(21)
    for d in range(30):
        write_doc(db, "kb-n" if d % 3 else "kb-m", f"d{d}.md", rnd, rnd.randint(4, 20))
    for d in range(6):  # long lists (more postings of a term than a block holds), long chunks, high tfs
        chunks = [
            f"steady q{i} " + "busy " * (i % 40 + 1) + "w1 " * (i % 9) + " ".join(f"pad{j}" for j in range(i * 7 % 800))
            for i in range(60)
        ]
        db.execute(
            "select kb.replace_document('kb-n', %s, '', %s::jsonb)",
            [f"long{d}.md", json.dumps([{"content": c} for c in chunks] + [{"content": "steady"}] * 60)],
        )
    kbs = [r[0] for r in db.execute("select id from kb.knowledge_bases order by id").fetchall()]
    with db.transaction():  # kb.build_postings takes numpy's path: it needs no SQL step
        db.execute("alter function kb_internal.build_postings_batch(integer, bigint, integer) rename to hidden_steps")
        for kb in kbs:
            db.execute("select kb_internal.build_postings(%s)", [kb])
        db.execute("alter function kb_internal.hidden_steps(integer, bigint, integer) rename to build_postings_batch")
    with_numpy = built_rows(db)
    assert db.execute("select count(*) from kb.postings where n = kb_internal.posting_block_size()").fetchone()[0] > 0
    assert db.execute("select count(distinct tier) from kb.postings").fetchone()[0] >= 20
    assert_lists_are_full_blocks(db)
    with db.transaction():
        db.execute("alter function kb_internal.build_postings_numpy(integer, integer) rename to hidden_builder")
        for kb in kbs:
            db.execute("select kb_internal.build_postings(%s)", [kb])
        in_sql = built_rows(db)
        db.execute("alter function kb_internal.hidden_builder(integer, integer) rename to build_postings_numpy")
    assert with_numpy == in_sql
    for kb in kbs:
        db.execute("select kb_internal.clear_postings(%s)", [kb])
        db.execute("select kb_internal.build_postings_numpy(%s, 7)", [kb])
    assert built_rows(db) == with_numpy
    for kb in kbs:
        build_in_sql_steps(db, kb, 5)
    assert built_rows(db) == with_numpy
    assert_postings_exact(db)
