"""`pgkb db start|stop|status|url|migrate`: the embedded cluster and migrations."""

from __future__ import annotations

import sys


def register(sub) -> None:
    parser = sub.add_parser("db", help="manage the database (embedded cluster, migrations)")
    parser.add_argument("action", choices=["start", "stop", "status", "url", "migrate"])
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.cluster import embedded_cluster_from_env
    from pgkb.db import connect, database_url
    from pgkb.migrate import migrate

    if args.action == "migrate":
        with connect(database_url(settings, migrated=False), vector=False) as conn:
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
        status = cluster.start()
        print(f"pgkb: database running (pid {status.pid}) at {status.url}")
    elif args.action == "stop":
        cluster.stop()
        print("pgkb: database stopped")
    else:
        status = cluster.status()
        state = "running" if status.running else ("stopped" if status.initialized else "not initialised")
        print(f"state: {state}\ndata_dir: {status.data_dir}\nport: {status.port}\nurl: {status.url}")
        return 0 if status.running else 3
    return 0
