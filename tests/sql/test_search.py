"""kb.hybrid_search and the single legs on the hand-written fixture: expected rankings checked by hand."""

from __future__ import annotations

import json

import fixture_docs
import numpy as np
import psycopg
import pytest
from chunk_terms import CHUNK_TERMS
from pgkb.migrate import SCHEMAS
from pgkb.quality.evaluate import SETTING_TYPES, SearchSettings
from pgvector import Vector
from term_dictionary import TERM_DICTIONARY

EXPANSIONS = "select kb_internal.fuzzy_expansions(%s, kb.visible_kb_ids())"  # the fuzzy leg's corrections


@pytest.fixture
def kbdb(db, embedder):
    fixture_docs.load(db, embedder)
    return db


def search(conn, sql, *params):
    cur = conn.execute(sql, params)
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def hybrid(conn, embedder, query, top_k=5, **kw):
    vec = Vector(embedder.embed(["query: " + query])[0])
    extra = "".join(f", {k} => %s" for k in kw)
    return search(
        conn,
        f"select * from kb.hybrid_search(%s, top_k => %s, query_embedding => %s{extra})",
        query,
        top_k,
        vec,
        *kw.values(),
    )


@pytest.mark.parametrize(
    ("query", "expected_doc", "leg"),
    [
        ("退款", "policy/refund.md", "lexical_rank"),  # two-character Chinese term
        ("缓存击穿", "guide/login.md", "lexical_rank"),
        ("Redis 缓存击穿", "guide/login.md", "lexical_rank"),  # mixed Chinese / English
        ("登錄態失效怎麼排查", "guide/login.md", "lexical_rank"),  # Traditional, docs are Simplified
        ("tidb_mem_quota_query", "db/tidb.md", "lexical_rank"),  # identifier
        ("ISO27001", "security/audit.md", "lexical_rank"),
        ("createUser", "security/audit.md", "lexical_rank"),
        ("tidb_mem_qouta_query", "db/tidb.md", "fuzzy_rank"),  # typo
        ("kubectl rollback", "ops/deploy.md", "lexical_rank"),  # English
        ("how do I roll back a release", "ops/deploy.md", "vector_rank"),
        ("系统响应很慢怎么优化", "perf/tuning.md", "vector_rank"),  # no shared term: vector leg only
    ],
)
def test_hybrid_ranks_expected_document_first(kbdb, embedder, query, expected_doc, leg):
    rows = hybrid(kbdb, embedder, query)
    assert rows, query
    assert rows[0]["doc_key"] == expected_doc, [(r["doc_key"], r["score"]) for r in rows]
    assert rows[0][leg] == 1
    assert rows[0]["vector_used"] is True


def test_vector_only_query_has_no_lexical_match(kbdb, embedder):
    top = hybrid(kbdb, embedder, "系统响应很慢怎么优化")[0]
    assert top["lexical_rank"] is None and top["fuzzy_rank"] is None


def leg_scores(conn, embedder, query, candidates):
    """Every hit of every leg: {leg: {chunk_id: (rank, score)}}."""
    vec = Vector(embedder.embed(["query: " + query])[0])
    out = {}
    for leg, sql, params in [
        ("vector", "select * from kb.vector_search(%s, %s, query_embedding => %s)", [query, candidates, vec]),
        ("lexical", "select * from kb.lexical_search(%s, %s)", [query, candidates]),
        ("fuzzy", "select * from kb.fuzzy_search(%s, %s)", [query, candidates]),
    ]:
        out[leg] = {r["chunk_id"]: (r[f"{leg}_rank"], r[f"{leg}_score"]) for r in search(conn, sql, *params)}
    return out


def test_result_columns_and_dbsf_score(kbdb, embedder):
    rows = hybrid(kbdb, embedder, "退款")
    top = rows[0]
    assert top["kb"] == "team-docs" and top["title"] == "退款政策"
    assert top["heading_path"] == ["规则"] and top["chunk_index"] == 0 and top["chunk_type"] == "text"
    assert top["lexical_score"] > 0 and -1 <= top["vector_score"] <= 1
    vw, lw, fw, candidates = kbdb.execute(
        "select vector_weight, lexical_weight, fuzzy_weight, candidates from kb.search_defaults()"
    ).fetchone()
    query = "退款 creatUser"  # a term to correct: the fuzzy leg joins the fusion
    rows = hybrid(kbdb, embedder, query)
    legs = leg_scores(kbdb, embedder, query, candidates)
    assert all(legs.values()), "every leg must contribute for this check"
    weights = {"vector": vw, "lexical": lw, "fuzzy": fw}

    def normalised(leg, score):
        scores = np.array([s for _, s in legs[leg].values()])
        mean, sd = scores.mean(), scores.std()
        return (score - (mean - 3 * sd)) / (6 * sd) if sd > 0 else 1.0

    for row in rows:
        expected = sum(
            weights[leg] * normalised(leg, legs[leg][row["chunk_id"]][1])
            for leg in legs
            if row["chunk_id"] in legs[leg]
        )
        assert row["score"] == pytest.approx(expected), row["doc_key"]
        for leg in legs:
            rank = legs[leg].get(row["chunk_id"], (None, None))[0]
            assert row[f"{leg}_rank"] == rank
    assert [r["score"] for r in rows] == sorted((r["score"] for r in rows), reverse=True)


ENGLISH_DOCS = {"ops/deploy.md"}  # the fixture's one document titled and headed in Latin letters


def test_rrf_fusion_score(kbdb, embedder):
    rows = hybrid(kbdb, embedder, "退款多久到账", fusion="rrf", rrf_k=30, lexical_weight=2.0, top_k=10)
    assert {r["doc_key"] for r in rows} & ENGLISH_DOCS and not any(r["fuzzy_rank"] for r in rows)
    for row in rows:
        vector, lexical = (1 / (30 + r) if r else 0.0 for r in (row["vector_rank"], row["lexical_rank"]))
        if row["doc_key"] in ENGLISH_DOCS:  # a Chinese query: BM25 counts as agreeing with the vector leg
            lexical = max(lexical, vector)
        assert row["score"] == pytest.approx(vector + 2.0 * lexical), row["doc_key"]
    assert [r["score"] for r in rows] == sorted((r["score"] for r in rows), reverse=True)


@pytest.mark.parametrize(
    ("query", "other_script"),
    [
        ("退款规则是什么", ENGLISH_DOCS),  # a Chinese question: BM25 cannot match the English document
        ("how do I roll back a release", {d[0] for d in fixture_docs.DOCS} - ENGLISH_DOCS),
        ("kubectl 回滚", set()),  # both scripts: any document could match a term
        ("部署", set()),  # one term: a keyword query, which a text in the other script may hold
    ],
)
def test_a_script_the_query_lacks_counts_the_term_legs_as_agreeing(kbdb, embedder, query, other_script):
    """The term legs cannot match text in a script the query is not written in, so for a chunk in such a
    script BM25 counts its own share or the vector leg's, whichever is larger (a term hit never lowers it);
    the rest is plain DBSF. Checked against the legs' own scores."""
    rows = hybrid(kbdb, embedder, query, top_k=10, fuzzy_weight=0.0)
    legs = leg_scores(kbdb, embedder, query, 80)

    def share(leg, row):
        if row[f"{leg}_rank"] is None:
            return 0.0
        scores = np.array([s for _, s in legs[leg].values()])
        mean, sd = scores.mean(), scores.std()
        return (legs[leg][row["chunk_id"]][1] - (mean - 3 * sd)) / (6 * sd) if sd > 0 else 1.0

    lifted = 0
    for row in rows:
        vector, lexical = share("vector", row), share("lexical", row)
        if row["doc_key"] in other_script and legs["lexical"]:
            lifted += vector > lexical
            lexical = max(lexical, vector)
        assert row["score"] == pytest.approx(vector + 0.6 * lexical), row["doc_key"]
    assert (lifted > 0) == bool(other_script)


def test_fusion_changes_the_order_only_through_the_scores(kbdb, embedder):
    """Both fusions rank the same candidate set; a leg given all the weight reproduces that leg."""
    for fusion in ("dbsf", "rrf"):
        only_lexical = hybrid(kbdb, embedder, "缓存击穿", fusion=fusion, vector_weight=0.0, fuzzy_weight=0.0)
        lexical = search(kbdb, "select * from kb.lexical_search('缓存击穿', 5)")
        assert [r["chunk_id"] for r in only_lexical] == [r["chunk_id"] for r in lexical]


def test_single_leg_functions_return_same_columns(kbdb, embedder):
    vec = Vector(embedder.embed(["query: 退款"])[0])
    hybrid_cols = [d.name for d in kbdb.execute("select * from kb.hybrid_search('退款', 1)").description]
    for sql, params in [
        ("select * from kb.vector_search('退款', 3, query_embedding => %s)", [vec]),
        ("select * from kb.lexical_search('退款', 3)", []),
        ("select * from kb.fuzzy_search('tidb_mem_qouta_query', 3)", []),
    ]:
        cur = kbdb.execute(sql, params)
        assert [d.name for d in cur.description] == hybrid_cols
        rows = cur.fetchall()
        assert rows, sql
    lex = search(kbdb, "select * from kb.lexical_search('退款', 3)")
    assert lex[0]["doc_key"] == "policy/refund.md"
    assert all(r["vector_rank"] is None and r["fuzzy_rank"] is None for r in lex)


def test_single_leg_top_k_is_the_head_of_a_longer_list(kbdb, embedder):
    """The lexical and fuzzy legs are asked for only top_k rows: each shorter answer is the head of a
    longer one, same rows, ranks and leg scores (and so is the vector leg's, which fetches at least 40)."""
    vec = Vector(embedder.embed(["query: 登录态失效 缓存"])[0])
    for sql, params in [
        ("select * from kb.vector_search('登录态失效 缓存', %s, query_embedding => %s)", [vec]),
        ("select * from kb.lexical_search('登录态失效 缓存 退款 部署', %s)", []),
        ("select * from kb.fuzzy_search('tidb_mem_qouta_query', %s)", []),
    ]:
        full = search(kbdb, sql, 7, *params)
        assert len(full) >= (1 if "fuzzy" in sql else 3), sql  # one fixture chunk holds tidb's terms
        keys = ["chunk_id", "vector_rank", "lexical_rank", "fuzzy_rank", "vector_score", "lexical_score", "fuzzy_score"]
        for k in range(1, len(full)):
            head = search(kbdb, sql, k, *params)
            assert [[r[c] for c in keys] for r in head] == [[r[c] for c in keys] for r in full[:k]], (sql, k)


def test_query_metacharacters_are_plain_text(kbdb):
    for query in ["& | ! ( ) : * ' \\ % _", "退款 & !", "a:* | b", "%_%", "'; drop table kb.chunks; --"]:
        kbdb.execute("select * from kb.hybrid_search(%s)", [query]).fetchall()
    assert kbdb.execute("select count(*) from kb.chunks").fetchone()[0] == 7
    rows = search(kbdb, "select * from kb.lexical_search(%s)", "退款 & !")
    assert rows[0]["doc_key"] == "policy/refund.md"


def test_bm25_statistics_follow_replacements(kbdb):
    """kb.term_stats (document frequency per term) and the knowledge base's chunk and term totals always
    equal what the stored chunks give when counted from scratch, before and after a delete and a replace."""

    def counted_from_chunks() -> dict[str, int]:
        return dict(kbdb.execute(f"select x.term, count(*) from {CHUNK_TERMS} as x group by x.term").fetchall())

    def kept() -> dict[str, int]:
        return dict(kbdb.execute(f"select term, df from {TERM_DICTIONARY} as d where df > 0").fetchall())

    def totals() -> tuple[int, int, int, int]:
        return kbdb.execute(
            "select k.chunk_count, k.term_total, (select count(*) from kb.chunks),"
            " (select sum(term_count) from kb.chunks) from kb.knowledge_bases k where k.name = 'team-docs'"
        ).fetchone()

    gone = {"原路", "签收", "quota", "tidb_mem_quota_query"}  # only in the refund and the old TiDB text
    before = counted_from_chunks()
    assert kept() == before and before["退款"] == 1 and gone <= before.keys()
    n, total, chunks, terms = totals()
    assert (n, total) == (chunks, terms) and n == 7

    kbdb.execute("select kb.delete_document('team-docs', 'policy/refund.md')")
    kbdb.execute(
        "select kb.replace_document(kb => 'team-docs', doc_key => 'db/tidb.md', title => 'TiDB',"
        ' chunks => \'[{"content": "退款 退款 退款"}]\')'
    )
    after = counted_from_chunks()
    assert kept() == after
    # the terms of the deleted and the replaced text left with them; 退款 counts the new chunk only
    assert after["退款"] == 1 and gone.isdisjoint(after)
    n, total, chunks, terms = totals()
    assert (n, total) == (chunks, terms) and n == 6


@pytest.mark.parametrize(
    ("sql", "params", "message"),
    [
        ("select * from kb.hybrid_search(%s)", [""], "must not be empty"),
        ("select * from kb.hybrid_search(%s)", [" \n\t\u3000"], "must not be empty"),
        ("select * from kb.hybrid_search(null)", [], "must not be empty"),
        ("select * from kb.hybrid_search(%s)", ["x" * 1_000_000], "at most 4000"),
        ("select * from kb.hybrid_search('退款', 0)", [], "top_k must be between 1 and 100"),
        ("select * from kb.hybrid_search('退款', 101)", [], "top_k must be between 1 and 100"),
        ("select * from kb.hybrid_search('退款', kb => 'nope')", [], 'unknown knowledge base "nope"'),
        ("select * from kb.hybrid_search('退款', model => 'nope')", [], 'unknown embedding model "nope"'),
        ("select * from kb.hybrid_search('退款', query_embedding => '[1,2,3]')", [], "has 3 dimensions"),
        ("select * from kb.hybrid_search('退款', vector_weight => -1)", [], "weights"),
        ("select * from kb.hybrid_search('退款', candidates => 0)", [], "candidates"),
        ("select * from kb.hybrid_search('退款', filter => '[1]')", [], "filter must be a JSON object"),
        ("select * from kb.lexical_search('退款', bm25_b => 2)", [], "bm25_b"),
        ("select * from kb.hybrid_search('退款', fusion => 'borda')", [], "fusion must be 'dbsf' or 'rrf'"),
        # issue 9: NaN passed "< 0" checks, Infinity passed lower bounds
        ("select * from kb.hybrid_search('退款', lexical_weight => 'NaN')", [], "weights"),
        ("select * from kb.hybrid_search('退款', lexical_weight => 'Infinity')", [], "weights"),
        ("select * from kb.hybrid_search('退款', vector_weight => 'NaN', lexical_weight => 0)", [], "weights"),
        ("select * from kb.hybrid_search('退款', fuzzy_weight => '-Infinity')", [], "weights"),
        ("select * from kb.hybrid_search('退款', vector_weight => 1e300, lexical_weight => 1e300)", [], "weights"),
        ("select * from kb.hybrid_search('退款', bm25_k1 => 'NaN')", [], "bm25_k1"),
        ("select * from kb.hybrid_search('退款', bm25_k1 => 'Infinity')", [], "bm25_k1"),
        ("select * from kb.hybrid_search('退款', bm25_b => 'NaN')", [], "bm25_b"),
        ("select * from kb.hybrid_search('退款', rrf_k => 'Infinity', fusion => 'rrf')", [], "rrf_k"),
        ("select * from kb.hybrid_search('退款', rrf_k => 'NaN')", [], "rrf_k"),
        ("select * from kb.lexical_search('退款', bm25_k1 => 'NaN')", [], "bm25_k1"),
        ("select * from kb.lexical_search('退款', bm25_b => 'Infinity')", [], "bm25_b"),
        ("select * from kb.hybrid_search('退款', query_embedding => %s)", [Vector([0.0] * 384)], "degenerate norm"),
        ("select * from kb.vector_search('退款', query_embedding => %s)", [Vector([1e-30] * 384)], "degenerate norm"),
        ("select * from kb.hybrid_search('退款', query_embedding => '[NaN]')", [], "NaN not allowed"),
    ],
)
def test_bad_search_input_is_a_clear_error(kbdb, sql, params, message):
    with pytest.raises(psycopg.Error, match=message):
        kbdb.execute(sql, params)


@pytest.mark.parametrize("fn", ["hybrid_search", "vector_search", "lexical_search", "fuzzy_search"])
@pytest.mark.parametrize(
    "query",
    ["\u00a0\u00a0", "\u200b", "\u200b\u200c\u200d\u2060\ufeff", " \u3000\u00a0\t\u202f", "\u2028\u2029"],
    ids=["nbsp", "zwsp", "zero-width-mix", "spaces-mix", "separators"],
)
def test_blank_queries_are_rejected_by_every_search_function(db, fn, query):
    """Issue 9: a query of only no-break or zero-width spaces was searched as if it said something."""
    db.execute("select kb.replace_document('docs', 'refund.md', '退款', '[{\"content\": \"退款规则\"}]')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="query must not be empty"):
        db.execute(f"select * from kb.{fn}(%s)", [query])
    # invisible characters around real words change nothing
    assert db.execute("select count(*) from kb.lexical_search(%s)", ["\u200b退款\u00a0"]).fetchone()[0] == 1


def test_long_identifier_queries_match_their_documents(db):
    """Word terms are cut to 64 characters on both sides, so an identifier longer than that still finds
    the chunk it occurs in."""
    ident = "very_long_configuration_key_" + "segment_" * 12 + "end"
    assert len(ident) > 64
    for key, text in [("long.md", f"配置项 {ident} 控制超时"), ("other.md", "配置项 very_long_configuration_key 别的")]:
        db.execute("select kb.replace_document('docs', %s, '长标识符', %s)", [key, json.dumps([{"content": text}])])
    rows = search(db, "select doc_key, lexical_rank from kb.lexical_search(%s, 1)", ident)
    assert rows == [{"doc_key": "long.md", "lexical_rank": 1}]


def test_nul_byte_in_query_is_rejected_before_the_database(kbdb):
    with pytest.raises(psycopg.DataError, match="NUL"):
        kbdb.execute("select * from kb.hybrid_search(%s)", ["退款\x00"])


def test_metadata_filter_restricts_every_leg(kbdb, embedder):
    kbdb.execute(
        "select kb.replace_document(kb => 'team-docs', doc_key => 'policy/refund-v2.md', title => '退款政策 v2',"
        ' chunks => \'[{"content": "退款需要提供订单号。"}]\', metadata => \'{"lang": "zh", "rev": 2}\')'
    )
    rows = hybrid(kbdb, embedder, "退款", filter='{"rev": 2}')
    assert [r["doc_key"] for r in rows] == ["policy/refund-v2.md"]


def test_database_embeds_the_query_itself_through_the_endpoint(kbdb, embedder, fake_embeddings):
    if not kbdb.execute("select 1 from pg_extension where extname = 'plpython3u'").fetchone():
        pytest.skip("plpython3u is not installed on this server: in-database query embedding is unavailable")
    endpoint = fake_embeddings(embedder.embed)  # real embeddings of the offline model
    kbdb.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
    query = "系统响应很慢怎么优化"
    rows = search(kbdb, "select * from kb.hybrid_search(%s)", query)
    assert endpoint.requests == [{"model": "multilingual-e5-small", "input": ["query: " + query]}]
    assert rows[0]["vector_used"] is True and rows[0]["doc_key"] == "perf/tuning.md"
    # the in-database embedding (model prefix, then the endpoint) equals the client-side one ...
    in_db = kbdb.execute(
        "select (kb_internal.embed_queries(array[%s], m))[1] from kb.embedding_models m"
        " where m.name = 'multilingual-e5-small'",
        [query],
    ).fetchone()[0]
    direct = embedder.embed(["query: " + query])[0]
    assert np.allclose(np.asarray(in_db.to_numpy() if hasattr(in_db, "to_numpy") else in_db), direct, atol=1e-6)
    # ... so searching with either gives the same vector leg: same chunks, ranks and vector scores
    via_client = hybrid(kbdb, embedder, query)

    def vector_leg(result):
        return [(r["chunk_id"], r["vector_rank"], round(r["vector_score"], 5)) for r in result]

    assert vector_leg(via_client) == vector_leg(rows[:5]) and all(r["vector_rank"] for r in via_client)


def test_unreachable_endpoint_degrades_to_lexical_with_a_notice(kbdb):
    kbdb.execute("update kb.settings set value = 'http://127.0.0.1:9/v1/embeddings' where key = 'embedding_url'")
    notices = []
    kbdb.add_notice_handler(lambda d: notices.append(d.message_primary))
    rows = search(kbdb, "select * from kb.hybrid_search('退款')")
    assert rows and rows[0]["doc_key"] == "policy/refund.md"
    assert all(r["vector_used"] is False and r["vector_rank"] is None for r in rows)
    assert any("lexical legs only" in n for n in notices)


def test_no_embedding_url_degrades_to_lexical(kbdb):
    kbdb.execute("update kb.settings set value = '' where key = 'embedding_url'")
    rows = search(kbdb, "select * from kb.hybrid_search('createUser')")
    assert rows[0]["doc_key"] == "security/audit.md" and rows[0]["vector_used"] is False


def test_exact_duplicates_are_one_result_that_says_where_else(kbdb, embedder, connect_as):
    """The same text in several knowledge bases, documents or chunks: one result (the best-scored copy), its
    also_in naming the other documents the caller may read -- never one it may not."""
    for user in ("alice", "bob"):
        kbdb.execute("select kb.create_user(%s, %s)", [user, user])
    kbdb.execute("select kb.create_knowledge_base('team-docs', 'public')")  # created by fixture_docs.load
    kbdb.execute("update kb.knowledge_bases set visibility = 'public' where name = 'team-docs'")
    kbdb.execute("select kb.create_knowledge_base('alice-copy', 'private', owner => 'alice')")
    kbdb.execute("select kb.create_knowledge_base('bob-copy', 'private', owner => 'bob')")
    fixture_docs.load(kbdb, embedder, "alice-copy")  # every chunk of team-docs again, for alice only
    refund = fixture_docs.DOCS[1][2][0][0]
    kbdb.execute(
        "select kb.replace_document('bob-copy', 'twice.md', '退款政策', %s::jsonb)",
        [json.dumps([{"content": refund}, {"content": "另一段"}, {"content": refund}])],
    )
    vec = Vector(embedder.embed(["query: 退款"])[0])
    alice = connect_as("alice")
    for sql, params in [
        ("select * from kb.hybrid_search('退款', 5, query_embedding => %s)", [vec]),
        ("select * from kb.lexical_search('退款', 5)", []),
        ("select * from kb.vector_search('退款', 5, query_embedding => %s)", [vec]),
    ]:
        rows = search(alice, sql, *params)
        contents = [r["content"] for r in rows]
        assert len(contents) == len(set(contents)), sql
        if "hybrid" in sql:  # five different texts, each with its one other copy (80 candidates per leg)
            assert len(rows) == 5 and all(len(r["also_in"]) == 1 for r in rows)
        top = rows[0]
        assert top["content"] == refund, sql
        shown = {f"kb://{top['kb']}/{top['doc_key']}", *top["also_in"]}
        assert shown == {"kb://team-docs/policy/refund.md", "kb://alice-copy/policy/refund.md"}, sql
    # bob reads team-docs and his own copy (which holds the text twice): one result, never alice's kb
    rows = search(connect_as("bob"), "select * from kb.hybrid_search('退款', 5, query_embedding => %s)", vec)
    assert [r["content"] for r in rows].count(refund) == 1
    top = next(r for r in rows if r["content"] == refund)
    assert {f"kb://{top['kb']}/{top['doc_key']}", *top["also_in"]} == {
        "kb://team-docs/policy/refund.md", "kb://bob-copy/twice.md"
    }  # fmt: skip
    assert not any("alice-copy" in u for r in rows for u in r["also_in"])
    # the same text in two chunks of one document is one result, also_in empty (no other document)
    rows = search(kbdb, "select * from kb.lexical_search('退款', 5, kb => 'bob-copy')")
    assert [(r["content"], r["also_in"]) for r in rows] == [(refund, []), ("另一段", [])]  # the title matches


def test_a_copy_the_filter_excludes_is_not_named(db):
    """also_in names the other candidates of a hit's text: a copy in a document the search's filter (or
    metadata_condition) leaves out is no candidate, so it is not named, though the content-hash lookup finds it."""
    db.execute("select kb.create_knowledge_base('teams', 'public')")
    text = "退款会在三个工作日内原路退回。"
    for key, team in [("a.md", "a"), ("b.md", "b")]:
        db.execute(
            "select kb.replace_document('teams', %s, '退款', %s::jsonb, metadata => %s::jsonb)",
            [key, json.dumps([{"content": text}]), json.dumps({"team": team})],
        )
    sql = (
        "select doc_key, also_in from kb.hybrid_search('退款', 5, 'teams', vector_weight => 0,"
        " filter => %s::jsonb, metadata_condition => %s::jsonb)"
    )
    assert db.execute(sql, [None, None]).fetchall() == [("a.md", ["kb://teams/b.md"])]
    assert db.execute(sql, ['{"team": "b"}', None]).fetchall() == [("b.md", [])]
    condition = {"conditions": [{"name": "team", "comparison_operator": "is", "value": "a"}]}
    assert db.execute(sql, [None, json.dumps(condition)]).fetchall() == [("a.md", [])]


def test_copies_crowding_the_top_leave_room_for_other_texts(kbdb):
    """Fusion reads kb.chunks only for the candidates that may reach the top_k (kb_internal.search's bar); when
    copies of one text fill that part, the others are read too: still top_k different texts, the copy once,
    naming every other document among the candidates that holds it."""
    kbdb.execute("select kb.create_knowledge_base('crowded', 'public')")
    copy = "退款规则：七天内无理由退款"
    for i in range(12):
        kbdb.execute(
            "select kb.replace_document('crowded', %s, '退款', %s::jsonb)",
            [f"copy{i}.md", json.dumps([{"content": copy}])],
        )
    for i in range(6):
        kbdb.execute(
            "select kb.replace_document('crowded', %s, '退款', %s::jsonb)",
            [f"other{i}.md", json.dumps([{"content": f"退款说明 第{i}条"}])],
        )
    for fusion in ("dbsf", "rrf"):
        rows = search(
            kbdb,
            f"select * from kb.hybrid_search('退款规则', 5, kb => 'crowded', vector_weight => 0, fusion => '{fusion}')",
        )
        assert [r["content"] for r in rows][0] == copy and len({r["content"] for r in rows}) == 5, rows
        assert sorted(rows[0]["also_in"] + [f"kb://crowded/{rows[0]['doc_key']}"]) == sorted(
            f"kb://crowded/copy{i}.md" for i in range(12)
        )
        assert all(r["also_in"] == [] for r in rows[1:])


def test_a_copy_in_an_invisible_knowledge_base_moves_no_counter(kbdb, connect_as):
    """also_in looks a hit's copies up by its content hash among the searched knowledge bases only: the same text
    in a knowledge base the caller cannot see is never read, so the pg_stat_xact counters of every kb table and
    index are equal with and without it (they are no oracle for another user's text)."""
    kbdb.execute("select kb.create_user('alice', 'alice')")
    kbdb.execute("select kb.create_user('bob', 'bob')")
    kbdb.execute("select kb.create_knowledge_base('open-rules', 'public')")
    kbdb.execute("select kb.create_knowledge_base('bob-rules', 'private', owner => 'bob')")
    text = "报销规则：三十天内提交发票"
    kbdb.execute(
        "select kb.replace_document('open-rules', 'rules.md', '报销', %s::jsonb)",
        [json.dumps([{"content": text}, {"content": "差旅标准 第二条"}])],
    )
    alice = connect_as("alice")
    counters = (
        "select relname, seq_scan, seq_tup_read, idx_scan, idx_tup_fetch from pg_stat_xact_user_tables"
        " where schemaname = 'kb' union all select c.relname, pg_stat_get_xact_numscans(c.oid),"
        " pg_stat_get_xact_tuples_returned(c.oid), pg_stat_get_xact_tuples_fetched(c.oid), 0 from pg_class c"
        " where c.relnamespace = 'kb'::regnamespace and c.relkind = 'i' order by 1"
    )

    def observe() -> list:
        with alice.transaction():
            before = alice.execute(counters).fetchall()
            rows = search(alice, "select * from kb.hybrid_search('报销规则', 5, vector_weight => 0)")
            after = alice.execute(counters).fetchall()
        assert rows[0]["content"] == text and rows[0]["also_in"] == []
        return [(b[0], *(y - x for x, y in zip(b[1:], a[1:], strict=True))) for b, a in zip(before, after, strict=True)]

    observe()  # warm caches and plans
    alone = observe()
    kbdb.execute(
        "select kb.replace_document('bob-rules', 'copy.md', '报销', %s::jsonb)", [json.dumps([{"content": text}])]
    )
    assert observe() == alone


def test_texts_of_one_length_are_not_copies(kbdb):
    """Fusion compares the content hash stored at write time (kb.chunks.content_hash, md5 of the content):
    texts of the same byte length that differ are separate results, a real copy among them is still found,
    and a chunk whose content changes gets its new hash."""
    kbdb.execute("select kb.create_knowledge_base('lengths', 'public')")
    texts = ["退款规则甲：七天内", "退款规则乙：七天内", "退款规则甲：七天内", "退款 rule of 7 days"]
    assert len({len(t.encode()) for t in texts[:3]}) == 1
    for i, text in enumerate(texts):
        kbdb.execute(
            "select kb.replace_document('lengths', %s, '规则', %s::jsonb)",
            [f"doc{i}.md", json.dumps([{"content": text}])],
        )
    rows = search(kbdb, "select * from kb.lexical_search('退款规则', 10, kb => 'lengths')")
    shown = {r["content"]: r for r in rows}
    assert len(rows) == 3 and shown["退款规则乙：七天内"]["also_in"] == [], rows
    copy = shown["退款规则甲：七天内"]
    assert {f"kb://lengths/{copy['doc_key']}", *copy["also_in"]} == {"kb://lengths/doc0.md", "kb://lengths/doc2.md"}
    assert kbdb.execute("select bool_and(content_hash = md5(content)::uuid) from kb.chunks").fetchone()[0]
    kbdb.execute(
        "select kb.replace_document('lengths', 'doc2.md', '规则', %s::jsonb)", [json.dumps([{"content": texts[1]}])]
    )
    rows = search(kbdb, "select * from kb.lexical_search('退款规则', 10, kb => 'lengths')")
    assert {r["content"]: len(r["also_in"]) for r in rows if "规则" in r["content"]} == {
        "退款规则甲：七天内": 0, "退款规则乙：七天内": 1
    }  # fmt: skip


@pytest.mark.parametrize(
    ("query", "expected_doc", "correction"),
    [
        ("tidb_mem_qouta_query", "db/tidb.md", "tidb_mem_quota_query"),  # two letters swapped
        ("creatUser 审计", "security/audit.md", "createuser"),  # a letter left out
        ("kubectl rolout", "ops/deploy.md", "rollout"),
        ("rollbac", "ops/deploy.md", "rollbacks"),  # the start of a longer word
        ("登陆态失效", "guide/login.md", "登录"),  # a Chinese near-miss (登陆 for 登录)
        ("退宽", "policy/refund.md", "退款"),  # no term of the query is in the knowledge base
    ],
)
def test_fuzzy_leg_corrects_misspelt_terms(kbdb, query, expected_doc, correction):
    """The fuzzy leg corrects the query's terms that the knowledge base does not hold, from its vocabulary,
    and ranks by BM25 of the query with the corrections."""
    expansions = kbdb.execute(EXPANSIONS, [query]).fetchone()[0]
    assert correction in expansions and all(0.5 <= w < 1 for w in expansions.values()), expansions
    rows = search(kbdb, "select * from kb.fuzzy_search(%s, 3)", query)
    assert rows[0]["doc_key"] == expected_doc and rows[0]["fuzzy_rank"] == 1, rows


def test_question_words_are_not_corrected(kbdb):
    """A question word (何时, 哪边, 多少) is in no document, so its bigrams are absent; it is the question's form,
    not a misspelling: the character next to it is not replaced, and a real near-miss still is."""
    text = "灯塔为何建在岛上？东边的灯塔和西边的灯塔都在海边。登录态失效时刷新令牌。"
    chunks = json.dumps([{"content": text}])
    kbdb.execute("select kb.replace_document('team-docs', 'lighthouse.md', '灯塔', %s)", [chunks])
    for query in ("灯塔于何时建立", "灯塔在哪边", "灯塔有多少座"):
        assert kbdb.execute(EXPANSIONS, [query]).fetchone()[0] is None, query
    assert "灯塔" in kbdb.execute(EXPANSIONS, ["灯搭何时建立"]).fetchone()[0]


def test_nothing_to_correct_skips_the_lookups(kbdb):
    """Where two words of a Chinese question meet, their bigram is absent; beside a known bigram it is no
    misspelling. Nothing to correct: NULL, and the corrections' lookups do not run (auto_explain sees no plan
    of them). A real near-miss still runs them, and the caller's plan_cache_mode stays its own."""
    text = "灯塔为何建在岛上？东边的灯塔和西边的灯塔都在海边。"
    chunks = json.dumps([{"content": text}])
    kbdb.execute("select kb.replace_document('team-docs', 'lighthouse.md', '灯塔', %s)", [chunks])
    notices: list[str] = []
    kbdb.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    kbdb.execute("load 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
        kbdb.execute(f"set auto_explain.{setting}")
    kbdb.execute("set plan_cache_mode = auto")
    assert kbdb.execute(EXPANSIONS, ["海边灯塔"]).fetchone()[0] is None  # 边灯 is absent, 海边 and 灯塔 known
    assert any("as known from kb_internal.term_counts" in n for n in notices)  # the terms were checked
    assert not any("with suspects as" in n for n in notices), notices
    notices.clear()
    assert "灯塔" in kbdb.execute(EXPANSIONS, ["灯搭何时建立"]).fetchone()[0]
    assert any("with suspects as" in n for n in notices)
    assert kbdb.execute("show plan_cache_mode").fetchone()[0] == "auto"


def test_fuzzy_leg_without_corrections_ranks_as_the_bm25_leg(kbdb):
    """A query whose terms are all known (or have no correction) gets the BM25 leg's ranking and scores
    from the fuzzy leg alone, and no fuzzy leg in a hybrid search (it would count BM25 twice); the
    corrections are bounded by the two settings."""
    for query in ("缓存击穿 token", "系统响应很慢怎么优化"):
        assert kbdb.execute(EXPANSIONS, [query]).fetchone()[0] is None
        fuzzy = kbdb.execute("select chunk_id, fuzzy_score from kb.fuzzy_search(%s, 10)", [query]).fetchall()
        lexical = kbdb.execute("select chunk_id, lexical_score from kb.lexical_search(%s, 10)", [query]).fetchall()
        assert fuzzy == lexical
        hybrid = kbdb.execute("select fuzzy_rank from kb.hybrid_search(%s, 10, vector_weight => 0)", [query])
        assert all(r[0] is None for r in hybrid.fetchall())
    corrected = kbdb.execute("select fuzzy_rank from kb.hybrid_search('creatUser', 3, vector_weight => 0)")
    assert corrected.fetchone()[0] == 1
    both = "tidb_mem_qouta_query creatUser"
    assert len(kbdb.execute(EXPANSIONS, [both]).fetchone()[0]) == 4
    kbdb.execute("update kb.settings set value = '1' where key = 'fuzzy_max_terms'")  # the longest word only
    got = kbdb.execute(EXPANSIONS, [both]).fetchone()[0]
    assert set(got) == {"tidb_mem_quota_query"}, got
    kbdb.execute("update kb.settings set value = '0' where key = 'fuzzy_term_expansions'")
    assert kbdb.execute(EXPANSIONS, [both]).fetchone()[0] is None


def test_null_settings_take_the_databases_defaults(kbdb, embedder):
    """kb.search_defaults() is the one place the search defaults live: NULL (what every client passes for
    a setting it was not told) gives the same ranking and scores as the defaults spelled out, and no Python
    restates them."""
    d = kbdb.execute("select * from kb.search_defaults()").fetchone()
    emb = Vector(embedder.embed(["query: 退款多久到账"])[0])
    explicit = kbdb.execute(
        "select chunk_id, score from kb.hybrid_search('退款多久到账', 10, query_embedding => %s, vector_weight => %s,"
        " lexical_weight => %s, fuzzy_weight => %s, rrf_k => %s, candidates => %s, bm25_k1 => %s, bm25_b => %s,"
        " fusion => %s)",
        [emb, *d],
    ).fetchall()
    nulls = kbdb.execute(
        "select chunk_id, score from kb.hybrid_search('退款多久到账', 10, query_embedding => %s, vector_weight => null,"
        " lexical_weight => null, fuzzy_weight => null, rrf_k => null, candidates => null, bm25_k1 => null,"
        " bm25_b => null, fusion => null)",
        [emb],
    ).fetchall()
    assert explicit and explicit == nulls
    assert all(getattr(SearchSettings(), f) is None for f in SETTING_TYPES)
    # candidates left NULL are at least top_k (a rerank fetch of 100 gets 100 candidates per leg): with
    # more matching chunks than the default number of candidates, a top_k of 100 returns all of them
    default_candidates = kbdb.execute("select candidates from kb.search_defaults()").fetchone()[0]
    more = json.dumps([{"content": f"退款记录 {i}"} for i in range(default_candidates + 9)])
    kbdb.execute("select kb.replace_document('team-docs', 'refunds.md', '记录', %s)", [more])
    matched = kbdb.execute(
        "select count(*) from kb.hybrid_search('退款', 100, vector_weight => 0, candidates => null)"
        " where lexical_rank is not null"
    ).fetchone()[0]
    assert matched == default_candidates + 10  # and policy/refund.md


def test_settings_are_read_in_one_place_and_a_missing_one_is_a_clear_error(kbdb):
    """kb_internal.setting (and kb_internal.settings_of, several keys in one read) is the one reader of kb.settings:
    no function falls back to a literal of its own. (The doctor, kb_admin.doctor, its areas and
    kb_internal.setting_problem, reads the table whole: it checks the rows themselves.)"""
    kbdb.execute("update kb.settings set value = 'scan' where key = 'lexical_leg'")  # the leg that reads it
    kbdb.execute("update kb.settings set value = 'many' where key = 'lexical_probe_budget'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='setting "lexical_probe_budget" must be an integer'):
        kbdb.execute("select * from kb.lexical_search('退款')")
    kbdb.execute("delete from kb.settings where key = 'lexical_probe_budget'")
    with pytest.raises(psycopg.errors.UndefinedObject, match='setting "lexical_probe_budget" is missing'):
        kbdb.execute("select * from kb.lexical_search('退款')")
    # the search defaults, read in one go, say which one is wrong too
    kbdb.execute("update kb.settings set value = 'half' where key = 'search_bm25_b'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='setting "search_bm25_b" must be a number'):
        kbdb.execute("select * from kb.lexical_search('退款')")
    kbdb.execute("delete from kb.settings where key = 'search_candidates'")
    with pytest.raises(psycopg.errors.UndefinedObject, match='setting "search_candidates" is missing'):
        kbdb.execute("select * from kb.search_defaults()")
    bodies = kbdb.execute(
        "select string_agg(prosrc, ' ') from pg_proc where pronamespace::regnamespace::text = any(%s)"
        " and proname not in ('setting', 'settings_of', 'setting_problem') and proname not like 'doctor%%'",
        [list(SCHEMAS)],
    ).fetchone()[0]
    assert "kb.settings" not in bodies.replace("kb.settings.", "")


def test_hnsw_ef_search_comes_from_the_settings_and_stays_inside_the_leg(kbdb, embedder):
    """kb_internal.vector_leg takes hnsw.ef_search from kb.settings.hnsw_ef_search; the caller's own value is back
    after the call, in and out of a transaction."""
    kbdb.execute("set hnsw.ef_search = 77")
    assert hybrid(kbdb, embedder, "退款")
    assert kbdb.execute("show hnsw.ef_search").fetchone()[0] == "77"
    with kbdb.transaction():
        kbdb.execute("set local hnsw.ef_search = 55")
        assert hybrid(kbdb, embedder, "退款")
        assert kbdb.execute("show hnsw.ef_search").fetchone()[0] == "55"
    kbdb.execute("update kb.settings set value = '0' where key = 'hnsw_ef_search'")
    with pytest.raises(psycopg.Error, match="hnsw.ef_search"):
        hybrid(kbdb, embedder, "退款")
    kbdb.execute("update kb.settings set value = '1000' where key = 'hnsw_ef_search'")
    assert hybrid(kbdb, embedder, "退款")
