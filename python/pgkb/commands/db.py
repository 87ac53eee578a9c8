"""`pgkb db start|stop|status|url|migrate`: the embedded cluster and migrations; `pgkb db replica …`: its read
replicas (pgkb.commands.replica)."""

from __future__ import annotations

import sys

ACTIONS = {
    "start": "initialise (first use) and start the embedded cluster, and its replicas",
    "stop": "stop the embedded cluster and its replicas",
    "status": "state, data dir, port and URL of the embedded cluster; each replica's replay lag",
    "url": "print the connection URL (starts and migrates the embedded cluster if needed)",
    "migrate": "apply db/migrations and db/functions (to PGKB_DATABASE_URL or the embedded cluster)",
}


def register(sub) -> None:
    from pgkb.commands import replica

    parser = sub.add_parser("db", help="manage the database (embedded cluster, replicas, migrations)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="{" + ",".join([*ACTIONS, "replica"]) + "}")
    for name, text in ACTIONS.items():
        actions.add_parser(name, help=text, description=text).set_defaults(func=run)
    replica.register(actions)


def run(args, settings) -> int:
    from pgkb.cluster import embedded_cluster_from_env
    from pgkb.db import connect, database_url

    if args.action == "migrate":
        from pgkb.migrate import migrate

        with connect(database_url(settings, migrated=False, writable=True), vector=False) as conn:
            report = migrate(conn, settings.db_dir)
        for line in report.lines():
            print(f"pgkb: {line}")
        return 0
    if settings.database_url and args.action in ("start", "stop", "status"):
        print("pgkb: PGKB_DATABASE_URL is set; the embedded cluster is not used", file=sys.stderr)
        return 2
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
        return 0 if status.running else 3
    return 0
