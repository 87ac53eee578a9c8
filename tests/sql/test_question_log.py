"""The question log (db/functions/39_question_log.sql, migration 036): off by default per knowledge base; when its
owner turns it on, each search and ask that searched it is logged (redacted), and its privacy rules hold as
ordinary users: a user sees their own questions, an owner their knowledge base's part without who asked,
administrators everything, a question over several knowledge bases shows each owner only their own part, and
nothing of a knowledge base with the log off is stored. Ratings (kb.rate_answer) go against a logged question,
or alone.

Users alice and bob; alice owns handbook (public, log on when a test turns it on) and alice-private (private);
bob owns bob-private (private)."""

from __future__ import annotations

import json

import psycopg
import pytest
from test_lifecycle import COUNTERS, assert_reads_alike


def chunks(*texts: str) -> str:
    return json.dumps([{"content": t} for t in texts], ensure_ascii=False)


@pytest.fixture
def world(db, steady_statistics):
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    for name, visibility, owner in (
        ("handbook", "public", "alice"),
        ("alice-private", "private", "alice"),
        ("bob-private", "private", "bob"),
    ):
        db.execute("select kb.create_knowledge_base(%s, %s, owner => %s)", [name, visibility, owner])
    db.execute(
        "select kb.replace_document('handbook', 'login.md', '登录', %s::jsonb)",
        [chunks("登录态失效时先检查 token 是否过期，再看网关的会话配置。")],
    )
    db.execute(
        "select kb.replace_document('alice-private', 'salary.md', 'salary', %s::jsonb)",
        [chunks("The salary review happens every March for the platform team.")],
    )
    db.execute(
        "select kb.replace_document('bob-private', 'deploy.md', 'deploy', %s::jsonb)",
        [chunks("登录态失效的部署排查：重启网关会话服务。")],
    )
    return db


def count(db, table: str) -> int:
    return db.execute(f"select count(*) from kb.{table}").fetchone()[0]


def search(conn, query: str, kb: str | None = None) -> list[tuple]:
    return conn.execute("select kb, doc_key from kb.lexical_search(%s, 5, %s)", [query, kb]).fetchall()


def test_the_log_is_off_by_default_and_writes_nothing(world, connect_as):
    bob = connect_as("bob")
    assert search(bob, "登录态失效")
    bob.execute("select * from kb.ask('登录态失效怎么办')").fetchall()
    bob.execute("select * from kb.retrieve('登录态失效')").fetchall()
    assert (count(world, "questions"), count(world, "question_kbs")) == (0, 0)
    assert bob.execute("select kb.last_question_id()").fetchone()[0] is None


def test_each_search_and_ask_is_logged_with_its_verdict_documents_and_entry_point(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    assert alice.execute("select kb.set_question_log('handbook', 30)").fetchone()[0] == 30
    assert search(bob, "登录态失效", "handbook") == [("handbook", "login.md")]
    first = bob.execute("select kb.last_question_id()").fetchone()[0]
    with bob.transaction():
        bob.execute("select set_config('pgkb.entry_point', 'mcp', true)")
        [(evidence,)] = bob.execute(
            "select evidence from kb.ask('登录态失效时检查 token 过期', kb => 'handbook')"
        ).fetchall()
    assert evidence["question_id"] == bob.execute("select kb.last_question_id()").fetchone()[0] > first
    bob.execute("select count(*) from kb.retrieve('completely unrelated words', kb => 'handbook')")
    rows = bob.execute(
        "select question, mode, entry_point, found, documents, knowledge_bases from kb.my_questions()"
        " order by question_id"
    ).fetchall()
    assert rows == [
        ("登录态失效", "lexical", "sql", True, ["handbook/login.md"], ["handbook"]),
        ("登录态失效时检查 token 过期", "ask", "mcp", True, ["handbook/login.md"], ["handbook"]),
        ("completely unrelated words", "retrieve", "sql", False, [], ["handbook"]),
    ]
    latencies = [r[0] for r in bob.execute("select latency_ms from kb.my_questions()")]
    assert all(0 < ms < 60_000 for ms in latencies)
    # alice's own list is empty: she asked nothing
    assert alice.execute("select count(*) from kb.my_questions()").fetchone()[0] == 0


def test_an_owner_sees_their_part_without_who_asked_and_an_administrator_sees_all(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 30)")
    search(bob, "登录态失效")  # every knowledge base bob sees: handbook and bob-private
    owner_view = alice.execute(
        "select knowledge_base, question, found, documents, asked_by from kb.question_log('handbook')"
    ).fetchall()
    assert owner_view == [("handbook", "登录态失效", True, ["login.md"], None)]
    admin_view = world.execute("select knowledge_base, asked_by from kb.question_log(null)").fetchall()
    assert admin_view == [("handbook", "bob")]
    # bob-private keeps no log: nothing of it is stored, not even its document among the question's (once
    # judged, when bob reads his questions) or its hits while it waits to be
    assert world.execute("select count(*) from kb.questions, unnest(hits) as h where h.kb <> 'handbook'").fetchone()[
        0
    ] == 0  # fmt: skip
    bob.execute("select * from kb.my_questions()").fetchall()
    [(documents,)] = world.execute("select documents from kb.questions").fetchall()
    handbook_doc = world.execute("select id from kb.documents where doc_key = 'login.md'").fetchone()[0]
    assert documents == [handbook_doc]
    assert world.execute("select count(*) from kb.question_kbs").fetchone()[0] == 1
    # bob may not read handbook's log; alice-private is invisible to him: the error of a missing one
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only the owner"):
        bob.execute("select * from kb.question_log('handbook')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        bob.execute("select * from kb.question_log(null)")
    assert_reads_alike(
        bob, "select * from kb.question_log(%s)", lambda name: [name], hidden="alice-private", missing="no-such-kb"
    )


def test_a_question_over_two_logged_knowledge_bases_shows_each_owner_only_their_part(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 30)")
    bob.execute("select kb.set_question_log('bob-private', 30)")
    search(bob, "登录态失效")
    [(kb, documents)] = alice.execute("select knowledge_base, documents from kb.question_log('handbook')").fetchall()
    assert (kb, documents) == ("handbook", ["login.md"])
    [(kb, documents)] = bob.execute("select knowledge_base, documents from kb.question_log('bob-private')").fetchall()
    assert (kb, documents) == ("bob-private", ["deploy.md"])
    # the asker sees both, an owner never learns the other
    [(kbs,)] = bob.execute("select knowledge_bases from kb.my_questions()").fetchall()
    assert kbs == ["bob-private", "handbook"]


def test_reading_ones_own_log_reads_no_row_of_another_users_private_log(world, connect_as):
    """pg_stat_xact counters and EXPLAIN ANALYZE row counts of kb.my_questions / kb.question_log /
    kb.knowledge_gaps / kb.rated_questions are the same whatever alice's private knowledge base logged and
    rated: no row of it is read, not even to be filtered out."""
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('alice-private', 30)")
    bob.execute("select kb.set_question_log('bob-private', 30)")
    search(bob, "登录态失效", "bob-private")

    def reads(sql: str) -> list:
        with bob.transaction():
            before = bob.execute(COUNTERS).fetchall()
            bob.execute(sql).fetchall()
            after = bob.execute(COUNTERS).fetchall()
        return [(b[0], *(y - x for x, y in zip(b[1:], a[1:], strict=True))) for b, a in zip(before, after, strict=True)]

    def plan(sql: str) -> list:  # what EXPLAIN ANALYZE shows bob: the rows of each node, no timing
        return bob.execute("explain (analyze, costs off, timing off, summary off) " + sql).fetchall()

    bob.execute("select kb.rate_answer(true, kb.last_question_id())")
    for sql in (
        "select * from kb.my_questions()",
        "select * from kb.question_log('bob-private')",
        "select * from kb.knowledge_gaps('bob-private')",
        "select * from kb.rated_questions('bob-private')",
    ):
        reads(sql)  # caches and plans; bob's own rows judged (kb_internal.settle_questions)
        reads(sql)  # the index entries that judging left dead are marked so by now
        quiet, shown = reads(sql), plan(sql)
        for _ in range(5):
            search(alice, "salary review", "alice-private")
            alice.execute("select kb.rate_answer(false, kb.last_question_id())")
        assert world.execute("select count(*) from kb.question_kbs").fetchone()[0] > 1
        assert reads(sql) == quiet, sql
        assert plan(sql) == shown, sql
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        bob.execute("select * from kb.questions")


def test_a_logged_question_is_redacted(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 30)")
    search(bob, "登录态失效 password=hunter2 联系 bob@example.com 13812345678", "handbook")
    [(question,)] = alice.execute("select question from kb.question_log('handbook')").fetchall()
    assert question == "登录态失效 password=[secret] 联系 [email] [phone]"
    assert "hunter2" not in json.dumps(world.execute("select to_jsonb(q) from kb.questions q").fetchall())


def test_ratings_go_against_ones_own_logged_question_or_alone(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 30)")
    search(bob, "登录态失效", "handbook")
    mine = bob.execute("select kb.last_question_id()").fetchone()[0]
    bob.execute("select kb.rate_answer(false, %s, note => '没说怎么改配置')", [mine])
    bob.execute("select kb.rate_answer(true, %s)", [mine])  # again: replaces
    assert bob.execute("select helpful, note from kb.my_questions()").fetchall() == [(True, None)]
    assert alice.execute("select helpful from kb.question_log('handbook')").fetchall() == [(True,)]
    # alice cannot rate bob's question: the error of a missing one
    errors = []
    for qid in (mine, mine + 1000):
        with pytest.raises(psycopg.errors.NoDataFound) as e:
            alice.execute("select kb.rate_answer(true, %s)", [qid])
        errors.append(str(e.value).replace(str(qid), "<id>"))
    assert errors[0] == errors[1]
    # alone: the log was off for bob-private
    bob.execute("select kb.rate_answer(false, question => '部署 token=abc123 怎么办', kb => 'bob-private')")
    assert world.execute(
        "select question, kb_id is not null from kb.answer_ratings where question_id is null"
    ).fetchall() == [("部署 token=[secret] 怎么办", True)]
    before = world.execute("select count(*) from kb.answer_ratings").fetchone()[0]
    for args, error in (
        ("null, %s", psycopg.errors.InvalidParameterValue),
        ("true", psycopg.errors.InvalidParameterValue),  # neither question_id nor question
        ("true, %s, question => 'x'", psycopg.errors.InvalidParameterValue),
        ("true, %s, note => repeat('x', 2001)", psycopg.errors.ProgramLimitExceeded),
        ("true, question => '   '", psycopg.errors.InvalidParameterValue),
        ("true, question => 'x', kb => 'alice-private'", psycopg.errors.NoDataFound),  # invisible to bob
    ):
        with pytest.raises(error):
            bob.execute(f"select kb.rate_answer({args})", [mine] if "%s" in args else [])
    assert world.execute("select count(*) from kb.answer_ratings").fetchone()[0] == before


def test_ratings_per_user_and_minute_are_bounded(world, connect_as):
    bob = connect_as("bob")
    world.execute("update kb.settings set value = '3' where key = 'ratings_per_minute'")
    for n in range(3):
        bob.execute("select kb.rate_answer(true, question => %s)", [f"问题 {n}"])
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="too many ratings: at most 3 per minute"):
        bob.execute("select kb.rate_answer(true, question => '问题 3')")
    connect_as("alice").execute("select kb.rate_answer(true, question => '别人的')")  # per user
    assert world.execute("select count(*) from kb.answer_ratings").fetchone()[0] == 4


def test_only_the_owner_reads_whether_the_log_is_on(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    assert alice.execute("select kb.question_log_days('handbook')").fetchone()[0] is None
    alice.execute("select kb.set_question_log('handbook', 14)")
    assert alice.execute("select kb.question_log_days('handbook')").fetchone()[0] == 14
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        bob.execute("select kb.question_log_days('handbook')")
    with pytest.raises(psycopg.errors.NoDataFound):
        bob.execute("select kb.question_log_days('alice-private')")


def test_retention_turning_off_and_purging(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 2)")
    search(bob, "登录态失效", "handbook")
    world.execute("update kb.question_kbs set asked_at = asked_at - interval '3 days'")
    search(bob, "网关", "handbook")  # the old row ages out as the new one is written
    assert [q for (q,) in world.execute("select question from kb.questions")] == ["网关"]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only the owner"):
        bob.execute("select kb.set_question_log('handbook', 0)")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        alice.execute("select kb.set_question_log('handbook', 9999)")
    assert alice.execute("select kb.set_question_log('handbook', 0)").fetchone()[0] is None
    search(bob, "会话", "handbook")
    assert count(world, "questions") == 1  # off: nothing new, the old kept
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        bob.execute("select kb.purge_question_log('handbook')")
    assert alice.execute("select kb.purge_question_log('handbook')").fetchone()[0] == 1
    assert (count(world, "questions"), count(world, "question_kbs")) == (0, 0)


def test_a_read_only_transaction_searches_and_logs_nothing(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 30)")
    with bob.transaction():
        bob.execute("set transaction read only")
        assert search(bob, "登录态失效", "handbook")
    assert count(world, "questions") == 0


def test_entry_points_other_than_pgkbs_own_are_sql_and_a_replay_is_not_logged(world, connect_as):
    alice = connect_as("alice")
    alice.execute("select kb.set_question_log('handbook', 30)")
    for given in ("page", "dify", "http", "dify'; drop table x", "", "eval"):
        with alice.transaction():
            alice.execute("select set_config('pgkb.entry_point', %s, true)", [given])
            search(alice, "网关", "handbook")
    # 'eval' (pgkb eval, pgkb sweep: a replay of questions) logs nothing
    assert [e for (e,) in alice.execute("select entry_point from kb.my_questions() order by question_id")] == [
        "page",
        "dify",
        "sql",
        "sql",
        "sql",
    ]


def test_a_companion_call_is_not_logged(world, connect_as):
    """pgkb.question_log 'off' for a transaction (the page's search beside its ask) logs nothing of it."""
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 30)")
    with bob.transaction():
        bob.execute("select set_config('pgkb.question_log', 'off', true)")
        assert search(bob, "登录态失效", "handbook")
        assert bob.execute("select kb.last_question_id()").fetchone()[0] is None
    assert count(world, "questions") == 0
    search(bob, "登录态失效", "handbook")  # the setting was transaction-local
    assert count(world, "questions") == 1


def test_rated_questions_are_the_owners_regression_set(world, connect_as):
    """kb.rated_questions: the logged questions of kb rated helpful, each once (its newest asking), with kb's
    documents it cited or found; owner or administrator only, an invisible kb reads like a missing one."""
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 30)")
    for text, helpful in (("登录态失效", True), ("登录态失效", True), ("token 过期", False), ("会话配置", None)):
        search(bob, text, "handbook")
        if helpful is not None:
            bob.execute("select kb.rate_answer(%s, kb.last_question_id())", [helpful])
    search(bob, "nothing matches this at all", "handbook")
    bob.execute("select kb.rate_answer(true, kb.last_question_id())")  # helpful, but no document: left out
    rows = alice.execute("select question, mode, documents from kb.rated_questions('handbook')").fetchall()
    assert rows == [("登录态失效", "lexical", ["login.md"])]
    newest = max(
        r[0] for r in bob.execute("select question_id, question from kb.my_questions()") if r[1] == "登录态失效"
    )
    assert alice.execute("select question_id from kb.rated_questions('handbook')").fetchone()[0] == newest
    assert world.execute("select count(*) from kb.rated_questions('handbook')").fetchone()[0] == 1  # administrator
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only the owner"):
        bob.execute("select * from kb.rated_questions('handbook')")
    for bad in (
        "select * from kb.rated_questions('handbook', null)",
        "select * from kb.rated_questions('handbook', max_rows => 0)",
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            alice.execute(bad)
    assert_reads_alike(
        bob, "select * from kb.rated_questions(%s)", lambda name: [name], hidden="alice-private", missing="no-such-kb"
    )


def test_the_listing_says_which_knowledge_bases_the_caller_manages(world, connect_as):
    listed = {r[0]: r[1] for r in connect_as("alice").execute("select name, can_manage from kb.list_knowledge_bases()")}
    assert listed == {"handbook": True, "alice-private": True}
    listed = {r[0]: r[1] for r in connect_as("bob").execute("select name, can_manage from kb.list_knowledge_bases()")}
    assert listed == {"handbook": False, "bob-private": True}
    assert all(r[0] for r in world.execute("select can_manage from kb.list_knowledge_bases()"))  # administrator


def test_a_search_is_judged_when_read_and_a_rewritten_document_is_no_false_gap(world, connect_as):
    """A search logs its documents and hits and is judged when the log is first read; when its hits no longer
    exist by then (the document was written again: new chunk ids), it cannot be judged -- found stays NULL,
    its documents stay -- and it is no gap."""
    alice, bob = connect_as("alice"), connect_as("bob")
    alice.execute("select kb.set_question_log('handbook', 30)")
    search(bob, "token 过期", "handbook")
    search(bob, "登录态失效", "handbook")
    waiting = world.execute("select found, hits is not null from kb.question_kbs order by question_id").fetchall()
    assert waiting == [(None, True), (None, True)]
    # judged by the owner's read: the newest search; the other waits for a read of its own
    assert alice.execute("select found from kb.question_log('handbook', max_rows => 1)").fetchall() == [(True,)]
    world.execute(
        "select kb.replace_document('handbook', 'login.md', '登录', %s::jsonb)",
        [chunks("登录态失效时先检查 token 是否过期，再看网关的会话配置。", "第二段")],
    )
    rows = alice.execute("select question, found, documents from kb.question_log('handbook') order by question_id")
    assert rows.fetchall() == [("token 过期", None, ["login.md"]), ("登录态失效", True, ["login.md"])]
    assert world.execute("select count(*) from kb.question_kbs where hits is not null").fetchone()[0] == 0
    assert alice.execute("select count(*) from kb.knowledge_gaps('handbook')").fetchone()[0] == 0
