"""pgkb ingest: incremental folder sync, bad files reported and skipped, atomic and resumable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pgkb.chunking import ChunkingOptions
from pgkb.ingest import IngestOptions, discover, ingest
from pgkb.models.embedding import OFFLINE_MODEL, ModelSpec

SPEC = ModelSpec(OFFLINE_MODEL, 384, "query: ", "passage: ")
LOGIN = """---
title: 登录态失效排查手册
reviewer: alice
---

# 登录态失效排查手册

## 排查步骤

用户登录后 token 过期会导致登录态失效。排查时先检查 Redis 缓存击穿，再确认 session 的过期时间配置。

```bash
# 这不是标题
redis-cli ttl session:123
```
"""
REFUND = "# 退款政策\n\n订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。\n"


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "guide").mkdir(parents=True)
    (root / "guide" / "login.md").write_text(LOGIN, encoding="utf-8")
    (root / "policy.md").write_text(REFUND, encoding="utf-8")
    (root / "notes.txt").write_text("部署前先备份数据库。\n\n回滚用 kubectl rollout undo。\n", encoding="utf-8")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD.md").write_text("ignored", encoding="utf-8")
    (root / "image.png").write_bytes(b"\x89PNG\r\n")
    return root


def run(db, root: Path, embedder, **kw):
    options = IngestOptions(**kw)
    return ingest(db, db.info.dsn, root, "docs", SPEC, embedder, options)


def test_discover_takes_documents_and_skips_hidden_and_other_files(docs):
    keys = [k for k, _ in discover(docs, IngestOptions().include, IngestOptions().exclude)]
    assert keys == ["guide/login.md", "notes.txt", "policy.md"]


def test_first_run_adds_everything_with_embeddings(db, docs, embedder):
    summary = run(db, docs, embedder)
    assert (summary.added, summary.changed, summary.unchanged, summary.failed) == (3, 0, 0, 0)
    assert summary.chunks == db.execute("select count(*) from kb.chunks").fetchone()[0] > 0
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    title, metadata, source = db.execute(
        "select title, metadata, source_url from kb.documents where doc_key = 'guide/login.md'"
    ).fetchone()
    assert title == "登录态失效排查手册" and metadata["reviewer"] == "alice"
    assert source.endswith("guide/login.md")
    # front matter is metadata, not text; the code block's '#' is not a heading
    contents = " ".join(r[0] for r in db.execute("select content from kb.chunks").fetchall())
    assert "reviewer" not in contents and "# 这不是标题" in contents


def test_ingested_documents_are_searchable(db, docs, embedder):
    run(db, docs, embedder)
    from pgvector import Vector

    query = Vector(embedder.embed(["query: 退款多久到账"])[0])
    top = db.execute(
        "select doc_key, vector_rank, lexical_rank from kb.hybrid_search('退款多久到账', 3, query_embedding => %s)",
        [query],
    ).fetchone()
    assert top[0] == "policy.md" and top[1] is not None and top[2] is not None


def test_rerun_is_incremental(db, docs, embedder):
    run(db, docs, embedder)
    ids = dict(db.execute("select doc_key, id from kb.documents").fetchall())
    again = run(db, docs, embedder)
    assert (again.added, again.changed, again.unchanged, again.removed) == (0, 0, 3, 0)
    (docs / "policy.md").write_text(REFUND + "\n## 例外\n\n定制商品不支持无理由退款。\n", encoding="utf-8")
    (docs / "notes.txt").unlink()
    (docs / "new.md").write_text("# 新文档\n\n网关超时时间默认 30 秒。\n", encoding="utf-8")
    third = run(db, docs, embedder)
    assert (third.added, third.changed, third.unchanged, third.removed) == (1, 1, 1, 1)
    after = dict(db.execute("select doc_key, id from kb.documents").fetchall())
    assert after["policy.md"] == ids["policy.md"] and "notes.txt" not in after
    assert db.execute("select count(*) from kb.chunks where content like '%定制商品%'").fetchone()[0] == 1


def test_files_without_text_are_skipped_not_failed(db, docs, embedder):
    (docs / "components.md").write_text("---\ntitle: 组件\n---\n\n<script setup>\nimport X from './X.vue'\n</script>\n")
    summary = run(db, docs, embedder)
    assert (summary.added, summary.failed, summary.empty) == (3, 0, 1)
    (docs / "policy.md").write_text("---\ntitle: 退款政策\n---\n")
    again = run(db, docs, embedder)
    assert (again.empty, again.removed) == (2, 1)
    assert db.execute("select count(*) from kb.documents where doc_key = 'policy.md'").fetchone()[0] == 0


def test_no_delete_keeps_documents_of_removed_files(db, docs, embedder):
    run(db, docs, embedder)
    (docs / "notes.txt").unlink()
    summary = run(db, docs, embedder, delete=False)
    assert summary.removed == 0
    assert db.execute("select count(*) from kb.documents where doc_key = 'notes.txt'").fetchone()[0] == 1


def test_chunking_options_change_rechunks_unchanged_files(db, docs, embedder):
    run(db, docs, embedder)
    summary = run(db, docs, embedder, chunking=ChunkingOptions(max_chars=200))
    assert summary.changed == 3


def test_bad_files_are_reported_recorded_and_skipped(db, docs, embedder):
    (docs / "latin1.md").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (docs / "binary.txt").write_bytes(b"abc\x00\x01\x02")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf")
    with open(docs / "huge.md", "wb") as f:  # 50 MB, sparse: the size check refuses it before reading
        f.truncate(50 * 1024 * 1024)
    summary = run(db, docs, embedder)
    failed = {f["doc_key"]: f["error"] for f in summary.failures}
    assert set(failed) == {"latin1.md", "binary.txt", "broken.pdf", "huge.md"}
    assert "UTF-8" in failed["latin1.md"] and "MB" in failed["huge.md"]
    assert summary.added == 3 and summary.failed == 4
    recorded = dict(db.execute("select doc_key, error from kb.ingest_failures").fetchall())
    assert set(recorded) == set(failed)
    # fixing a file clears its failure on the next run
    (docs / "latin1.md").write_text("café au lait", encoding="utf-8")
    run(db, docs, embedder)
    assert "latin1.md" not in dict(db.execute("select doc_key, error from kb.ingest_failures").fetchall())


@pytest.mark.skipif(os.geteuid() == 0, reason="running as root: file permissions cannot make a file unreadable")
def test_unreadable_file_is_a_failure_not_a_deletion(db, docs, embedder):
    run(db, docs, embedder)
    (docs / "policy.md").chmod(0)
    summary = run(db, docs, embedder)
    assert [f["doc_key"] for f in summary.failures] == ["policy.md"] and summary.removed == 0


def test_interrupted_run_leaves_whole_documents_and_rerun_completes(db, docs, embedder):
    class Interrupting:
        name, dimension, calls = embedder.name, embedder.dimension, 0

        def embed(self, texts):
            Interrupting.calls += 1
            if Interrupting.calls == 2:
                raise KeyboardInterrupt
            return embedder.embed(texts)

    with pytest.raises(KeyboardInterrupt):
        run(db, docs, Interrupting())
    written = db.execute(
        "select d.doc_key, d.chunk_count, count(c.id) from kb.documents d"
        " left join kb.chunks c on c.document_id = d.id group by 1, 2"
    ).fetchall()
    assert len(written) == 1 and all(n == count for _, n, count in written)
    summary = run(db, docs, embedder)
    assert summary.added == 2 and summary.unchanged == 1


def test_defer_embedding_queues_chunks_for_the_worker(db, docs):
    summary = run(db, docs, None, defer_embedding=True)
    assert summary.added == 3
    queued = db.execute("select count(*) from kb.embedding_queue").fetchone()[0]
    assert queued == summary.chunks and db.execute("select count(*) from kb.embeddings").fetchone()[0] == 0


def test_cli_json_summary_and_exit_code(db, docs, tmp_path):
    (docs / "bad.md").write_bytes(b"\xff\xfe bad")
    env = dict(os.environ, PGKB_DATABASE_URL=db.info.dsn)
    cli = [sys.executable, "-m", "pgkb.cli", "ingest", str(docs), "--kb", "docs", "--json", "--defer-embedding"]
    result = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert {"added", "changed", "unchanged", "removed", "failed", "chunks", "seconds"} <= summary.keys()
    assert summary["added"] == 3 and summary["failed"] == 1
    result = subprocess.run(cli[:-1] + ["--defer-embedding"], env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(result.stdout)["unchanged"] == 3
    missing = subprocess.run(
        [sys.executable, "-m", "pgkb.cli", "ingest", str(tmp_path / "nope"), "--kb", "docs"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "is not a directory" in missing.stderr
