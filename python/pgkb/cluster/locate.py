"""Where the embedded cluster lives and who runs it: the server binaries, the default data directory, the
OS user of the server, the port, the socket directory and the libpq URL built from them."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

from pgkb.cluster.errors import ClusterError

__all__ = [
    "DEFAULT_DBNAME",
    "DEFAULT_PORT",
    "MIN_PG_MAJOR",
    "ROOT_DEFAULT_DATA_DIR",
    "ROOT_SERVER_USER",
    "ServerUser",
    "default_data_dir",
    "default_socket_dir",
    "find_pg_bindir",
    "make_url",
    "parse_port",
    "server_user",
]

DEFAULT_PORT = 55432
DEFAULT_DBNAME = "pgkb"
#: Default data directory when running as root (``/root`` is not traversable by ``postgres``).
ROOT_DEFAULT_DATA_DIR = Path("/var/lib/pgkb/cluster")
#: The OS user that runs the server when pgkb itself runs as root.
ROOT_SERVER_USER = "postgres"
#: Oldest PostgreSQL major version pgkb looks for under ``/usr/lib/postgresql``.
MIN_PG_MAJOR = 15

_DEBIAN_PG_ROOT = Path("/usr/lib/postgresql")
_SOCKET_ROOT = Path("/tmp")
_SETUP_HINT = "PostgreSQL server binaries not found: run `make setup`"


@dataclasses.dataclass(frozen=True)
class ServerUser:
    """The OS user that owns the data directory and runs the server."""

    name: str
    uid: int
    gid: int
    switch: bool  # True: we are root and must run server-side commands via runuser


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
    """The default data directory (ignoring ``PGKB_DATA_DIR``), see the package docstring."""
    if os.geteuid() == 0:
        return ROOT_DEFAULT_DATA_DIR
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "pgkb" / "cluster"


def default_socket_dir(server_uid: int, port: int) -> Path:
    """``/tmp/pgkb-<uid of the server's OS user>-<port>``."""
    return _SOCKET_ROOT / f"pgkb-{server_uid}-{port}"


def server_user() -> ServerUser:
    """The OS user that runs the server: ``postgres`` when we are root, else ourselves."""
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
        return ServerUser(pw.pw_name, pw.pw_uid, pw.pw_gid, switch=True)
    try:
        pw = pwd.getpwuid(euid)
    except KeyError:
        raise ClusterError(f"the current user (uid {euid}) has no passwd entry; initdb needs one") from None
    return ServerUser(pw.pw_name, pw.pw_uid, pw.pw_gid, switch=False)


def parse_port(value: str | int, source: str) -> int:
    """``value`` as a port number 1..65535; ClusterError naming ``source`` otherwise."""
    try:
        port = int(value)
    except ValueError:
        raise ClusterError(f"{source}: not a port number: {value!r}") from None
    if not 1 <= port <= 65535:
        raise ClusterError(f"{source}: port out of range: {port}")
    return port


def make_url(user: str, dbname: str, socket_dir: Path, port: int) -> str:
    """A libpq URL for a unix-socket server."""
    return (
        f"postgresql://{quote(user, safe='')}@/{quote(dbname, safe='')}"
        f"?host={quote(str(socket_dir), safe='/')}&port={port}"
    )
