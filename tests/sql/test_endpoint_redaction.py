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


LONG_KEY = "sk-" + "A1b2C3d4E5" * 4 + "f6G7h8J"  # 50 characters, like a real key


def visible_pieces(text: str, secret: str, shortest: int = 8) -> list[str]:
    """The pieces of secret, of at least `shortest` characters, that text shows."""
    return [
        secret[i:j] for i in range(len(secret)) for j in range(i + shortest, len(secret) + 1) if secret[i:j] in text
    ]


def test_an_excerpt_is_redacted_before_it_is_cut(db):
    """Issue 32, finding 1: a cut through a secret leaves neither its start nor its end
    (kb_internal.redacted_excerpt)."""
    url = "http://127.0.0.1:9/v1/embeddings"
    for pad in range(0, 320, 3):
        message = "." * pad + " Bearer " + LONG_KEY + " tail"
        for already_cut in (False, True):
            shown = db.execute(
                "select kb_internal.redacted_excerpt(%s, %s, array[%s], 300, %s)", [message, url, LONG_KEY, already_cut]
            ).fetchone()[0]
            assert not visible_pieces(shown, LONG_KEY, 3), (pad, shown)
            assert len(shown) <= 301 and shown.startswith("." * min(pad, 290))
    # a body read up to a bound may end in the start of a secret: it is dropped
    cut = "answer: Bearer " + LONG_KEY[:20]
    shown = db.execute(
        "select kb_internal.redacted_excerpt(%s, %s, array[%s], 300, true)", [cut, url, LONG_KEY]
    ).fetchone()
    assert shown[0] == "answer: Bearer …"
    assert db.execute("select kb_internal.secret_start_length('abc sk-A1', array[%s])", [LONG_KEY]).fetchone()[0] == 5
    assert db.execute("select kb_internal.secret_start_length('abc', array['xyz', ''])").fetchone()[0] == 0


@pytest.mark.parametrize("padding", [230, 245, 252, 260, 268, 280])
def test_an_embedding_error_cut_through_the_key_shows_none_of_it(db, searcher, fake_embeddings, padding):
    """Issue 32, finding 1: an endpoint that answers 500 with ~265 characters and then the key. Before, the body
    was cut to 300 bytes first, and the first 35 characters of the key were shown in search notices and evidence."""
    endpoint = fake_embeddings(statuses=[500] * 20, padding=padding)
    set_settings(db, embedding_url=endpoint.url, embedding_api_key=LONG_KEY, chat_url="")
    notices = notices_of(searcher)
    searcher.execute("select * from kb.hybrid_search('checklist')").fetchall()
    searcher.execute("select * from kb.retrieve('checklist')").fetchall()
    evidence = searcher.execute("select evidence::text from kb.ask('checklist')").fetchone()[0]
    text = " ".join([*notices, evidence])
    assert "HTTP 500" in text, text
    assert not visible_pieces(text, LONG_KEY, 4), visible_pieces(text, LONG_KEY, 4)


@pytest.mark.parametrize("padding", [250, 300, 360, 390])
def test_a_chat_error_cut_through_the_key_shows_none_of_it(db, searcher, fake_chat, padding):
    chat = fake_chat("error500", padding=padding)
    set_settings(db, chat_url=chat.url, chat_api_key=LONG_KEY, embedding_url="", answer_min_score="0")
    evidence = searcher.execute("select evidence::text from kb.ask('退款到账时间')").fetchone()[0]
    assert "HTTP 500" in evidence, evidence
    assert not visible_pieces(evidence, LONG_KEY, 4), visible_pieces(evidence, LONG_KEY, 4)


@pytest.mark.parametrize("stream", [False, True])
def test_the_answers_model_is_pgkbs_own_not_the_endpoints(db, searcher, fake_chat, stream):
    """Issue 32, finding 2: the endpoint's `model` field echoed the key; kb.ask returned it unredacted."""
    chat = fake_chat("model_echo")
    set_settings(db, chat_url=chat.url, chat_api_key=CHAT_KEY, chat_model="qwen-plus", embedding_url="")
    set_settings(db, answer_min_score="0")
    row = searcher.execute("select mode, model, evidence::text from kb.ask('退款到账时间', stream => %s)", [stream])
    mode, model, evidence = row.fetchone()
    assert mode == "llm" and model == "qwen-plus", (mode, model)
    assert not visible_pieces(evidence, CHAT_KEY), evidence
