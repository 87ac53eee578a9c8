"""Running the embed server: :func:`serve` (`pgkb embed-server`: load the models, serve until SIGTERM or
SIGINT, let in-flight requests finish) and :func:`start_in_thread` (tests, embedding in other programs)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pgkb.config import ConfigError, Settings
from pgkb.embed_server.handler import EmbedServer
from pgkb.embed_server.models import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PER_CLIENT,
    RERANK_ENV,
    Service,
    load_server_embedder,
)
from pgkb.models.embedding import Embedder, EmbeddingError, OfflineEmbedder
from pgkb.models.rerank import CrossEncoderReranker
from pgkb.serving.config import metrics_access

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "TOKEN_ENV", "RunningServer", "make_server", "serve", "start_in_thread"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
TOKEN_ENV = "PGKB_EMBED_SERVER_TOKEN"

log = logging.getLogger("pgkb.embed_server")


@dataclass
class RunningServer:
    """A server answering in a background thread; ``stop()`` shuts it down and waits for it."""

    server: EmbedServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:8765 (append /v1/embeddings)."""
        return self.server.url

    @property
    def embeddings_url(self) -> str:
        return self.url + "/v1/embeddings"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_server(service: Service, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> EmbedServer:
    return EmbedServer((host, port), service)


def start_in_thread(
    embedder: Embedder | None = None,
    *,
    reranker: CrossEncoderReranker | None = None,
    host: str = DEFAULT_HOST,
    port: int = 0,
    token: str | None = None,
    batch_size: int = 16,
    served_names: Sequence[str] = (),
    max_pending: int = DEFAULT_MAX_PENDING,
    max_per_client: int = DEFAULT_MAX_PER_CLIENT,
    metrics_access: str = "loopback",
) -> RunningServer:
    """Serve in a daemon thread (port 0: a free port); for tests and embedding in other programs.
    ``metrics_access``: who may read /metrics (PGKB_METRICS_ACCESS's values)."""
    service = Service(
        embedder or OfflineEmbedder(),
        reranker=reranker,
        token=token or None,
        batch_size=batch_size,
        served_names=tuple(served_names),
        max_pending=max_pending,
        max_per_client=max_per_client,
        metrics_access=metrics_access,
    )
    server = make_server(service, host, port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    return RunningServer(server, thread)


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    provider: str | None = None,
    model: str | None = None,
    served_names: Sequence[str] = (),
    rerank_model: str | None = None,
    batch_size: int | None = None,
    max_pending: int = DEFAULT_MAX_PENDING,
    max_per_client: int = DEFAULT_MAX_PER_CLIENT,
) -> int:
    """Load the models, then serve until SIGTERM/SIGINT; in-flight requests finish before it returns 0.
    Raises ConfigError / EmbeddingError for a bad configuration (PGKB_METRICS_ACCESS too) and OSError when
    the port is taken."""
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = Settings.from_env()
    token = token if token is not None else os.environ.get(TOKEN_ENV, "")
    rerank_model = rerank_model if rerank_model is not None else os.environ.get(RERANK_ENV, "").strip()
    batch = batch_size or settings.embed_batch
    if not 1 <= batch <= 1024:
        raise ConfigError("--batch-size must be between 1 and 1024")
    if max_pending < 1 or max_per_client < 1:
        raise ConfigError("--max-pending and --max-per-client must be at least 1")
    access = metrics_access()

    started = time.perf_counter()
    embedder = load_server_embedder(settings, provider, model, batch)
    probe = np.asarray(embedder.embed(["query: warm-up"]))
    if probe.shape != (1, embedder.dimension):
        raise EmbeddingError(f"{embedder.name!r} returned shape {probe.shape}, expected (1, {embedder.dimension})")
    reranker = CrossEncoderReranker(rerank_model, batch_size=batch) if rerank_model else None
    log.info(
        "loaded %s (%d-d)%s in %.1f s",
        embedder.name,
        embedder.dimension,
        f" and reranker {reranker.name}" if reranker else "",
        time.perf_counter() - started,
    )

    service = Service(
        embedder,
        reranker,
        token or None,
        batch,
        tuple(served_names),
        max_pending=max_pending,
        max_per_client=max_per_client,
        metrics_access=access,
    )
    server = make_server(service, host, port)
    if not token and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s without a token: anyone who can reach it can use it (set %s)", host, TOKEN_ENV)

    stopping = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(1)
        stopping.set()
        log.info("%s: finishing in-flight requests and stopping", signal.Signals(signum).name)
        threading.Thread(target=server.shutdown, daemon=True).start()

    in_main_thread = threading.current_thread() is threading.main_thread()  # signals can only be set there
    signals = (signal.SIGTERM, signal.SIGINT) if in_main_thread else ()
    previous = {s: signal.signal(s, _on_signal) for s in signals}
    log.info("serving %s on %s/v1/embeddings%s", service.model_name, server.url, " (token required)" if token else "")
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    log.info("stopped")
    return 0
