"""Connections: PGKB_DATABASE_URL if set, else the embedded cluster (started on demand).

Every command gets its URL from :func:`database_url`, which is also the one place that makes sure the
database is migrated before a command uses it: the embedded cluster is migrated on the spot (it is pgkb's
own), a configured PGKB_DATABASE_URL that lacks migrations is refused with the command to run (it may be
shared or managed, so pgkb does not change its schema unasked).
"""

from __future__ import annotations

import sys

import psycopg
from pgvector.psycopg import register_vector

from pgkb.cluster import embedded_cluster_from_env
from pgkb.config import Settings
from pgkb.migrate import NotMigratedError, migrate, pending_migrations


def database_url(settings: Settings | None = None, *, migrated: bool = True) -> str:
    """The URL pgkb connects to; starts the embedded cluster when no URL is configured.

    With ``migrated`` (the default) the database is brought up to date first: the embedded cluster is
    migrated (what `pgkb db migrate` does, reported on stderr when something was applied); for a
    configured URL that has no kb schema or misses some of db/migrations, NotMigratedError says to run
    `pgkb db migrate`. ``migrated=False`` is for the commands that migrate themselves."""
    settings = settings or Settings.from_env()
    if settings.database_url:
        url = settings.database_url
        if migrated:
            _refuse_unmigrated(url, settings)
        return url
    cluster = embedded_cluster_from_env()
    cluster.ensure_running()
    url = cluster.url()
    if migrated:
        with connect(url, vector=False) as conn:
            report = migrate(conn, settings.db_dir)
        if report.applied or report.functions_applied:
            print(f"pgkb: migrated the embedded database: {', '.join(report.lines())}", file=sys.stderr)
    return url


def _refuse_unmigrated(url: str, settings: Settings) -> None:
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
        f"the database at PGKB_DATABASE_URL {what}: run `pgkb db migrate` (as its owner or a superuser), then try again"
    )


def connect(url: str | None = None, *, autocommit: bool = True, vector: bool = True) -> psycopg.Connection:
    """Open a connection; registers the pgvector type when the extension is installed."""
    conn = psycopg.connect(url or database_url(), autocommit=autocommit)
    if vector and conn.execute("select 1 from pg_extension where extname = 'vector'").fetchone():
        register_vector(conn)
    return conn
