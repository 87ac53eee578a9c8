"""Reliability 7: resource limits.

- statement timeouts on every read path of the product (MCP search_knowledge, get_document,
  list_knowledge_bases; `pgkb search`): with the tables locked by a stuck transaction, each call ends within
  PGKB_STATEMENT_TIMEOUT_MS plus a little with a message that says so, and works again afterwards;
- concurrent MCP requests: the database connections of the MCP HTTP server stay within PGKB_MCP_POOL_SIZE
  under a burst of requests; and requests beyond PGKB_MCP_MAX_CONCURRENT are answered promptly (busy)
  rather than queued;
- the embedding queue parks poison chunks (an input the endpoint always fails on) after max_attempts, and
  the other chunks -- also those claimed in the same batch -- are embedded.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from datetime import timedelta

import anyio
import psycopg
import pytest
import relhelpers as rh
from pgkb.config import Settings
from pgkb.models.embedding import HttpEmbedder

pytestmark = pytest.mark.reliability

TIMEOUT_MS = 500
LOCKED = ("kb.knowledge_bases", "kb.documents", "kb.chunks", "kb.embeddings")


@pytest.fixture
def world(rdb):
    rdb.execute("select kb.create_knowledge_base('lim', 'public', owner => 'alice')")
    for i in range(3):
        content = f"限流 limitword {i}：连接池满了以后请求排队。"
        rdb.execute(
            "select * from kb.replace_document('lim', %s, 'T', %s)",
            [f"l{i}.md", json.dumps([{"content": content, "embedding": rh.fake_vector(content)}])],
        )
    return rdb


class TableLock:
    """An admin transaction holding ACCESS EXCLUSIVE locks on the tables every read needs (a stuck
    migration or a runaway maintenance job), until released or ``seconds`` pass."""

    def __init__(self, dsn: str, seconds: float) -> None:
        self.release = threading.Event()
        self.held = threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(dsn, seconds), daemon=True)
        self.thread.start()
        assert self.held.wait(30), "could not take the locks"

    def _hold(self, dsn: str, seconds: float) -> None:
        with psycopg.connect(dsn) as conn:
            conn.execute(f"lock table {', '.join(LOCKED)} in access exclusive mode")
            self.held.set()
            self.release.wait(seconds)
            conn.rollback()

    def close(self) -> None:
        self.release.set()
        self.thread.join(30)


def test_statement_timeout_bounds_every_mcp_read_and_the_cli_search(world, dsn_of, fake, tmp_path):
    calls = {
        "search_knowledge": {"query": "limitword"},
        "get_document": {"doc_id": "l0.md"},
        "list_knowledge_bases": {},
    }

    async def mcp_calls():
        out = {}
        async with rh.stdio_client(
            dsn_of("svc"), fake.url, PGKB_USER="alice", PGKB_STATEMENT_TIMEOUT_MS=str(TIMEOUT_MS)
        ) as client:
            await client.call_tool("list_knowledge_bases", {})  # warm: pool open, model known
            lock = TableLock(dsn_of(world.info.user), 60)
            try:
                for tool, args in calls.items():
                    t0 = time.monotonic()
                    result = await client.call_tool(tool, args)
                    out[tool] = (result.is_error, rh.text_of(result), time.monotonic() - t0)
                env = rh.child_env(dsn_of("alice"), fake.url, PGKB_STATEMENT_TIMEOUT_MS=str(TIMEOUT_MS))
                cli = rh.spawn(["search", "limitword"], env, tmp_path, "search")
                t0 = time.monotonic()
                code = await anyio.to_thread.run_sync(cli.proc.wait, 60)
                out["pgkb search"] = (code != 0, cli.stderr(), time.monotonic() - t0)
            finally:
                lock.close()
            after = await client.call_tool("search_knowledge", {"query": "limitword"})
            out["after"] = (after.is_error, rh.text_of(after), 0.0)
        return out

    out = anyio.run(mcp_calls)
    figures = {}
    for path in [*calls, "pgkb search"]:
        failed, text, seconds = out[path]
        figures[path] = round(seconds, 2)
        assert failed and f"timed out after {TIMEOUT_MS} ms" in text, (path, text[:300])
        assert seconds < TIMEOUT_MS / 1000 + 3.0 + (5.0 if path == "pgkb search" else 0.0), (path, seconds)
    assert not out["after"][0], out["after"][1]
    rh.publish("limits-statement-timeout", timeout_ms=TIMEOUT_MS, seconds_to_error=figures)


def svc_connections(admin) -> int:
    return admin.execute("select count(*) from pg_stat_activity where usename = 'svc'").fetchone()[0]


def burst(base: str, n: int, timeout: float, stall: TableLock | None = None, stall_s: float = 0.0):
    """n concurrent search_knowledge calls, each on its own HTTP session (all sessions are opened first,
    then the calls go out together; ``stall`` is released ``stall_s`` seconds after that); (ok, seconds of
    the call, text) each."""
    results: list[tuple[bool, float, str]] = []
    opened = anyio.Event()
    count = [0]

    async def one():
        t0 = time.monotonic()
        try:
            async with rh.http_client(base, "tok", read_timeout_seconds=timeout) as client:
                await client.list_tools()
                count[0] += 1
                if count[0] == n:
                    opened.set()
                    if stall is not None:
                        threading.Timer(stall_s, stall.close).start()
                with anyio.fail_after(timeout):
                    await opened.wait()
                t0 = time.monotonic()
                with anyio.fail_after(timeout):
                    result = await client.call_tool("search_knowledge", {"query": "limitword"})
            results.append((not result.is_error, time.monotonic() - t0, rh.text_of(result)[:200]))
        except Exception as e:
            results.append((False, time.monotonic() - t0, f"{type(e).__name__}: {e}"[:200]))

    async def main():
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)

    anyio.run(main)
    return results


POOL = 4


MAX_CONCURRENT = 12


def test_mcp_http_database_connections_stay_bounded(world, dsn_of, fake, tmp_path):
    """The service role's connections stay within the pool (PGKB_MCP_POOL_SIZE) plus the one probe that calls
    waiting POOL_QUICK_WAIT_SECONDS for a pooled connection share (is the database down or just busy?), however
    many calls wait (PGKB_MCP_MAX_CONCURRENT well above the pool here). Found by this test: each waiting call
    used to open a probe of its own (12 connections with a pool of 4); then, under load, that they opened
    them in turn (6: a closed probe's backend was still counted when the next one connected)."""
    extra = {"PGKB_MCP_POOL_SIZE": str(POOL), "PGKB_MCP_MAX_CONCURRENT": str(MAX_CONCURRENT)}
    # the service role's connections of earlier tests' servers are gone (they close as those servers exit);
    # the new server opens its pool as it starts (it reads the language of the knowledge for its instructions)
    assert rh.wait_for(lambda: svc_connections(world) == 0, 30), (
        "connections of the service role linger",
        world.execute(
            "select application_name, state, backend_start, query from pg_stat_activity where usename = 'svc'"
        ).fetchall(),
    )
    server, base = rh.mcp_http_server(dsn_of("svc"), fake.url, tmp_path, {"tok": "alice"}, **extra)
    peak = 0
    stop = threading.Event()

    def watch():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, svc_connections(world))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    try:
        lock = TableLock(dsn_of(world.info.user), 120)  # requests pile up behind the stuck transaction
        watcher.start()
        results = burst(base, rh.scale(24, 64), 60, lock, 4.0)
        lock.close()
    finally:
        stop.set()
        watcher.join(10)
        server.stop()
    ok = sum(1 for r in results if r[0])
    busy = sum(1 for r in results if not r[0] and "busy" in r[2])
    rh.publish(
        "limits-mcp-connections",
        pool_size=POOL,
        max_concurrent=MAX_CONCURRENT,
        requests=len(results),
        served=ok,
        busy=busy,
        peak_db_connections=peak,
        slowest_s=round(max(r[1] for r in results), 1),
    )
    assert POOL <= peak <= POOL + 1
    assert ok + busy == len(results) and MAX_CONCURRENT - 2 <= ok <= MAX_CONCURRENT, results


def test_mcp_requests_beyond_a_concurrency_bound_are_answered_promptly(world, dsn_of, fake, tmp_path):
    """PGKB_MCP_MAX_CONCURRENT (default twice the pool): against a stalled database, the calls beyond the
    bound are turned away as busy within about a second instead of queueing for the whole stall."""
    server, base = rh.mcp_http_server(dsn_of("svc"), fake.url, tmp_path, {"tok": "alice"}, PGKB_MCP_POOL_SIZE=str(POOL))
    n, bound = 32, 2 * POOL
    try:
        lock = TableLock(dsn_of(world.info.user), 120)
        results = burst(base, n, 20, lock, 4.0)
        lock.close()
    finally:
        server.stop()
    busy = [r for r in results if not r[0] and "busy" in r[2]]
    ok = [r for r in results if r[0]]
    rh.publish(
        "limits-mcp-concurrency",
        requests=n,
        bound=bound,
        served=len(ok),
        turned_away=len(busy),
        slowest_turned_away_s=round(max((r[1] for r in busy), default=0), 2),
        slowest_served_s=round(max((r[1] for r in ok), default=0), 2),
        example=busy[0][2] if busy else None,
    )
    assert len(ok) <= bound and len(ok) + len(busy) == n, results
    assert all("PGKB_MCP_MAX_CONCURRENT" in r[2] and r[1] < 3.0 for r in busy), sorted(r[1] for r in busy)


# ------------------------------------------------------------------------------------------ poison chunks


def queue_state(db) -> dict[str, int]:
    return dict(
        db.execute(
            "select case when parked then 'parked' else 'waiting' end, count(*) from kb.embedding_queue group by 1"
        ).fetchall()
    )


def run_until_settled(db, fake, max_attempts: int) -> tuple[int, int]:
    """Run the worker (batches of 16) with the backoff skipped until nothing is left to try; returns
    (embedded, rounds)."""
    from pgkb.worker import run_worker

    info = db.info
    settings = dataclasses.replace(
        Settings.from_env(), database_url=f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}"
    )
    embedder = HttpEmbedder(fake.url, rh.MODEL, rh.DIM, timeout=5, retries=0)
    embedded = rounds = 0
    while rounds < 4 * max_attempts + 1:
        rounds += 1
        stats = run_worker(
            settings, once=True, batch=16, embedder=embedder, max_attempts=max_attempts, lease=timedelta(seconds=30)
        )
        embedded += stats.embedded
        if not queue_state(db).get("waiting"):
            break
        db.execute("update kb.embedding_queue set next_attempt_at = now() where not parked")  # backoff passed
    return embedded, rounds


def write_queue(db, good: int, poison: int) -> None:
    chunks = [{"content": f"正常段落 {i}"} for i in range(good)]
    for i in range(poison):
        chunks.insert(i * 7 % (len(chunks) + 1), {"content": f"POISONWORD 段落 {i}"})
    db.execute("select * from kb.replace_document('lim', 'q.md', 'T', %s)", [json.dumps(chunks)])


def test_a_lone_poison_chunk_is_parked_and_can_be_retried(world, fake):
    fake.set("ok", poison="POISONWORD")
    world.execute(
        "select * from kb.replace_document('lim', 'p.md', 'T', %s)", [json.dumps([{"content": "POISONWORD 段落"}])]
    )
    embedded, rounds = run_until_settled(world, fake, max_attempts=3)
    parked = world.execute("select doc_key, attempts, last_error from kb.parked_embeddings").fetchall()
    assert embedded == 0 and [p[0] for p in parked] == ["p.md"] and "poisoned input" in parked[0][2]
    fake.set("ok")
    assert world.execute("select kb_admin.retry_parked_embeddings()").fetchone()[0] == 1
    assert run_until_settled(world, fake, max_attempts=3)[0] == 1
    assert queue_state(world) == {}


def test_a_poison_chunk_does_not_take_its_batch_mates_down(world, fake):
    fake.set("ok", poison="POISONWORD")
    write_queue(world, good=30, poison=1)
    embedded, rounds = run_until_settled(world, fake, max_attempts=3)
    state = queue_state(world)
    rh.publish("limits-poison", good=30, poison=1, embedded=embedded, rounds=rounds, queue=state)
    assert state == {"parked": 1} and embedded == 30


def test_sql_reads_of_a_login_role_are_bounded_by_a_statement_timeout(world, connect_as, dsn_of):
    """kb.create_user gives a pgkb user's login role a statement and a lock timeout in this database
    (kb_internal.bound_sessions): a psql read behind a stuck lock ends with a clear error instead of waiting."""
    alice = connect_as("alice")  # a fresh session, as psql would open it
    timeout = alice.execute("select current_setting('statement_timeout')").fetchone()[0]
    assert timeout not in ("0", "0ms"), "no statement timeout in a user's session"
    lock = TableLock(dsn_of(world.info.user), 120)
    try:
        t0 = time.monotonic()
        with pytest.raises((psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)):
            alice.execute("select * from kb.hybrid_search('limitword', query_embedding => null)").fetchall()
        assert time.monotonic() - t0 < 60
    finally:
        lock.close()
