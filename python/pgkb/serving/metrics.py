"""pgkb's Prometheus metrics: every metric the three HTTP servers (`pgkb serve`, `pgkb mcp --transport
http`, `pgkb embed-server`) export at /metrics is defined here, in a registry of the server's own (one per
server, so servers started side by side in one process count apart; not prometheus_client's global one).

No label carries what a caller sent: routes are the server's own route names (any other path is "other"),
operations and stages are fixed words, models are embedding-registry names. No query text, user name,
token, knowledge base or document key reaches a metric."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

OTHER_ROUTE = "other"
# seconds: a lexical search takes milliseconds, a model call or a chat answer seconds
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def route_label(path: str, routes: Collection[str], prefixes: Collection[str] = ()) -> str:
    """The route a request path is counted under: the path itself when it is one of ``routes``, the
    prefix it starts with when one of ``prefixes`` matches, else "other" (so no caller can make up labels)."""
    if path in routes:
        return path
    return next((p for p in prefixes if path.startswith(p)), OTHER_ROUTE)


class _Callback:
    """A collector whose metrics are read when /metrics is scraped."""

    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self.read = read

    def collect(self) -> Iterable[Metric]:
        return self.read()


class ServerMetrics:
    """One server's metrics: HTTP requests by route and status with their latency, the latency of each
    stage of the work (embed, sql, rerank, answer) per operation, answers degraded to lexical-only, calls
    turned away as busy, plus gauges read at scrape time (``add_gauges``) and the process's own."""

    def __init__(self, server: str) -> None:
        from pgkb.cli import version  # the installed distribution's (pgkb.cli imports the commands lazily)

        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        info = Gauge(
            "pgkb_server_info", "Which pgkb server this is (always 1)", ["server", "version"], registry=self.registry
        )
        info.labels(server, version()).set(1)
        self.requests = Counter(
            "pgkb_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "pgkb_http_request_duration_seconds",
            "Time from a request's arrival to the end of its answer",
            ["route"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "pgkb_stage_duration_seconds",
            "Time spent in one stage of a call: embed (query or texts), sql (the database), rerank, answer "
            "(generating an answer)",
            ["operation", "stage"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.degraded = Counter(
            "pgkb_degraded_answers",
            "Answers served lexical-only because the query embedding failed (embedder unavailable, too slow "
            "or failing)",
            ["operation"],
            registry=self.registry,
        )
        self.busy = Counter(
            "pgkb_busy_rejections",
            "Calls turned away because a concurrency limit was reached, by limit (max_concurrent: "
            "PGKB_MCP_MAX_CONCURRENT; key_checks: API keys checked at once; max_pending, max_per_client: the "
            "embed server's)",
            ["limit"],
            registry=self.registry,
        )

    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def stage(self, operation: str, stage: str, seconds: float) -> None:
        self.stage_seconds.labels(operation, stage).observe(seconds)

    @contextlib.contextmanager
    def timed(self, operation: str, stage: str) -> Iterator[None]:
        """Observe the block's duration as ``stage`` of ``operation`` (also when it raises)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.stage(operation, stage, time.perf_counter() - started)

    def add_gauges(self, read: Callable[[], Iterable[Metric]]) -> None:
        """Have ``read`` (one of the *_gauges functions below, bound to its values) run at every scrape."""
        self.registry.register(_Callback(read))

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) of /metrics: the text format, or OpenMetrics when ``accept`` asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


def _gauge(name: str, documentation: str, value: float | None = None, labels: tuple[str, ...] = ()):
    return GaugeMetricFamily(name, documentation, value=value, labels=labels or None)


def backend_gauges(calls: int, calls_limit: int, pool: dict[str, int], pool_limit: int) -> list[Metric]:
    """`pgkb serve` / `pgkb mcp`: calls in progress against PGKB_MCP_MAX_CONCURRENT and the database pool
    (psycopg_pool's get_stats(); empty before the pool is opened by the first call)."""
    connections = _gauge("pgkb_db_pool_connections", "Pooled database connections, in use or idle", labels=("state",))
    size, idle = pool.get("pool_size", 0), pool.get("pool_available", 0)
    connections.add_metric(["in_use"], size - idle)
    connections.add_metric(["idle"], idle)
    return [
        _gauge("pgkb_calls_in_progress", "Calls holding or waiting for a database connection", calls),
        _gauge("pgkb_calls_limit", "Calls served at once at most (PGKB_MCP_MAX_CONCURRENT)", calls_limit),
        connections,
        _gauge("pgkb_db_pool_max_connections", "Pooled database connections at most (PGKB_MCP_POOL_SIZE)", pool_limit),
        _gauge("pgkb_db_pool_waiting", "Calls waiting for a pooled connection", pool.get("requests_waiting", 0)),
    ]


def backlog_gauges(rows: Iterable[tuple[str, int, int, float | None]]) -> list[Metric]:
    """The database's embedding queue (kb_service.embedding_backlog: model, queued, parked, oldest queued age in
    seconds), what `pgkb worker` has still to embed."""
    chunks = _gauge(
        "pgkb_embedding_backlog_chunks",
        "Chunks in kb.embedding_queue waiting for an embedding "
        "(queued) or given up on after repeated failures (parked), per model",
        labels=("model", "state"),
    )
    oldest = _gauge(
        "pgkb_embedding_backlog_oldest_seconds",
        "Age of the oldest queued (not parked) chunk, per model (0 when none is queued)",
        labels=("model",),
    )
    for model, queued, parked, oldest_seconds in rows:
        chunks.add_metric([model, "queued"], queued)
        chunks.add_metric([model, "parked"], parked)
        oldest.add_metric([model], oldest_seconds or 0.0)
    return [chunks, oldest]


def embed_queue_gauges(in_progress: int, oldest_seconds: float, limit: int) -> list[Metric]:
    """`pgkb embed-server`: the requests admitted and not yet answered (running or waiting for a model)."""
    return [
        _gauge("pgkb_embed_requests_in_progress", "Requests using or waiting for a model", in_progress),
        _gauge(
            "pgkb_embed_requests_oldest_seconds",
            "Age of the oldest request using or waiting for a model (0 when none is)",
            oldest_seconds,
        ),
        _gauge("pgkb_embed_requests_limit", "Requests in progress at most (--max-pending)", limit),
    ]
