"""The `pgkb` command line."""

from __future__ import annotations

import argparse
import sys

import psycopg

from pgkb.cluster import ClusterError, embedded_cluster_from_env
from pgkb.config import Settings
from pgkb.db import connect, database_url
from pgkb.migrate import MigrationError, migrate


def _cmd_db(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "migrate":
        with connect(vector=False) as conn:
            report = migrate(conn, settings.db_dir)
        for line in report.lines():
            print(f"pgkb: {line}")
        return 0
    if settings.database_url and args.action in ("start", "stop", "status"):
        print("pgkb: PGKB_DATABASE_URL is set; the embedded cluster is not used", file=sys.stderr)
        return 2
    cluster = embedded_cluster_from_env()
    if args.action == "start":
        status = cluster.start()
        print(f"pgkb: database running (pid {status.pid}) at {status.url}")
    elif args.action == "stop":
        cluster.stop()
        print("pgkb: database stopped")
    elif args.action == "status":
        status = cluster.status()
        state = "running" if status.running else ("stopped" if status.initialized else "not initialised")
        print(f"state: {state}\ndata_dir: {status.data_dir}\nport: {status.port}\nurl: {status.url}")
        return 0 if status.running else 3
    elif args.action == "url":
        print(database_url(settings))
    return 0


def _cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb.bench import run_search_bench

    run_search_bench(chunks=args.chunks, queries=args.queries, datasets=args.datasets, out=args.out, kb_name=args.kb)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgkb", description="A knowledge base inside PostgreSQL.")
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="manage the database (embedded cluster, migrations)")
    db.add_argument("action", choices=["start", "stop", "status", "url", "migrate"])
    db.set_defaults(func=_cmd_db)

    bench = sub.add_parser("bench", help="search latency benchmark: hybrid vs single legs")
    bench.add_argument("--chunks", type=int, default=100_000, help="synthetic chunks to load")
    bench.add_argument("--queries", type=int, default=200, help="queries to time per mode")
    bench.add_argument("--datasets", default="../shared/datasets", help="folder with the BEIR sets")
    bench.add_argument("--kb", default="bench", help="knowledge base to (re)load")
    bench.add_argument("--out", default=None, help="append a Markdown report to this file")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    try:
        return args.func(args, settings)
    except (ClusterError, MigrationError) as e:
        print(f"pgkb: error: {e}", file=sys.stderr)
        return 1
    except psycopg.OperationalError as e:
        print(f"pgkb: cannot reach the database: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
