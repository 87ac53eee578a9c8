"""The Python side's endpoint messages show no secret (issue 20, finding 3): an embedding endpoint whose
URL carries a key in its query string and whose errors echo the request line and the Authorization header.
The messages of the HTTP embedder, of the worker (kb.embedding_queue.last_error) and of `pgkb ingest`
(kb.ingest_failures, the summary) are redacted by pgkb.models.http_json.redact."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from pgkb.config import Settings
from pgkb.ingest import IngestOptions, ingest
from pgkb.models.embedding import OFFLINE_MODEL, EmbeddingError, HttpEmbedder, ModelSpec
from pgkb.models.http_json import endpoint_secrets, redact, redacted_excerpt, secret_start_length, shown_url
from pgkb.worker import run_worker

URL_SECRET = "urlsecret-4711"
KEY = "embedkey-0815-never-shown"
SPEC = ModelSpec(OFFLINE_MODEL, 384, "query: ", "passage: ")


@pytest.fixture
def careless(fake_embeddings) -> HttpEmbedder:
    endpoint = fake_embeddings(statuses=[401] * 20)
    return HttpEmbedder(f"{endpoint.url}?api-key={URL_SECRET}", SPEC.name, SPEC.dimension, KEY, retries=0)


def clean(text: str) -> bool:
    return URL_SECRET not in text and KEY not in text


def test_redact_is_the_databases_rule():
    url = f"https://u:pw-{URL_SECRET}@example.com:8443/v1/embeddings?api-key={URL_SECRET}&x=1#frag-{URL_SECRET}"
    message = f"endpoint {url} said: Bearer {KEY} for /v1/embeddings?api-key={URL_SECRET} ({URL_SECRET})"
    shown = redact(message, url, [KEY])
    assert clean(shown) and "pw-" not in shown
    assert shown.startswith("endpoint https://example.com:8443/v1/embeddings said: Bearer *** for"), shown
    assert shown_url("not a url ?k=secret") == "(the configured URL)"


def test_http_embedder_errors_are_redacted(careless):
    with pytest.raises(EmbeddingError) as failed:
        careless.embed(["text"])
    message = str(failed.value)
    assert "HTTP 401" in message and "Bearer ***" in message and clean(message), message


def test_worker_records_redacted_failures(db, careless):
    db.execute("select kb.replace_document('docs', 'a.md', 'T', %s::jsonb)", [json.dumps([{"content": "第一段"}])])
    info = db.info
    settings = dataclasses.replace(
        Settings.from_env(), database_url=f"host={info.host} port={info.port} user={info.user} dbname={info.dbname}"
    )
    assert run_worker(settings, once=True, embedder=careless).failed == 1
    errors = [r[0] for r in db.execute("select last_error from kb.embedding_queue").fetchall()]
    assert errors and all("HTTP 401" in e and clean(e) for e in errors), errors


def test_ingest_records_redacted_failures(db, careless, tmp_path: Path):
    (tmp_path / "a.md").write_text("# A\n\n第一段。\n", encoding="utf-8")
    summary = ingest(db, db.info.dsn, tmp_path, "docs", SPEC, careless, IngestOptions())
    recorded = [r[0] for r in db.execute("select error from kb.ingest_failures").fetchall()]
    assert summary.failed == 1 and recorded and all("HTTP 401" in e and clean(e) for e in recorded), recorded
    assert all(clean(f["error"]) for f in summary.failures)


LONG_KEY = "sk-" + "A1b2C3d4E5" * 4 + "f6G7h8J"  # 50 characters


@pytest.mark.parametrize("padding", [230, 245, 252, 260, 268, 280])
def test_an_error_cut_through_the_key_shows_none_of_it(fake_embeddings, padding):
    """Issue 32, finding 1: post_json cut the body to 300 bytes before redacting it, and /api/search's
    degraded_reason showed 36 characters of the key."""
    endpoint = fake_embeddings(statuses=[500] * 5, padding=padding)
    embedder = HttpEmbedder(endpoint.url, SPEC.name, SPEC.dimension, LONG_KEY, retries=0)
    with pytest.raises(EmbeddingError) as failed:
        embedder.embed(["text"])
    message = str(failed.value)
    assert "HTTP 500" in message
    assert not [LONG_KEY[i : i + 4] for i in range(len(LONG_KEY) - 3) if LONG_KEY[i : i + 4] in message], message


def test_the_excerpt_rule_is_the_databases(db):
    url = "http://127.0.0.1:9/v1/embeddings?token=urlsecret-4711"
    for pad in range(0, 320, 7):
        for already_cut in (False, True):
            text = "." * pad + " Bearer " + LONG_KEY + " urlsecret-47"
            ours = redacted_excerpt(text, url, [LONG_KEY], 300, already_cut)
            theirs = db.execute(
                "select kb_internal.redacted_excerpt(%s, %s, array[%s], 300, %s)", [text, url, LONG_KEY, already_cut]
            ).fetchone()[0]
            assert ours == theirs, (pad, already_cut)
    for text in ("abc sk-A1", "abc", "urlsecret", "x urlsecret-47"):
        expected = db.execute(
            "select kb_internal.secret_start_length(%s, kb_internal.endpoint_secrets(%s, array[%s]))",
            [text, url, LONG_KEY],
        ).fetchone()[0]
        assert secret_start_length(text, endpoint_secrets(url, [LONG_KEY])) == expected, text
