"""Read replicas of the embedded cluster: hot standbys fed by PostgreSQL streaming replication.

``pgkb db replica add`` copies the running embedded cluster (the *primary*) with ``pg_basebackup``
through a physical replication slot, so the primary keeps every WAL segment a replica still needs, and
starts the copy as a hot standby (``standby.signal``, ``primary_conninfo``, ``primary_slot_name``): it
answers read-only queries -- every pgkb read, see docs/operations.md, "Read replicas" -- and replays the primary's
writes within milliseconds. Like the primary, a replica listens on a unix socket only
(``/tmp/pgkb-<uid>-<port>``) and, when pgkb runs as root, runs as the ``postgres`` OS user.

Layout, next to the primary's data directory ``DATA``::

    DATA.replicas/NAME/        the replica's data directory (an EmbeddedCluster of its own)
    DATA.replicas/NAME.json    its port and replication slot
    DATA.replicas/NAME.lock    its start/stop lock (EmbeddedCluster's)
    DATA.replicas/.lock        serialises add / remove (the directory goes with the last replica)

Replication connects as ``pgkb_replicator``: a login role with the REPLICATION attribute and nothing
else (no superuser, no membership), which the primary's ``pg_hba.conf`` lets open replication
connections only (a ``reject`` line for every database comes first). Importing this module registers
lifecycle hooks (pgkb.cluster.AFTER_START / AFTER_STOP): replicas start after their primary starts and
stop when it stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pwd
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from pgkb import cluster as _cluster
from pgkb.cluster import ClusterError, EmbeddedCluster
from pgkb.rows import one
from pgkb.service_role import ensure_service_role

__all__ = [
    "REPLICATION_ROLE",
    "Replica",
    "ReplicaError",
    "ReplicaState",
    "add_replica",
    "read_url",
    "remove_replica",
    "replica_states",
    "replicas",
    "replicas_dir",
    "start_replicas",
    "stop_replicas",
]

#: The login role replicas stream as: REPLICATION and nothing more.
REPLICATION_ROLE = "pgkb_replicator"
#: Replica names: they name a directory and (prefixed with ``pgkb_``) a replication slot.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")  # fullmatch: "$" would let a trailing newline through
_HBA_MARK = f"# pgkb: {REPLICATION_ROLE} may open replication connections only (managed by pgkb.replica)"
_HBA_LINE = f"local   all             {REPLICATION_ROLE}                         reject"
_SLOT_RELEASE_SECONDS = 30.0  # a stopped standby's walsender lets go of the slot within this
_BASEBACKUP_TIMEOUT = 6 * 3600.0


class ReplicaError(ClusterError):
    """A replica cannot be added, found, started or removed; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Replica:
    """A registered read replica of the embedded cluster."""

    name: str
    port: int
    slot: str
    data_dir: Path

    def cluster(self, primary: EmbeddedCluster) -> EmbeddedCluster:
        """The replica as an EmbeddedCluster (start, stop, status, url), serving ``primary``'s database."""
        return EmbeddedCluster(self.data_dir, self.port, primary.dbname, bindir=primary.bindir)


@dataclasses.dataclass(frozen=True)
class ReplicaState:
    """What ``pgkb db replica list`` shows for one replica.

    ``state``: ``stopped``; the walsender's state as the primary reports it (``streaming``, ``catchup``,
    ``startup``); ``disconnected`` (running, not streaming); ``primary down``. ``lag_bytes``: WAL the
    replica has not replayed yet -- against the primary's current position when the primary is up (for a
    stopped replica: the WAL its slot holds back), else what it received but has not replayed.
    ``lag_seconds``: the primary's ``replay_lag`` (0 when nothing is left to replay; None when unknown).
    """

    replica: Replica
    running: bool
    state: str
    lag_bytes: int | None
    lag_seconds: float | None
    url: str


# --------------------------------------------------------------------------------------------------
# The registry


def replicas_dir(primary: EmbeddedCluster) -> Path:
    """Where ``primary``'s replicas live: ``<its data dir>.replicas``."""
    return primary.data_dir.with_name(primary.data_dir.name + ".replicas")


def replicas(primary: EmbeddedCluster) -> list[Replica]:
    """The registered replicas of ``primary``, by name (none when it never had one)."""
    root = replicas_dir(primary)
    found = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for meta in sorted(root.glob("*.json")):
            try:
                data = json.loads(meta.read_text())
                found.append(Replica(data["name"], int(data["port"]), data["slot"], root / data["name"]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ReplicaError(f"unreadable replica record {meta}: {exc}") from None
    return found


def _find(primary: EmbeddedCluster, name: str) -> Replica:
    for replica in replicas(primary):
        if replica.name == name:
            return replica
    known = ", ".join(r.name for r in replicas(primary)) or "none"
    raise ReplicaError(f"no replica named {name!r} (replicas: {known})")


@contextlib.contextmanager
def _registry_lock(primary: EmbeddedCluster) -> Iterator[None]:
    """Serialise add/remove of ``primary``'s replicas (between processes too) with ``.lock`` in the registry
    directory, both made for the purpose. Released with no replica registered, the directory is removed again,
    lock file and all, so a failed first add leaves nothing behind (a process that locked the removed file
    sees that it is gone and locks the new one)."""
    root = replicas_dir(primary)
    lock = root / ".lock"
    while True:
        root.mkdir(mode=0o755, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # the directory went between mkdir and open
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = os.fstat(fd)
        with contextlib.suppress(FileNotFoundError):
            current = os.stat(lock)
            if (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                break
        os.close(fd)
    try:
        yield
    finally:
        try:
            if [p.name for p in root.iterdir()] == [".lock"]:
                lock.unlink()
                root.rmdir()
        finally:
            os.close(fd)


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ReplicaError(
            f"bad replica name {name!r}: use 1-40 lower-case letters, digits and _, starting with a letter"
        )


def _next_name(taken: set[str]) -> str:
    n = 1
    while f"replica{n}" in taken:
        n += 1
    return f"replica{n}"


def _port_in_use(port: int, primary: EmbeddedCluster) -> bool:
    """The socket directory a pgkb cluster on this port would use exists (another cluster has it)."""
    return EmbeddedCluster(primary.data_dir, port, primary.dbname, bindir=primary.bindir).socket_dir.exists()


def _choose_port(primary: EmbeddedCluster, registered: list[Replica], port: int | None) -> int:
    taken = {primary.port, primary.status().port} | {r.port for r in registered}
    if port is not None:
        if not 1 <= port <= 65535:
            raise ReplicaError(f"port out of range: {port}")
        if port in taken:
            raise ReplicaError(f"port {port} is already used by the primary or another replica")
        if _port_in_use(port, primary):
            raise ReplicaError(f"port {port} is in use (a socket directory for it exists): choose another --port")
        return port
    candidate = primary.port + 1
    while candidate in taken or _port_in_use(candidate, primary):
        candidate += 1
        if candidate > 65535:
            raise ReplicaError("no free port above the primary's: pass --port")
    return candidate


# --------------------------------------------------------------------------------------------------
# Adding


def _admin(primary: EmbeddedCluster) -> psycopg.Connection:
    """The bootstrap superuser's connection to the primary's database (autocommit)."""
    return psycopg.connect(primary.url(), autocommit=True, connect_timeout=10)


def _check_primary(conn: psycopg.Connection) -> None:
    """Fail clearly when the primary's settings cannot feed one more replica."""
    wal_level, senders, slots = one(
        conn.execute(
            "select current_setting('wal_level'), current_setting('max_wal_senders')::int,"
            " current_setting('max_replication_slots')::int"
        )
    )
    if one(conn.execute("select pg_is_in_recovery()"))[0]:
        raise ReplicaError("the embedded cluster is itself a standby: replicas are made from the primary")
    if wal_level not in ("replica", "logical"):
        raise ReplicaError(
            f"wal_level is {wal_level!r} on the primary; streaming replication needs 'replica' (the default): "
            "remove the override and restart the database"
        )
    used_senders = one(conn.execute("select count(*) from pg_stat_replication"))[0]
    used_slots = one(conn.execute("select count(*) from pg_replication_slots"))[0]
    # pg_basebackup -X stream takes two walsenders while it copies
    if senders < used_senders + 2:
        raise ReplicaError(f"max_wal_senders is {senders} with {used_senders} in use: raise it and restart")
    if slots <= used_slots:
        raise ReplicaError(f"max_replication_slots is {slots}, all used: raise it and restart")


def _ensure_replication_role(conn: psycopg.Connection) -> None:
    """pgkb_replicator: LOGIN REPLICATION, no other attribute, no membership, no password (the primary's
    socket directory is reachable by its OS user alone; pg_hba lets the role do replication only)."""
    row = conn.execute(
        "select rolsuper or rolcreaterole or rolcreatedb or rolbypassrls, rolreplication, rolcanlogin"
        " from pg_roles where rolname = %s",
        [REPLICATION_ROLE],
    ).fetchone()
    if row is None:
        conn.execute(f"create role {REPLICATION_ROLE} login replication")
    elif row[0]:
        raise ReplicaError(
            f"the role {REPLICATION_ROLE} exists with more privileges than replication needs: "
            f"ALTER ROLE {REPLICATION_ROLE} NOSUPERUSER NOCREATEROLE NOCREATEDB NOBYPASSRLS, then try again"
        )
    elif not (row[1] and row[2]):
        conn.execute(f"alter role {REPLICATION_ROLE} login replication")


def _ensure_hba(conn: psycopg.Connection, primary: EmbeddedCluster) -> None:
    """Put ``local all pgkb_replicator reject`` before every other pg_hba.conf line (once) and reload, so
    the replication role can open replication connections (``local replication all trust``) only."""
    hba = Path(one(conn.execute("select current_setting('hba_file')"))[0])
    text = hba.read_text()
    if _HBA_MARK in text.splitlines():
        return
    st = hba.stat()
    tmp = hba.with_name(hba.name + ".pgkb-tmp")
    tmp.write_text(f"{_HBA_MARK}\n{_HBA_LINE}\n\n{text}")
    if os.geteuid() == 0:
        os.chown(tmp, st.st_uid, st.st_gid)
    os.chmod(tmp, st.st_mode & 0o777)
    os.replace(tmp, hba)
    conn.execute("select pg_reload_conf()")
    errors = conn.execute("select line_number, error from pg_hba_file_rules where error is not null").fetchall()
    if errors:  # cannot happen with the line above; never leave a broken file behind silently
        raise ReplicaError(f"{hba} has errors after pgkb's edit: {errors}")


def _ensure_service_login(conn: psycopg.Connection) -> None:
    """The MCP server's login role (pgkb_mcp) must exist before the copy: a standby cannot create it."""
    if conn.execute("select 1 from pg_roles where rolname = 'pgkb_service'").fetchone():
        ensure_service_role(conn)


def _base_backup(primary: EmbeddedCluster, replica: Replica) -> None:
    """pg_basebackup into the replica's (new, empty) data directory through a new slot, with -R."""
    replica.data_dir.mkdir(mode=0o700)
    if os.geteuid() == 0:
        pw = pwd.getpwnam(primary.server_user)
        os.chown(replica.data_dir, pw.pw_uid, pw.pw_gid)
    st = primary.status()
    conninfo = make_conninfo(
        host=str(st.socket_dir), port=str(st.port), user=REPLICATION_ROLE, application_name=replica.name
    )
    primary.run_as_server(
        "pg_basebackup",
        "--dbname",
        conninfo,
        "--pgdata",
        str(replica.data_dir),
        "--wal-method=stream",
        "--checkpoint=fast",
        "--create-slot",
        "--slot",
        replica.slot,
        "--write-recovery-conf",
        "--no-password",
        timeout=_BASEBACKUP_TIMEOUT,
    )
    log_file = replica.cluster(primary).log_file
    if log_file.exists():  # the primary's log came along: the replica starts its own
        log_file.write_text("")


def add_replica(primary: EmbeddedCluster, name: str | None = None, port: int | None = None) -> Replica:
    """Make a hot standby of ``primary`` (started if needed) and start it; returns it.

    ``name`` defaults to the first free ``replicaN``, ``port`` to the first free one above the primary's.
    Raises ReplicaError (bad name or port, settings that cannot feed another replica) or ClusterError
    (pg_basebackup or the start failed); either way nothing is left behind: no directory, no slot.
    """
    if name is not None:
        _check_name(name)
    with _registry_lock(primary):
        registered = replicas(primary)
        taken = {r.name for r in registered}
        name = name or _next_name(taken)
        if name in taken:
            raise ReplicaError(f"a replica named {name!r} exists already")
        root = replicas_dir(primary)
        if (root / name).exists():
            raise ReplicaError(f"{root / name} exists but is no registered replica: remove it first")
        port = _choose_port(primary, registered, port)
        replica = Replica(name, port, f"pgkb_{name}", root / name)
        primary.ensure_running()
        with _admin(primary) as conn:
            _check_primary(conn)
            if conn.execute("select 1 from pg_replication_slots where slot_name = %s", [replica.slot]).fetchone():
                raise ReplicaError(
                    f"the replication slot {replica.slot} exists already: `pgkb db replica remove {name}` drops it"
                )
            _ensure_replication_role(conn)
            _ensure_hba(conn, primary)
            _ensure_service_login(conn)
        try:
            _base_backup(primary, replica)
            (root / f"{name}.json").write_text(
                json.dumps({"name": name, "port": port, "slot": replica.slot}, indent=1) + "\n"
            )
            replica.cluster(primary).start()
        except BaseException:
            _discard(primary, replica)
            raise
        return replica


# --------------------------------------------------------------------------------------------------
# Removing


def _drop_slot(primary: EmbeddedCluster, slot: str) -> bool:
    """Drop ``slot`` on the primary once its walsender let go of it; False if there was none."""
    deadline = time.monotonic() + _SLOT_RELEASE_SECONDS
    with _admin(primary) as conn:
        while True:
            row = conn.execute("select active from pg_replication_slots where slot_name = %s", [slot]).fetchone()
            if row is None:
                return False
            if not row[0]:
                try:
                    conn.execute("select pg_drop_replication_slot(%s)", [slot])
                    return True
                except psycopg.errors.ObjectInUse:
                    pass  # a walsender took it again in between
            if time.monotonic() > deadline:
                raise ReplicaError(
                    f"the replication slot {slot} is still in use after {_SLOT_RELEASE_SECONDS:g} s: is a standby "
                    "still streaming from it? (see pg_stat_replication)"
                )
            time.sleep(0.1)


def _discard(primary: EmbeddedCluster, replica: Replica) -> None:
    """Stop the replica, forget it, delete its data directory, then drop its slot on the primary (started
    for it if needed); each step only if there is something to undo."""
    if replica.port:  # 0: a leftover without a record (see remove_replica), not running
        rc = replica.cluster(primary)
        if (replica.data_dir / "PG_VERSION").exists():
            rc.stop()
        with contextlib.suppress(OSError):  # empty once the server is down; kept, it would hold the port
            rc.socket_dir.rmdir()
    root = replicas_dir(primary)
    (root / f"{replica.name}.json").unlink(missing_ok=True)
    shutil.rmtree(replica.data_dir, ignore_errors=True)
    if replica.data_dir.exists():
        raise ReplicaError(f"could not delete {replica.data_dir}")
    (root / f"{replica.name}.lock").unlink(missing_ok=True)
    # the record is gone before the primary is (re)started, so its start does not bring the replica up again
    primary.ensure_running()
    _drop_slot(primary, replica.slot)


def remove_replica(primary: EmbeddedCluster, name: str) -> Replica:
    """Stop replica ``name``, delete its data directory and drop its slot (the primary is started for it).

    Also finishes an earlier removal that stopped half-way (a directory or slot left without a record)."""
    _check_name(name)
    with _registry_lock(primary):
        try:
            replica = _find(primary, name)
        except ReplicaError:
            replica = Replica(name, 0, f"pgkb_{name}", replicas_dir(primary) / name)
            primary.ensure_running()
            with _admin(primary) as conn:
                has_slot = conn.execute(
                    "select 1 from pg_replication_slots where slot_name = %s", [replica.slot]
                ).fetchone()
            if not has_slot and not replica.data_dir.exists():
                raise
            if (replica.data_dir / "postmaster.pid").exists():
                raise ReplicaError(
                    f"{replica.data_dir} has no replica record but a server may be running there: stop it "
                    f"(pg_ctl -D {replica.data_dir} stop), then remove it again"
                ) from None
        _discard(primary, replica)
        return replica


# --------------------------------------------------------------------------------------------------
# State


def _lsn_row(url: str, sql: str) -> tuple | None:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql).fetchone()
    except psycopg.OperationalError:
        return None


def replica_states(primary: EmbeddedCluster) -> list[ReplicaState]:
    """State and replay lag of each replica (see ReplicaState); reads only, starts nothing."""
    registered = replicas(primary)
    if not registered:
        return []
    primary_rows: dict[str, tuple] = {}
    current_lsn = None
    if primary.status().running:
        try:
            with _admin(primary) as conn:
                current_lsn = one(conn.execute("select pg_current_wal_lsn()::text"))[0]
                for slot in conn.execute(
                    "select s.slot_name, r.state, pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,"
                    " extract(epoch from r.replay_lag)::float8"
                    " from pg_replication_slots as s left join pg_stat_replication as r on r.pid = s.active_pid"
                    " where s.slot_name = any(%s)",
                    [[r.slot for r in registered]],
                ):
                    primary_rows[slot[0]] = slot[1:]
        except psycopg.OperationalError:
            current_lsn = None
    states = []
    for replica in registered:
        rc = replica.cluster(primary)
        status = rc.status()
        state, lag_bytes, lag_seconds = "stopped", None, None
        walsender_state, retained, replay_lag = primary_rows.get(replica.slot, (None, None, None))
        if not status.running:
            lag_bytes = retained  # WAL the slot keeps for it
        elif current_lsn is not None:
            row = _lsn_row(
                status.url,
                f"select pg_wal_lsn_diff('{current_lsn}'::pg_lsn, pg_last_wal_replay_lsn())::bigint",
            )
            state = walsender_state or "disconnected"
            lag_bytes = max(int(row[0]), 0) if row and row[0] is not None else None
            lag_seconds = 0.0 if lag_bytes == 0 else replay_lag
        else:
            state = "primary down"
            row = _lsn_row(
                status.url, "select pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::bigint"
            )
            lag_bytes = max(int(row[0]), 0) if row and row[0] is not None else None
            lag_seconds = 0.0 if lag_bytes == 0 else None
        states.append(ReplicaState(replica, status.running, state, lag_bytes, lag_seconds, status.url))
    return states


def read_url(primary: EmbeddedCluster) -> str | None:
    """A PGKB_READ_DATABASE_URL for the embedded cluster: every replica, then the primary, with
    ``target_session_attrs=prefer-standby`` (a standby when one answers, else the primary); None without
    replicas. The user is the bootstrap superuser, as in ``pgkb db url`` (`pgkb mcp` logs in as pgkb_mcp)."""
    registered = replicas(primary)
    if not registered:
        return None
    clusters = [r.cluster(primary) for r in registered] + [primary]
    return make_conninfo(
        host=",".join(str(c.socket_dir) for c in clusters),
        port=",".join(str(c.port) for c in clusters),
        dbname=primary.dbname,
        user=primary.server_user,
        target_session_attrs="prefer-standby",
    )


# --------------------------------------------------------------------------------------------------
# Starting and stopping with the primary


def start_replicas(primary: EmbeddedCluster) -> list[str]:
    """Start every replica of ``primary`` that is not running; returns the problems (one line each)."""
    problems = []
    for replica in replicas(primary):
        try:
            replica.cluster(primary).ensure_running()
        except ClusterError as exc:
            problems.append(f"replica {replica.name} did not start: {exc}")
    return problems


def stop_replicas(primary: EmbeddedCluster) -> list[str]:
    """Stop every replica of ``primary``; returns the problems (one line each)."""
    problems = []
    for replica in replicas(primary):
        try:
            replica.cluster(primary).stop()
        except ClusterError as exc:
            problems.append(f"replica {replica.name} did not stop: {exc}")
    return problems


def _report(problems: list[str]) -> None:
    for line in problems:
        print(f"pgkb: {line}", file=sys.stderr)


def _after_start(cluster: EmbeddedCluster) -> None:
    if replicas_dir(cluster).is_dir():
        _report(start_replicas(cluster))


def _after_stop(cluster: EmbeddedCluster) -> None:
    if replicas_dir(cluster).is_dir():
        _report(stop_replicas(cluster))


if _after_start not in _cluster.AFTER_START:
    _cluster.AFTER_START.append(_after_start)
if _after_stop not in _cluster.AFTER_STOP:
    _cluster.AFTER_STOP.append(_after_stop)
