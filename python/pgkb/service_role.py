"""The least-privileged database role pgkb's servers connect as.

A server that answers end users (``pgkb mcp``) must see no more than the user it acts for, so it never
connects as a superuser or another role that bypasses row-level security or administers pgkb:
``refuse_privileged`` asks the database (``kb.service_role_problem()``) and the server refuses to serve.
With PGKB_DATABASE_URL unset the server uses the embedded cluster as ``pgkb_mcp``, a login role that is a
member of pgkb_service only (created here on first use, through the cluster's bootstrap superuser).
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgkb.config import ConfigError
from pgkb.rows import one

SERVICE_ROLE = "pgkb_mcp"


class PrivilegedRoleError(ConfigError):
    """The server's database role sees more than the users it serves."""


def login_url(url: str, user: str) -> str:
    """The same server and database as ``url`` but logging in as ``user`` (libpq URL or key=value)."""
    params = conninfo_to_dict(url)
    params["user"] = user
    params.pop("password", None)
    return make_conninfo("", **params)


def ensure_service_role(admin: psycopg.Connection, role: str = SERVICE_ROLE) -> None:
    """Create the service login role if missing and make it a member of pgkb_service (idempotent).
    ``admin`` must be allowed to create roles; the database must be migrated."""
    if not admin.execute("select 1 from pg_roles where rolname = 'pgkb_service'").fetchone():
        raise ConfigError("the database is not migrated (no role pgkb_service): run `pgkb db migrate` first")
    if not admin.execute("select 1 from pg_roles where rolname = %s", [role]).fetchone():
        admin.execute(f'create role "{role}" login')
    admin.execute(f'grant pgkb_service to "{role}"')


def refuse_privileged(conn: psycopg.Connection) -> None:
    """Raise PrivilegedRoleError when the connection's login role bypasses visibility."""
    problem = one(conn.execute("select kb.service_role_problem()"))[0]
    if problem:
        raise PrivilegedRoleError(
            f"refusing to serve: {problem}, so it would see every knowledge base whatever user it acts for. "
            f"Connect as a member of pgkb_service that is nothing more (unset PGKB_DATABASE_URL to use "
            f"{SERVICE_ROLE} on the embedded cluster, or: CREATE ROLE {SERVICE_ROLE} LOGIN; "
            f"GRANT pgkb_service TO {SERVICE_ROLE};)"
        )
