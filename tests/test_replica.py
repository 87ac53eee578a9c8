"""Read replicas (pgkb.replica) with real streaming replication: a small primary of its own and a hot
standby made by ``add_replica`` (pg_basebackup through a slot), both on this machine, plus the read path
under ``default_transaction_read_only`` on the session's test cluster.

Replication waits on the LSN (the standby's pg_last_wal_replay_lsn() reaching the primary's
pg_current_wal_lsn()), never on a fixed sleep. Queries are embedded inside the database (plpython3u
kb_internal.http_embedding) or by the client, both through the shared fake_embeddings endpoint, whose vectors are
bags of words: a query shares its nearest chunk's words.

The module's primary starts once (about 10 s with its replica); the primary-down test stops it with
``pg_ctl -m immediate`` (a crash, so the lifecycle hooks do not stop the standby too) and restarts it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from pgkb import replica as replicas_mod
from pgkb.cluster import ClusterError, EmbeddedCluster, find_pg_bindir
from pgkb.config import Settings
from pgkb.migrate import migrate
from pgkb.replica import ReplicaError, add_replica, read_url, remove_replica, replica_states, replicas
from pgkb.service_role import SERVICE_ROLE, login_url

pytestmark = pytest.mark.slow  # replication: a primary and its standbys

try:
    find_pg_bindir()
except ClusterError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(str(exc), allow_module_level=True)

PYTHON_DIR = Path(__file__).resolve().parents[1] / "python"
DIM = 384  # multilingual-e5-small, the registry's default model
REPLAY_TIMEOUT_S = 60.0


def bag_of_words(texts: list[str]) -> list[list[float]]:
    """Fake embeddings: each word hashed into one of DIM - 1 buckets, plus a constant component (never a
    zero vector). Model prefixes are dropped, so a query and a passage sharing words are near."""
    out = []
    for text in texts:
        text = re.sub(r"^(query|passage): ", "", text)
        vector = [0.0] * DIM
        vector[0] = 0.1
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            vector[1 + int(hashlib.sha256(word.encode()).hexdigest(), 16) % (DIM - 1)] += 1.0
        out.append(vector)
    return out


def _free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not any(Path("/tmp").glob(f"pgkb-*-{port}")):
            return port


@dataclass
class Pair:
    primary: EmbeddedCluster
    standby: replicas_mod.Replica
    base: Path

    @property
    def standby_cluster(self) -> EmbeddedCluster:
        return self.standby.cluster(self.primary)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.primary.url(), autocommit=True)

    def on_standby(self, role: str | None = None) -> psycopg.Connection:
        url = self.standby_cluster.url()
        return psycopg.connect(login_url(url, role) if role else url, autocommit=True)

    def wait_replayed(self) -> str:
        """Wait until the standby has replayed everything the primary has written so far; returns the LSN."""
        with self.admin() as conn:
            target = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]
        deadline = time.monotonic() + REPLAY_TIMEOUT_S
        with self.on_standby() as conn:
            while not conn.execute("select pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]).fetchone()[0]:
                assert time.monotonic() < deadline, f"the standby did not replay up to {target}"
                time.sleep(0.01)
        return target


@contextlib.contextmanager
def _running_primary(prefix: str) -> Iterator[tuple[EmbeddedCluster, Path]]:
    """A started primary in a temporary folder of its own, and that folder; afterwards it and every replica
    it got are stopped and their folders and sockets removed."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    primary = EmbeddedCluster(base / "primary", _free_port(), "pgkb")
    try:
        primary.start()
        yield primary, base
    finally:
        with contextlib.suppress(ClusterError):
            primary.stop()  # the lifecycle hook stops the replicas
        for replica in replicas(primary):
            with contextlib.suppress(ClusterError):
                replica.cluster(primary).stop()
        sockets = [primary.socket_dir] + [r.cluster(primary).socket_dir for r in replicas(primary)]
        shutil.rmtree(base, ignore_errors=True)
        for sock in sockets:
            shutil.rmtree(sock, ignore_errors=True)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with _running_primary("pgkb-replica-") as (primary, base):
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            migrate(conn, Settings.from_env().db_dir)
            for role in ("alice", "bob"):
                conn.execute(f"create role {role} login")
                conn.execute("select kb.create_user(%s, %s)", [role, role])
            conn.execute("select kb.create_knowledge_base('handbook', visibility => 'public')")
        standby = add_replica(primary, "standby1", port=_free_port())
        yield Pair(primary, standby, base)


@pytest.fixture
def embedded_env(pair: Pair, monkeypatch: pytest.MonkeyPatch, fake_embeddings):
    """The environment of a machine whose embedded cluster is ``pair.primary`` with the replica; the
    database embeds queries through a fake endpoint (and so does pgkb's client side). Returns the endpoint."""
    endpoint = fake_embeddings(bag_of_words)
    for name in ("PGKB_DATABASE_URL", "PGKB_READ_DATABASE_URL", "PGKB_USER", "PGKB_QUERY_LOG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGKB_DATA_DIR", str(pair.primary.data_dir))
    monkeypatch.setenv("PGKB_PORT", str(pair.primary.port))
    monkeypatch.setenv("PGKB_EMBED_PROVIDER", "http")
    monkeypatch.setenv("PGKB_EMBED_URL", endpoint.url)
    with pair.admin() as conn:
        conn.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
    return endpoint


def pgkb(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the pgkb CLI in a subprocess with the current environment (plus ``env``)."""
    return subprocess.run(
        [sys.executable, "-m", "pgkb.cli", *args],
        env={**os.environ, "PYTHONPATH": str(PYTHON_DIR), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def write_docs(folder: Path, docs: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def ingest_as(pair: Pair, role: str | None, folder: Path, kb: str) -> None:
    url = pair.primary.url() if role is None else login_url(pair.primary.url(), role)
    done = pgkb("ingest", str(folder), "--kb", kb, "--json", env={"PGKB_DATABASE_URL": url})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["added"] == len(list(folder.iterdir())) and not summary["failed"]


def hybrid(conn: psycopg.Connection, query: str) -> list[tuple[str, str, int | None, bool]]:
    """kb.hybrid_search with the in-database query embedding: (kb, doc_key, vector_rank, vector_used)."""
    return conn.execute(
        "select kb, doc_key, vector_rank, vector_used from kb.hybrid_search(%s, top_k => 10)", [query]
    ).fetchall()


@pytest.fixture(scope="module")
def documents(pair: Pair, tmp_path_factory) -> None:
    """Three knowledge bases ingested on the primary through `pgkb ingest`: public handbook, alice's and
    bob's private notes (embedded by the client through a fake endpoint of its own)."""
    from fake_embeddings import FakeEmbeddings

    endpoint = FakeEmbeddings(bag_of_words, (), False)
    root = tmp_path_factory.mktemp("docs")
    env = {"PGKB_EMBED_PROVIDER": "http", "PGKB_EMBED_URL": endpoint.url}
    try:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        ingest_as(
            pair,
            None,
            write_docs(root / "handbook", {"deploy.md": "# Deploy\n\nRolling deploy of the payments service."}),
            "handbook",
        )
        ingest_as(
            pair,
            "alice",
            write_docs(root / "alice", {"falcon.md": "# Falcon\n\nProject falcon launch code is amber seven."}),
            "alice-notes",
        )
        ingest_as(
            pair,
            "bob",
            write_docs(root / "bob", {"budget.md": "# Falcon budget\n\nFalcon budget is ninety thousand."}),
            "bob-notes",
        )
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        endpoint.close()


# ------------------------------------------------------------------------------------------- replication


def test_ingest_on_the_primary_is_found_on_the_standby(pair, documents, embedded_env):
    pair.wait_replayed()
    with pair.on_standby("alice") as alice, pair.on_standby("bob") as bob:
        assert alice.execute("select pg_is_in_recovery()").fetchone()[0]
        alice_hits = hybrid(alice, "falcon launch code")
        bob_hits = hybrid(bob, "falcon launch code")
    # the standby embedded the query itself (plpython3u) and the vector leg ran there
    assert any(body["input"] == ["query: falcon launch code"] for body in embedded_env.requests)
    assert alice_hits[0][:3] == ("alice-notes", "falcon.md", 1) and all(h[3] for h in alice_hits)
    assert {h[0] for h in alice_hits} <= {"alice-notes", "handbook"}
    # RLS on the standby: bob finds his own falcon note, never alice's
    assert bob_hits and {h[0] for h in bob_hits} <= {"bob-notes", "handbook"}
    assert ("bob-notes", "budget.md") in {h[:2] for h in bob_hits}


def test_a_new_write_is_visible_after_replay(pair, documents, embedded_env):
    with pair.admin() as conn:
        conn.execute(
            "select kb.replace_document('handbook', 'pager.md', 'Pager', %s::jsonb)",
            [json.dumps([{"content": "pager rotation starts monday", "embedding": bag_of_words(["pager"])[0]}])],
        )
    lsn = pair.wait_replayed()
    with pair.on_standby("bob") as bob:
        assert bob.execute("select pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]).fetchone()[0]
        assert ("handbook", "pager.md") in {h[:2] for h in hybrid(bob, "pager rotation")}


def test_read_only_sessions_never_write_on_the_read_path(pair, documents, embedded_env):
    """Every read function works on the standby (where any write fails) for a user, an unmapped role and
    the MCP service role acting for a user."""
    pair.wait_replayed()
    with pair.on_standby("alice") as alice, pair.on_standby(SERVICE_ROLE) as svc:
        assert_read_path(alice, expect_private="alice-notes")
        with svc.transaction():
            svc.execute("select set_config('pgkb.acting_user', 'bob', true)")
            assert_read_path(svc, expect_private="bob-notes")
        assert svc.execute("select kb.service_role_problem()").fetchone()[0] is None


def assert_read_path(conn: psycopg.Connection, expect_private: str) -> None:
    kbs = {r[0] for r in conn.execute("select name from kb.list_knowledge_bases()")}
    assert kbs == {"handbook", expect_private}
    assert conn.execute("select username from kb.whoami()").fetchone()[0]
    docs = conn.execute("select doc_key from kb.list_documents(%s)", [expect_private]).fetchall()
    assert len(docs) == 1
    doc = conn.execute("select chunk_count from kb.get_document(%s, kb => %s)", [docs[0][0], expect_private])
    assert doc.fetchone()[0] >= 1
    conn.execute("select * from kb.list_ingest_failures()").fetchall()
    conn.execute("select * from kb.embedding_status()").fetchall()
    conn.execute("select kb.check_search_input('falcon', 5)")
    for fn in ("hybrid_search", "vector_search", "lexical_search", "fuzzy_search"):
        rows = conn.execute(f"select kb, vector_used from kb.{fn}('falcon', top_k => 5)").fetchall()
        assert {r[0] for r in rows} <= {"handbook", expect_private}
    assert all(r[3] for r in hybrid(conn, "falcon launch code"))
    assert "[falcon]" in conn.execute("select kb.snippet('the falcon launch', 'falcon', 160, '[', ']')").fetchone()[0]
    answer = conn.execute("select found, mode, citations from kb.ask('falcon launch code', mode => 'extractive')")
    found, mode, citations = answer.fetchone()
    assert mode in ("extractive", "not_found") and (found or not citations)


# --------------------------------------------------------------------------------------- routing reads


@contextlib.contextmanager
def replay_paused(pair: Pair) -> Iterator[None]:
    with pair.on_standby() as conn:
        conn.execute("select pg_wal_replay_pause()")
        try:
            yield
        finally:
            conn.execute("select pg_wal_replay_resume()")


def test_read_url_routes_search_and_mcp_to_the_standby(pair, documents, embedded_env, monkeypatch):
    """With replay paused on the standby, a document written on the primary is seen through the primary
    only: `pgkb search` and the MCP server configured with PGKB_READ_DATABASE_URL do not see it, and the
    MCP server's connections show up in the standby's pg_stat_activity, not the primary's."""
    read = read_url(pair.primary)
    assert read.index(str(pair.standby.port)) < read.index(str(pair.primary.port))
    with replay_paused(pair):
        with pair.admin() as conn:
            conn.execute(
                "select kb.replace_document('handbook', 'heron.md', 'Heron', %s::jsonb)",
                [json.dumps([{"content": "heron migration window", "embedding": bag_of_words(["heron"])[0]}])],
            )
        primary_only = pgkb("search", "heron migration window", "--json", "--no-rerank")
        assert primary_only.returncode == 0, primary_only.stderr
        assert "heron.md" in {r["doc_key"] for r in json.loads(primary_only.stdout)["results"]}

        monkeypatch.setenv("PGKB_READ_DATABASE_URL", read)
        through_read = pgkb("search", "heron migration window", "--json", "--no-rerank")
        assert through_read.returncode == 0, through_read.stderr
        assert "heron.md" not in {r["doc_key"] for r in json.loads(through_read.stdout)["results"]}

        from pgkb.serving.backend import Backend
        from pgkb.serving.config import ServiceConfig

        config = ServiceConfig.from_env(Settings.from_env())
        assert "user=pgkb_mcp" in config.database_url  # the embedded replicas: the service role logs in
        backend = Backend(config)
        try:
            hits = {h.doc_key for h in backend.search("alice", "heron migration window", 5, None).results}
            assert "heron.md" not in hits
            assert "falcon.md" in {h.doc_key for h in backend.search("alice", "falcon launch code", 5, None).results}
            sql = "select count(*) from pg_stat_activity where usename = %s and datname = 'pgkb'"
            with pair.on_standby() as standby, pair.admin() as primary:
                assert standby.execute(sql, [SERVICE_ROLE]).fetchone()[0] >= 1
                assert primary.execute(sql, [SERVICE_ROLE]).fetchone()[0] == 0
        finally:
            backend.close()
    pair.wait_replayed()
    with pair.on_standby("alice") as alice:
        assert ("handbook", "heron.md") in {h[:2] for h in hybrid(alice, "heron migration window")}


# ----------------------------------------------------------------------------------------- primary down


def test_the_standby_answers_while_the_primary_is_down(pair, documents, embedded_env, monkeypatch, tmp_path):
    pair.wait_replayed()
    read = read_url(pair.primary)
    standby_url = pair.standby_cluster.url()
    pair.primary.run_as_server("pg_ctl", "-D", str(pair.primary.data_dir), "-m", "immediate", "stop")
    try:
        assert not pair.primary.status().running and pair.standby_cluster.status().running
        with pair.on_standby("alice") as alice, pair.on_standby("bob") as bob:
            alice_hits = hybrid(alice, "falcon launch code")
            assert alice_hits[0][:3] == ("alice-notes", "falcon.md", 1) and alice_hits[0][3]
            assert "alice-notes" not in {h[0] for h in hybrid(bob, "falcon launch code")}
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                alice.execute("select kb.replace_document('alice-notes', 'x.md', 'x', '[{\"content\": \"x\"}]'::jsonb)")

        # pgkb search through the multi-host read URL: the primary is down, the standby answers
        monkeypatch.setenv("PGKB_READ_DATABASE_URL", read)
        done = pgkb("search", "falcon launch code", "--json", "--no-rerank", "--user", "alice")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["results"][0]["doc_key"] == "falcon.md"

        states = {s.replica.name: s for s in replica_states(pair.primary)}
        assert states["standby1"].running and states["standby1"].state == "primary down"

        # a writer pointed at the standby says it is read-only and writes nothing
        folder = write_docs(tmp_path / "more", {"new.md": "# New\n\nnew text"})
        refused = pgkb("ingest", str(folder), "--kb", "handbook", env={"PGKB_DATABASE_URL": standby_url})
        assert refused.returncode == 2
        assert "read-only" in refused.stderr and "hot standby" in refused.stderr
        assert "PGKB_DATABASE_URL at the primary" in refused.stderr
    finally:
        pair.primary.start()
    pair.wait_replayed()
    with pair.admin() as conn:
        assert conn.execute("select count(*) from kb.documents where doc_key = 'new.md'").fetchone()[0] == 0


# ----------------------------------------------------------------------------------------- add / remove


def test_replica_state_reports_replay_lag(pair, documents, embedded_env):
    pair.wait_replayed()
    (state,) = [s for s in replica_states(pair.primary) if s.replica.name == "standby1"]
    assert state.running and state.state == "streaming"
    assert state.lag_bytes == 0 and state.lag_seconds == 0.0
    with replay_paused(pair):
        with pair.admin() as conn:
            conn.execute("select kb.create_knowledge_base('lag-check', visibility => 'public')")
            written = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]
        with pair.on_standby() as conn:  # received, not replayed: the lag is what the standby still has to apply
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while not conn.execute("select pg_last_wal_receive_lsn() >= %s::pg_lsn", [written]).fetchone()[0]:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        (paused,) = [s for s in replica_states(pair.primary) if s.replica.name == "standby1"]
        assert paused.lag_bytes > 0
    pair.wait_replayed()


def test_cli_add_list_status_remove(pair, embedded_env):
    """`pgkb db replica add / list / remove` and `pgkb db status` on the embedded cluster: the replica
    streams through its own slot as pgkb_replicator (replication only), and removal leaves no slot, no data
    directory, no socket directory and no record."""
    port = _free_port()
    added = pgkb("db", "replica", "add", "extra", "--port", str(port))
    assert added.returncode == 0, added.stderr
    assert "PGKB_READ_DATABASE_URL=" in added.stdout and "target_session_attrs=prefer-standby" in added.stdout
    extra = next(r for r in replicas(pair.primary) if r.name == "extra")
    assert extra.port == port and extra.data_dir.is_dir()
    pair.wait_replayed()
    listed = pgkb("db", "replica", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert set(rows) == {"extra", "standby1"}
    assert rows["extra"]["state"] == "streaming" and rows["extra"]["port"] == port
    assert isinstance(rows["extra"]["lag_bytes"], int) and rows["extra"]["data_dir"] == str(extra.data_dir)
    status = pgkb("db", "status")
    assert status.returncode == 0, status.stderr
    assert re.search(rf"^replica extra: streaming, port {port}, lag \d+ bytes", status.stdout, re.M)
    with pair.admin() as conn:
        slot = conn.execute(
            "select s.active, r.usename from pg_replication_slots as s"
            " left join pg_stat_replication as r on r.pid = s.active_pid where s.slot_name = %s",
            [extra.slot],
        ).fetchone()
        assert slot == (True, "pgkb_replicator")
        role = conn.execute(
            "select rolreplication, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls from pg_roles"
            " where rolname = 'pgkb_replicator'"
        ).fetchone()
        assert role == (True, False, False, False, False)
    # the replication role may not open an ordinary session
    with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects"):
        psycopg.connect(login_url(pair.primary.url(), "pgkb_replicator")).close()

    socket_dir = extra.cluster(pair.primary).socket_dir
    removed = pgkb("db", "replica", "remove", "extra")
    assert removed.returncode == 0, removed.stderr
    assert not extra.data_dir.exists() and not socket_dir.exists()
    assert extra.name not in {r.name for r in replicas(pair.primary)}
    assert sorted(p.name for p in replicas_mod.replicas_dir(pair.primary).iterdir()) == [
        ".lock",
        "standby1",
        "standby1.json",
        "standby1.lock",
    ]
    with pair.admin() as conn:
        assert not conn.execute("select 1 from pg_replication_slots where slot_name = %s", [extra.slot]).fetchone()
    with pytest.raises(ReplicaError, match="no replica named"):
        remove_replica(pair.primary, extra.name)


def test_bad_add_changes_nothing(pair):
    before = sorted(p.name for p in replicas_mod.replicas_dir(pair.primary).iterdir())
    with pair.admin() as conn:
        slots = conn.execute("select slot_name from pg_replication_slots order by 1").fetchall()
    for bad in ("Bad Name", "probe1\n"):  # a trailing newline once passed (re.match with "$")
        with pytest.raises(ReplicaError, match="bad replica name"):
            add_replica(pair.primary, bad)
        with pytest.raises(ReplicaError, match="bad replica name"):
            remove_replica(pair.primary, bad)
    with pytest.raises(ReplicaError, match="exists already"):
        add_replica(pair.primary, "standby1")
    with pytest.raises(ReplicaError, match="already used"):
        add_replica(pair.primary, "other", port=pair.primary.port)
    with pytest.raises(ReplicaError, match="out of range"):
        add_replica(pair.primary, "other", port=70000)
    assert sorted(p.name for p in replicas_mod.replicas_dir(pair.primary).iterdir()) == before
    with pair.admin() as conn:
        assert conn.execute("select slot_name from pg_replication_slots order by 1").fetchall() == slots


@pytest.fixture
def lone_primary() -> Iterator[EmbeddedCluster]:
    """A running primary of its own that has never had a replica."""
    with _running_primary("pgkb-replica-lone-") as (primary, _):
        yield primary


def test_a_failed_first_add_leaves_nothing_behind(lone_primary, monkeypatch):
    """Whether add fails before the copy (a slot of that name exists) or after it (interrupted once
    pg_basebackup has written the directory and created the slot): no registry directory or lock file, no
    data directory, no slot, no socket directory; a later add works."""
    primary = lone_primary
    registry = replicas_mod.replicas_dir(primary)
    port = _free_port()
    with psycopg.connect(primary.url(), autocommit=True) as conn:
        conn.execute("select pg_create_physical_replication_slot('pgkb_probe1')")
        with pytest.raises(ReplicaError, match="exists already"):
            add_replica(primary, "probe1", port=port)
        assert not registry.exists()
        conn.execute("select pg_drop_replication_slot('pgkb_probe1')")

    real_backup = replicas_mod._base_backup

    def interrupted(primary, replica):
        real_backup(primary, replica)
        assert (replica.data_dir / "PG_VERSION").exists()
        raise KeyboardInterrupt

    monkeypatch.setattr(replicas_mod, "_base_backup", interrupted)
    with pytest.raises(KeyboardInterrupt):
        add_replica(primary, "probe1", port=port)
    assert not registry.exists() and not any(Path("/tmp").glob(f"pgkb-*-{port}"))
    with psycopg.connect(primary.url(), autocommit=True) as conn:
        assert conn.execute("select slot_name from pg_replication_slots").fetchall() == []

    monkeypatch.setattr(replicas_mod, "_base_backup", real_backup)
    added = add_replica(primary, "probe1", port=port)
    assert sorted(p.name for p in registry.iterdir()) == [".lock", "probe1", "probe1.json", "probe1.lock"]
    remove_replica(primary, added.name)
    assert not registry.exists()


def test_replicas_stop_and_start_with_the_primary(pair):
    pair.primary.stop()
    assert not pair.standby_cluster.status().running
    pair.primary.start()
    assert pair.standby_cluster.status().running
    pair.wait_replayed()


# --------------------------------------------------------------- read path on the session's test cluster


def test_read_path_works_in_read_only_transactions(db, connect_as, fake_embeddings):
    """The same read path in sessions whose transactions are read-only by default (on the primary): any
    write reachable from it (statistics, temp tables, sequences, identity rows) would fail here."""
    endpoint = fake_embeddings(bag_of_words)
    db.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
    db.execute("select kb.create_user('alice', 'alice'), kb.create_user('bob', 'bob')")
    db.execute("grant pgkb_service to svc")
    db.execute("select kb.create_knowledge_base('handbook', visibility => 'public')")
    for owner, kb, doc, text in (
        ("alice", "alice-notes", "falcon.md", "falcon launch code is amber"),
        ("bob", "bob-notes", "budget.md", "falcon budget is ninety"),
        (None, "handbook", "deploy.md", "rolling deploy of payments"),
    ):
        if owner:
            db.execute("select kb.create_knowledge_base(%s, owner => %s)", [kb, owner])
        db.execute(
            "select kb.replace_document(%s, %s, %s, %s::jsonb)",
            [kb, doc, doc, json.dumps([{"content": text, "embedding": bag_of_words([text])[0]}])],
        )
    info = db.info
    for role, acting, private in (("alice", None, "alice-notes"), ("svc", "bob", "bob-notes")):
        with psycopg.connect(
            host=info.host,
            port=info.port,
            user=role,
            dbname=info.dbname,
            autocommit=True,
            options="-c default_transaction_read_only=on",
        ) as conn:
            assert conn.execute("show transaction_read_only").fetchone()[0] == "on"
            with conn.transaction():
                if acting:
                    conn.execute("select set_config('pgkb.acting_user', %s, true)", [acting])
                assert_read_path(conn, expect_private=private)
                # the same session may write its own knowledge base, but not in a read-only transaction
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    conn.execute(
                        "select kb.replace_document(%s, 'x.md', 'x', '[{\"content\": \"x\"}]'::jsonb)", [private]
                    )
    assert len(endpoint.requests) >= 4
