"""Shared pieces of the reliability suite (tests/reliability): run-length knobs, figure publishing, a fake
OpenAI-compatible embedding endpoint with switchable faults, private clusters that may be killed, database
fingerprints and convergence checks, and process / MCP plumbing.

Every server here binds 127.0.0.1; every loop is bounded in count and in time.

Run length: the fast variants run in ``make test``. ``PGKB_SOAK=1`` selects the long variants;
``PGKB_SOAK_SECONDS`` (default 60) is the duration of the timed ones. Figures go to the terminal summary and,
with ``PGKB_RELIABILITY_OUT=path.jsonl``, one JSON line per figure set.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import psycopg
from chunk_terms import CHUNK_TERMS
from term_dictionary import TERM_DICTIONARY

SOAK = os.environ.get("PGKB_SOAK", "").strip() not in ("", "0")
DIM = 384  # the default model's dimension (multilingual-e5-small)
MODEL = "multilingual-e5-small"
FIGURES: list[dict] = []
PYTHON_DIR = str(
    Path(__file__).resolve().parents[2] / "python"
)  # child processes run this checkout's pgkb  # printed by tests/reliability/conftest.py at the end of the run


def soak_seconds(fast: float) -> float:
    """Duration of a timed loop: ``fast`` seconds normally, PGKB_SOAK_SECONDS (60) in the long variant."""
    if not SOAK:
        return fast
    return float(os.environ.get("PGKB_SOAK_SECONDS", "60"))


def scale(fast: int, long: int) -> int:
    """A count: ``fast`` normally, ``long`` in the long variant."""
    return long if SOAK else fast


def publish(area: str, **figures) -> None:
    """Record the figures of one test (shown in the terminal summary; appended to PGKB_RELIABILITY_OUT)."""
    record = {"area": area, "variant": "long" if SOAK else "fast", **figures}
    FIGURES.append(record)
    out = os.environ.get("PGKB_RELIABILITY_OUT", "").strip()
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p95/p99/max of durations in seconds, as milliseconds."""
    if not samples:
        return {"n": 0}
    a = np.asarray(samples) * 1000
    return {
        "n": len(samples),
        "p50_ms": round(float(np.percentile(a, 50)), 1),
        "p95_ms": round(float(np.percentile(a, 95)), 1),
        "p99_ms": round(float(np.percentile(a, 99)), 1),
        "max_ms": round(float(a.max()), 1),
    }


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is truthy (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if predicate():
                return True
        time.sleep(interval)
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_url() -> str:
    """An embeddings URL on a loopback port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}/v1/embeddings"


# ------------------------------------------------------------------------------------ fake embedding server


def fake_vector(text: str, dim: int = DIM) -> list[float]:
    """A deterministic unit vector for ``text`` (seeded by its SHA-256): cheap, stable, no model needed."""
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim)
    return [float(x) for x in v / np.linalg.norm(v)]


class FakeEmbedder:
    """An OpenAI-compatible ``POST /v1/embeddings`` on 127.0.0.1 (port 0) with switchable behaviour.

    ``mode``: ``ok``; ``slow`` (sleeps ``delay`` seconds, then answers); ``error500``; ``wrong_dim`` (vectors
    of ``dim + 1``); ``wrong_count`` (one vector too few); ``garbage`` (not JSON); ``reset`` (the connection
    is dropped unanswered). ``poison``: a word whose presence in any input makes that request fail with 500
    (whatever the mode). ``delay`` also applies in
    ``ok`` mode when ``always_delay`` is set (a slow but healthy endpoint). Counts requests and texts.
    """

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self.mode = "ok"
        self.delay = 0.0
        self.always_delay = False
        self.poison: str | None = None
        self.requests = 0
        self.texts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                if length > 64 * 1024 * 1024:
                    self._reply(413, {"error": {"message": "too large"}})
                    return
                body = json.loads(self.rfile.read(length) or b"{}")
                texts = body.get("input") or []
                texts = [texts] if isinstance(texts, str) else list(texts)
                with fake._lock:
                    fake.requests += 1
                    fake.texts += len(texts)
                mode = fake.mode
                if mode == "slow" or fake.always_delay:
                    fake._stop.wait(fake.delay)
                if fake.poison and any(fake.poison in t for t in texts):
                    self._reply(500, {"error": {"message": f"poisoned input ({fake.poison})"}})
                    return
                if mode == "error500":
                    self._reply(500, {"error": {"message": "internal failure (fake)"}})
                    return
                if mode == "reset":  # the connection is dropped without an answer (a crashing server)
                    self.close_connection = True
                    return
                if mode == "garbage":
                    self._raw(200, b"<html>not json")
                    return
                dim = fake.dim + 1 if mode == "wrong_dim" else fake.dim
                vectors = [fake_vector(t, fake.dim)[:dim] + [0.0] * (dim - fake.dim) for t in texts]
                if mode == "wrong_count":
                    vectors = vectors[:-1]
                data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
                self._reply(200, {"object": "list", "data": data, "model": body.get("model")})

            def _reply(self, status: int, payload: object) -> None:
                self._raw(status, json.dumps(payload).encode())

            def _raw(self, status: int, raw: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): fine

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/embeddings"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    def set(self, mode: str = "ok", delay: float = 0.0, poison: str | None = None) -> None:
        self.mode, self.delay, self.poison = mode, delay, poison

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def fake_embedder(dim: int = DIM) -> Iterator[FakeEmbedder]:
    fake = FakeEmbedder(dim)
    try:
        yield fake
    finally:
        fake.close()


# ------------------------------------------------------------------------------------------- own clusters


class OwnCluster:
    """A migrated PostgreSQL cluster of the test's own (temp data dir, free port), so it may be killed or
    restarted without touching the session's cluster. Login roles alice, bob, svc exist (svc in
    pgkb_service)."""

    def __init__(self) -> None:
        from pgkb.cluster import EmbeddedCluster

        self.tmp = tempfile.mkdtemp(prefix="pgkb-rel-", dir="/tmp")
        Path(self.tmp).chmod(0o755)  # the postgres OS user must reach the data dir when we run as root
        self.cluster = EmbeddedCluster(data_dir=Path(self.tmp) / "data", port=free_port(), dbname="pgkb")
        self.cluster.start()
        self.admin_url = self.dsn(self.cluster.server_user)
        from pgkb.config import Settings
        from pgkb.migrate import migrate

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            migrate(conn, Settings.from_env().db_dir)
            for role in ("alice", "bob", "svc"):
                conn.execute(f"create role {role} login")
            conn.execute("grant pgkb_service to svc")
            conn.execute("select kb.create_user('alice', 'alice')")
            conn.execute("select kb.create_user('bob', 'bob')")

    def dsn(self, user: str) -> str:
        return f"host={self.cluster.socket_dir} port={self.cluster.port} dbname=pgkb user={user}"

    def connect(self, user: str | None = None) -> psycopg.Connection:
        from pgvector.psycopg import register_vector

        conn = psycopg.connect(self.dsn(user) if user else self.admin_url, autocommit=True)
        register_vector(conn)
        return conn

    def postmaster_pid(self) -> int | None:
        return self.cluster.status().pid

    def kill9(self) -> None:
        """SIGKILL the postmaster (the backends notice and exit), as a power cut of the server would."""
        pid = self.postmaster_pid()
        assert pid, "the cluster is not running"
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), 10)

    def start(self, timeout: float = 60) -> float:
        """Start (after a crash: once the orphaned backends are gone and the shared memory is free);
        returns the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout
        while True:
            try:
                self.cluster.start()
                return time.monotonic() - started
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        self.cluster.stop()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.cluster.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


# ------------------------------------------------------------------------------- fingerprints and checks


def snapshot(admin: psycopg.Connection) -> dict[str, tuple[int, str]]:
    """(row count, md5 of every row's text) per kb table (all of them, from the catalog): equal snapshots =
    nothing changed."""
    tables = admin.execute(
        "select relname from pg_class where relnamespace = 'kb'::regnamespace and relkind in ('r', 'p') order by 1"
    ).fetchall()
    out = {}
    for (table,) in tables:
        out[table] = admin.execute(
            f"select count(*), coalesce(md5(string_agg(t::text, '|' order by t::text)), '') from kb.{table} as t"
        ).fetchone()
    return out


def integrity_problems(admin: psycopg.Connection) -> list[str]:
    """Derived state that must always agree with the rows it derives from (whatever crashed when)."""
    problems = []
    for doc_key, stored, actual in admin.execute(
        "select d.doc_key, d.chunk_count, count(c.id) from kb.documents as d"
        " left join kb.chunks as c on c.document_id = d.id group by d.id having d.chunk_count <> count(c.id)"
    ):
        problems.append(f"{doc_key}: chunk_count {stored} but {actual} chunks")
    for name, n, total, real_n, real_total in admin.execute(
        "select k.name, k.chunk_count, k.term_total, count(c.id), coalesce(sum(c.term_count), 0)"
        " from kb.knowledge_bases as k left join kb.chunks as c on c.kb_id = k.id group by k.id"
        " having k.chunk_count <> count(c.id) or k.term_total <> coalesce(sum(c.term_count), 0)"
    ):
        problems.append(f"kb {name}: N/total {n}/{total} but chunks say {real_n}/{real_total}")
    bad_df = admin.execute(
        f"with real as (select x.kb_id, x.term, count(*) as df from {CHUNK_TERMS} as x group by 1, 2)"
        f" select count(*) from {TERM_DICTIONARY} as s full join real as r on r.kb_id = s.kb_id and r.term = s.term"
        " where coalesce(s.df, 0) <> coalesce(r.df, 0)"
    ).fetchone()[0]
    if bad_df:
        problems.append(f"{bad_df} term_stats rows disagree with the chunks' terms")
    both = admin.execute(
        "select count(*) from kb.embedding_queue as q join kb.embeddings as e using (chunk_id, model_id)"
    ).fetchone()[0]
    if both:
        problems.append(f"{both} chunks both embedded and queued")
    neither = admin.execute(
        "select count(*) from kb.chunks as c cross join kb.embedding_models as m where not exists"
        " (select from kb.embeddings as e where e.chunk_id = c.id and e.model_id = m.id) and not exists"
        " (select from kb.embedding_queue as q where q.chunk_id = c.id and q.model_id = m.id)"
    ).fetchone()[0]
    if neither:
        problems.append(f"{neither} chunks neither embedded nor queued")
    wrong_status = admin.execute(
        "select count(*) from kb.documents as d where d.status = 'ready' and exists (select from"
        " kb.embedding_queue as q join kb.chunks as c on c.id = q.chunk_id where c.document_id = d.id)"
    ).fetchone()[0]
    if wrong_status:
        problems.append(f"{wrong_status} documents 'ready' with queued chunks")
    return problems


def expected_documents(root: Path, options=None) -> dict[str, tuple[str, list[str]]]:
    """What `pgkb ingest root` must leave: doc_key -> (content hash, chunk contents in order), documents
    without text left out."""
    from pgkb.chunking import ChunkingError, chunk_bytes
    from pgkb.ingest import IngestOptions, content_hash, discover

    options = options or IngestOptions()
    out = {}
    for found in discover(root, options.include, options.exclude):
        data = found.path.read_bytes()
        try:
            doc = chunk_bytes(data, found.path.name, options.chunking)
        except ChunkingError:
            continue
        if doc.chunks:
            out[found.doc_key] = (content_hash(data, options.chunking), [c.content for c in doc.chunks])
    return out


def convergence_problems(admin: psycopg.Connection, kb: str, root: Path, *, embedded: bool = True) -> list[str]:
    """Differences between knowledge base ``kb`` and the folder it was ingested from, plus integrity
    problems; with ``embedded``, also every chunk not embedded or a queue entry left (leased or not)."""
    expected = expected_documents(root)
    stored = {
        doc_key: (digest, contents)
        for doc_key, digest, contents in admin.execute(
            "select d.doc_key, d.content_hash, coalesce(array_agg(c.content order by c.ordinal)"
            " filter (where c.id is not null), '{}') from kb.documents as d"
            " join kb.knowledge_bases as k on k.id = d.kb_id left join kb.chunks as c on c.document_id = d.id"
            " where k.name = %s group by d.id",
            [kb],
        )
    }
    problems = []
    for key in sorted(set(expected) - set(stored)):
        problems.append(f"lost: {key}")
    for key in sorted(set(stored) - set(expected)):
        problems.append(f"extra: {key}")
    for key in sorted(set(expected) & set(stored)):
        if stored[key][0] != expected[key][0]:
            problems.append(f"stale hash: {key}")
        if list(stored[key][1]) != expected[key][1]:
            problems.append(f"chunks differ: {key} ({len(stored[key][1])} stored, {len(expected[key][1])} expected)")
    if embedded:
        left = admin.execute(
            "select count(*), count(*) filter (where q.next_attempt_at > now()), count(*) filter (where q.parked)"
            " from kb.embedding_queue as q join kb.knowledge_bases as k on k.id = q.kb_id where k.name = %s",
            [kb],
        ).fetchone()
        if left[0]:
            problems.append(f"{left[0]} queue entries left ({left[1]} leased or backing off, {left[2]} parked)")
        not_ready = admin.execute(
            "select count(*) from kb.documents as d join kb.knowledge_bases as k on k.id = d.kb_id"
            " where k.name = %s and d.status <> 'ready'",
            [kb],
        ).fetchone()[0]
        if not_ready:
            problems.append(f"{not_ready} documents not ready")
    return problems + integrity_problems(admin)


# ---------------------------------------------------------------------------------------------- processes


def child_env(database_url: str, embed_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a pgkb child process: this one's, pointed at ``database_url``; embeddings from
    ``embed_url`` (provider http) when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGKB_")}
    env.update({"PGKB_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_DIR, os.environ.get("PYTHONPATH", "")) if p)
    if embed_url:
        env.update({"PGKB_EMBED_PROVIDER": "http", "PGKB_EMBED_URL": embed_url})
    env.update(extra)
    return env


@dataclass
class Child:
    """A pgkb child process whose output goes to files (no pipe can fill up and stall it)."""

    proc: subprocess.Popen
    out: Path
    err: Path
    started: float = field(default_factory=time.monotonic)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode


def spawn(args: list[str], env: dict[str, str], logdir: Path, name: str) -> Child:
    """Start ``python -m pgkb.cli <args>`` (``python <args>`` when args[0] is ``-m`` or ``-c``)."""
    logdir.mkdir(parents=True, exist_ok=True)
    out, err = logdir / f"{name}.out", logdir / f"{name}.err"
    argv = [sys.executable, *args] if args[0] in ("-m", "-c") else [sys.executable, "-m", "pgkb.cli", *args]
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(argv, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
    return Child(proc, out, err)


def wait_port(port: int, child: Child, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if child.proc.poll() is not None or time.monotonic() > deadline:
                child.stop()
                raise RuntimeError(f"server did not start: {child.stderr()[-2000:]}") from None
            time.sleep(0.1)


def mcp_http_server(database_url: str, embed_url: str, logdir: Path, tokens: dict[str, str], **extra: str):
    """`pgkb mcp --transport http` on a free loopback port; returns (Child, base URL)."""
    port = free_port()
    env = child_env(database_url, embed_url, PGKB_MCP_TOKENS=",".join(f"{t}:{u}" for t, u in tokens.items()), **extra)
    child = spawn(["mcp", "--transport", "http", "--port", str(port)], env, logdir, f"mcp-{port}")
    wait_port(port, child)
    return child, f"http://127.0.0.1:{port}"


def http_client(base: str, token: str | None, **kwargs):
    """An MCP SDK client over streamable HTTP with a bearer token."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = streamable_http_client(base + "/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=60))
    return Client(transport, **kwargs)


def stdio_client(database_url: str, embed_url: str, **extra: str):
    """An MCP SDK client that starts `pgkb mcp` (stdio) itself."""
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "pgkb.cli", "mcp"], env=child_env(database_url, embed_url, **extra)
    )
    return Client(params, read_timeout_seconds=60)


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def rss_kb(pid: int) -> int:
    """Resident set size of a process in KiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def hwm_kb(pid: int) -> int:
    """Peak resident set size of a process in KiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
