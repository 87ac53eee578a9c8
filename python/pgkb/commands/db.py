"""`pgkb db start|stop|status|url|migrate|doctor`: the embedded cluster, migrations and the indexes pgkb
expects (status reports a missing or invalid one, migrate re-creates it), the database's health with a fix
for each problem (doctor, pgkb.doctor); `pgkb db replica …`: its read replicas (pgkb.commands.replica)."""

from __future__ import annotations

import sys

ACTIONS = {
    "start": "initialise (first use) and start the embedded cluster, and its replicas",
    "stop": "stop the embedded cluster and its replicas",
    "status": "state, data dir, port and URL of the embedded cluster; each replica's replay lag; the indexes "
    "pgkb expects that are missing or invalid (also for PGKB_DATABASE_URL)",
    "url": "print the connection URL (starts and migrates the embedded cluster if needed)",
    "migrate": "apply db/migrations and db/functions and re-create missing indexes (to PGKB_DATABASE_URL or the "
    "embedded cluster)",
    "doctor": "check the database's health (indexes, extensions, numpy, row security, privileges, migrations, "
    "settings, embeddings) and the configured embedder; print each problem with its fix. Exit 0 healthy, "
    "1 problems, 2 no usable connection",
}


def register(sub) -> None:
    from pgkb.commands import replica

    parser = sub.add_parser("db", help="manage the database (embedded cluster, replicas, migrations)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="{" + ",".join([*ACTIONS, "replica"]) + "}")
    for name, text in ACTIONS.items():
        action = actions.add_parser(name, help=text, description=text)
        action.set_defaults(func=run)
        if name == "doctor":
            action.add_argument("--json", action="store_true", help="print the findings as JSON")
    replica.register(actions)


def run(args, settings) -> int:
    from pgkb.cluster import embedded_cluster_from_env
    from pgkb.db import connect, database_url

    if args.action == "doctor":
        return _doctor(settings, args.json)
    if args.action == "migrate":
        from pgkb.migrate import migrate

        with connect(database_url(settings, migrated=False, writable=True), vector=False) as conn:
            report = migrate(conn, settings.db_dir)
        for line in report.lines():
            print(f"pgkb: {line}")
        return 0
    if settings.database_url and args.action in ("start", "stop", "status"):
        print("pgkb: PGKB_DATABASE_URL is set; the embedded cluster is not used", file=sys.stderr)
        return _report_indexes(settings.database_url) if args.action == "status" else 2
    if args.action == "url":
        print(database_url(settings))
        return 0
    cluster = embedded_cluster_from_env()
    if args.action == "start":
        status = cluster.start()  # the replicas start with it (pgkb.replica's lifecycle hook)
        print(f"pgkb: database running (pid {status.pid}) at {status.url}")
    elif args.action == "stop":
        cluster.stop()  # and the replicas stop
        print("pgkb: database stopped")
    else:
        from pgkb.commands.replica import describe
        from pgkb.replica import replica_states

        status = cluster.status()
        state = "running" if status.running else ("stopped" if status.initialized else "not initialised")
        print(f"state: {state}\ndata_dir: {status.data_dir}\nport: {status.port}\nurl: {status.url}")
        for replica in replica_states(cluster):
            print(f"replica {replica.replica.name}: {describe(replica)}")
        return _report_indexes(status.url) if status.running else 3
    return 0


def _lexical_engine(conn) -> str:
    """Which BM25 leg serves and why (kb_admin.lexical_engine_choice)."""
    import psycopg

    try:
        with conn.transaction():
            engine, reason = conn.execute("select engine, reason from kb_admin.lexical_engine_choice()").fetchone()
    except psycopg.Error as e:
        return f"unknown ({str(e).strip().splitlines()[0]})"
    return f"{engine} ({reason})" if engine == "numpy" else f"{engine} in SQL ({reason})"


def _languages(conn) -> list[str]:
    """A line per knowledge base with its language profile (kb.list_knowledge_bases), and the lexicon's edition."""
    import psycopg

    from pgkb.languages import describe

    try:
        with conn.transaction():
            rows = conn.execute("select name, chunk_count, languages from kb.list_knowledge_bases()").fetchall()
            edition = conn.execute(
                "select edition || ', ' || entries || ' entries' from kb_internal.lexicon_edition"
            ).fetchone()
    except psycopg.Error:
        return []  # a schema before migration 032
    lines = [f"knowledge base {n}: {c} chunks, {describe(p) or 'empty'}" for n, c, p in rows]
    return lines + [f"lexicon: {edition[0] if edition else 'not loaded (pgkb db migrate loads it)'}"]


def _report_indexes(url: str) -> int:
    """Print each index pgkb expects that searches cannot use (missing or invalid); 4 when there is one."""
    import psycopg

    from pgkb.db import connect
    from pgkb.migrate import index_problems
    from pgkb.rows import one

    try:
        with connect(url, vector=False) as conn:
            if one(conn.execute("select to_regprocedure('kb_admin.index_problems()')"))[0] is None:
                print("indexes: not checked (no pgkb schema of this version: run `pgkb db migrate`)")
                return 0
            problems = index_problems(conn)
            engine = _lexical_engine(conn)
            languages = _languages(conn)
    except psycopg.Error as e:
        print(f"indexes: not checked ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})")
        return 0
    print(f"BM25 leg: {engine}")
    for line in languages:
        print(line)
    for name, problem in problems:
        print(f"index kb.{name}: {problem} (searches that need it scan sequentially; `pgkb db migrate` re-creates it)")
    if not problems:
        print("indexes: every index pgkb expects is present and valid")
    return 4 if problems else 0


def _doctor(settings, as_json: bool) -> int:
    """Print the findings of pgkb.doctor (as JSON with ``as_json``); 0 when there is no problem, 1 when there
    is one, 2 when the database cannot be reached or the role may not run the doctor."""
    import json

    import psycopg

    from pgkb.cluster import ClusterError
    from pgkb.db import connect, database_url
    from pgkb.doctor import NotAdministratorError, examine

    try:
        with connect(database_url(settings, migrated=False), vector=False) as conn:
            findings = examine(conn, settings)
    except (psycopg.OperationalError, ClusterError, NotAdministratorError) as e:
        print(f"pgkb: db doctor: {str(e).strip() or type(e).__name__}", file=sys.stderr)
        return 2
    problems = sum(f.status == "problem" for f in findings)
    if as_json:
        print(json.dumps({"healthy": not problems, "problems": problems, "checks": [f.as_dict() for f in findings]}))
        return 1 if problems else 0
    for f in findings:
        print(f"{'PROBLEM' if f.status == 'problem' else f.status:<8} {f.check}: {f.detail}")
        if f.fix:
            print(f"{'':<8} fix: {f.fix}")
    print(f"pgkb: {problems} problem{'s' if problems != 1 else ''} found" if problems else "pgkb: healthy")
    return 1 if problems else 0
