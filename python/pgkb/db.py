"""Connections: PGKB_DATABASE_URL if set, else the embedded cluster (started on demand).

Every command gets its URL from :func:`database_url`, which is also the one place that makes sure the
database is migrated before a command uses it: the embedded cluster is migrated on the spot (it is pgkb's
own), a configured PGKB_DATABASE_URL that lacks migrations is refused with the command to run (it may be
shared or managed, so pgkb does not change its schema unasked).

Readers and writers are separated by configuration alone: readers (search, MCP) take
:func:`read_database_url` -- PGKB_READ_DATABASE_URL when set, typically a hot standby or a libpq
multi-host URL with ``target_session_attrs=prefer-standby`` -- and writers (ingest, worker, migrations)
take ``database_url(writable=True)``, which refuses a read-only database with a message saying so.
"""

from __future__ import annotations

import sys

import psycopg
from pgvector.psycopg import register_vector

from pgkb import replica as _replica  # noqa: F401 (registers: replicas start and stop with the embedded cluster)
from pgkb.cluster import embedded_cluster_from_env
from pgkb.config import ConfigError, Settings
from pgkb.migrate import NotMigratedError, migrate, pending_migrations
from pgkb.rows import one
from pgkb.service_role import SERVICE_ROLE, ensure_service_role, login_url


class ReadOnlyDatabaseError(ConfigError):
    """A command that writes was pointed at a read-only database (a hot standby, or a server or role whose
    sessions default to read-only transactions)."""


def database_url(settings: Settings | None = None, *, migrated: bool = True, writable: bool = False) -> str:
    """The URL pgkb connects to; starts the embedded cluster when no URL is configured.

    With ``migrated`` (the default) the database is brought up to date first: the embedded cluster is
    migrated (what `pgkb db migrate` does, reported on stderr when something was applied); for a
    configured URL that has no kb schema or misses some of db/migrations, NotMigratedError says to run
    `pgkb db migrate`. ``migrated=False`` is for the commands that migrate themselves. ``writable``
    (commands that write): a configured URL that reaches a read-only database raises ReadOnlyDatabaseError
    (the embedded cluster is always pgkb's own primary)."""
    settings = settings or Settings.from_env()
    if settings.database_url:
        url = settings.database_url
        if writable:
            _refuse_read_only(url)
        if migrated:
            _refuse_unmigrated(url, settings)
        return url
    cluster = embedded_cluster_from_env()
    cluster.ensure_running()
    url = cluster.url()
    if migrated:
        with connect(url, vector=False) as conn:
            report = migrate(conn, settings.db_dir, vector_indexes=False)  # those: `pgkb db migrate`
        if report.applied or report.functions_applied or report.compacted:
            print(f"pgkb: migrated the embedded database: {', '.join(report.lines())}", file=sys.stderr)
    return url


def read_database_url(settings: Settings | None = None) -> str:
    """The URL readers connect to (search, MCP, every read-only path): PGKB_READ_DATABASE_URL when set --
    checked to be migrated like PGKB_DATABASE_URL, never started or changed, so reads keep working while
    the primary is down -- else :func:`database_url`."""
    settings = settings or Settings.from_env()
    if settings.read_database_url:
        _refuse_unmigrated(settings.read_database_url, settings, "PGKB_READ_DATABASE_URL")
        return settings.read_database_url
    return database_url(settings)


def require_writable(conn: psycopg.Connection, what: str = "this command", source: str = "PGKB_DATABASE_URL") -> None:
    """ReadOnlyDatabaseError when ``conn``'s database takes no writes: in recovery (a hot standby), or its
    transactions are read-only by default."""
    in_recovery, read_only = one(
        conn.execute("select pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'")
    )
    if in_recovery or read_only:
        why = "a hot standby replaying its primary" if in_recovery else "its sessions are read-only by default"
        raise ReadOnlyDatabaseError(
            f"the database at {source} is read-only ({why}) and {what} writes: point PGKB_DATABASE_URL at the "
            "primary (readers may use a standby through PGKB_READ_DATABASE_URL)"
        )


def _refuse_read_only(url: str) -> None:
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError:
        return  # unreachable now: the command's own connection reports it
    with conn:
        require_writable(conn)


def _refuse_unmigrated(url: str, settings: Settings, source: str = "PGKB_DATABASE_URL") -> None:
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError:
        return  # unreachable now: the command's own connection reports it (the MCP server starts anyway)
    with conn:
        pending = pending_migrations(conn, settings.db_dir)
        has_schema = conn.execute("select 1 from pg_namespace where nspname = 'kb'").fetchone() is not None
    if not pending:
        return
    what = (
        "has no pgkb schema yet"
        if not has_schema
        else f"lacks {len(pending)} migration{'s' if len(pending) > 1 else ''} ({', '.join(pending)})"
    )
    raise NotMigratedError(
        f"the database at {source} {what}: run `pgkb db migrate` (as its owner or a superuser), then try again"
    )


def connect(url: str | None = None, *, autocommit: bool = True, vector: bool = True) -> psycopg.Connection:
    """Open a connection; registers the pgvector type when the extension is installed."""
    conn = psycopg.connect(url or database_url(), autocommit=autocommit)
    if vector and conn.execute("select 1 from pg_extension where extname = 'vector'").fetchone():
        register_vector(conn)
    return conn


def service_database_url(settings: Settings) -> str:
    """PGKB_DATABASE_URL when set (the operator chose the role; ``refuse_privileged`` still checks it),
    else the embedded cluster as SERVICE_ROLE. Either is migrated first (see pgkb.db.database_url)."""
    if settings.database_url:
        return database_url(settings)
    admin_url = database_url(settings)
    with connect(admin_url, vector=False) as admin:
        ensure_service_role(admin)
    return login_url(admin_url, SERVICE_ROLE)


def service_read_url(settings: Settings) -> str:
    """Where a read-only server (`pgkb mcp`) connects: PGKB_READ_DATABASE_URL when set -- as given with
    PGKB_DATABASE_URL set too (the operator chose the role), else, for the embedded cluster's replicas,
    with SERVICE_ROLE as the user (``pgkb db replica add`` created it on the primary, so it exists on
    every standby) -- otherwise :func:`service_database_url`. Nothing is started or written for it."""
    if not settings.read_database_url:
        return service_database_url(settings)
    url = read_database_url(settings)
    return url if settings.database_url else login_url(url, SERVICE_ROLE)
