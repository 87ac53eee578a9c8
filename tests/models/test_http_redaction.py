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
from pgkb.models.http_json import redact, shown_url
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
