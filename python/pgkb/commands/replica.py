"""`pgkb db replica add [NAME] [--port N] | list [--json] | remove NAME`: read replicas (hot standbys) of the
embedded cluster, see pgkb.replica. For a replica of another server, docs/operations.md ("A replica on another
host") lists the steps."""

from __future__ import annotations

import json
import sys


def register(actions) -> None:
    """Add ``replica`` to the ``pgkb db`` actions."""
    parser = actions.add_parser(
        "replica",
        help="read replicas of the embedded cluster: add, list, remove",
        description="Hot standbys of the embedded cluster, fed by streaming replication through a slot.",
    )
    ops = parser.add_subparsers(dest="replica_action", required=True)
    add = ops.add_parser("add", help="copy the embedded cluster (pg_basebackup) and start it as a hot standby")
    add.add_argument("name", nargs="?", help="replica name (default: replica1, replica2, …)")
    add.add_argument("--port", type=int, help="its port, naming its unix socket (default: the next free one)")
    lst = ops.add_parser("list", help="name, port, state, replay lag (bytes, seconds), data dir")
    lst.add_argument("--json", action="store_true", help="one JSON object per replica")
    remove = ops.add_parser("remove", help="stop a replica, delete its data directory, drop its slot")
    remove.add_argument("name")
    parser.set_defaults(func=run)


def describe(state) -> str:
    """One line: state, port, replay lag, data directory."""
    lag = "lag unknown" if state.lag_bytes is None else f"lag {state.lag_bytes} bytes"
    if state.lag_seconds is not None:
        lag += f", {state.lag_seconds:.3f} s"
    return f"{state.state}, port {state.replica.port}, {lag}, data {state.replica.data_dir}"


def run(args, settings) -> int:
    from pgkb.cluster import embedded_cluster_from_env
    from pgkb.db import database_url
    from pgkb.replica import add_replica, read_url, remove_replica, replica_states

    if settings.database_url:
        print(
            "pgkb: db replica: PGKB_DATABASE_URL is set; `pgkb db replica` manages replicas of the embedded cluster "
            '(for a replica of another server, see docs/operations.md, "A replica on another host")',
            file=sys.stderr,
        )
        return 2
    primary = embedded_cluster_from_env()
    if args.replica_action == "add":
        database_url(settings)  # started and migrated first, so the copy has the whole schema
        replica = add_replica(primary, args.name, args.port)
        print(f"pgkb: replica {replica.name} is streaming from the primary (port {replica.port}, slot {replica.slot})")
        print(f"pgkb: data {replica.data_dir}; url {replica.cluster(primary).url()}")
        print(f"pgkb: readers: export PGKB_READ_DATABASE_URL='{read_url(primary)}'")
    elif args.replica_action == "remove":
        replica = remove_replica(primary, args.name)
        print(f"pgkb: replica {replica.name} removed (server stopped, {replica.data_dir} deleted, slot dropped)")
    else:
        states = replica_states(primary)
        if args.json:
            for s in states:
                print(
                    json.dumps(
                        {
                            "name": s.replica.name,
                            "port": s.replica.port,
                            "data_dir": str(s.replica.data_dir),
                            "state": s.state,
                            "lag_bytes": s.lag_bytes,
                            "lag_seconds": s.lag_seconds,
                            "slot": s.replica.slot,
                            "url": s.url,
                        }
                    )
                )
            return 0
        if not states:
            print("no replicas (pgkb db replica add)")
            return 0
        print(f"{'name':<16} {'port':>5}  {'state':<13} {'lag bytes':>10} {'lag s':>8}  data dir")
        for s in states:
            seconds = "-" if s.lag_seconds is None else f"{s.lag_seconds:.3f}"
            lag = "-" if s.lag_bytes is None else str(s.lag_bytes)
            name, port, data = s.replica.name, s.replica.port, s.replica.data_dir
            print(f"{name:<16} {port:>5}  {s.state:<13} {lag:>10} {seconds:>8}  {data}")
        print(f"\nPGKB_READ_DATABASE_URL='{read_url(primary)}'")
    return 0
