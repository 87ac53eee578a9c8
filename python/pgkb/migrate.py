"""Apply db/migrations (numbered, each exactly once, checksummed) and db/functions (re-applied when
changed) in one transaction under an advisory lock. Running it twice changes nothing. Migrations run in
their numbered order only: a gap in the folder's numbering, a version missing from kb.schema_migrations
below the highest one recorded, or a pending migration numbered below it stops everything with a
MigrationError naming the versions (see _check_order). When there is
something to apply, every kb table is locked first without queueing (see _lock_tables), so migrating
while searches run neither deadlocks with them nor stalls them for long.

A function file whose first line is ``-- requires: <extension>`` is skipped, with the reason reported,
when that extension cannot be installed (e.g. plpython3u on managed PostgreSQL).

Then the indexes pgkb expects (kb_internal.expected_indexes: the migrations' and one HNSW index per model and
large knowledge base) are checked, and a missing one is re-created, an invalid one rebuilt
(kb_internal.restore_indexes), in a transaction of their own; the per-knowledge-base HNSW ones are built, rebuilt
and dropped CONCURRENTLY instead, one statement at a time (:func:`maintain_vector_indexes`), so no search waits
for them. An interrupted bulk load (`pgkb bench`) or a failed REINDEX cannot leave searches on sequential scans
past the next `pgkb db migrate`. :func:`index_problems` tells which are missing (`pgkb db status`).

db/functions are re-applied when their files changed and also when a function or view they define is
missing from the database (dropped by hand, or with the plpython3u extension), so `pgkb db migrate`
repairs that too. :func:`ledger_state` tells, without changing anything, how the database's record of
migrations and functions compares with the files (`pgkb db doctor`).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from pgkb.lexicon import load_lexicon
from pgkb.rows import one

LOCK_KEY = 0x70676B62  # "pgkb"
LOCK_WAIT_S = 60.0  # how long to keep trying for the table locks while searches run
_VERSION = re.compile(r"\d{3}")
_MIGRATION_NAME = re.compile(r"(\d{3})_[a-z0-9_]+\.sql")  # fullmatch: "$" would let a trailing newline through
_REQUIRES = re.compile(r"--\s*requires:\s*([a-z0-9_]+)\s*")
SCHEMAS = ("kb", "kb_service", "kb_admin", "kb_internal")  # pgkb's: the API, the servers', admins', internals
_DEFINES = re.compile(
    rf"create\s+or\s+replace\s+(?:function|view)\s+((?:{'|'.join(SCHEMAS)})\.[a-z0-9_]+)", re.IGNORECASE
)


class MigrationError(RuntimeError):
    """A migration cannot be applied (changed after it was applied, bad file name, SQL error)."""


class NotMigratedError(MigrationError):
    """The database lacks the kb schema or some of db/migrations; the message names `pgkb db migrate`."""


@dataclass
class MigrateReport:
    applied: list[str] = field(default_factory=list)
    functions_applied: bool = False
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)
    indexes: list[tuple[str, str]] = field(default_factory=list)  # (index, what was done)
    recounted: list[str] = field(default_factory=list)  # knowledge bases whose terms were counted again
    compacted: list[str] = field(default_factory=list)  # knowledge bases whose term dictionary was compacted
    term_indexes: str = ""  # what _rebuild_term_row_indexes did after the compactions
    lexicon: str = ""  # what pgkb.lexicon.load_lexicon did

    def lines(self) -> list[str]:
        out = [f"applied migration {name}" for name in self.applied]
        out.append("applied db/functions" if self.functions_applied else "db/functions unchanged")
        out += [f"skipped {name}: {reason}" for name, reason in self.skipped]
        out += [f"index kb.{name} {action}" for name, action in self.indexes]
        out += [f"counted the terms of knowledge base {name} again (an older term model)" for name in self.recounted]
        out += [f"compacted the term dictionary of knowledge base {name}" for name in self.compacted]
        out += [self.term_indexes] if self.term_indexes else []
        out += [self.lexicon] if self.lexicon else []
        return out


@dataclass
class LedgerState:
    """How kb.schema_migrations compares with db/: the migrations not recorded as applied (``pending``:
    file name and checksum; ``unrecorded`` those of them older than a recorded one: a deleted record, or a
    file added out of order), those recorded with another checksum than the file's (``changed``), versions
    recorded with no file (``unknown``: a newer pgkb migrated this database); whether db/functions differ
    from what was applied, and the functions and views they define that are missing."""

    pending: list[tuple[str, str]] = field(default_factory=list)
    unrecorded: list[tuple[str, str]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    functions_changed: bool = False
    missing_functions: list[str] = field(default_factory=list)


def _checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _sql_files(db_dir: Path, kind: str) -> list[Path]:
    """The *.sql files of db_dir/kind (migrations or functions), sorted; MigrationError when there are none,
    so a broken install or a wrong PGKB_DB_DIR stops every command instead of passing as "nothing to apply"."""
    files = sorted((db_dir / kind).glob("*.sql"))
    if not files:
        raise MigrationError(
            f"no SQL files in {db_dir / kind}: PGKB_DB_DIR points at the wrong folder, or this pgkb install "
            "lacks its SQL (pgkb/sql in the package); nothing was changed"
        )
    return files


def _migrations(db_dir: Path) -> list[tuple[str, Path]]:
    files = []
    for path in _sql_files(db_dir, "migrations"):
        match = _MIGRATION_NAME.fullmatch(path.name)
        if not match:
            raise MigrationError(f"bad migration file name {path.name}: expected NNN_lower_snake.sql")
        files.append((match.group(1), path))
    versions = [v for v, _ in files]
    if len(set(versions)) != len(versions):
        raise MigrationError("two migration files share a number")
    missing = _gaps(versions)
    if missing:
        raise MigrationError(
            f"{db_dir / 'migrations'} has a gap in its numbering: {', '.join(missing)} missing before "
            f"{versions[-1]}; migrations run in order, one number after another; nothing was changed"
        )
    return files


def _gaps(versions: list[str]) -> list[str]:
    """The three-digit versions from 001 up to the highest of ``versions`` that are not among them."""
    present = {int(v) for v in versions}
    return [f"{n:03d}" for n in range(1, max(present, default=0) + 1) if n not in present]


def _check_order(recorded: list[str], pending: list[str]) -> None:
    """Refuse to migrate out of order: every version below the highest one kb.schema_migrations records
    must be recorded too, so a pending migration numbered below it (a deleted record, or a file added after
    later ones were applied) would run after migrations written to run after it."""
    versions = [v for v in recorded if _VERSION.fullmatch(v)]
    lacking = _gaps(versions)
    if not lacking:
        return
    early = [name for name in pending if name[:3] in lacking]
    raise MigrationError(
        f"kb.schema_migrations records {max(versions)} but lacks {', '.join(lacking)} below it"
        + (f", so {', '.join(early)} would run after later migrations" if early else "")
        + ": if their changes are in the database, restore their records (pgkb db doctor prints them); a "
        "migration file added out of order needs the next free number; nothing was changed"
    )


def _unavailable_reason(conn: psycopg.Connection, extension: str) -> str | None:
    """Why the extension cannot be used here, or None if it is installed or installable."""
    if conn.execute("select 1 from pg_extension where extname = %s", [extension]).fetchone():
        return None
    row = conn.execute("select 1 from pg_available_extensions where name = %s", [extension]).fetchone()
    if not row:
        return f"extension {extension} is not available on this server"
    trusted = one(conn.execute("select rolsuper from pg_roles where rolname = current_user"))[0]
    if not trusted:
        return f"extension {extension} is untrusted and needs a superuser to install"
    return None


def pending_migrations(conn: psycopg.Connection, db_dir: Path) -> list[str] | None:
    """The db/migrations files not applied to this database yet (all of them when there is no kb schema),
    in order; None when the connected role may not read kb.schema_migrations (nothing can be told).
    Reads the catalogs only, so it works for every role and changes nothing."""
    row = conn.execute(
        "select c.oid, has_table_privilege(c.oid, 'select') from pg_class as c"
        " join pg_namespace as n on n.oid = c.relnamespace"
        " where n.nspname = 'kb' and c.relname = 'schema_migrations'"
    ).fetchone()
    files = _migrations(db_dir)
    if row is None:
        return [path.name for _, path in files]
    if not row[1]:
        return None
    applied = {r[0] for r in conn.execute("select version from kb.schema_migrations").fetchall()}
    return [path.name for version, path in files if version not in applied]


def migrate(
    conn: psycopg.Connection, db_dir: Path, lock_wait_s: float = LOCK_WAIT_S, vector_indexes: bool = True
) -> MigrateReport:
    """Bring the database up to date, then restore the expected indexes (the per-knowledge-base HNSW ones only
    when vector_indexes: the implicit migrate before every command on the embedded cluster leaves them to
    `pgkb db migrate`, `pgkb ingest` and `pgkb kb delete`, so a transaction left open cannot slow every
    command by their waits). Raises MigrationError, leaving the database unchanged (a failing index restore,
    which runs after the migrations are committed, alone)."""
    report = MigrateReport()
    try:
        with conn.transaction():
            conn.execute("select pg_advisory_xact_lock(%s)", [LOCK_KEY])
            conn.execute("set local client_min_messages = warning")
            conn.execute("create schema if not exists kb")
            conn.execute(
                "create table if not exists kb.schema_migrations ("
                " version text primary key, name text not null, checksum text not null,"
                " applied_at timestamptz not null default now())"
            )
            applied: dict[str, str] = dict(
                conn.execute("select version, checksum from kb.schema_migrations").fetchall()
            )
            pending = []
            for version, path in _migrations(db_dir):
                text = path.read_text(encoding="utf-8")
                checksum = _checksum(text)
                if version not in applied:
                    pending.append((version, path, text, checksum))
                elif applied[version] != checksum:
                    raise MigrationError(
                        f"migration {path.name} was changed after it was applied; add a new "
                        "migration instead of editing an applied one"
                    )
            _check_order(list(applied), [path.name for _, path, _, _ in pending])

            files, report.skipped = _function_files(conn, db_dir)
            functions_checksum = _functions_checksum(files)
            functions_changed = applied.get("functions") != functions_checksum or bool(_missing_functions(conn, files))
            if pending or functions_changed:
                _lock_tables(conn, lock_wait_s)
                for version, path, text, checksum in pending:
                    _execute(conn, path, text)
                    conn.execute(
                        "insert into kb.schema_migrations (version, name, checksum) values (%s, %s, %s)",
                        [version, path.name, checksum],
                    )
                    report.applied.append(path.name)
                for path, text in files:
                    _execute(conn, path, text)
                conn.execute(
                    "insert into kb.schema_migrations (version, name, checksum) values ('functions', %s, %s)"
                    " on conflict (version) do update set checksum = excluded.checksum, applied_at = now()",
                    ["db/functions", functions_checksum],
                )
                report.functions_applied = True
        with conn.transaction():  # a transaction of its own, with the functions just applied
            conn.execute("select pg_advisory_xact_lock(%s)", [LOCK_KEY])
            report.indexes = conn.execute("select index_name, action from kb_internal.restore_indexes()").fetchall()
            # writes undo a chunk's statistics from its text: a knowledge base counted with an older term model
            # (kb_internal.terms_version) is counted again before it is written to
            report.recounted = [r[0] for r in conn.execute("select name from kb_internal.recount_old_terms()")]
            # a knowledge base whose dictionary rows passed their bound (an upgrade from before migration 049,
            # writes that stopped short of it) gets its blocks (kb_internal.compact_due_terms)
            report.compacted = [r[0] for r in conn.execute("select name from kb_internal.compact_due_terms()")]
        if report.compacted:
            report.term_indexes = _rebuild_term_row_indexes(conn)
        if vector_indexes:
            report.indexes += maintain_vector_indexes(conn)  # CONCURRENTLY, each statement on its own
        # its own transaction; unchanged editions are not reloaded; fetched only by an explicit migrate
        report.lexicon = load_lexicon(conn, fetch=vector_indexes)
    except psycopg.Error as e:
        raise MigrationError(str(e)) from e
    return report


def _function_files(conn: psycopg.Connection, db_dir: Path) -> tuple[list[tuple[Path, str]], list[tuple[str, str]]]:
    """The db/functions files to apply here, with their text, and (file, reason) for those skipped because
    the extension their ``-- requires:`` line names cannot be installed."""
    files, skipped = [], []
    for path in _sql_files(db_dir, "functions"):
        text = path.read_text(encoding="utf-8")
        first = text.splitlines()[0] if text else ""
        requires = _REQUIRES.fullmatch(first)
        reason = _unavailable_reason(conn, requires.group(1)) if requires else None
        if reason:
            skipped.append((path.name, reason))
        else:
            files.append((path, text))
    return files, skipped


def _functions_checksum(files: list[tuple[Path, str]]) -> str:
    return _checksum("".join(p.name + t for p, t in files))


def _missing_functions(conn: psycopg.Connection, files: list[tuple[Path, str]]) -> list[str]:
    """The functions and views of pgkb's schemas (kb, kb_service, kb_admin, kb_internal) these files define
    (``create or replace function|view kb.name``) that the database lacks, as ``schema.name``, sorted."""
    defined = {name.lower() for _, text in files for name in _DEFINES.findall(text)}
    present = {
        r[0]
        for r in conn.execute(
            "select n.nspname || '.' || p.proname from pg_proc as p join pg_namespace as n on n.oid = p.pronamespace"
            " where n.nspname = any(%(schemas)s)"
            " union select n.nspname || '.' || c.relname from pg_class as c join pg_namespace as n"
            " on n.oid = c.relnamespace where n.nspname = any(%(schemas)s) and c.relkind = 'v'",
            {"schemas": list(SCHEMAS)},
        ).fetchall()
    }
    return sorted(defined - present)


def ledger_state(conn: psycopg.Connection, db_dir: Path) -> LedgerState:
    """Compare kb.schema_migrations and the schema with db/ (see :class:`LedgerState`); reads only. The
    connected role must be able to read kb.schema_migrations."""
    state = LedgerState()
    files = _migrations(db_dir)
    recorded: dict[str, str] = dict(conn.execute("select version, checksum from kb.schema_migrations").fetchall())
    functions_checksum = recorded.pop("functions", None)
    for version, path in files:
        checksum = _checksum(path.read_text(encoding="utf-8"))
        if version not in recorded:
            state.pending.append((path.name, checksum))
        elif recorded[version] != checksum:
            state.changed.append((path.name, checksum))
    versions = {v for v, _ in files}
    state.unknown = sorted(set(recorded) - versions)
    latest = max(set(recorded) & versions, default="")
    state.unrecorded = [(name, checksum) for name, checksum in state.pending if name[:3] < latest]
    function_files, _ = _function_files(conn, db_dir)
    state.functions_changed = functions_checksum != _functions_checksum(function_files)
    state.missing_functions = _missing_functions(conn, function_files)
    return state


def index_problems(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """(index, "missing" or "invalid") for each index pgkb expects that searches cannot use
    (kb_admin.index_problems); reads the catalogs only."""
    return conn.execute("select index_name, problem from kb_admin.index_problems()").fetchall()


VECTOR_INDEX_LOCK_TIMEOUT = "5s"  # how long one CONCURRENTLY step waits for a transaction in its way


def maintain_vector_indexes(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """Bring the per-knowledge-base HNSW indexes in line with kb_admin.index_problems, CONCURRENTLY, one
    statement at a time, so searches and writes go on: build the missing ones (a knowledge base grown past
    kb.settings.vector_exact_chunks), rebuild the invalid ones, drop the stale ones (a knowledge base deleted,
    or fallen below that size). Each step waits at most VECTOR_INDEX_LOCK_TIMEOUT for transactions in its way;
    one that cannot is left for the next call, and said so. Needs an autocommit session that owns schema kb;
    returns [] for any other. Returns (index, what was done). `pgkb db migrate`, `pgkb ingest` and
    `pgkb kb delete` call it."""
    if not conn.autocommit:  # CONCURRENTLY cannot run in a transaction (and none is opened here)
        return []
    may = conn.execute(
        "select pg_has_role(current_user, n.nspowner, 'USAGE') from pg_namespace as n where n.nspname = 'kb'"
    ).fetchone()
    if not (may and may[0]):
        return []
    problems = conn.execute(
        "select p.index_name, p.problem, p.definition from kb_admin.index_problems() as p"
        " where p.index_name ~ '^embeddings_hnsw_model_[0-9]+_kb_[0-9]+$' order by p.index_name"
    ).fetchall()
    done: list[tuple[str, str]] = []
    with _lock_timeout(conn, VECTOR_INDEX_LOCK_TIMEOUT):
        for name, problem, definition in problems:
            drop = f"drop index concurrently if exists kb.{name}"
            create = definition.replace("create index if not exists", "create index concurrently if not exists", 1)
            steps, action = {
                "missing": ([create], "created (was missing)"),
                "invalid": ([drop, create], "rebuilt (was invalid)"),
                "stale": ([drop], "dropped (no longer expected)"),
            }[problem]
            try:
                for step in steps:
                    conn.execute(step)
                done.append((name, action))
            except psycopg.Error as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                done.append((name, f"not {action.split(' ')[0]}: left for the next `pgkb db migrate` ({first})"))
    return done


@contextmanager
def _lock_timeout(conn: psycopg.Connection, value: str) -> Iterator[None]:
    """The session's lock_timeout set to value meanwhile, the caller's restored afterwards: a CONCURRENTLY
    statement of migrate waits that long at most for a transaction in its way."""
    callers = conn.execute("select current_setting('lock_timeout')").fetchone()
    conn.execute("select set_config('lock_timeout', %s, false)", [value])
    try:
        yield
    finally:
        conn.execute("select set_config('lock_timeout', %s, false)", [callers[0] if callers else "0"])


def _rebuild_term_row_indexes(conn: psycopg.Connection) -> str:
    """After compactions: kb.term_stats's indexes still hold the entries of the rows folded into blocks (an
    upgrade to migration 049 folds every row). Rebuilt CONCURRENTLY, after the compactions' commit, so searches
    and writes go on, waiting at most VECTOR_INDEX_LOCK_TIMEOUT for a transaction in the way; in a session that
    is not autocommit, or when the wait runs out, they are left (their pages are reused by later rows)."""
    if not conn.autocommit:  # CONCURRENTLY cannot run in a transaction
        return ""
    with _lock_timeout(conn, VECTOR_INDEX_LOCK_TIMEOUT):
        try:
            conn.execute("reindex table concurrently kb.term_stats")
        except psycopg.Error as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return f"left the indexes of kb.term_stats as they are ({first})"
    return "rebuilt the indexes of kb.term_stats (its rows were compacted)"


def _lock_tables(conn: psycopg.Connection, wait_s: float) -> None:
    """Lock every kb table exclusively before changing anything, without ever waiting in a lock queue.

    Searches lock kb.users before kb.chunks while migrations alter them in another order, so waiting
    could deadlock with a running search (or stall every search behind the migration). Instead all
    locks are tried at once with NOWAIT; when one is taken the attempt is rolled back (releasing the
    rest) and retried until ``wait_s`` has passed."""
    tables = [
        r[0]
        for r in conn.execute(
            "select format('%I.%I', schemaname, tablename) from pg_tables where schemaname = 'kb' order by 1"
        ).fetchall()
    ]
    if not tables:
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with conn.transaction():  # a savepoint: a refused lock releases the ones already taken
                conn.execute(f"lock table {', '.join(tables)} in access exclusive mode nowait")
            return
        except psycopg.errors.LockNotAvailable:
            if time.monotonic() >= deadline:
                raise MigrationError(
                    f"could not lock the kb tables within {wait_s:g} s: long-running transactions are using "
                    "them (see pg_stat_activity); nothing was changed, run it again"
                ) from None
            time.sleep(0.05)


def _execute(conn: psycopg.Connection, path: Path, text: str) -> None:
    try:
        conn.execute(text)
    except psycopg.Error as e:
        raise MigrationError(f"{path.parent.name}/{path.name}: {e}") from e
