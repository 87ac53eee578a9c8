"""Concurrency sweep for ``pgkb bench``: C client threads, each with its own connection, each running the
same fixed number of queries of one mode back to back; all clients start together (a barrier after
connecting and one warm-up query each). Reports QPS (all queries / wall time from the barrier to the last
client's end) and the latency percentiles of every call. The wall time starts when the barrier opens (its
action, before any client is released) and ends at the last client's own end time, so it covers every timed
query: a client's queries, one after the other, take at most the wall time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pgkb.bench.data import log
from pgkb.db import connect

__all__ = ["ConcurrencyRow", "sweep"]


@dataclass
class ConcurrencyRow:
    """One (mode, clients) cell of the sweep; latencies in milliseconds."""

    mode: str
    clients: int
    queries: int
    seconds: float
    latencies: list[float]

    @property
    def qps(self) -> float:
        return self.queries / self.seconds

    def pct(self, p: float) -> float:
        return float(np.percentile(self.latencies, p))


def _run(
    url: str, sql: str, setup: Sequence[str], params: Sequence[dict], clients: int, per_client: int
) -> ConcurrencyRow:
    started: list[float] = []
    barrier = threading.Barrier(clients + 1, action=lambda: started.append(time.perf_counter()))
    latencies: list[list[float]] = [[] for _ in range(clients)]
    ended = [0.0] * clients
    errors: list[BaseException] = []

    def client(c: int) -> None:
        try:
            with connect(url) as conn:
                for statement in setup:
                    conn.execute(statement)
                conn.execute(sql, params[c % len(params)]).fetchall()  # warm-up
                barrier.wait()
                for k in range(per_client):
                    p = params[(c * per_client + k) % len(params)]
                    t0 = time.perf_counter()
                    conn.execute(sql, p).fetchall()
                    latencies[c].append((time.perf_counter() - t0) * 1000.0)
                ended[c] = time.perf_counter()
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a client failed: its error is raised below
        barrier.wait()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    seconds = max(ended) - started[0]
    flat = [x for lat in latencies for x in lat]
    return ConcurrencyRow("", clients, len(flat), seconds, flat)


def sweep(
    url: str,
    modes: dict[str, tuple[str, Sequence[str]]],
    params: Sequence[dict],
    clients: Sequence[int],
    per_client: int,
) -> list[ConcurrencyRow]:
    """For every mode {name: (sql, setup statements)} and client count: one run of per_client queries per
    client, parameters taken round-robin from `params`."""
    rows = []
    for mode, (sql, setup) in modes.items():
        for c in clients:
            log(f"concurrency: {mode}, {c} clients x {per_client} queries")
            row = _run(url, sql, setup, params, c, per_client)
            row.mode = mode
            rows.append(row)
            log(f"concurrency: {mode} x{c}: {row.qps:.1f} QPS, p95 {row.pct(95):.1f} ms")
    return rows
