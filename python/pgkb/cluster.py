"""The embedded local PostgreSQL cluster pgkb uses when ``PGKB_DATABASE_URL`` is not set.

pgkb keeps a private PostgreSQL cluster of its own (``initdb`` + ``pg_ctl``), reachable only through a
unix socket, so that a knowledge base works out of the box on a machine with the PostgreSQL server
binaries installed (``make setup``) and nothing else configured.

Layout and defaults (each overridable through the environment):

* data directory -- ``PGKB_DATA_DIR``; default ``${XDG_DATA_HOME:-~/.local/share}/pgkb/cluster``, or
  ``/var/lib/pgkb/cluster`` when running as root (the ``postgres`` OS user cannot traverse ``/root``);
* port -- ``PGKB_PORT``; default 55432. The server listens on no TCP address at all
  (``listen_addresses = ''``): the port only names the unix socket file;
* socket directory -- ``/tmp/pgkb-<uid of the server's OS user>-<port>``, mode 0700, so only that
  user (and root) can connect;
* server binaries -- see :func:`find_pg_bindir` (``PGKB_PG_BINDIR`` overrides);
* cluster locale ``C.UTF-8``, encoding UTF8 (``pg_trgm`` needs a UTF-8 ``LC_CTYPE`` to build
  trigrams of non-ASCII text such as Chinese); local connections use ``trust`` authentication and TCP
  connections are rejected;
* the server log is ``<data dir>/server.log``; the settings pgkb manages live in
  ``<data dir>/pgkb.conf``, included from ``postgresql.conf`` and rewritten at every start.

PostgreSQL refuses to run as root. When pgkb runs as root, every server-side command (``initdb``,
``pg_ctl``) runs as the ``postgres`` OS user through ``runuser``, and the data and socket
directories are owned by that user. The cluster's bootstrap superuser is named after the OS user
that runs the server (``postgres`` as root, otherwise the current user), and it is the user in
:meth:`EmbeddedCluster.url`.

Concurrent :meth:`EmbeddedCluster.start` calls (from several processes) are serialised with an
``fcntl`` lock on ``<data dir>.lock``, so only one of them ever runs ``initdb`` or ``pg_ctl start``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

__all__ = [
    "AFTER_START",
    "AFTER_STOP",
    "DEFAULT_DBNAME",
    "DEFAULT_PORT",
    "ROOT_DEFAULT_DATA_DIR",
    "ClusterError",
    "ClusterStatus",
    "EmbeddedCluster",
    "default_data_dir",
    "embedded_cluster_from_env",
    "find_pg_bindir",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 55432
DEFAULT_DBNAME = "pgkb"
#: Default data directory when running as root (``/root`` is not traversable by ``postgres``).
ROOT_DEFAULT_DATA_DIR = Path("/var/lib/pgkb/cluster")
#: The OS user that runs the server when pgkb itself runs as root.
ROOT_SERVER_USER = "postgres"
#: Oldest PostgreSQL major version pgkb looks for under ``/usr/lib/postgresql``.
MIN_PG_MAJOR = 15
#: Cluster (and database) locale: the only UTF-8 locale guaranteed to exist on Debian/Ubuntu.
LOCALE = "C.UTF-8"

_DEBIAN_PG_ROOT = Path("/usr/lib/postgresql")
_SOCKET_ROOT = Path("/tmp")
_CONF_FILE = "pgkb.conf"
_CONF_INCLUDE_LINE = f"include_if_exists = '{_CONF_FILE}'"
_LOG_FILE = "server.log"
_START_TIMEOUT = 60  # seconds pg_ctl waits for the server to come up / go down
_LOCK_TIMEOUT = 300.0  # seconds to wait for another process's start()/stop()
_LOG_TAIL_LINES = 30
_MAX_SOCKET_PATH = 107  # sizeof(sun_path) - 1 on Linux
_READY_STATES = ("ready", "standby")
_SETUP_HINT = "PostgreSQL server binaries not found: run `make setup`"

#: Lifecycle hooks, called as ``hook(cluster)`` at the end of :meth:`EmbeddedCluster.start` (the server is
#: up) and of :meth:`EmbeddedCluster.stop` (it is down, or was not running). pgkb.replica adds its own so
#: that read replicas start and stop with their primary. A hook that raises is logged; the start or stop
#: still stands.
AFTER_START: list[Callable[[EmbeddedCluster], None]] = []
AFTER_STOP: list[Callable[[EmbeddedCluster], None]] = []


class ClusterError(RuntimeError):
    """The embedded cluster could not be located, initialised, started or stopped."""


@dataclasses.dataclass(frozen=True)
class ClusterStatus:
    """A snapshot of the embedded cluster's state.

    ``port``, ``socket_dir`` and ``url`` describe the running server when there is one (as recorded
    in its ``postmaster.pid``), otherwise the configured values.
    """

    initialized: bool
    running: bool
    pid: int | None
    port: int
    data_dir: Path
    socket_dir: Path
    url: str


@dataclasses.dataclass(frozen=True)
class _ServerUser:
    """The OS user that owns the data directory and runs the server."""

    name: str
    uid: int
    gid: int
    switch: bool  # True: we are root and must run server-side commands via runuser


@dataclasses.dataclass(frozen=True)
class _PidFile:
    """The interesting lines of ``postmaster.pid``."""

    pid: int
    port: int | None
    socket_dir: str | None
    state: str | None  # "starting", "ready", "stopping", "standby" (None: not written yet)


# --------------------------------------------------------------------------------------------------
# Locating binaries and defaults


def _has_server_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / exe, os.X_OK) for exe in ("postgres", "initdb", "pg_ctl"))


def find_pg_bindir() -> Path:
    """Return the directory holding the PostgreSQL server binaries (``postgres``, ``initdb``, ``pg_ctl``).

    Order: ``$PGKB_PG_BINDIR``; else the newest ``/usr/lib/postgresql/<N>/bin`` (N >= 15) that
    contains them; else ``pg_config --bindir``.

    Raises:
        ClusterError: no suitable directory was found.
    """
    env = os.environ.get("PGKB_PG_BINDIR")
    if env:
        bindir = Path(env).expanduser()
        if not _has_server_binaries(bindir):
            raise ClusterError(f"PGKB_PG_BINDIR={env}: no postgres, initdb and pg_ctl executables there")
        return bindir

    candidates: list[tuple[int, Path]] = []
    with contextlib.suppress(OSError):
        for version_dir in _DEBIAN_PG_ROOT.iterdir():
            if version_dir.name.isdigit() and int(version_dir.name) >= MIN_PG_MAJOR:
                bindir = version_dir / "bin"
                if _has_server_binaries(bindir):
                    candidates.append((int(version_dir.name), bindir))
    if candidates:
        return max(candidates)[1]

    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], check=True, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and _has_server_binaries(Path(out)):
            return Path(out)
    raise ClusterError(_SETUP_HINT)


def default_data_dir() -> Path:
    """The default data directory (ignoring ``PGKB_DATA_DIR``), see the module docstring."""
    if os.geteuid() == 0:
        return ROOT_DEFAULT_DATA_DIR
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "pgkb" / "cluster"


def _server_user() -> _ServerUser:
    euid = os.geteuid()
    if euid == 0:
        try:
            pw = pwd.getpwnam(ROOT_SERVER_USER)
        except KeyError:
            raise ClusterError(
                f"PostgreSQL refuses to run as root, and there is no {ROOT_SERVER_USER!r} OS user to run "
                "the embedded cluster as: install the PostgreSQL server (`make setup`), or run pgkb as a "
                "normal user, or set PGKB_DATABASE_URL"
            ) from None
        return _ServerUser(pw.pw_name, pw.pw_uid, pw.pw_gid, switch=True)
    try:
        pw = pwd.getpwuid(euid)
    except KeyError:
        raise ClusterError(f"the current user (uid {euid}) has no passwd entry; initdb needs one") from None
    return _ServerUser(pw.pw_name, pw.pw_uid, pw.pw_gid, switch=False)


def _parse_port(value: str | int, source: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise ClusterError(f"{source}: not a port number: {value!r}") from None
    if not 1 <= port <= 65535:
        raise ClusterError(f"{source}: port out of range: {port}")
    return port


# --------------------------------------------------------------------------------------------------
# Small helpers


def _child_env() -> dict[str, str]:
    """The environment for child processes: ours minus libpq/server ``PG*`` variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _conf_quote(value: str) -> str:
    """Quote a string for postgresql.conf."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _make_url(user: str, dbname: str, socket_dir: Path, port: int) -> str:
    return (
        f"postgresql://{quote(user, safe='')}@/{quote(dbname, safe='')}"
        f"?host={quote(str(socket_dir), safe='/')}&port={port}"
    )


def _postmaster_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process that looks like a postmaster (guards against stale pid files)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user (e.g. postgres while we are a normal user)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (or hidden): trust kill()
    # After a reboot the pid of a stale postmaster.pid may belong to an unrelated process.
    return b"postgres" in cmdline or b"postmaster" in cmdline


def _runuser() -> str:
    found = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not found:
        raise ClusterError("running as root needs `runuser` (util-linux) to start PostgreSQL as postgres")
    return found


# --------------------------------------------------------------------------------------------------
# The cluster


class EmbeddedCluster:
    """pgkb's private PostgreSQL cluster: a data directory plus a server reachable on a unix socket.

    Args:
        data_dir: data directory; default :func:`default_data_dir`.
        port: port number (it only names the unix socket; no TCP listener is opened).
        dbname: database created on start and named in :meth:`url`.
        bindir: directory of the server binaries; default :func:`find_pg_bindir` (resolved lazily).
        socket_dir: unix socket directory; default ``/tmp/pgkb-<server uid>-<port>``.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        port: int = DEFAULT_PORT,
        dbname: str = DEFAULT_DBNAME,
        *,
        bindir: str | os.PathLike[str] | None = None,
        socket_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.data_dir: Path = Path(os.path.abspath(Path(data_dir).expanduser())) if data_dir else default_data_dir()
        self.port: int = _parse_port(port, "port")
        if not dbname:
            raise ClusterError("dbname must not be empty")
        self.dbname: str = dbname
        self._bindir = Path(bindir) if bindir else None
        self._socket_dir = Path(os.path.abspath(socket_dir)) if socket_dir else None
        self._server: _ServerUser | None = None

    def __repr__(self) -> str:
        return f"EmbeddedCluster(data_dir={str(self.data_dir)!r}, port={self.port}, dbname={self.dbname!r})"

    # ---- derived properties ---------------------------------------------------------------------

    @property
    def bindir(self) -> Path:
        """Directory of the PostgreSQL server binaries."""
        if self._bindir is None:
            self._bindir = find_pg_bindir()
        return self._bindir

    @property
    def server_user(self) -> str:
        """OS user that runs the server; also the bootstrap superuser, the user in :meth:`url`."""
        return self._srv.name

    @property
    def socket_dir(self) -> Path:
        """Configured unix socket directory."""
        if self._socket_dir is None:
            self._socket_dir = _SOCKET_ROOT / f"pgkb-{self._srv.uid}-{self.port}"
        return self._socket_dir

    @property
    def log_file(self) -> Path:
        """The server log (``pg_ctl -l``)."""
        return self.data_dir / _LOG_FILE

    @property
    def lock_file(self) -> Path:
        """The lock file serialising start/stop, next to the data directory."""
        return self.data_dir.with_name(self.data_dir.name + ".lock")

    @property
    def _srv(self) -> _ServerUser:
        if self._server is None:
            self._server = _server_user()
        return self._server

    # ---- public API -----------------------------------------------------------------------------

    def status(self) -> ClusterStatus:
        """Report whether the cluster is initialised and running (cheap: reads ``postmaster.pid``)."""
        pidfile = self._live_pidfile()
        port, socket_dir = self.port, self.socket_dir
        if pidfile is not None:
            port = pidfile.port or port
            socket_dir = Path(pidfile.socket_dir) if pidfile.socket_dir else socket_dir
        return ClusterStatus(
            initialized=self._initialized(),
            running=pidfile is not None,
            pid=pidfile.pid if pidfile else None,
            port=port,
            data_dir=self.data_dir,
            socket_dir=socket_dir,
            url=_make_url(self.server_user, self.dbname, socket_dir, port),
        )

    def url(self) -> str:
        """A libpq URL for the database, e.g. ``postgresql://postgres@/pgkb?host=/tmp/pgkb-101-55432&port=55432``.

        Points at the running server if there is one, else at where :meth:`start` will put it.
        """
        return self.status().url

    def ensure_running(self) -> ClusterStatus:
        """Start the cluster unless it is already up and ready; idempotent.

        When the server is running this only reads ``postmaster.pid`` and checks the pid.
        """
        pidfile = self._live_pidfile()
        if pidfile is not None and pidfile.state in _READY_STATES:
            return self.status()
        return self.start()

    def start(self) -> ClusterStatus:
        """Initialise the cluster if needed, start the server and create the database if missing.

        Idempotent: when the server is already running it only makes sure the database exists.

        Raises:
            ClusterError: with the relevant command output and the tail of the server log.
        """
        with self._lock():
            if not self._wait_until_ready_or_down():
                self._prepare_directories()
                if self._initialized():
                    self._check_version()
                else:
                    self._initdb()
                self._write_config()
                self._pg_ctl_start()
            self._ensure_database()
            return self._after(AFTER_START)

    def stop(self) -> ClusterStatus:
        """Stop the server (``pg_ctl stop -m fast``); no error if it is not running."""
        with self._lock():
            if self._live_pidfile() is None:
                return self._after(AFTER_STOP)
            log.info("stopping PostgreSQL cluster in %s", self.data_dir)
            try:
                self._run(
                    [
                        self._tool("pg_ctl"),
                        "-D",
                        str(self.data_dir),
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        str(_START_TIMEOUT),
                        "stop",
                    ],
                    as_server=True,
                    what="pg_ctl stop",
                )
            except ClusterError as exc:
                if self._live_pidfile() is not None:
                    raise ClusterError(f"{exc}{self._log_tail()}") from exc
            return self._after(AFTER_STOP)

    def run_as_server(self, tool: str, *args: str, timeout: float = _START_TIMEOUT + 60) -> str:
        """Run one of the PostgreSQL programs (``pg_basebackup``, ``pg_ctl``, …) with ``args`` as the
        server's OS user, from ``/`` and without ``PG*`` variables; returns its stdout.

        Raises:
            ClusterError: the program is missing, failed (its output is in the message) or timed out.
        """
        return self._run([self._tool(tool), *args], as_server=True, what=tool, timeout=timeout).stdout

    def _after(self, hooks: list[Callable[[EmbeddedCluster], None]]) -> ClusterStatus:
        """Run the lifecycle ``hooks`` (see AFTER_START), then return the status."""
        for hook in list(hooks):
            try:
                hook(self)
            except Exception:  # a hook's failure must not undo or fail the start/stop itself
                log.warning("%s: lifecycle hook %r failed", self, hook, exc_info=True)
        return self.status()

    # ---- state ----------------------------------------------------------------------------------

    def _initialized(self) -> bool:
        try:
            return (self.data_dir / "PG_VERSION").is_file()
        except PermissionError:
            raise ClusterError(f"cannot read the data directory {self.data_dir} (owned by another OS user?)") from None

    def _read_pidfile(self) -> _PidFile | None:
        try:
            lines = (self.data_dir / "postmaster.pid").read_text(errors="replace").splitlines()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError:
            raise ClusterError(f"cannot read the data directory {self.data_dir} (owned by another OS user?)") from None
        # Lines: 1 pid, 2 data dir, 3 start time, 4 port, 5 socket dir, 6 listen addr, 7 shmem, 8 status.
        fields = [line.strip() for line in lines] + [""] * 8
        try:
            pid = int(fields[0])
        except ValueError:
            return None  # being written right now, or garbage
        port = int(fields[3]) if fields[3].isdigit() else None
        return _PidFile(pid=pid, port=port, socket_dir=fields[4] or None, state=fields[7] or None)

    def _live_pidfile(self) -> _PidFile | None:
        """The pid file of a live postmaster, or None if the server is not running."""
        pidfile = self._read_pidfile()
        if pidfile is None or not _postmaster_alive(pidfile.pid):
            return None
        return pidfile

    def _wait_until_ready_or_down(self) -> bool:
        """Wait while a server is starting up or shutting down: True if one is ready, False if none runs."""
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            pidfile = self._live_pidfile()
            if pidfile is None:
                return False
            if pidfile.state in _READY_STATES:
                return True
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"PostgreSQL (pid {pidfile.pid}) in {self.data_dir} has been "
                    f"{pidfile.state or 'starting'} for {_START_TIMEOUT}s{self._log_tail()}"
                )
            time.sleep(0.1)

    # ---- commands -------------------------------------------------------------------------------

    def _tool(self, name: str) -> str:
        path = self.bindir / name
        if os.access(path, os.X_OK):
            return str(path)
        found = shutil.which(name)
        if found is None:
            raise ClusterError(f"{name} not found in {self.bindir} or on PATH: run `make setup`")
        return found

    def _run(
        self,
        argv: Sequence[str],
        *,
        what: str,
        as_server: bool = False,
        input: str | None = None,
        timeout: float = _START_TIMEOUT + 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (as the server's OS user if ``as_server``), raising ClusterError on failure."""
        cmd = list(argv)
        if as_server and self._srv.switch:
            cmd = [_runuser(), "-u", self._srv.name, "--", *cmd]
        try:
            return subprocess.run(
                cmd,
                check=True,
                capture_output=True,
                text=True,
                input=input,
                stdin=subprocess.DEVNULL if input is None else None,
                cwd="/",  # the server user may not be allowed into our working directory
                env=_child_env(),
                timeout=timeout,
            )
        except FileNotFoundError as exc:
            raise ClusterError(f"{what}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{what}: timed out after {timeout:.0f}s: {' '.join(cmd)}") from exc
        except subprocess.CalledProcessError as exc:
            output = "\n".join(s.strip() for s in (exc.stdout, exc.stderr) if s and s.strip())
            raise ClusterError(
                f"{what} failed (exit status {exc.returncode}): {' '.join(cmd)}" + (f"\n{output}" if output else "")
            ) from exc

    def _log_tail(self) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        except OSError:
            return ""
        if not lines:
            return ""
        return f"\n--- last lines of {self.log_file} ---\n" + "\n".join(lines)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Hold an exclusive fcntl lock on :attr:`lock_file` (created, with its parents, if needed)."""
        path = self.lock_file
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # O_CLOEXEC: the postmaster we spawn must not inherit (and so keep holding) the lock.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ClusterError(f"cannot create the lock file {path}: {exc}") from exc
        try:
            deadline = time.monotonic() + _LOCK_TIMEOUT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ClusterError(
                            f"timed out waiting for {path}: another process is starting or stopping the cluster"
                        ) from None
                    time.sleep(0.1)
            yield
        finally:
            os.close(fd)  # also releases the lock

    # ---- start steps ----------------------------------------------------------------------------

    def _prepare_directories(self) -> None:
        """Create the data and socket directories, owned by the server's OS user."""
        srv = self._srv
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            self.data_dir.mkdir(mode=0o700)
        st = self.data_dir.stat()
        if not stat.S_ISDIR(st.st_mode):
            raise ClusterError(f"data directory {self.data_dir} is not a directory")
        if st.st_uid != srv.uid:
            if srv.switch and not self._initialized() and not any(self.data_dir.iterdir()):
                os.chown(self.data_dir, srv.uid, srv.gid)
                os.chmod(self.data_dir, 0o700)
            else:
                raise ClusterError(
                    f"data directory {self.data_dir} is owned by uid {st.st_uid}, but the server runs as "
                    f"{srv.name} (uid {srv.uid})"
                )
        if srv.switch:
            try:
                self._run(["test", "-w", str(self.data_dir)], as_server=True, what="access check")
            except ClusterError:
                raise ClusterError(
                    f"the {srv.name} OS user cannot reach the data directory {self.data_dir}: every parent "
                    f"directory must be traversable by it (as root, do not put it under /root; the default "
                    f"is {ROOT_DEFAULT_DATA_DIR})"
                ) from None
        self._prepare_socket_dir()

    def _prepare_socket_dir(self) -> None:
        srv = self._srv
        sock = self.socket_dir
        if len(str(sock / f".s.PGSQL.{self.port}")) > _MAX_SOCKET_PATH:
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

    def _initdb(self) -> None:
        log.info("initialising PostgreSQL cluster in %s", self.data_dir)
        self._run(
            [
                self._tool("initdb"),
                "-D",
                str(self.data_dir),
                f"--username={self._srv.name}",
                "--encoding=UTF8",
                f"--locale={LOCALE}",
                "--auth-local=trust",
                "--auth-host=reject",
            ],
            as_server=True,
            what="initdb",
            timeout=600,
        )

    def _check_version(self) -> None:
        """Fail clearly if the data directory belongs to another PostgreSQL major version."""
        try:
            data_version = (self.data_dir / "PG_VERSION").read_text().strip()
        except OSError as exc:
            raise ClusterError(f"cannot read {self.data_dir / 'PG_VERSION'}: {exc}") from exc
        out = self._run([self._tool("postgres"), "--version"], what="postgres --version").stdout
        match = re.search(r"\)\s*(\d+)", out)
        if match and match.group(1) != data_version:
            raise ClusterError(
                f"the cluster in {self.data_dir} was created by PostgreSQL {data_version}, but the server "
                f"binaries in {self.bindir} are version {match.group(1)}: set PGKB_PG_BINDIR to version "
                f"{data_version}'s bin directory, or use another PGKB_DATA_DIR"
            )

    def _write_config(self) -> None:
        """(Re)write pgkb.conf with the current port and socket directory; include it from postgresql.conf."""
        srv = self._srv
        conf = self.data_dir / "postgresql.conf"
        text = conf.read_text()
        if _CONF_INCLUDE_LINE not in text.splitlines():
            with conf.open("a") as fh:
                fh.write(f"\n# Settings managed by pgkb (rewritten at every start).\n{_CONF_INCLUDE_LINE}\n")
        managed = self.data_dir / _CONF_FILE
        tmp = managed.with_name(managed.name + ".tmp")
        tmp.write_text(
            "# Managed by pgkb (pgkb.cluster): rewritten at every start, do not edit.\n"
            "listen_addresses = ''\n"
            f"port = {self.port}\n"
            f"unix_socket_directories = {_conf_quote(str(self.socket_dir))}\n"
        )
        if srv.switch:
            os.chown(tmp, srv.uid, srv.gid)
        os.chmod(tmp, 0o600)
        os.replace(tmp, managed)

    def _pg_ctl_start(self) -> None:
        log.info("starting PostgreSQL cluster in %s (socket %s)", self.data_dir, self.socket_dir)
        try:
            self._run(
                [
                    self._tool("pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                    "-w",
                    "-t",
                    str(_START_TIMEOUT),
                    "start",
                ],
                as_server=True,
                what="pg_ctl start",
            )
        except ClusterError as exc:
            raise ClusterError(f"{exc}{self._log_tail()}") from exc

    def _ensure_database(self) -> None:
        """Create :attr:`dbname` (template0, UTF8, C.UTF-8) unless it exists."""
        st = self.status()
        conn = ["-h", str(st.socket_dir), "-p", str(st.port), "-U", self.server_user]
        psql = [
            self._tool("psql"),
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
            f"dbname={self.dbname}",
        ]
        query = "SELECT 1 FROM pg_database WHERE datname = :'dbname';\n"

        def exists() -> bool:
            return self._run(psql, input=query, what="psql").stdout.strip() == "1"

        if exists():
            return
        log.info("creating database %s", self.dbname)
        try:
            self._run(
                [
                    self._tool("createdb"),
                    *conn,
                    "-T",
                    "template0",
                    "-E",
                    "UTF8",
                    f"--locale={LOCALE}",
                    "--",
                    self.dbname,
                ],
                what="createdb",
            )
        except ClusterError:
            if not exists():  # lost a race with someone else creating it?
                raise


def embedded_cluster_from_env(dbname: str = DEFAULT_DBNAME) -> EmbeddedCluster:
    """The embedded cluster configured by ``PGKB_DATA_DIR``, ``PGKB_PORT`` (and ``PGKB_PG_BINDIR``)."""
    data_dir = os.environ.get("PGKB_DATA_DIR") or None
    port_env = os.environ.get("PGKB_PORT")
    port = _parse_port(port_env, "PGKB_PORT") if port_env else DEFAULT_PORT
    return EmbeddedCluster(data_dir, port, dbname)
