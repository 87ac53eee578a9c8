"""Endpoint secrets never reach a caller (issue 20, findings 3 and 4).

An administrator's embedding URL may carry a key in its query string (``?api-key=…``) besides
``embedding_api_key``; a careless endpoint echoes the request line and the Authorization header in its
errors, or a chat endpoint in its answer. Neither the NOTICE a searcher gets nor an answer, its citations or
its streamed deltas may show them (kb_internal.redact, db/functions/38_redaction.sql).
"""

from __future__ import annotations

import json

import psycopg
import pytest

URL_SECRET = "urlsecret-4711"
EMBED_KEY = "embedkey-0815-never-shown"
CHAT_KEY = "sk-chatkey-0123456789-never-shown"
DELTA = "pgkb-delta:"


def set_settings(db, **values) -> None:
    for key, value in values.items():
        assert db.execute("update kb.settings set value = %s where key = %s", [value, key]).rowcount == 1, key


def notices_of(conn) -> list[str]:
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
    return seen


@pytest.fixture
def searcher(db, connect_as):
    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.create_knowledge_base('probe-alice', 'private', owner => 'alice')")
    db.execute(
        "select kb.replace_document('probe-alice', 'a.md', 'checklist', %s::jsonb)",
        [json.dumps([{"content": "退款到账时间：微信余额实时到账，银行卡 1–3 个工作日到账。release checklist"}])],
    )
    return connect_as("alice")


def test_redact_hides_key_user_info_and_query(db):
    url = f"https://user:pw-{URL_SECRET}@example.com:8443/v1/embeddings?api-key={URL_SECRET}&x=1#frag-{URL_SECRET}"
    message = f"endpoint {url} said: Bearer {EMBED_KEY} for /v1/embeddings?api-key={URL_SECRET} ({URL_SECRET})"
    shown = db.execute("select kb_internal.redact(%s, %s, array[%s])", [message, url, EMBED_KEY]).fetchone()[0]
    assert URL_SECRET not in shown and EMBED_KEY not in shown and "pw-" not in shown
    assert shown.startswith("endpoint https://example.com:8443/v1/embeddings said: Bearer *** for"), shown
    assert db.execute("select kb_internal.shown_url('not a url ?k=secret')").fetchone()[0] == "(the configured URL)"


@pytest.mark.parametrize("key", [EMBED_KEY, EMBED_KEY + "\n"])  # a newline: http.client's own error quotes it
def test_embedding_failures_reach_searchers_without_secrets(db, searcher, fake_embeddings, key):
    endpoint = fake_embeddings(statuses=[401] * 5)
    set_settings(db, embedding_url=f"{endpoint.url}?api-key={URL_SECRET}", embedding_api_key=key)
    notices = notices_of(searcher)
    rows = searcher.execute("select doc_key, vector_used from kb.hybrid_search('checklist')").fetchall()
    assert rows == [("a.md", False)]
    failure = [n for n in notices if "query embedding failed" in n]
    assert failure, notices
    text = " ".join(notices)
    assert URL_SECRET not in text and EMBED_KEY not in text, text
    if key == EMBED_KEY:  # the endpoint was reached, and its (redacted) answer is shown
        assert "HTTP 401" in text and "Bearer ***" in text and "/v1/embeddings" in text, text


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_answer_echoing_the_key_shows_it_nowhere(db, searcher, fake_chat, stream):
    """The endpoint ends its answer with the Authorization header; streamed in 6-character deltas, the key
    is split across deltas (the end of each held back while it may begin a secret)."""
    chat = fake_chat("echo")
    set_settings(db, chat_url=f"{chat.url}?token={URL_SECRET}", chat_api_key=CHAT_KEY, embedding_url="")
    set_settings(db, answer_min_score="0")
    notices = notices_of(searcher)
    cur = searcher.execute(
        "select answer, mode, citations::text, evidence::text from kb.ask('退款到账时间', stream => %s)", [stream]
    )
    answer, mode, citations, evidence = cur.fetchone()
    assert mode == "llm" and chat.headers[0]["Authorization"] == f"Bearer {CHAT_KEY}"
    everything = " ".join([answer, citations, evidence, *notices])
    assert CHAT_KEY not in everything and URL_SECRET not in everything, everything
    assert "Bearer ***" in answer
    for i in range(8, len(CHAT_KEY)):  # no visible piece of the key either
        assert CHAT_KEY[:i] not in everything and CHAT_KEY[-i:] not in everything
    if stream:
        deltas = [n[len(DELTA) :] for n in notices if n.startswith(DELTA)]
        assert len(deltas) > 3 and "".join(deltas) == answer


def test_chat_errors_show_no_secret(db, searcher, fake_chat):
    chat = fake_chat("error500")
    set_settings(db, chat_url=f"{chat.url}?token={URL_SECRET}", chat_api_key=CHAT_KEY, embedding_url="")
    set_settings(db, answer_min_score="0")
    with pytest.raises(psycopg.errors.SystemError) as failed:
        db.execute("select kb_internal.chat_completion(%s, 'm', '[]'::jsonb)", [f"{chat.url}?token={URL_SECRET}"])
    message = str(failed.value)
    assert "HTTP 500" in message and CHAT_KEY not in message and URL_SECRET not in message, message
