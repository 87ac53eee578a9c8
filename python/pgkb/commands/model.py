"""`pgkb model list|add|use`: the embedding model registry."""

from __future__ import annotations

import sys


def register(sub) -> None:
    parser = sub.add_parser("model", help="embedding models: list, add (and backfill), use")
    parser.add_argument("action", choices=["list", "add", "use"])
    parser.add_argument("name", nargs="?")
    parser.add_argument("--dimension", type=int)
    parser.add_argument("--query-prefix", default="")
    parser.add_argument("--passage-prefix", default="")
    parser.add_argument(
        "--storage",
        choices=["vector", "halfvec"],
        help="how embeddings are stored and indexed (default: halfvec above 512 dimensions, vector otherwise)",
    )
    parser.add_argument("--force", action="store_true", help="use even if chunks still lack embeddings")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.db import connect, database_url, read_database_url
    from pgkb.rows import one

    # list reads (PGKB_READ_DATABASE_URL when set); add and use write, so a read-only database is refused
    url = read_database_url(settings) if args.action == "list" else database_url(settings, writable=True)
    with connect(url) as conn:
        if args.action == "add":
            if not args.name or not args.dimension:
                print("pgkb: model add needs NAME and --dimension", file=sys.stderr)
                return 2
            conn.execute(
                "select kb.register_embedding_model(%s, %s, %s, %s, make_default => false, storage => %s)",
                [args.name, args.dimension, args.query_prefix, args.passage_prefix, args.storage],
            )
            queued, storage = one(conn.execute("select queued, storage from kb.embedding_status(%s)", [args.name]))
            if args.storage:
                why = ""
            elif storage == "halfvec":
                why = " (above 512 dimensions)"
            else:
                why = " (512 dimensions or fewer)" if args.dimension <= 512 else " (registered before: kept as it was)"
            print(
                f"pgkb: registered {args.name} ({args.dimension}-d), stored and indexed as {storage}{why};"
                f" {queued} chunks queued for backfill"
            )
            print(
                f"pgkb: run `PGKB_EMBED_PROVIDER=<sentence-transformers or http> PGKB_EMBED_MODEL={args.name}"
                f" pgkb worker --once` (docs/ingest.md, Embedding models), then `pgkb model use {args.name}`"
            )
        elif args.action == "use":
            if not args.name:
                print("pgkb: model use needs NAME", file=sys.stderr)
                return 2
            missing = one(conn.execute("select kb.use_embedding_model(%s, %s)", [args.name, args.force]))[0]
            print(
                f"pgkb: {args.name} is now the default model"
                + (f" ({missing} chunks still missing)" if missing else "")
            )
        else:
            rows = conn.execute(
                "select model, dimension, storage, is_default, query_prefix, passage_prefix, embedded, queued,"
                " parked from kb.embedding_status()"
            ).fetchall()
            print(
                f"{'model':<32} {'dim':>5} {'storage':>7} {'default':>7} {'embedded':>9} {'queued':>7} {'parked':>7}"
                "  prefixes"
            )
            for name, dim, storage, default, qp, pp, done, queued, parked in rows:
                print(
                    f"{name:<32} {dim:>5} {storage:>7} {'yes' if default else '':>7} {done:>9} {queued:>7}"
                    f" {parked:>7}  {qp!r} / {pp!r}"
                )
    return 0
