"""kb.save_knowledge (db/functions/32_saved_knowledge.sql): a note written through kb.replace_document into a
knowledge base the caller may write, idempotent by doc_key, with who saved it, when and from where in its
metadata; bounded in size and rate; an invisible knowledge base gives the error and reads the rows a missing
one does. Tried as ordinary users (their own login roles) and as pgkb_service acting for them.

Users alice and bob; alice owns alice-private (private) and shared (public); bob owns bob-private."""

from __future__ import annotations

import json

import psycopg
import pytest
from test_lifecycle import assert_reads_alike

SAVE = "select * from kb.save_knowledge(%s, %s, %s, %s::jsonb, doc_key => %s, tags => %s, origin => %s)"


def chunks(text: str) -> str:
    return json.dumps([{"content": text}], ensure_ascii=False)


@pytest.fixture
def world(db):
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    for name, visibility, owner in (
        ("alice-private", "private", "alice"),
        ("shared", "public", "alice"),
        ("bob-private", "private", "bob"),
    ):
        db.execute("select kb.create_knowledge_base(%s, %s, owner => %s)", [name, visibility, owner])
    db.execute("grant pgkb_user to mallory")  # a login role that is no pgkb user
    yield db
    db.execute("revoke pgkb_user from mallory")


def save(conn, kb, title="支付回调超时", body="回调超时先查网关日志。", doc_key=None, tags=(), origin="sql"):
    return conn.execute(SAVE, [kb, title, body, chunks(body), doc_key, list(tags), origin]).fetchone()


def documents(db, kb: str) -> list[tuple]:
    return db.execute(
        "select d.doc_key, d.title, d.metadata from kb.documents d join kb.knowledge_bases k on k.id = d.kb_id"
        " where k.name = %s order by 1",
        [kb],
    ).fetchall()


def test_a_saved_note_is_a_searchable_document_with_its_provenance(world, connect_as):
    alice = connect_as("alice")
    key, _, chunk_count, changed, queued = save(alice, "alice-private", tags=["支付", "payment", "支付"])
    assert (key, chunk_count, changed, queued) == ("saved/支付回调超时", 1, True, 1)
    [(doc_key, title, metadata)] = documents(world, "alice-private")
    assert (doc_key, title) == ("saved/支付回调超时", "支付回调超时")
    assert metadata["saved_by"] == "alice" and metadata["origin"] == "sql" and metadata["saved_at"]
    assert metadata["tags"] == ["payment", "支付"]
    hits = alice.execute("select doc_key from kb.lexical_search('网关日志', 5, 'alice-private')").fetchall()
    assert hits == [("saved/支付回调超时",)]

    # the same doc_key again replaces it; another title is another note
    key, _, _, changed, _ = save(alice, "alice-private", body="回调超时先查支付网关的重试记录。")
    assert key == "saved/支付回调超时" and changed
    assert alice.execute("select doc_key from kb.lexical_search('重试记录', 5, 'alice-private')").fetchall() == [
        ("saved/支付回调超时",)
    ]
    assert alice.execute("select count(*) from kb.lexical_search('日志', 5, 'alice-private')").fetchone()[0] == 0
    save(alice, "alice-private", title="Rotate TLS certificates!", body="Run certbot renew.")
    save(alice, "alice-private", title="???", body="x", doc_key="  notes/x.md  ")
    assert [d[0] for d in documents(world, "alice-private")] == [
        "notes/x.md",
        "saved/rotate-tls-certificates",
        "saved/支付回调超时",
    ]


def test_only_writers_save_and_an_invisible_knowledge_base_reads_like_a_missing_one(world, connect_as):
    bob = connect_as("bob")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='may not write to knowledge base "shared"'):
        save(bob, "shared")
    # the same error, and the same rows read, for another user's knowledge base and a missing one
    assert_reads_alike(bob, SAVE, lambda kb: [kb, "t", "b", chunks("b"), None, [], "sql"], "alice-private", "no-such")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="needs a pgkb user"):
        save(connect_as("mallory"), "shared")
    assert documents(world, "alice-private") == documents(world, "shared") == []


def test_the_service_saves_as_the_user_it_acts_for(world, connect_as):
    world.execute("grant pgkb_service to svc")
    try:
        svc = connect_as("svc")
        with svc.transaction():
            svc.execute("select set_config('pgkb.acting_user', 'bob', true)")
            key = save(svc, "bob-private", origin="mcp")[0]
        with svc.transaction(), pytest.raises(psycopg.errors.NoDataFound):
            svc.execute("select set_config('pgkb.acting_user', 'bob', true)")
            save(svc, "alice-private", origin="mcp")
    finally:
        world.execute("revoke pgkb_service from svc")
    [(doc_key, _, metadata)] = documents(world, "bob-private")
    assert doc_key == key and metadata["saved_by"] == "bob" and metadata["origin"] == "mcp"


def test_bad_input_and_the_bounds_change_nothing(world, connect_as):
    alice = connect_as("alice")
    world.execute("update kb.settings set value = '40' where key = 'save_max_chars'")
    world.execute("update kb.settings set value = '3' where key = 'saves_per_minute'")
    cases = [
        (dict(title="  "), psycopg.errors.InvalidParameterValue, "needs a title"),
        (dict(title="t" * 201), psycopg.errors.InvalidParameterValue, "at most 200"),
        (dict(body=" \n "), psycopg.errors.InvalidParameterValue, "needs a body"),
        (dict(body="长" * 41), psycopg.errors.ProgramLimitExceeded, "at most 40 are accepted"),
        (dict(tags=["a"] * 17), psycopg.errors.InvalidParameterValue, "at most 16"),
        (dict(tags=[" "]), psycopg.errors.InvalidParameterValue, "tags"),
        (dict(tags=["x" * 51]), psycopg.errors.InvalidParameterValue, "tags"),
        (dict(origin="email"), psycopg.errors.InvalidParameterValue, "origin must be one of"),
    ]
    for given, error, message in cases:
        with pytest.raises(error, match=message):
            save(alice, "alice-private", **given)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        alice.execute(SAVE, ["alice-private", "t", "body", "[]", None, [], "sql"])  # no chunks
    assert documents(world, "alice-private") == []
    for i in range(3):
        save(alice, "alice-private", title=f"note {i}")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="at most 3 per minute"):
        save(alice, "alice-private", title="note 3")
    assert len(documents(world, "alice-private")) == 3
    save(connect_as("bob"), "bob-private")  # the bound is per user
    # a minute later the user may save again
    world.execute("update kb.knowledge_saves set saved_at = saved_at - interval '61 seconds'")
    save(alice, "alice-private", title="note 3")
    assert len(documents(world, "alice-private")) == 4
