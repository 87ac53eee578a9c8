"""Tests for pgkb.cluster: real initdb / pg_ctl runs against throwaway data directories (no mocks).

Needs the PostgreSQL server binaries (``make setup``) and psycopg; skipped without them. Works as
root (the server then runs as ``postgres``) and as a normal user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pgkb.cluster import (
    DEFAULT_PORT,
    ROOT_DEFAULT_DATA_DIR,
    ClusterError,
    EmbeddedCluster,
    embedded_cluster_from_env,
    find_pg_bindir,
)

psycopg = pytest.importorskip("psycopg")

try:
    find_pg_bindir()
except ClusterError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(str(exc), allow_module_level=True)

IS_ROOT = os.geteuid() == 0
SERVER_USER = "postgres" if IS_ROOT else pwd.getpwuid(os.geteuid()).pw_name
PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"


def _free_port() -> int:
    """A port number not in use by TCP and with no pgkb socket directory yet."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not any(Path("/tmp").glob(f"pgkb-*-{port}")):
            return port


@pytest.fixture
def make_cluster() -> Iterator[Callable[[], EmbeddedCluster]]:
    """Factory of clusters in fresh temp dirs under /tmp (traversable by postgres); all torn down after."""
    created: list[tuple[EmbeddedCluster, Path]] = []

    def make() -> EmbeddedCluster:
        base = Path(tempfile.mkdtemp(prefix="pgkb-test-", dir="/tmp"))
        base.chmod(0o755)
        cluster = EmbeddedCluster(base / "cluster", _free_port())
        created.append((cluster, base))
        return cluster

    yield make
    for cluster, base in created:
        with contextlib.suppress(ClusterError):
            cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(cluster.socket_dir, ignore_errors=True)


def _query(url: str, sql: str) -> object:
    with psycopg.connect(url, connect_timeout=10) as conn:
        return conn.execute(sql).fetchone()[0]


def test_find_pg_bindir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bindir = find_pg_bindir()
    for exe in ("postgres", "initdb", "pg_ctl"):
        assert os.access(bindir / exe, os.X_OK)
    monkeypatch.setenv("PGKB_PG_BINDIR", str(bindir))
    assert find_pg_bindir() == bindir
    monkeypatch.setenv("PGKB_PG_BINDIR", str(tmp_path))
    with pytest.raises(ClusterError, match="PGKB_PG_BINDIR"):
        find_pg_bindir()


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGKB_DATA_DIR", raising=False)
    monkeypatch.delenv("PGKB_PORT", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "/tmp/pgkb-xdg-test")
    cluster = embedded_cluster_from_env()
    assert cluster.port == DEFAULT_PORT
    assert cluster.dbname == "pgkb"
    if IS_ROOT:
        assert cluster.data_dir == ROOT_DEFAULT_DATA_DIR
    else:
        assert cluster.data_dir == Path("/tmp/pgkb-xdg-test/pgkb/cluster")

    monkeypatch.setenv("PGKB_DATA_DIR", "/tmp/pgkb-env-test/data")
    monkeypatch.setenv("PGKB_PORT", "54999")
    cluster = embedded_cluster_from_env()
    assert cluster.data_dir == Path("/tmp/pgkb-env-test/data")
    assert cluster.port == 54999
    uid = pwd.getpwnam(SERVER_USER).pw_uid
    assert cluster.socket_dir == Path(f"/tmp/pgkb-{uid}-54999")
    assert cluster.url() == f"postgresql://{SERVER_USER}@/pgkb?host=/tmp/pgkb-{uid}-54999&port=54999"

    monkeypatch.setenv("PGKB_PORT", "nope")
    with pytest.raises(ClusterError, match="PGKB_PORT"):
        embedded_cluster_from_env()


def test_status_of_new_cluster_does_not_create_anything(make_cluster: Callable[[], EmbeddedCluster]) -> None:
    cluster = make_cluster()
    st = cluster.status()
    assert (st.initialized, st.running, st.pid) == (False, False, None)
    assert st.port == cluster.port
    assert st.data_dir == cluster.data_dir
    assert not cluster.data_dir.exists()
    cluster.stop()  # not running: no error
    assert not cluster.data_dir.exists()


@pytest.mark.slow
def test_lifecycle(make_cluster: Callable[[], EmbeddedCluster]) -> None:
    cluster = make_cluster()

    # Start from nothing: initdb + start + createdb.
    st = cluster.start()
    assert st.initialized and st.running and st.pid
    assert st.url == cluster.url()
    assert _query(st.url, "SELECT current_database()") == "pgkb"
    assert _query(st.url, "SELECT current_user") == SERVER_USER
    with psycopg.connect(st.url) as conn:
        conn.execute("CREATE TABLE marker (note text)")
        conn.execute("INSERT INTO marker VALUES ('survives restarts')")

    # Idempotent: same server, nothing re-initialised.
    assert cluster.start().pid == st.pid
    assert cluster.ensure_running().pid == st.pid
    assert cluster.status().running

    # Stop, twice.
    stopped = cluster.stop()
    assert stopped.initialized and not stopped.running and stopped.pid is None
    assert not cluster.stop().running

    # Start again: the data is reused.
    again = cluster.ensure_running()
    assert again.running and again.pid != st.pid
    assert _query(again.url, "SELECT note FROM marker") == "survives restarts"


@pytest.mark.slow
def test_locale_encoding_and_trigrams(make_cluster: Callable[[], EmbeddedCluster]) -> None:
    cluster = make_cluster()
    url = cluster.ensure_running().url
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW lc_ctype").fetchone()[0] == "C.UTF-8"
        assert conn.execute("SHOW lc_collate").fetchone()[0] == "C.UTF-8"
        assert conn.execute("SHOW server_encoding").fetchone()[0] == "UTF8"
        assert conn.execute("SHOW listen_addresses").fetchone()[0] == ""
        row = conn.execute(
            "SELECT pg_encoding_to_char(encoding), datctype FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        assert row == ("UTF8", "C.UTF-8")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        trigrams = conn.execute("SELECT show_trgm('数据库')").fetchone()[0]
        assert trigrams
        assert conn.execute("SELECT similarity('数据库管理', '数据库')").fetchone()[0] > 0


@pytest.mark.slow
def test_directories_and_ownership(make_cluster: Callable[[], EmbeddedCluster]) -> None:
    cluster = make_cluster()
    st = cluster.ensure_running()
    server_uid = pwd.getpwnam(SERVER_USER).pw_uid
    assert st.socket_dir == Path(f"/tmp/pgkb-{server_uid}-{cluster.port}")
    sock_stat = st.socket_dir.lstat()
    assert stat.S_ISDIR(sock_stat.st_mode)
    assert stat.S_IMODE(sock_stat.st_mode) == 0o700
    assert sock_stat.st_uid == server_uid
    assert (st.socket_dir / f".s.PGSQL.{cluster.port}").is_socket()
    assert cluster.data_dir.stat().st_uid == server_uid
    assert (cluster.data_dir / "server.log").is_file()
    assert cluster.lock_file.is_file()


@pytest.mark.slow
def test_start_failure_reports_server_log(make_cluster: Callable[[], EmbeddedCluster]) -> None:
    cluster = make_cluster()
    cluster.start()
    cluster.stop()
    with (cluster.data_dir / "postgresql.auto.conf").open("a") as fh:
        fh.write("shared_buffers = 'not a size'\n")
    with pytest.raises(ClusterError) as info:
        cluster.start()
    message = str(info.value)
    assert "pg_ctl start failed" in message
    assert "server.log" in message and "shared_buffers" in message
    assert not cluster.status().running


@pytest.mark.slow
def test_concurrent_ensure_running(make_cluster: Callable[[], EmbeddedCluster]) -> None:
    """Two processes racing on a fresh data dir: one initdb, one server, both get a working URL."""
    cluster = make_cluster()
    code = (
        "import sys; from pgkb.cluster import EmbeddedCluster;"
        "st = EmbeddedCluster(sys.argv[1], int(sys.argv[2])).ensure_running(); print(st.pid, st.url)"
    )
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(cluster.data_dir), str(cluster.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=180) for p in procs]
    for proc, (_out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    outputs = {out.strip() for out, _err in results}
    assert len(outputs) == 1  # same pid, same url
    pid, url = outputs.pop().split(" ", 1)
    assert int(pid) == cluster.status().pid
    assert _query(url, "SELECT 1") == 1


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT, reason="root only")
def test_root_rejects_data_dir_postgres_cannot_reach(make_cluster: Callable[[], EmbeddedCluster]) -> None:
    cluster = make_cluster()
    private = cluster.data_dir.parent / "private"
    private.mkdir(mode=0o700)
    hidden = EmbeddedCluster(private / "cluster", cluster.port)
    with pytest.raises(ClusterError, match="cannot reach"):
        hidden.start()
    assert not hidden.status().running


def test_shared_buffers_sized_to_the_machine(
    make_cluster: Callable[[], EmbeddedCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server gets an eighth of the memory (128 MB .. 4 GB) unless PGKB_SHARED_BUFFERS says otherwise or
    an operator raised it in postgresql.conf; a malformed or out-of-range value is refused before anything
    starts, naming the variable; ALTER SYSTEM wins over all of them."""
    from pgkb.cluster.bootstrap import _memory_mb, shared_buffers

    memory = _memory_mb()
    expected = 128 if memory is None else min(max(memory // 8, 128), 4096)
    monkeypatch.delenv("PGKB_SHARED_BUFFERS", raising=False)
    assert shared_buffers() == f"{expected}MB"
    cluster = make_cluster()
    assert _query(cluster.ensure_running().url, "SHOW shared_buffers") == f"{expected}MB"
    cluster.stop()
    monkeypatch.setenv("PGKB_SHARED_BUFFERS", "256MB")
    assert _query(cluster.ensure_running().url, "SHOW shared_buffers") == "256MB"
    cluster.stop()

    fresh = make_cluster()
    too_much = f"{memory // 2 + 1}MB" if memory else "9999999GB"
    for bad in ("64MB", "lots", "2TB", "-1GB", "NaN", "1e3MB", "1\u00a0GB", too_much):
        monkeypatch.setenv("PGKB_SHARED_BUFFERS", bad)
        for target in (cluster, fresh):
            with pytest.raises(ClusterError, match="PGKB_SHARED_BUFFERS"):
                target.start()
            assert not target.status().running
        assert not fresh.status().initialized  # refused before initdb: nothing was made

    # an operator's larger value in postgresql.conf is kept; the variable still wins over it
    monkeypatch.delenv("PGKB_SHARED_BUFFERS")
    conf = cluster.data_dir / "postgresql.conf"
    conf.write_text(conf.read_text().replace("\nshared_buffers = ", "\nshared_buffers = 384MB # tuned, was "))
    assert _query(cluster.ensure_running().url, "SHOW shared_buffers") == "384MB"
    cluster.stop()
    monkeypatch.setenv("PGKB_SHARED_BUFFERS", "256MB")
    url = cluster.ensure_running().url
    assert _query(url, "SHOW shared_buffers") == "256MB"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_buffers = '192MB'")
    cluster.stop()
    assert _query(cluster.ensure_running().url, "SHOW shared_buffers") == "192MB"
