"""The embedded cluster itself: :class:`EmbeddedCluster` (status, url, start, stop, ensure_running),
which drives the steps of ``locate``, ``process`` and ``bootstrap`` under one start/stop lock, and
:func:`embedded_cluster_from_env`. See the package docstring for the layout and the defaults."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from pgkb.cluster.bootstrap import (
    check_version,
    ensure_database,
    initdb,
    is_initialized,
    prepare_directories,
    shared_buffers,
    write_config,
)
from pgkb.cluster.errors import ClusterError
from pgkb.cluster.locate import (
    DEFAULT_DBNAME,
    DEFAULT_PORT,
    ServerUser,
    default_data_dir,
    default_socket_dir,
    find_pg_bindir,
    make_url,
    parse_port,
    server_user,
)
from pgkb.cluster.process import (
    READY_STATES,
    START_TIMEOUT,
    PidFile,
    ServerCommands,
    file_lock,
    live_pidfile,
    pg_ctl_start,
    pg_ctl_stop,
    wait_until_ready_or_down,
)

__all__ = ["AFTER_START", "AFTER_STOP", "ClusterStatus", "EmbeddedCluster", "embedded_cluster_from_env"]

log = logging.getLogger(__name__)

_LOG_FILE = "server.log"

#: Lifecycle hooks, called as ``hook(cluster)`` at the end of :meth:`EmbeddedCluster.start` (the server is
#: up) and of :meth:`EmbeddedCluster.stop` (it is down, or was not running). pgkb.replica adds its own so
#: that read replicas start and stop with their primary. A hook that raises is logged; the start or stop
#: still stands.
AFTER_START: list[Callable[[EmbeddedCluster], None]] = []
AFTER_STOP: list[Callable[[EmbeddedCluster], None]] = []


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
        self.port: int = parse_port(port, "port")
        if not dbname:
            raise ClusterError("dbname must not be empty")
        self.dbname: str = dbname
        self._bindir = Path(bindir) if bindir else None
        self._socket_dir = Path(os.path.abspath(socket_dir)) if socket_dir else None
        self._server: ServerUser | None = None

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
            self._socket_dir = default_socket_dir(self._srv.uid, self.port)
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
    def _srv(self) -> ServerUser:
        if self._server is None:
            self._server = server_user()
        return self._server

    @property
    def _commands(self) -> ServerCommands:
        return ServerCommands(self.bindir, self._srv)

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
            url=make_url(self.server_user, self.dbname, socket_dir, port),
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
        if pidfile is not None and pidfile.state in READY_STATES:
            return self.status()
        return self.start()

    def start(self) -> ClusterStatus:
        """Initialise the cluster if needed, start the server and create the database if missing.

        Idempotent: when the server is already running it only makes sure the database exists.

        Raises:
            ClusterError: with the relevant command output and the tail of the server log.
        """
        with self._lock():
            if not wait_until_ready_or_down(self.data_dir, self.log_file):
                shared_buffers()  # a bad PGKB_SHARED_BUFFERS is refused before anything is made
                prepare_directories(self._commands, self.data_dir, self.socket_dir, self.port)
                if self._initialized():
                    check_version(self._commands, self.data_dir)
                else:
                    log.info("initialising PostgreSQL cluster in %s", self.data_dir)
                    initdb(self._commands, self.data_dir)
                write_config(self._srv, self.data_dir, self.port, self.socket_dir)
                log.info("starting PostgreSQL cluster in %s (socket %s)", self.data_dir, self.socket_dir)
                pg_ctl_start(self._commands, self.data_dir, self.log_file)
            st = self.status()
            ensure_database(self._commands, st.socket_dir, st.port, self.dbname)
            return self._after(AFTER_START)

    def stop(self) -> ClusterStatus:
        """Stop the server (``pg_ctl stop -m fast``); no error if it is not running."""
        with self._lock():
            if self._live_pidfile() is None:
                return self._after(AFTER_STOP)
            log.info("stopping PostgreSQL cluster in %s", self.data_dir)
            pg_ctl_stop(self._commands, self.data_dir, self.log_file, lambda: self._live_pidfile() is not None)
            return self._after(AFTER_STOP)

    def run_as_server(self, tool: str, *args: str, timeout: float = START_TIMEOUT + 60) -> str:
        """Run one of the PostgreSQL programs (``pg_basebackup``, ``pg_ctl``, …) with ``args`` as the
        server's OS user, from ``/`` and without ``PG*`` variables; returns its stdout.

        Raises:
            ClusterError: the program is missing, failed (its output is in the message) or timed out.
        """
        commands = self._commands
        return commands.run([commands.tool(tool), *args], as_server=True, what=tool, timeout=timeout).stdout

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
        return is_initialized(self.data_dir)

    def _live_pidfile(self) -> PidFile | None:
        """The pid file of a live postmaster, or None if the server is not running."""
        return live_pidfile(self.data_dir)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Hold the exclusive start/stop lock on :attr:`lock_file`."""
        with file_lock(self.lock_file):
            yield


def embedded_cluster_from_env(dbname: str = DEFAULT_DBNAME) -> EmbeddedCluster:
    """The embedded cluster configured by ``PGKB_DATA_DIR``, ``PGKB_PORT`` (and ``PGKB_PG_BINDIR``)."""
    data_dir = os.environ.get("PGKB_DATA_DIR") or None
    port_env = os.environ.get("PGKB_PORT")
    port = parse_port(port_env, "PGKB_PORT") if port_env else DEFAULT_PORT
    return EmbeddedCluster(data_dir, port, dbname)
