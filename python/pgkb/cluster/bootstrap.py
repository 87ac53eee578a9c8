"""Making a cluster from nothing: the data and socket directories (owned by the server's OS user),
``initdb`` (UTF8, locale C.UTF-8, trust on the socket, TCP rejected), the major-version check of an
existing data directory, the managed ``pgkb.conf`` (port, socket, and ``shared_buffers`` sized to the
machine), and the database pgkb uses."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from pathlib import Path

from pgkb.cluster.errors import ClusterError
from pgkb.cluster.locate import ROOT_DEFAULT_DATA_DIR, ServerUser
from pgkb.cluster.process import ServerCommands

__all__ = [
    "LOCALE",
    "check_version",
    "ensure_database",
    "initdb",
    "is_initialized",
    "prepare_directories",
    "prepare_socket_dir",
    "shared_buffers",
    "write_config",
]

#: Cluster (and database) locale: the only UTF-8 locale guaranteed to exist on Debian/Ubuntu.
LOCALE = "C.UTF-8"

log = logging.getLogger(__name__)

_CONF_FILE = "pgkb.conf"
_CONF_INCLUDE_LINE = f"include_if_exists = '{_CONF_FILE}'"
_MAX_SOCKET_PATH = 107  # sizeof(sun_path) - 1 on Linux
# shared_buffers: an eighth of the memory the server may use, within these bounds (MB). PostgreSQL's 128 MB
# default holds neither the HNSW graph nor the posting blocks of 100k chunks (195 + 150 MB), and the legs of
# one search then evict each other's pages (docs/benchmarks.md, "Shared buffers")
_SHARED_BUFFERS_MIN_MB = 128
_SHARED_BUFFERS_MAX_MB = 4096
_SHARED_BUFFERS_ENV = "PGKB_SHARED_BUFFERS"


def _conf_quote(value: str) -> str:
    """Quote a string for postgresql.conf."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def is_initialized(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds a cluster (its ``PG_VERSION``)."""
    try:
        return (data_dir / "PG_VERSION").is_file()
    except PermissionError:
        raise ClusterError(f"cannot read the data directory {data_dir} (owned by another OS user?)") from None


def prepare_directories(commands: ServerCommands, data_dir: Path, socket_dir: Path, port: int) -> None:
    """Create the data and socket directories, owned by the server's OS user."""
    srv = commands.user
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        data_dir.mkdir(mode=0o700)
    st = data_dir.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise ClusterError(f"data directory {data_dir} is not a directory")
    if st.st_uid != srv.uid:
        if srv.switch and not is_initialized(data_dir) and not any(data_dir.iterdir()):
            os.chown(data_dir, srv.uid, srv.gid)
            os.chmod(data_dir, 0o700)
        else:
            raise ClusterError(
                f"data directory {data_dir} is owned by uid {st.st_uid}, but the server runs as "
                f"{srv.name} (uid {srv.uid})"
            )
    if srv.switch:
        try:
            commands.run(["test", "-w", str(data_dir)], as_server=True, what="access check")
        except ClusterError:
            raise ClusterError(
                f"the {srv.name} OS user cannot reach the data directory {data_dir}: every parent "
                f"directory must be traversable by it (as root, do not put it under /root; the default "
                f"is {ROOT_DEFAULT_DATA_DIR})"
            ) from None
    prepare_socket_dir(srv, socket_dir, port)


def prepare_socket_dir(srv: ServerUser, sock: Path, port: int) -> None:
    """Create the socket directory ``sock`` (mode 0700, owned by the server's OS user)."""
    if len(str(sock / f".s.PGSQL.{port}")) > _MAX_SOCKET_PATH:
        raise ClusterError(f"unix socket path too long (max {_MAX_SOCKET_PATH} bytes): {sock}")
    sock.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(sock, 0o700)
    st = os.lstat(sock)
    if not stat.S_ISDIR(st.st_mode):
        raise ClusterError(f"socket directory {sock} exists and is not a directory")
    if st.st_uid != srv.uid:
        if srv.switch and st.st_uid == 0:  # ours (root), e.g. just created: hand it over
            os.chown(sock, srv.uid, srv.gid)
        else:
            raise ClusterError(f"socket directory {sock} belongs to another user (uid {st.st_uid})")
    os.chmod(sock, 0o700)


def initdb(commands: ServerCommands, data_dir: Path) -> None:
    """``initdb`` a new cluster in ``data_dir``: superuser = the server's OS user, UTF8, :data:`LOCALE`."""
    commands.run(
        [
            commands.tool("initdb"),
            "-D",
            str(data_dir),
            f"--username={commands.user.name}",
            "--encoding=UTF8",
            f"--locale={LOCALE}",
            "--auth-local=trust",
            "--auth-host=reject",
        ],
        as_server=True,
        what="initdb",
        timeout=600,
    )


def check_version(commands: ServerCommands, data_dir: Path) -> None:
    """Fail clearly if the data directory belongs to another PostgreSQL major version."""
    try:
        data_version = (data_dir / "PG_VERSION").read_text().strip()
    except OSError as exc:
        raise ClusterError(f"cannot read {data_dir / 'PG_VERSION'}: {exc}") from exc
    out = commands.run([commands.tool("postgres"), "--version"], what="postgres --version").stdout
    match = re.search(r"\)\s*(\d+)", out)
    if match and match.group(1) != data_version:
        raise ClusterError(
            f"the cluster in {data_dir} was created by PostgreSQL {data_version}, but the server "
            f"binaries in {commands.bindir} are version {match.group(1)}: set PGKB_PG_BINDIR to version "
            f"{data_version}'s bin directory, or use another PGKB_DATA_DIR"
        )


def _cgroup_limits_mb() -> list[int]:
    """The memory limits, in MB, of this process's cgroup and its ancestors (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), read where /proc/self/cgroup says the process is; none when unlimited or
    unreadable."""
    limits = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                root, name = Path("/sys/fs/cgroup"), "memory.max"  # v2, the unified hierarchy
            elif "memory" in controllers.split(","):
                root, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"  # v1
            else:
                continue
            group = root / path.lstrip("/")
            for directory in (group, *group.parents):
                if not directory.is_relative_to(root):
                    break
                with contextlib.suppress(OSError, ValueError):
                    limit = (directory / name).read_text().strip()
                    if limit.isdigit():
                        limits.append(int(limit) // (1024 * 1024))
    return limits


def _memory_mb() -> int | None:
    """The memory this machine lets the server use, in MB: MemTotal, or the lowest memory limit of this
    process's cgroups (a container's, a systemd unit's) when lower; None when /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            total = next(int(line.split()[1]) // 1024 for line in fh if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return min([total, *_cgroup_limits_mb()])


def _configured_shared_buffers_mb(conf_text: str) -> int | None:
    """The shared_buffers an operator set in postgresql.conf (its last active line, before pgkb's include),
    in MB, or None when there is none or it cannot be read as a size."""
    found = None
    for line in conf_text.split(_CONF_INCLUDE_LINE)[0].splitlines():
        match = re.fullmatch(r"\s*shared_buffers\s*=?\s*'?([0-9]+)\s*(kB|MB|GB)?'?\s*(#.*)?", line)
        if match:
            n, unit = int(match.group(1)), match.group(2)
            found = {"kB": n // 1024, "MB": n, "GB": n * 1024}[unit] if unit else n * 8 // 1024
    return found


def shared_buffers(env: dict[str, str] | None = None, conf_text: str = "") -> str | None:
    """The embedded cluster's shared_buffers: PGKB_SHARED_BUFFERS (a whole number of MB or GB, e.g. 512MB,
    2GB, at most half the memory the server may use); else None when ``conf_text`` (postgresql.conf) sets
    more than PostgreSQL's 128 MB (an operator's choice, kept); else an eighth of that memory
    (:func:`_memory_mb`) between 128 MB and 4 GB.

    Raises:
        ClusterError: PGKB_SHARED_BUFFERS is not such a size, is below 128MB or above half the memory.
    """
    value = (os.environ if env is None else env).get(_SHARED_BUFFERS_ENV, "").strip()
    memory = _memory_mb()
    # PGKB_SHARED_BUFFERS wins over postgresql.conf
    if value:
        match = re.fullmatch(r"([1-9][0-9]{0,6}) ?(MB|GB)", value, flags=re.IGNORECASE | re.ASCII)
        mb = int(match.group(1)) * (1024 if match.group(2).upper() == "GB" else 1) if match else 0
        if mb < _SHARED_BUFFERS_MIN_MB:
            raise ClusterError(
                f"{_SHARED_BUFFERS_ENV} must be a size of at least {_SHARED_BUFFERS_MIN_MB}MB written as "
                f"<n>MB or <n>GB (e.g. 512MB, 2GB), got {value!r}"
            )
        if memory is not None and mb > memory // 2:
            raise ClusterError(
                f"{_SHARED_BUFFERS_ENV} is {value}: more than half of the {memory}MB of memory here "
                "(the server would not start, or be killed when its buffers fill)"
            )
        return f"{mb}MB"
    configured = _configured_shared_buffers_mb(conf_text)
    if configured is not None and configured > _SHARED_BUFFERS_MIN_MB:
        return None
    mb = _SHARED_BUFFERS_MIN_MB if memory is None else memory // 8
    return f"{min(max(mb, _SHARED_BUFFERS_MIN_MB), _SHARED_BUFFERS_MAX_MB)}MB"


def write_config(srv: ServerUser, data_dir: Path, port: int, socket_dir: Path) -> None:
    """(Re)write pgkb.conf with the current port, socket directory and :func:`shared_buffers` (none when an
    operator set more than 128 MB in postgresql.conf); include it from postgresql.conf (ALTER SYSTEM still
    overrides it: postgresql.auto.conf is read last)."""
    conf = data_dir / "postgresql.conf"
    text = conf.read_text()
    buffers = shared_buffers(conf_text=text)
    if _CONF_INCLUDE_LINE not in text.splitlines():
        with conf.open("a") as fh:
            fh.write(f"\n# Settings managed by pgkb (rewritten at every start).\n{_CONF_INCLUDE_LINE}\n")
    managed = data_dir / _CONF_FILE
    tmp = managed.with_name(managed.name + ".tmp")
    tmp.write_text(
        "# Managed by pgkb (pgkb.cluster): rewritten at every start, do not edit.\n"
        "listen_addresses = ''\n"
        f"port = {port}\n"
        f"unix_socket_directories = {_conf_quote(str(socket_dir))}\n"
        + (f"shared_buffers = {_conf_quote(buffers)}\n" if buffers else "")
    )
    if srv.switch:
        os.chown(tmp, srv.uid, srv.gid)
    os.chmod(tmp, 0o600)
    os.replace(tmp, managed)


def ensure_database(commands: ServerCommands, socket_dir: Path, port: int, dbname: str) -> bool:
    """Create ``dbname`` (template0, UTF8, :data:`LOCALE`) unless it exists; True if it was created."""
    conn = ["-h", str(socket_dir), "-p", str(port), "-U", commands.user.name]
    psql = [
        commands.tool("psql"),
        "-X",
        "-q",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        *conn,
        "-d",
        "postgres",
        "-v",
        f"dbname={dbname}",
    ]
    query = "SELECT 1 FROM pg_database WHERE datname = :'dbname';\n"

    def exists() -> bool:
        return commands.run(psql, input=query, what="psql").stdout.strip() == "1"

    if exists():
        return False
    log.info("creating database %s", dbname)
    try:
        commands.run(
            [commands.tool("createdb"), *conn, "-T", "template0", "-E", "UTF8", f"--locale={LOCALE}", "--", dbname],
            what="createdb",
        )
    except ClusterError:
        if not exists():  # lost a race with someone else creating it?
            raise
    return True
