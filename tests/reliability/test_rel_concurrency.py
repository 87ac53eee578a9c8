"""Reliability 1: concurrent writers and readers.

8 writer threads re-ingest their documents over and over (kb.replace_document with new content: every
chunk of version v says ``ver<v>``, and version v has 2 + v % 4 chunks) while 32 readers search: 24 threads
call kb.hybrid_search as the login role alice, and 8 tasks call search_knowledge over one real MCP stdio
session acting for alice. Every result set is checked: no document with chunks of two versions, no chunk
beyond its version's chunk count, no reader seeing a document go back in time, and every document found by
its own unique word (none lost while it is being replaced). At the end each document holds the version its
writer last committed and the derived state (chunk counts, BM25 statistics) agrees with the chunks.

Fast: a few seconds. Long (PGKB_SOAK=1): PGKB_SOAK_SECONDS (60). Figures: operations, throughput and
p50/p95/p99 latency per kind of caller.
"""

from __future__ import annotations

import json
import re
import string
import threading
import time
from collections import defaultdict

import anyio
import psycopg
import pytest
import relhelpers as rh
from pgvector import Vector
from pgvector.psycopg import register_vector

pytestmark = pytest.mark.reliability

WRITERS, DOCS_PER_WRITER, SQL_READERS, MCP_READERS = 8, 3, 24, 8
KB = "rel"
VERSION = re.compile(r"\bver(\d+)\b")
FILLER = "数据库连接池满了以后，新的请求会排队等待；排查时先看慢查询日志，再看连接数配置。"


def token(w: int, d: int) -> str:
    """A word only document (w, d) contains."""
    return f"dk{string.ascii_lowercase[w]}{string.ascii_lowercase[d]}x"


def doc_key(w: int, d: int) -> str:
    return f"w{w}/d{d}.md"


def chunk_count(version: int) -> int:
    return 2 + version % 4


def chunks(w: int, d: int, version: int) -> str:
    out = []
    for i in range(chunk_count(version)):
        content = f"relword {token(w, d)} ver{version} part{i}. {FILLER}"
        out.append({"content": content, "heading_path": [f"v{version}"], "embedding": rh.fake_vector(content)})
    return json.dumps(out)


class Tally:
    """Thread-safe counters, latency samples and the first few violations of each kind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.count: dict[str, int] = defaultdict(int)
        self.examples: dict[str, list[str]] = defaultdict(list)

    def op(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.latency[kind].append(seconds)

    def bad(self, kind: str, detail: str) -> None:
        with self.lock:
            self.count[kind] += 1
            if len(self.examples[kind]) < 5:
                self.examples[kind].append(detail)


def check_results(rows, seen: dict[str, int], tally: Tally, who: str, wanted: str | None) -> None:
    """rows: (doc_key, chunk_index, content). Mixed versions, impossible chunks, time travel, lost docs."""
    versions: dict[str, set[int]] = defaultdict(set)
    for key, index, content in rows:
        match = VERSION.search(content)
        if match is None:
            tally.bad("unmarked", f"{who}: {key} {content[:60]}")
            continue
        v = int(match.group(1))
        versions[key].add(v)
        if index >= chunk_count(v):
            tally.bad("impossible_chunk", f"{who}: {key} chunk {index} of version {v}")
    for key, vs in versions.items():
        if len(vs) > 1:
            tally.bad("mixed", f"{who}: {key} versions {sorted(vs)}")
        v = max(vs)
        if v < seen.get(key, -1):
            tally.bad("time_travel", f"{who}: {key} version {v} after {seen[key]}")
        seen[key] = max(v, seen.get(key, -1))
    if wanted is not None and wanted not in versions:
        tally.bad("lost", f"{who}: {wanted} not found by its own word")


def test_concurrent_writers_and_readers(rdb, dsn_of, fake):
    seconds = rh.soak_seconds(4.0)
    rdb.execute(f"select kb.create_knowledge_base('{KB}', 'public', owner => 'alice')")
    docs = [(w, d) for w in range(WRITERS) for d in range(DOCS_PER_WRITER)]
    committed = {doc_key(w, d): 0 for w, d in docs}
    for w, d in docs:
        rdb.execute("select * from kb.replace_document(%s, %s, %s, %s)", [KB, doc_key(w, d), "T", chunks(w, d, 0)])
    tally = Tally()
    stop = threading.Event()
    ready = threading.Barrier(WRITERS + SQL_READERS + 2)  # + the MCP thread + this one

    def writer(w: int) -> None:
        mine = [(w, d) for d in range(DOCS_PER_WRITER)]
        version = 0
        with psycopg.connect(dsn_of(rdb.info.user), autocommit=True) as conn:
            ready.wait(60)
            while not stop.is_set():
                version += 1
                for wd in mine:
                    key = doc_key(*wd)
                    t0 = time.perf_counter()
                    try:
                        changed = conn.execute(
                            "select changed from kb.replace_document(%s, %s, %s, %s)",
                            [KB, key, "T", chunks(*wd, version)],
                        ).fetchone()[0]
                        assert changed, "a new version must change the document"
                        committed[key] = version
                    except Exception as e:  # counted, never fatal to the run
                        tally.bad("errors", f"writer {w}: {type(e).__name__}: {e}")
                    tally.op("write", time.perf_counter() - t0)

    def sql_reader(r: int) -> None:
        seen: dict[str, int] = {}
        with psycopg.connect(dsn_of("alice"), autocommit=True) as conn:
            register_vector(conn)
            ready.wait(60)
            i = 0
            while not stop.is_set():
                i += 1
                wanted = docs[(r + i) % len(docs)] if i % 2 else None
                query = token(*wanted) if wanted else "relword 连接池"
                t0 = time.perf_counter()
                try:
                    rows = conn.execute(
                        "select doc_key, chunk_index, content from kb.hybrid_search(%s, top_k => %s, kb => %s,"
                        " query_embedding => %s)",
                        [query, 10 if wanted else 60, KB, Vector(rh.fake_vector("query: " + query))],
                    ).fetchall()
                except Exception as e:
                    tally.bad("errors", f"sql reader {r}: {type(e).__name__}: {e}")
                    stop.wait(0.1)
                    continue
                tally.op("sql_search", time.perf_counter() - t0)
                check_results(rows, seen, tally, f"sql{r}", doc_key(*wanted) if wanted else None)

    def mcp_readers() -> None:
        async def main() -> None:
            async with rh.stdio_client(dsn_of("svc"), fake.url, PGKB_USER="alice") as client:
                await client.list_tools()
                ready.wait(60)

                async def one(r: int) -> None:
                    seen: dict[str, int] = {}
                    i = 0
                    while not stop.is_set():
                        i += 1
                        wanted = docs[(r * 3 + i) % len(docs)] if i % 2 else None
                        query = token(*wanted) if wanted else "relword 连接池"
                        t0 = time.perf_counter()
                        try:
                            result = await client.call_tool("search_knowledge", {"query": query, "top_k": 20, "kb": KB})
                        except Exception as e:
                            tally.bad("errors", f"mcp reader {r}: {type(e).__name__}: {e}")
                            await anyio.sleep(0.1)
                            continue
                        tally.op("mcp_search", time.perf_counter() - t0)
                        if result.is_error:
                            tally.bad("errors", f"mcp reader {r}: {rh.text_of(result)[:200]}")
                            continue
                        out = result.structured_content
                        if out["degraded"]:
                            tally.bad("degraded", f"mcp reader {r}: {out['degraded_reason']}")
                        rows = [(x["doc_id"], x["chunk_index"], x["content"]) for x in out["results"]]
                        check_results(rows, seen, tally, f"mcp{r}", doc_key(*wanted) if wanted else None)

                async with anyio.create_task_group() as tg:
                    for r in range(MCP_READERS):
                        tg.start_soon(one, r)

        try:
            anyio.run(main)
        except Exception as e:
            tally.bad("errors", f"mcp session: {type(e).__name__}: {e}")
            if not stop.is_set():
                ready.abort()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    threads += [threading.Thread(target=sql_reader, args=(r,)) for r in range(SQL_READERS)]
    threads.append(threading.Thread(target=mcp_readers))
    for t in threads:
        t.start()
    ready.wait(120)
    started = time.monotonic()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(120)
    elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in threads), "a worker thread did not stop"

    # the end state: every document holds its writer's last committed version, nothing half-derived
    final = {
        key: (n, {int(VERSION.search(c).group(1)) for c in contents})
        for key, n, contents in rdb.execute(
            "select d.doc_key, d.chunk_count, array_agg(c.content) from kb.documents d"
            " join kb.chunks c on c.document_id = d.id group by d.id"
        )
    }
    for key, version in committed.items():
        if final.get(key) != (chunk_count(version), {version}):
            tally.bad("lost", f"final: {key} is {final.get(key)}, expected version {version}")
    problems = rh.integrity_problems(rdb)

    figures = {
        "seconds": round(elapsed, 1),
        "writers": WRITERS,
        "sql_readers": SQL_READERS,
        "mcp_readers": MCP_READERS,
        "load_average": rh.load_average(),
    }
    for kind, samples in sorted(tally.latency.items()):
        figures[kind] = {**rh.percentiles(samples), "per_s": round(len(samples) / elapsed, 1)}
    figures["violations"] = dict(tally.count)
    rh.publish("concurrency", **figures)
    assert not problems, problems
    assert dict(tally.count) == {}, dict(tally.examples)
    assert all(len(tally.latency[k]) > 0 for k in ("write", "sql_search", "mcp_search")), figures


def test_the_checker_sees_each_kind_of_violation():
    """The result checks above can fail: mixed versions, impossible chunks, time travel, lost documents."""
    tally = Tally()
    seen: dict[str, int] = {}
    check_results([("a", 0, "ver3"), ("a", 1, "ver3")], seen, tally, "t", "a")
    assert dict(tally.count) == {} and seen == {"a": 3}
    check_results([("a", 0, "ver4"), ("a", 1, "ver5")], seen, tally, "t", None)
    check_results([("a", 3, "ver5")], seen, tally, "t", None)  # version 5 has 3 chunks
    check_results([("a", 0, "ver2")], seen, tally, "t", "b")
    assert dict(tally.count) == {"mixed": 1, "impossible_chunk": 1, "time_travel": 1, "lost": 1}
