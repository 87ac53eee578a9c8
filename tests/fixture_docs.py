"""A small hand-written knowledge base (Chinese + English) whose expected rankings were checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

DOCS = [
    (
        "guide/login.md",
        "登录态失效排查手册",
        [
            (
                "用户登录后 token 过期会导致登录态失效。排查时先检查 Redis 缓存击穿，再确认 session 的过期时间配置。",
                ["排查步骤"],
            ),
            ("如果网关返回 401，说明 JWT 签名校验失败，需要重新获取令牌。", ["常见错误"]),
        ],
    ),
    (
        "policy/refund.md",
        "退款政策",
        [
            ("订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。", ["规则"]),
        ],
    ),
    (
        "db/tidb.md",
        "TiDB 内存配置",
        [
            ("通过 tidb_mem_quota_query 限制单条 SQL 的内存使用，超出配额的查询会被取消。", ["参数"]),
        ],
    ),
    (
        "ops/deploy.md",
        "Deployment guide",
        [
            (
                "To deploy the service, build the Docker image and roll it out with kubectl apply. "
                "Rollbacks use kubectl rollout undo.",
                ["Deploy"],
            ),
        ],
    ),
    (
        "security/audit.md",
        "合规要求",
        [
            ("公司通过 ISO27001 认证，所有 createUser 操作都必须写入审计日志。", ["审计"]),
        ],
    ),
    (
        "perf/tuning.md",
        "性能调优",
        [
            ("为数据库加索引、开启查询结果缓存，可以显著降低接口延迟，提升吞吐量。", ["建议"]),
        ],
    ),
]


_VECTORS: dict[object, list[list[list[float]]]] = {}  # embedder -> each document's chunk vectors (DOCS never change)


def _vectors(embedder) -> list[list[list[float]]]:
    """The passage embeddings of every chunk of DOCS by ``embedder`` (one call per document, as ingestion
    makes them), computed once per embedder."""
    if embedder not in _VECTORS:
        _VECTORS[embedder] = [
            [
                [float(x) for x in vec]
                for vec in embedder.embed(
                    ["passage: " + title + " > " + " > ".join(path) + "\n" + content for content, path in chunks]
                )
            ]
            for _, title, chunks in DOCS
        ]
    return _VECTORS[embedder]


def load(conn, embedder, kb: str = "team-docs", source_root: Path | None = None) -> dict[str, int]:
    """Write DOCS with real passage embeddings; returns doc_key -> document id. ``source_root``: record each
    document's source as ``source_root/doc_key``, as `pgkb ingest` of that folder does without --base-url."""
    ids = {}
    for (doc_key, title, chunks), vectors in zip(DOCS, _vectors(embedder), strict=True):
        payload = [
            {"content": content, "heading_path": path, "embedding": vec}
            for (content, path), vec in zip(chunks, vectors, strict=True)
        ]
        source = None if source_root is None else str(source_root / doc_key)
        row = conn.execute(
            "select document_id from kb.replace_document(kb => %s, doc_key => %s, title => %s, chunks => %s,"
            " source_url => %s)",
            [kb, doc_key, title, json.dumps(payload), source],
        ).fetchone()
        ids[doc_key] = row[0]
    return ids
