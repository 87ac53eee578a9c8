"""`pgkb db doctor`: is this pgkb database healthy, and if not, what fixes it.

The database judges itself (``kb_admin.doctor()``, db/functions/85_doctor.sql: extensions, numpy, indexes, row
security, privileges, service roles, settings, the database's query embedding, embeddings per model, the
chunks' stored heading scripts); this module adds what only the client can see -- the migration files on
disk against ``kb.schema_migrations`` and the schema (:func:`pgkb.migrate.ledger_state`), and the embedder the
PGKB_EMBED_* settings configure -- and returns every finding as a :class:`Finding`. It changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psycopg

from pgkb.config import ConfigError, Settings
from pgkb.migrate import ledger_state
from pgkb.models.embedding import EmbeddingError, load_embedder, model_spec, prefixed
from pgkb.models.http_json import shown_url
from pgkb.rows import one


class NotAdministratorError(ConfigError):
    """The connection's role may not run the doctor (kb_admin.doctor() is for pgkb administrators)."""


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # "ok", "problem" or "skipped" (cannot be checked here)
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def examine(conn: psycopg.Connection, settings: Settings) -> list[Finding]:
    """Every finding about the database ``conn`` reaches (as an administrator) and the configured embedder:
    migrations, functions, then kb_admin.doctor()'s areas, then the embedder. Raises NotAdministratorError when
    the role may not run kb_admin.doctor()."""
    if one(conn.execute("select to_regclass('kb.schema_migrations')"))[0] is None:
        return [
            Finding("migrations", "problem", "this database has no pgkb schema", "pgkb db migrate"),
            Finding("embedder", "skipped", "needs the pgkb schema (its model registry)"),
        ]
    doctor, allowed = conn.execute(  # by the catalog: naming a schema one may not use is an error
        "select p.oid, has_schema_privilege(p.pronamespace, 'usage') and has_function_privilege(p.oid, 'execute')"
        " from pg_proc as p where p.pronamespace = to_regnamespace('kb_admin') and p.proname = 'doctor'"
    ).fetchone() or (None, False)
    if doctor and not allowed:
        user = one(conn.execute("select session_user"))[0]
        raise NotAdministratorError(
            f"role {user} may not run kb_admin.doctor(): connect as a pgkb administrator (a superuser, the owner of "
            "schema kb or a member of pgkb_admin), e.g. with the URL `pgkb db url` prints"
        )
    findings = _ledger_findings(conn, settings.db_dir)
    if doctor:
        doctor_rows = conn.execute('select "check", status, detail, fix from kb_admin.doctor()')
        findings += [Finding(*row) for row in doctor_rows]
    else:
        missing = "kb_admin.doctor() is missing: this pgkb's db/functions are not applied (see above)"
        findings.append(Finding("database", "skipped", missing))
    findings.append(_embedder_finding(conn, settings))
    return findings


def _ledger_findings(conn: psycopg.Connection, db_dir: Path) -> list[Finding]:
    """The migrations and functions the database records against the files in ``db_dir``."""
    state = ledger_state(conn, db_dir)
    unrecorded = {name for name, _ in state.unrecorded}
    found = [
        Finding(
            "migrations",
            "problem",
            f"migration {name} is not recorded as applied, though later ones are: its record was deleted, or "
            "the file was added out of order",
            f"if its changes are in the database, record it: insert into kb.schema_migrations (version, name, "
            f"checksum) values ('{name[:3]}', '{name}', '{checksum}'); otherwise give the file the next free number "
            "(pgkb db migrate runs migrations in order only)",
        )
        for name, checksum in state.unrecorded
    ]
    pending = [name for name, _ in state.pending if name not in unrecorded]
    if pending:
        found.append(Finding("migrations", "problem", f"not applied yet: {', '.join(pending)}", "pgkb db migrate"))
    found += [
        Finding(
            "migrations",
            "problem",
            f"migration {name} differs from the one applied (its checksum is not the one kb.schema_migrations records)",
            f"if the file was edited (git diff -- db/migrations/{name}), restore it and put the change in a new "
            f"migration; if the record was changed: update kb.schema_migrations set checksum = '{checksum}' "
            f"where version = '{name[:3]}'",
        )
        for name, checksum in state.changed
    ]
    if state.unknown:
        found.append(
            Finding(
                "migrations",
                "problem",
                f"kb.schema_migrations records {', '.join(state.unknown)}, which {db_dir / 'migrations'} lacks: a "
                "newer pgkb migrated this database",
                "run the pgkb that migrated it (update this checkout or package)",
            )
        )
    if not found:
        found.append(Finding("migrations", "ok", "every file of db/migrations is applied and matches its record"))
    if state.functions_changed:
        found.append(Finding("functions", "problem", "db/functions changed since they were applied", "pgkb db migrate"))
    if state.missing_functions:
        found.append(
            Finding(
                "functions",
                "problem",
                f"missing from the database: {', '.join(state.missing_functions)}",
                "pgkb db migrate (it applies db/functions again when one is missing)",
            )
        )
    if not (state.functions_changed or state.missing_functions):
        found.append(Finding("functions", "ok", "db/functions are applied as they are on disk"))
    return found


def _embedder_finding(conn: psycopg.Connection, settings: Settings) -> Finding:
    """Whether the embedder PGKB_EMBED_* configure (what ingest, the worker and the servers load) loads and
    embeds a query for its model with the registered dimension."""
    provider = settings.embed_provider
    if provider == "http":
        provider += f" {shown_url(settings.embed_url or '')}"
    try:
        spec = model_spec(conn, settings.embed_model)
    except psycopg.Error as e:
        return Finding(
            "embedder",
            "problem",
            f"PGKB_EMBED_MODEL: {e.diag.message_primary or e}",
            "set PGKB_EMBED_MODEL to a registered model (pgkb model list), or unset it for the default",
        )
    try:
        vectors = load_embedder(settings, spec).embed(prefixed(spec, ["pgkb doctor"], query=True))
        if vectors.shape != (1, spec.dimension) or not np.isfinite(vectors).all():
            raise EmbeddingError(f"it returned an array of shape {vectors.shape}, not one {spec.dimension}-d vector")
    except Exception as e:  # whatever stops it loading or embedding is the finding
        return Finding(
            "embedder",
            "problem",
            f"{provider} cannot embed for {spec.name} ({spec.dimension}-d): {e}",
            _embedder_fix(settings, spec.name, spec.dimension),
        )
    return Finding("embedder", "ok", f"{provider} embeds for {spec.name}: {spec.dimension}-d vectors")


def _embedder_fix(settings: Settings, model: str, dimension: int) -> str:
    if settings.embed_provider == "http":
        return (
            f"start the endpoint (pgkb embed-server, or make run), or set PGKB_EMBED_URL to one serving {model} "
            f"({dimension}-d)"
        )
    if settings.embed_provider == "sentence-transformers":
        return (
            "pip install -e '.[sentence-transformers]', and set PGKB_EMBED_MODEL to a model or path that loads and "
            f"gives {dimension}-d vectors"
        )
    return (
        "for a model other than multilingual-e5-small set PGKB_EMBED_PROVIDER (http or sentence-transformers); "
        "else reinstall pgkb's dependencies (make setup)"
    )
