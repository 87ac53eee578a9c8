"""pgkb ingest: incremental folder sync, bad files reported and skipped, atomic and resumable."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pgkb.chunking import ChunkingOptions
from pgkb.folder import FolderError, read_inside
from pgkb.ingest import MAX_FILE_BYTES, IngestOptions, discover, ingest
from pgkb.models.embedding import OFFLINE_MODEL, ModelSpec

pytestmark = pytest.mark.slow  # whole ingest runs, with endpoints and subprocesses of their own

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
    (root / "archive.zip").write_bytes(b"PK\x03\x04")  # not a document type: skipped
    return root


def run(db, root: Path, embedder, **kw):
    options = IngestOptions(**kw)
    return ingest(db, db.info.dsn, root, "docs", SPEC, embedder, options)


def test_discover_takes_documents_and_skips_hidden_and_other_files(docs):
    keys = [f.doc_key for f in discover(docs, IngestOptions().include, IngestOptions().exclude)]
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


def test_a_new_base_url_reaches_files_whose_bytes_did_not_change(db, docs, embedder):
    run(db, docs, embedder)
    summary = run(db, docs, embedder, base_url="https://git.example.com/docs")
    assert summary.changed == 3
    urls = dict(db.execute("select doc_key, source_url from kb.documents").fetchall())
    assert urls["guide/login.md"] == "https://git.example.com/docs/guide/login.md"
    assert run(db, docs, embedder, base_url="https://git.example.com/docs").unchanged == 3


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


@contextlib.contextmanager
def tcp_relay(unix_socket: str) -> Iterator[int]:
    """A TCP port on 127.0.0.1 relaying every connection to a Unix socket (the test cluster listens on a
    socket in a mode-0700 directory, which a process without file-permission overrides cannot enter)."""
    listener = socket.create_server(("127.0.0.1", 0))
    opened: list[socket.socket] = []

    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            upstream = socket.socket(socket.AF_UNIX)
            opened.extend((client, upstream))
            upstream.connect(unix_socket)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        for s in (listener, *opened):
            s.close()


def test_unreadable_file_is_a_failure_not_a_deletion(db, docs, embedder):
    """A file the ingest cannot read is recorded as failed; its indexed version stays. The second run is
    `pgkb ingest` in a subprocess; as root it runs without the capabilities that bypass file permissions
    (setpriv drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding set), so mode 000 bites, and
    it reaches the database through a TCP relay to the cluster's socket."""
    run(db, docs, embedder)
    (docs / "policy.md").chmod(0)
    drop = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv") or shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
        assert setpriv, "running as root needs setpriv (util-linux, like the runuser the test cluster uses)"
        drop = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]
    info = db.info
    cli = [sys.executable, "-m", "pgkb.cli", "ingest", str(docs), "--kb", "docs", "--json", "--defer-embedding"]
    with tcp_relay(f"{info.host}/.s.PGSQL.{info.port}") as port:
        url = f"host=127.0.0.1 port={port} dbname={info.dbname} user={info.user} sslmode=disable"
        env = dict(os.environ, PGKB_DATABASE_URL=url)
        result = subprocess.run(drop + cli, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failures"] == [{"doc_key": "policy.md", "error": "cannot read: Permission denied"}]
    assert (summary["removed"], summary["unchanged"], summary["failed"]) == (0, 2, 1)
    assert recorded_failures(db) == {"policy.md": "cannot read: Permission denied"}
    kept = db.execute("select chunk_count from kb.documents where doc_key = 'policy.md'").fetchone()
    assert kept is not None and kept[0] >= 1


def test_symlinks_out_of_the_folder_are_refused_recorded_and_never_read(db, docs, embedder, tmp_path):
    """A file or directory reached through a symlink that resolves outside the folder is not read: it is a
    recorded failure with the reason, and an indexed version of its key goes (here: a file swapped for a
    link between runs). Symlinks to files inside the folder are taken under the link's name."""
    outside = tmp_path / "outside"
    (outside / "more").mkdir(parents=True)
    (outside / "secret.txt").write_text("外部机密：发射代码 amber seven。\n", encoding="utf-8")
    (outside / "more" / "plan.md").write_text("# Plan\n\nThe outside plan is amber seven.\n", encoding="utf-8")
    shutil.copy(outside / "secret.txt", docs / "leak.txt")
    run(db, docs, embedder)
    assert db.execute("select count(*) from kb.get_document('leak.txt', 'docs')").fetchone()[0] == 1
    (docs / "leak.txt").unlink()
    (docs / "leak.txt").symlink_to(outside / "secret.txt")
    (docs / "guide" / "outdir").symlink_to(Path("..") / ".." / "outside" / "more")
    (docs / "alias.md").symlink_to(Path("guide") / "login.md")
    (docs / "loop.md").symlink_to("loop.md")  # leads nowhere: skipped, as a dangling link is
    summary = run(db, docs, embedder)
    refused = "a symlink that resolves outside the ingested folder: not read"
    expected = {"guide/outdir": refused, "leak.txt": refused}
    assert {f["doc_key"]: f["error"] for f in summary.failures} == expected
    assert (summary.failed, summary.added, summary.removed) == (2, 1, 1)
    assert recorded_failures(db) == expected
    with pytest.raises(psycopg.errors.NoDataFound, match="unknown document"):
        db.execute("select * from kb.get_document('leak.txt', 'docs')")
    assert db.execute("select count(*) from kb.chunks where content like '%amber%'").fetchone()[0] == 0
    keys = [r[0] for r in db.execute("select doc_key from kb.documents order by 1").fetchall()]
    assert keys == ["alias.md", "guide/login.md", "notes.txt", "policy.md"]


def test_a_path_swapped_for_a_symlink_after_the_walk_is_not_read(docs, tmp_path):
    """Between the walk and the read, a directory on a found file's path or the file itself becomes a link
    out of the folder: the read follows no symlink, so it fails instead of reading the outside file."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "login.md").write_text("outside secret", encoding="utf-8")
    found = {f.doc_key: f for f in discover(docs, IngestOptions().include, IngestOptions().exclude)}
    assert read_inside(docs, found["policy.md"].parts, MAX_FILE_BYTES) == REFUND.encode()
    shutil.move(docs / "guide", tmp_path / "guide-moved")
    (docs / "guide").symlink_to(outside)
    (docs / "policy.md").unlink()
    (docs / "policy.md").symlink_to(outside / "login.md")
    for key in ("guide/login.md", "policy.md"):
        with pytest.raises(FolderError, match="changed into a symlink"):
            read_inside(found[key].root, found[key].parts, MAX_FILE_BYTES)


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


def test_cli_builds_the_hnsw_index_of_a_knowledge_base_grown_past_exact_search(db, docs):
    """Issue 32: a knowledge base of vector_exact_chunks chunks or more is expected to have its HNSW index.
    `pgkb ingest`, when its session owns schema kb, builds a missing one CONCURRENTLY after the run, so the
    knowledge base leaves exact search at once; others leave it to `pgkb db migrate`."""
    db.execute("update kb.settings set value = '2' where key = 'vector_exact_chunks'")
    env = dict(os.environ, PGKB_DATABASE_URL=db.info.dsn)
    cli = [sys.executable, "-m", "pgkb.cli", "ingest", str(docs), "--kb", "docs", "--defer-embedding"]
    result = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    name = db.execute(
        "select kb.hnsw_index_name(m.id, k.id) from kb.embedding_models as m, kb.knowledge_bases as k"
        " where m.is_default and k.name = 'docs'"
    ).fetchone()[0]
    assert f"pgkb: index kb.{name} created (was missing)" in result.stderr
    assert db.execute("select count(*) from kb_admin.index_problems()").fetchone()[0] == 0
    again = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "index kb." not in again.stderr


# ------------------------------------------------------------------------------ failures that must not stop a run


def recorded_failures(db) -> dict[str, str]:
    return dict(db.execute("select doc_key, error from kb.ingest_failures").fetchall())


def more_docs(docs: Path, n: int) -> None:
    for i in range(n):
        (docs / f"extra{i}.md").write_text(f"# 补充文档 {i}\n\n第 {i} 份补充说明。\n", encoding="utf-8")


def test_embedding_endpoint_down_records_failures_stops_early_and_rerun_resumes(db, docs, embedder, dead_embedding_url):
    from pgkb.models.embedding import HttpEmbedder

    more_docs(docs, 3)  # 6 files: 3 fail in a row, then the run stops
    down = HttpEmbedder(dead_embedding_url, SPEC.name, SPEC.dimension, retries=0)
    summary = run(db, docs, down)
    assert (summary.added, summary.failed, summary.not_attempted) == (0, 3, 3)
    assert summary.stopped and "embedding endpoint looks down" in summary.stopped
    failed = recorded_failures(db)
    assert set(failed) == {f["doc_key"] for f in summary.failures} and len(failed) == 3
    assert all("embedding failed" in e and "unreachable" in e for e in failed.values())
    assert db.execute("select count(*) from kb.documents").fetchone()[0] == 0
    # once the endpoint is back, the next run does everything and clears the failures
    again = run(db, docs, embedder)
    assert (again.added, again.failed, again.stopped) == (6, 0, None)
    assert recorded_failures(db) == {}
    assert run(db, docs, embedder).unchanged == 6


def test_one_document_failing_to_embed_does_not_stop_the_run(db, docs, embedder):
    class FailsOnRefunds:
        name, dimension = embedder.name, embedder.dimension

        def embed(self, texts):
            if any("退款" in t for t in texts):
                raise RuntimeError("model crashed on this input")
            return embedder.embed(texts)

    summary = run(db, docs, FailsOnRefunds())
    assert (summary.added, summary.failed, summary.stopped) == (2, 1, None)
    assert recorded_failures(db) == {"policy.md": "embedding failed: model crashed on this input"}


def test_database_errors_fail_only_their_document(db, docs, embedder):
    """A check violation, a statement timeout, a doc_key longer than the database accepts, one too wide for
    its index and a lost (but re-opened) connection each cost only their document; the documents around them
    are written."""
    db.execute("alter table kb.documents add constraint test_no_rejected check (doc_key <> 'rejected.md')")
    db.execute(
        "create function public.test_trap() returns trigger language plpgsql as $$ begin"
        " if new.doc_key = 'slow.md' then perform pg_sleep(5); end if;"
        " if new.doc_key = 'kill.md' then perform pg_terminate_backend(pg_backend_pid()); end if;"
        " return new; end $$"
    )
    db.execute(
        "create trigger test_trap before insert on kb.documents for each row execute function public.test_trap()"
    )
    for name in ("rejected.md", "slow.md", "kill.md"):
        (docs / name).write_text(f"# {name}\n\n这份文档写入时会出错。\n", encoding="utf-8")
    deep = docs
    for i in range(5):  # a doc_key of more than 1000 characters
        deep = deep / (f"{i}" * 210)
    deep.mkdir(parents=True)
    (deep / "long.md").write_text("# 很长的路径\n\n路径超过一千个字符。\n", encoding="utf-8")
    long_key = (deep / "long.md").relative_to(docs).as_posix()
    wide = docs  # under 1000 characters, but more bytes than a btree index row holds (2704)
    for i in range(11):
        wide = wide / "".join(chr(0x4E00 + (i * 83 + j) * 37 % 20000) for j in range(83))
    wide.mkdir(parents=True)
    (wide / "wide.md").write_text("# 很宽的路径\n\n路径的字节数超过索引行的上限。\n", encoding="utf-8")
    wide_key = (wide / "wide.md").relative_to(docs).as_posix()
    assert len(wide_key) < 1000 < 2704 < len(wide_key.encode())
    url = db.info.dsn + " options='-c statement_timeout=1000'"
    summary = ingest(db, url, docs, "docs", SPEC, embedder, IngestOptions())
    failed = {f["doc_key"]: f for f in summary.failures}
    assert set(failed) == {"rejected.md", "slow.md", "kill.md", long_key, wide_key}
    assert "2000 bytes" in failed[wide_key]["error"] and "22023" in failed[wide_key]["error"]  # checked, not raw
    assert "test_no_rejected" in failed["rejected.md"]["error"] and "23514" in failed["rejected.md"]["error"]
    assert "statement timeout" in failed["slow.md"]["error"] and "57014" in failed["slow.md"]["error"]
    assert "connection was lost" in failed["kill.md"]["error"]
    assert "1000 characters" in failed[long_key]["error"] and "1000 characters" in failed[long_key]["not_recorded"]
    assert (summary.added, summary.failed, summary.stopped) == (3, 5, None)
    assert set(recorded_failures(db)) == {"rejected.md", "slow.md", "kill.md"}  # the others fit no row either
    written = {r[0] for r in db.execute("select doc_key from kb.documents").fetchall()}
    assert written == {"guide/login.md", "notes.txt", "policy.md"}


def test_lost_database_aborts_with_the_summary_so_far(db, docs):
    """When the connection is lost and cannot be re-opened (here: the role may no longer log in), the run
    stops with an honest message; --json still prints the summary, and the next run resumes."""
    import time

    db.execute("select kb.create_user('carol', 'carol')")
    db.execute("select kb.create_knowledge_base('docs', 'private', owner => 'carol')")
    db.execute(
        "create function public.test_stall() returns trigger language plpgsql as $$ begin"
        " if new.doc_key = 'policy.md' then perform pg_sleep(60); end if; return new; end $$"
    )
    db.execute(
        "create trigger test_stall before insert on kb.documents for each row execute function public.test_stall()"
    )
    info = db.info
    env = dict(os.environ, PGKB_DATABASE_URL=f"host={info.host} port={info.port} dbname={info.dbname} user=carol")
    cli = [sys.executable, "-m", "pgkb.cli", "ingest", str(docs), "--kb", "docs", "--json", "--defer-embedding"]
    proc = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not db.execute(
            "select 1 from pg_stat_activity where usename = 'carol' and wait_event = 'PgSleep'"
        ).fetchone():  # the writer is inside policy.md's insert
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        db.execute("alter role carol nologin")
        db.execute("select pg_terminate_backend(pid) from pg_stat_activity where wait_event = 'PgSleep'")
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        db.execute("alter role carol login")
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    summary = json.loads(stdout)
    assert "lost the database connection" in summary["stopped"] and "not permitted to log in" in summary["stopped"]
    assert "cannot reach the database" not in stderr and "ingest stopped early" in stderr
    assert summary["added"] == 2  # guide/login.md and notes.txt, written before policy.md
    db.execute("drop trigger test_stall on kb.documents")
    result = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    again = json.loads(result.stdout)
    assert (again["added"], again["unchanged"], again["failed"], again["stopped"]) == (1, 2, 0, None)


def test_cli_json_summary_when_the_embedding_endpoint_is_down(db, docs, dead_embedding_url):
    env = dict(os.environ, PGKB_DATABASE_URL=db.info.dsn, PGKB_EMBED_PROVIDER="http", PGKB_EMBED_URL=dead_embedding_url)
    cli = [sys.executable, "-m", "pgkb.cli", "ingest", str(docs), "--kb", "docs", "--json"]
    result = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failed"] == 3 and summary["added"] == 0 and "looks down" in summary["stopped"]
    assert set(recorded_failures(db)) == {"guide/login.md", "notes.txt", "policy.md"}
    assert "unreachable" in summary["failures"][0]["error"] and "(after 4 attempts)" in summary["failures"][0]["error"]


def test_decomposed_file_names_are_one_nfc_document(db, docs, embedder):
    """A decomposed (NFD) file name, as macOS writes them, is stored under its NFC key, and a re-run finds
    it unchanged instead of deleting and re-adding it."""
    import unicodedata

    nfd = unicodedata.normalize("NFD", "café.md")
    (docs / nfd).write_text("# Café\n\nLe café ouvre à 8 h.\n", encoding="utf-8")
    first = run(db, docs, embedder)
    assert not first.failures
    keys = {r[0] for r in db.execute("select doc_key from kb.documents")}
    assert "café.md" in keys and nfd not in keys
    again = run(db, docs, embedder)
    assert (again.added, again.changed, again.removed, again.unchanged) == (0, 0, 0, first.added)


# ------------------------------------------------------------------------- the engine on titled texts


class CountingEmbedder:
    """The offline model, recording how many texts each call embeds; fails on texts containing ``poison``."""

    def __init__(self, embedder, poison: str | None = None) -> None:
        self.inner, self.poison, self.calls = embedder, poison, []
        self.name, self.dimension = embedder.name, embedder.dimension

    def embed(self, texts):
        self.calls.append(len(texts))
        if self.poison and any(self.poison in t for t in texts):
            raise RuntimeError(f"cannot embed {self.poison}")
        return self.inner.embed(texts)


def texts(n: int, changed: int | None = None) -> list:
    from pgkb.sources import TextDocument

    return [
        TextDocument(f"t{i}", f"标题 {i}", f"第 {i} 段正文{'（改过）' if i == changed else ''}。", {"n": i})
        for i in range(n)
    ]


def test_text_documents_are_embedded_across_documents_and_synced(db, embedder):
    from pgkb.ingest import ingest_documents

    counting = CountingEmbedder(embedder)
    options = IngestOptions(embed_batch=3)
    summary = ingest_documents(db, db.info.dsn, "texts", SPEC, counting, texts(5), options)
    assert (summary.added, summary.chunks, summary.failed) == (5, 5, 0)
    assert counting.calls == [3, 2]  # one chunk each: 3 documents in the first call, the rest at the end
    title, metadata, source_type = db.execute(
        "select title, metadata, source_type from kb.documents where doc_key = 't1'"
    ).fetchone()
    assert (title, metadata, source_type) == ("标题 1", {"n": 1}, "text")
    content = db.execute(
        "select c.content from kb.chunks c join kb.documents d on d.id = c.document_id where d.doc_key = 't1'"
    ).fetchone()[0]
    assert content == "第 1 段正文。" and db.execute("select count(*) from kb.embeddings").fetchone()[0] == 5
    counting.calls.clear()
    again = ingest_documents(db, db.info.dsn, "texts", SPEC, counting, texts(4, changed=2), options)
    assert (again.unchanged, again.changed, again.added, again.removed) == (3, 1, 0, 1)
    assert counting.calls == [1]


def test_a_failed_batch_is_embedded_document_by_document(db, embedder):
    from pgkb.ingest import ingest_documents
    from pgkb.sources import TextDocument

    docs = texts(4) + [TextDocument("bad", "poison", "正文"), TextDocument("t9", "标题 9", "")]
    counting = CountingEmbedder(embedder, poison="poison")
    summary = ingest_documents(db, db.info.dsn, "texts", SPEC, counting, docs, IngestOptions(embed_batch=100))
    assert (summary.added, summary.failed, summary.stopped) == (5, 1, None)
    assert counting.calls == [6, 1, 1, 1, 1, 1, 1]  # the whole batch, then each document alone
    assert recorded_failures(db) == {"bad": "embedding failed: cannot embed poison"}
    # a document without text but with a title is its title
    assert db.execute(
        "select c.content from kb.chunks c join kb.documents d on d.id = c.document_id where d.doc_key = 't9'"
    ).fetchone() == ("标题 9",)
