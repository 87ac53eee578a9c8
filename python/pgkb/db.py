"""Connections: PGKB_DATABASE_URL if set, else the embedded cluster (started on demand)."""

from __future__ import annotations

import psycopg
from pgvector.psycopg import register_vector

from pgkb.cluster import embedded_cluster_from_env
from pgkb.config import Settings


def database_url(settings: Settings | None = None) -> str:
    """The URL pgkb connects to; starts the embedded cluster when no URL is configured."""
    settings = settings or Settings.from_env()
    if settings.database_url:
        return settings.database_url
    cluster = embedded_cluster_from_env()
    cluster.ensure_running()
    return cluster.url()


def connect(url: str | None = None, *, autocommit: bool = True, vector: bool = True) -> psycopg.Connection:
    """Open a connection; registers the pgvector type when the extension is installed."""
    conn = psycopg.connect(url or database_url(), autocommit=autocommit)
    if vector and conn.execute("select 1 from pg_extension where extname = 'vector'").fetchone():
        register_vector(conn)
    return conn
