"""Reliability 2: crashes. kill -9 of `pgkb ingest` mid-run, of `pgkb worker` mid-batch and of the PostgreSQL
postmaster mid-ingest (then restart). After each kill nothing is half-written (chunk counts and BM25
statistics agree with the chunks); re-running converges to exactly the source folder -- no duplicate, lost,
stale or half-written document, no chunk unembedded or stuck in a lease; a worker picks up expired leases.

The processes are the real CLI (`python -m pgkb.cli ...`) against a cluster of the module's own (so the
postmaster may be killed), embedding through a fake OpenAI-compatible endpoint on 127.0.0.1 that is slowed
down so that the kills land mid-run. Fast: 2 kills of each kind (1 of the postmaster); long: more.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import relhelpers as rh

pytestmark = pytest.mark.reliability

SECTIONS = [
    ("部署", "部署前先备份数据库，然后用 kubectl apply 滚动发布；失败时执行 kubectl rollout undo 回滚。"),
    ("排查", "接口超时先看网关日志，再看数据库慢查询；连接池满了要检查是否有长事务没有提交。"),
    ("Config", "Set PGKB_STATEMENT_TIMEOUT_MS to bound slow queries; the default is ten seconds for every call."),
    ("缓存", "Redis 缓存击穿时热点 key 过期，大量请求直接打到数据库；可以用互斥锁或者逻辑过期解决。"),
    ("FAQ", "Q: 退款多久到账？ A: 审核通过后三个工作日内原路退回，节假日顺延。"),
]


def write_doc(path: Path, rng: random.Random, revision: int) -> None:
    """A Markdown document of 2-5 sections (each long enough to be a chunk of its own)."""
    parts = [f"# 文档 {path.stem} 第 {revision} 版\n"]
    for title, text in rng.sample(SECTIONS, rng.randint(2, 5)):
        parts.append(f"## {title} r{revision}\n\n" + " ".join([text] * rng.randint(2, 6)) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")


def make_corpus(root: Path, n: int, seed: int = 7) -> random.Random:
    rng = random.Random(seed)
    for i in range(n):
        write_doc(root / f"dir{i % 4}" / f"doc{i:03d}.md", rng, 0)
    return rng


def mutate(root: Path, rng: random.Random, revision: int) -> None:
    """Between crashes the folder changes: some files edited, one deleted, one added."""
    files = sorted(root.rglob("*.md"))
    for path in rng.sample(files, min(3, len(files))):
        write_doc(path, rng, revision)
    rng.choice(files).unlink()
    write_doc(root / "new" / f"added{revision}.md", rng, revision)


def doc_count(admin, kb: str) -> int:
    return admin.execute(
        "select count(*) from kb.documents d join kb.knowledge_bases k on k.id = d.kb_id where k.name = %s", [kb]
    ).fetchone()[0]


@pytest.fixture(scope="module")
def own():
    cluster = rh.OwnCluster()
    yield cluster
    cluster.close()


@pytest.fixture
def admin(own):
    conn = own.connect()
    yield conn
    conn.close()


def ingest(own, fake, root: Path, kb: str, logdir: Path, name: str, *extra: str) -> rh.Child:
    env = rh.child_env(own.admin_url, fake.url)
    return rh.spawn(["ingest", str(root), "--kb", kb, "--json", *extra], env, logdir, name)


def test_kill9_ingest_mid_run_then_rerun_converges(own, admin, fake, tmp_path):
    kb, root = "crash-ingest", tmp_path / "src"
    rng = make_corpus(root, rh.scale(40, 120))
    fake.always_delay, fake.delay = True, 0.05  # ~50 ms per document: the kills land mid-run
    kills, killed_at = rh.scale(2, 8), []
    for round_ in range(kills):
        before = doc_count(admin, kb) if round_ else 0
        child = ingest(own, fake, root, kb, tmp_path / "logs", f"ingest{round_}")
        target = before + rng.randint(2, 8)
        rh.wait_for(lambda: doc_count(admin, kb) >= target or child.proc.poll() is not None, 60)  # noqa: B023
        assert child.proc.poll() is None, f"ingest finished before the kill: {child.stderr()[-500:]}"
        child.kill9()
        killed_at.append(doc_count(admin, kb))
        assert rh.integrity_problems(admin) == []  # whatever was written is whole
        mutate(root, rng, round_ + 1)
    fake.always_delay = False
    final = ingest(own, fake, root, kb, tmp_path / "logs", "final")
    assert final.proc.wait(120) == 0, final.stderr()[-2000:]
    summary = json.loads(final.stdout())
    assert rh.convergence_problems(admin, kb, root) == []
    again = ingest(own, fake, root, kb, tmp_path / "logs", "again")
    assert again.proc.wait(120) == 0 and json.loads(again.stdout())["unchanged"] == len(rh.expected_documents(root))
    rh.publish(
        "crash-ingest",
        kills=kills,
        documents_when_killed=killed_at,
        final_run=summary,
        converged=True,
        load_average=rh.load_average(),
    )


def leased(admin, kb: str) -> int:
    return admin.execute(
        "select count(*) from kb.embedding_queue q join kb.knowledge_bases k on k.id = q.kb_id"
        " where k.name = %s and q.attempts > 0 and q.next_attempt_at > now() and not q.parked",
        [kb],
    ).fetchone()[0]


def embedded(admin, kb: str) -> int:
    return admin.execute(
        "select count(*) from kb.embeddings e join kb.knowledge_bases k on k.id = e.kb_id where k.name = %s", [kb]
    ).fetchone()[0]


SHORT_LEASE_WORKER = (
    "import sys; from datetime import timedelta; from pgkb.config import Settings; from pgkb.worker import "
    "run_worker; run_worker(Settings.from_env(), batch=4, lease=timedelta(seconds=3))"
)


def test_kill9_worker_mid_batch_leases_expire_and_work_completes(own, admin, fake, tmp_path):
    kb, root = "crash-worker", tmp_path / "src"
    rng = make_corpus(root, rh.scale(30, 90), seed=11)
    deferred = ingest(own, fake, root, kb, tmp_path / "logs", "deferred", "--defer-embedding")
    assert deferred.proc.wait(120) == 0, deferred.stderr()
    env = rh.child_env(own.admin_url, fake.url)
    fake.always_delay, fake.delay = True, 1.0  # one batch takes a second: the kill lands mid-batch
    rounds, stuck_after_kill, figures = rh.scale(2, 6), [], {}
    for round_ in range(rounds):
        short_lease = round_ % 2 == 1  # odd rounds: a worker with a 3 s lease, expiring in real time
        args = ["-c", SHORT_LEASE_WORKER] if short_lease else ["worker", "--batch", "4"]
        if round_:  # the previous round's clean-up drained the queue: the folder changes, new chunks queue up
            mutate(root, rng, round_)
            more = ingest(own, fake, root, kb, tmp_path / "logs", f"deferred{round_}", "--defer-embedding")
            assert more.proc.wait(120) == 0, more.stderr()
        child = rh.spawn(args, env, tmp_path / "logs", f"w{round_}")
        start = embedded(admin, kb)
        # mid-batch: at least one batch stored since this worker started and another one claimed
        assert rh.wait_for(
            lambda: embedded(admin, kb) > start and leased(admin, kb) > 0 or child.proc.poll() is not None,  # noqa: B023
            60,
        ), child.stderr()[-2000:]
        assert child.proc.poll() is None, child.stderr()[-1000:]
        child.kill9()
        stuck = leased(admin, kb)
        stuck_after_kill.append(stuck)
        assert stuck > 0  # the killed worker's claim is leased to nobody now
        assert rh.integrity_problems(admin) == []
        if short_lease:
            time.sleep(3.5)  # the lease runs out in real time
        else:
            # a fresh worker leaves the 5-minute lease alone ...
            fake.always_delay = False
            once = rh.spawn(["worker", "--once", "--batch", "50"], env, tmp_path / "logs", f"once{round_}")
            assert once.proc.wait(120) == 0, once.stderr()[-1000:]
            assert leased(admin, kb) == stuck
            # ... until it has run out (moved back as five minutes would)
            admin.execute(
                "update kb.embedding_queue set next_attempt_at = now() - interval '1 second'"
                " where attempts > 0 and next_attempt_at > now() and not parked"
            )
            fake.always_delay = True
    fake.always_delay = False
    started = time.monotonic()
    final = rh.spawn(["worker", "--once", "--batch", "50"], env, tmp_path / "logs", "final")
    assert final.proc.wait(120) == 0, final.stderr()[-1000:]
    figures["final_worker_seconds"] = round(time.monotonic() - started, 1)
    total = admin.execute(
        "select count(*) from kb.chunks c join kb.knowledge_bases k on k.id = c.kb_id where k.name = %s", [kb]
    ).fetchone()[0]
    assert embedded(admin, kb) == total
    assert rh.convergence_problems(admin, kb, root) == []
    rh.publish(
        "crash-worker",
        kills=rounds,
        chunks=total,
        leased_after_kill=stuck_after_kill,
        **figures,
        load_average=rh.load_average(),
    )


def test_kill9_postmaster_mid_ingest_restart_and_rerun_converges(own, fake, tmp_path):
    kb, root = "crash-postmaster", tmp_path / "src"
    rng = make_corpus(root, rh.scale(40, 100), seed=23)
    rounds, recovery, ingest_exit = rh.scale(1, 4), [], []
    for round_ in range(rounds):
        admin = own.connect()
        before = doc_count(admin, kb) if round_ else 0
        fake.always_delay, fake.delay = True, 0.05
        child = ingest(own, fake, root, kb, tmp_path / "logs", f"ingest{round_}")
        target = before + rng.randint(3, 8)
        rh.wait_for(lambda: doc_count(admin, kb) >= target or child.proc.poll() is not None, 60)  # noqa: B023
        admin.close()
        assert child.proc.poll() is None, f"ingest finished before the kill: {child.stderr()[-500:]}"
        own.kill9()
        # the ingest process sees its connection die: it must exit (non-zero) and say so, not hang
        t0 = time.monotonic()
        code = child.proc.wait(60)
        ingest_exit.append({"code": code, "seconds": round(time.monotonic() - t0, 1)})
        assert code != 0 and "pgkb: " in child.stderr() and "Traceback" not in child.stderr(), child.stderr()
        recovery.append(round(own.start(), 1))
        admin = own.connect()
        assert rh.integrity_problems(admin) == []  # crash recovery kept only whole documents
        admin.close()
        mutate(root, rng, round_ + 1)
    fake.always_delay = False
    final = ingest(own, fake, root, kb, tmp_path / "logs", "final")
    assert final.proc.wait(120) == 0, final.stderr()[-2000:]
    admin = own.connect()
    try:
        assert rh.convergence_problems(admin, kb, root) == []
    finally:
        admin.close()
    rh.publish(
        "crash-postmaster",
        kills=rounds,
        restart_seconds=recovery,
        ingest_exit=ingest_exit,
        converged=True,
        load_average=rh.load_average(),
    )
