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
* ``shared_buffers`` -- ``PGKB_SHARED_BUFFERS`` (at most half the memory); default an eighth of the
  memory (the process's cgroup limit when lower), between 128 MB and 4 GB, unless ``postgresql.conf`` sets
  more;
* the server log is ``<data dir>/server.log``; the settings pgkb manages live in
  ``<data dir>/pgkb.conf``, included from ``postgresql.conf`` and rewritten at every start.

PostgreSQL refuses to run as root. When pgkb runs as root, every server-side command (``initdb``,
``pg_ctl``) runs as the ``postgres`` OS user through ``runuser``, and the data and socket
directories are owned by that user. The cluster's bootstrap superuser is named after the OS user
that runs the server (``postgres`` as root, otherwise the current user), and it is the user in
:meth:`EmbeddedCluster.url`.

Concurrent :meth:`EmbeddedCluster.start` calls (from several processes) are serialised with an
``fcntl`` lock on ``<data dir>.lock``, so only one of them ever runs ``initdb`` or ``pg_ctl start``.

The package by concern: ``locate`` (binaries, default data directory, the server's OS user, port,
socket directory, URL), ``process`` (running the server's commands, ``postmaster.pid``, ``pg_ctl``,
the start/stop lock, the server log), ``bootstrap`` (directories, ``initdb``, version check,
``pgkb.conf``, the database) and ``embedded`` (:class:`EmbeddedCluster`, which drives them).
"""

from pgkb.cluster.bootstrap import LOCALE
from pgkb.cluster.embedded import AFTER_START, AFTER_STOP, ClusterStatus, EmbeddedCluster, embedded_cluster_from_env
from pgkb.cluster.errors import ClusterError
from pgkb.cluster.locate import (
    DEFAULT_DBNAME,
    DEFAULT_PORT,
    MIN_PG_MAJOR,
    ROOT_DEFAULT_DATA_DIR,
    ROOT_SERVER_USER,
    default_data_dir,
    find_pg_bindir,
)

__all__ = [
    "AFTER_START",
    "AFTER_STOP",
    "DEFAULT_DBNAME",
    "DEFAULT_PORT",
    "LOCALE",
    "MIN_PG_MAJOR",
    "ROOT_DEFAULT_DATA_DIR",
    "ROOT_SERVER_USER",
    "ClusterError",
    "ClusterStatus",
    "EmbeddedCluster",
    "default_data_dir",
    "embedded_cluster_from_env",
    "find_pg_bindir",
]
