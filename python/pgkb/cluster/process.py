"""Process control of the embedded cluster: running the server's commands (as the server's OS user when we
are root), reading ``postmaster.pid``, ``pg_ctl start`` / ``stop``, the start/stop lock and the server log."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pgkb.cluster.errors import ClusterError
from pgkb.cluster.locate import ServerUser

__all__ = [
    "READY_STATES",
    "START_TIMEOUT",
    "PidFile",
    "ServerCommands",
    "file_lock",
    "live_pidfile",
    "log_tail",
    "pg_ctl_start",
    "pg_ctl_stop",
    "postmaster_alive",
    "read_pidfile",
    "wait_until_ready_or_down",
]

START_TIMEOUT = 60  # seconds pg_ctl waits for the server to come up / go down
READY_STATES = ("ready", "standby")
_LOCK_TIMEOUT = 300.0  # seconds to wait for another process's start()/stop()
_LOG_TAIL_LINES = 30


@dataclasses.dataclass(frozen=True)
class PidFile:
    """The interesting lines of ``postmaster.pid``."""

    pid: int
    port: int | None
    socket_dir: str | None
    state: str | None  # "starting", "ready", "stopping", "standby" (None: not written yet)


def _child_env() -> dict[str, str]:
    """The environment for child processes: ours minus libpq/server ``PG*`` variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _runuser() -> str:
    found = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not found:
        raise ClusterError("running as root needs `runuser` (util-linux) to start PostgreSQL as postgres")
    return found


@dataclasses.dataclass(frozen=True)
class ServerCommands:
    """Runs the PostgreSQL programs of ``bindir``, as the server's OS user ``user`` where asked."""

    bindir: Path
    user: ServerUser

    def tool(self, name: str) -> str:
        """The path of program ``name``: in ``bindir``, else on PATH."""
        path = self.bindir / name
        if os.access(path, os.X_OK):
            return str(path)
        found = shutil.which(name)
        if found is None:
            raise ClusterError(f"{name} not found in {self.bindir} or on PATH: run `make setup`")
        return found

    def run(
        self,
        argv: Sequence[str],
        *,
        what: str,
        as_server: bool = False,
        input: str | None = None,
        timeout: float = START_TIMEOUT + 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (as the server's OS user if ``as_server``), raising ClusterError on failure."""
        cmd = list(argv)
        if as_server and self.user.switch:
            cmd = [_runuser(), "-u", self.user.name, "--", *cmd]
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


# --------------------------------------------------------------------------------------------------
# The postmaster's state


def postmaster_alive(pid: int) -> bool:
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


def read_pidfile(data_dir: Path) -> PidFile | None:
    """The ``postmaster.pid`` of ``data_dir`` (None: there is none, or it is being written)."""
    try:
        lines = (data_dir / "postmaster.pid").read_text(errors="replace").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise ClusterError(f"cannot read the data directory {data_dir} (owned by another OS user?)") from None
    # Lines: 1 pid, 2 data dir, 3 start time, 4 port, 5 socket dir, 6 listen addr, 7 shmem, 8 status.
    fields = [line.strip() for line in lines] + [""] * 8
    try:
        pid = int(fields[0])
    except ValueError:
        return None  # being written right now, or garbage
    port = int(fields[3]) if fields[3].isdigit() else None
    return PidFile(pid=pid, port=port, socket_dir=fields[4] or None, state=fields[7] or None)


def live_pidfile(data_dir: Path) -> PidFile | None:
    """The pid file of a live postmaster, or None if the server is not running."""
    pidfile = read_pidfile(data_dir)
    if pidfile is None or not postmaster_alive(pidfile.pid):
        return None
    return pidfile


def wait_until_ready_or_down(data_dir: Path, log_file: Path) -> bool:
    """Wait while a server is starting up or shutting down: True if one is ready, False if none runs."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        pidfile = live_pidfile(data_dir)
        if pidfile is None:
            return False
        if pidfile.state in READY_STATES:
            return True
        if time.monotonic() > deadline:
            raise ClusterError(
                f"PostgreSQL (pid {pidfile.pid}) in {data_dir} has been "
                f"{pidfile.state or 'starting'} for {START_TIMEOUT}s{log_tail(log_file)}"
            )
        time.sleep(0.1)


def log_tail(log_file: Path) -> str:
    """The last lines of the server log, as a suffix for an error message ('' if none)."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError:
        return ""
    if not lines:
        return ""
    return f"\n--- last lines of {log_file} ---\n" + "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Start, stop, lock


def pg_ctl_start(commands: ServerCommands, data_dir: Path, log_file: Path) -> None:
    """``pg_ctl start`` and wait; on failure ClusterError with the tail of the server log."""
    try:
        commands.run(
            [
                commands.tool("pg_ctl"),
                "-D",
                str(data_dir),
                "-l",
                str(log_file),
                "-w",
                "-t",
                str(START_TIMEOUT),
                "start",
            ],
            as_server=True,
            what="pg_ctl start",
        )
    except ClusterError as exc:
        raise ClusterError(f"{exc}{log_tail(log_file)}") from exc


def pg_ctl_stop(commands: ServerCommands, data_dir: Path, log_file: Path, still_running: Callable[[], bool]) -> None:
    """``pg_ctl stop -m fast`` and wait; a failure is an error only while ``still_running()``."""
    try:
        commands.run(
            [commands.tool("pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w", "-t", str(START_TIMEOUT), "stop"],
            as_server=True,
            what="pg_ctl stop",
        )
    except ClusterError as exc:
        if still_running():
            raise ClusterError(f"{exc}{log_tail(log_file)}") from exc


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive fcntl lock on ``path`` (created, with its parents, if needed)."""
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
