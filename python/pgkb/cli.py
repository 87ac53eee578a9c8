"""The `pgkb` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg

from pgkb.chunking import ChunkingError
from pgkb.cluster import ClusterError, embedded_cluster_from_env
from pgkb.config import ConfigError, Settings
from pgkb.db import connect, database_url
from pgkb.migrate import MigrationError, migrate
from pgkb.models.embedding import EmbeddingError


def _cmd_db(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "migrate":
        with connect(database_url(settings, migrated=False), vector=False) as conn:
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


def _cmd_ingest(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb.chunking import ChunkingOptions
    from pgkb.ingest import DEFAULT_EXCLUDE, DEFAULT_INCLUDE, IngestAborted, IngestOptions, ingest
    from pgkb.models.embedding import load_embedder, model_spec

    options = IngestOptions(
        include=tuple(args.include) or DEFAULT_INCLUDE,
        exclude=DEFAULT_EXCLUDE + tuple(args.exclude),
        delete=not args.no_delete,
        defer_embedding=args.defer_embedding,
        base_url=args.base_url,
        max_file_bytes=int(args.max_file_mb * 1024 * 1024),
        chunking=ChunkingOptions(max_chars=args.max_chars, overlap=args.overlap, heading_levels=args.heading_levels),
    )
    url = database_url(settings)
    with connect(url) as conn:
        spec = model_spec(conn, settings.embed_model)
        embedder = None if args.defer_embedding else load_embedder(settings, spec)
        try:
            summary = ingest(
                conn,
                url,
                Path(args.path),
                args.kb,
                spec,
                embedder,
                options,
                progress=sys.stderr.isatty() and not args.json,
            )
        except IngestAborted as e:  # the database connection was lost for good: still report what was done
            summary = e.summary
    if args.json:
        print(summary.as_json())
    else:
        for failure in summary.failures:
            print(f"pgkb: failed {failure['doc_key']}: {failure['error']}", file=sys.stderr)
        print(f"pgkb: {summary.line()}")
    if summary.stopped:
        print(f"pgkb: ingest stopped early: {summary.stopped}", file=sys.stderr)
    return 1 if summary.failed or summary.stopped else 0


def _cmd_model(args: argparse.Namespace, settings: Settings) -> int:
    with connect() as conn:
        if args.action == "add":
            if not args.name or not args.dimension:
                print("pgkb: model add needs NAME and --dimension", file=sys.stderr)
                return 2
            conn.execute(
                "select kb.register_embedding_model(%s, %s, %s, %s, make_default => false)",
                [args.name, args.dimension, args.query_prefix, args.passage_prefix],
            )
            queued = conn.execute("select queued from kb.embedding_status(%s)", [args.name]).fetchone()[0]
            print(f"pgkb: registered {args.name} ({args.dimension}-d); {queued} chunks queued for backfill")
            print(f"pgkb: run `PGKB_EMBED_MODEL={args.name} pgkb worker --once`, then `pgkb model use {args.name}`")
        elif args.action == "use":
            missing = conn.execute("select kb.use_embedding_model(%s, %s)", [args.name, args.force]).fetchone()[0]
            print(
                f"pgkb: {args.name} is now the default model"
                + (f" ({missing} chunks still missing)" if missing else "")
            )
        else:
            rows = conn.execute(
                "select model, dimension, is_default, query_prefix, passage_prefix, embedded, queued, parked"
                " from kb.embedding_status()"
            ).fetchall()
            print(f"{'model':<32} {'dim':>5} {'default':>7} {'embedded':>9} {'queued':>7} {'parked':>7}  prefixes")
            for name, dim, default, qp, pp, done, queued, parked in rows:
                print(
                    f"{name:<32} {dim:>5} {'yes' if default else '':>7} {done:>9} {queued:>7} {parked:>7}"
                    f"  {qp!r} / {pp!r}"
                )
    return 0


def _cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb.worker import run_cli

    return run_cli(settings, once=args.once, batch=args.batch, model=args.model)


def _cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb.launcher import up

    return up(Path(args.docs) if args.docs else None, args.kb, args.user, args.embed_port, args.mcp_port)


def _cmd_down(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb.launcher import down

    return down()


def _cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb import search

    return search.run(args, settings)


def _cmd_mcp(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb.mcp import server as mcp_server

    return mcp_server.run(args, settings)


def _cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb.quality import evaluate

    return evaluate.run(args, settings)


def _cmd_sweep(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb.quality import sweep

    return sweep.run(args, settings)


def _cmd_embed_server(args: argparse.Namespace, settings: Settings) -> int:
    from pgkb import embed_server

    return embed_server.run(args)


def _cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    if args.ingest:
        from pgkb.bench.ingest import run_ingest_bench

        run_ingest_bench(args.ingest, kb_name=args.kb, out=args.out)
        return 0
    from pgkb.bench.run import BenchOptions, run_search_bench

    options = BenchOptions(
        chunks=args.chunks,
        queries=args.queries,
        datasets=args.datasets,
        kb_name=args.kb,
        out=args.out,
        load=args.load,
        recall_queries=args.recall_queries,
        clients=args.clients,
        client_queries=args.client_queries,
        mcp_calls=args.mcp_calls,
        maintenance_work_mem=args.maintenance_work_mem,
        vectors=args.vectors,
        anchors=args.anchors,
    )
    try:
        options.check()
    except ValueError as e:
        print(f"pgkb bench: error: {e}", file=sys.stderr)
        return 2
    run_search_bench(options, settings=settings)
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def _client_counts(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated client counts like 1,4,16, got {text!r}")
    return tuple(_positive_int(p) for p in parts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgkb", description="A knowledge base inside PostgreSQL.")
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="manage the database (embedded cluster, migrations)")
    db.add_argument("action", choices=["start", "stop", "status", "url", "migrate"])
    db.set_defaults(func=_cmd_db)

    up = sub.add_parser("up", help="start database, embed-server and MCP server, ingest docs (make run)")
    up.add_argument("--docs", help="folder to ingest (default: examples/kb)")
    up.add_argument("--kb", default="team-docs", help="knowledge base (public) to ingest into")
    up.add_argument("--user", default="dev", help="pgkb user the MCP server acts for")
    up.add_argument("--embed-port", type=int, default=8765)
    up.add_argument("--mcp-port", type=int, default=8766)
    up.set_defaults(func=_cmd_up)
    down = sub.add_parser("down", help="stop the MCP server, embed-server and embedded database")
    down.set_defaults(func=_cmd_down)

    ing = sub.add_parser("ingest", help="sync a folder of documents into a knowledge base")
    ing.add_argument("path", help="folder to ingest (document keys are paths relative to it)")
    ing.add_argument("--kb", required=True, help="knowledge base name (created if missing)")
    ing.add_argument("--include", action="append", default=[], help="glob of files to take (repeatable)")
    ing.add_argument("--exclude", action="append", default=[], help="glob of files/folders to skip (repeatable)")
    ing.add_argument("--no-delete", action="store_true", help="keep documents whose files are gone")
    ing.add_argument("--defer-embedding", action="store_true", help="queue chunks for `pgkb worker`")
    ing.add_argument("--base-url", help="source URL prefix, e.g. https://git.example.com/docs/blob/main")
    ing.add_argument("--max-chars", type=int, default=800, help="chunk size limit in characters")
    ing.add_argument("--overlap", type=int, default=0, help="characters repeated from the previous chunk")
    ing.add_argument("--heading-levels", type=int, default=3, help="heading levels that open sections")
    ing.add_argument("--max-file-mb", type=float, default=20, help="larger files are skipped as failures")
    ing.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    ing.set_defaults(func=_cmd_ingest)

    model = sub.add_parser("model", help="embedding models: list, add (and backfill), use")
    model.add_argument("action", choices=["list", "add", "use"])
    model.add_argument("name", nargs="?")
    model.add_argument("--dimension", type=int)
    model.add_argument("--query-prefix", default="")
    model.add_argument("--passage-prefix", default="")
    model.add_argument("--force", action="store_true", help="use even if chunks still lack embeddings")
    model.set_defaults(func=_cmd_model)

    worker = sub.add_parser("worker", help="embed queued chunks (written without embeddings) until stopped")
    worker.add_argument("--once", action="store_true", help="exit when nothing is due")
    worker.add_argument("--batch", type=int, default=None, help="chunks per claim (default PGKB_EMBED_BATCH)")
    worker.add_argument("--model", default=None, help="registry model (default PGKB_EMBED_MODEL, else the default)")
    worker.set_defaults(func=_cmd_worker)

    from pgkb import search as search_cmd
    from pgkb.mcp import server as mcp_server

    se = sub.add_parser("search", help="hybrid search: rank, score, title > headings, source, snippet")
    search_cmd.add_arguments(se)
    se.set_defaults(func=_cmd_search)

    mcp = sub.add_parser("mcp", help="MCP server for IDE agents (stdio; --transport http on 127.0.0.1:8766)")
    mcp_server.add_arguments(mcp)
    mcp.set_defaults(func=_cmd_mcp)

    from pgkb.quality import evaluate

    ev = sub.add_parser("eval", help="retrieval quality: Recall@k, MRR, nDCG per search mode (BEIR or doc questions)")
    evaluate.add_arguments(ev)
    ev.set_defaults(func=_cmd_eval)

    from pgkb.quality import sweep

    sw = sub.add_parser("sweep", help="compare search settings on datasets `pgkb eval` has loaded (nDCG@10 grid)")
    sweep.add_arguments(sw)
    sw.set_defaults(func=_cmd_sweep)

    from pgkb import embed_server

    es = sub.add_parser("embed-server", help="OpenAI-compatible embedding/rerank HTTP server (127.0.0.1:8765)")
    embed_server.add_arguments(es)
    es.set_defaults(func=_cmd_embed_server)

    bench = sub.add_parser(
        "bench", help="search benchmark: latency by mode, HNSW recall, index builds, concurrency, MCP overhead"
    )
    bench.add_argument("--chunks", type=_positive_int, default=100_000, help="synthetic chunks to load")
    bench.add_argument("--queries", type=_positive_int, default=200, help="queries to time per mode")
    bench.add_argument("--datasets", default="../shared/datasets", help="folder with the BEIR sets")
    bench.add_argument("--kb", default="bench", help="knowledge base to (re)load")
    bench.add_argument("--out", default=None, help="append a Markdown report to this file")
    bench.add_argument(
        "--load",
        choices=["bulk", "replace"],
        default="bulk",
        help="bulk: SQL + COPY, indexes built after the load (timed); replace: through kb.replace_document",
    )
    bench.add_argument("--recall-queries", type=_positive_int, default=200, help="queries for HNSW recall@10")
    bench.add_argument(
        "--clients", type=_client_counts, default=(1, 4, 16), help="concurrency sweep client counts (default 1,4,16)"
    )
    bench.add_argument("--client-queries", type=_positive_int, default=50, help="queries per client in the sweep")
    bench.add_argument(
        "--mcp-calls", type=_non_negative_int, default=200, help="timed MCP search_knowledge calls (0: skip)"
    )
    bench.add_argument(
        "--maintenance-work-mem", default="4GB", help="maintenance_work_mem for the index builds of a bulk load"
    )
    bench.add_argument(
        "--vectors",
        choices=["uniform", "anchored"],
        default="uniform",
        help="chunk embeddings: uniform random unit vectors (worst case for HNSW, cost only) or anchored on "
        "real passage embeddings of the default model, with real query embeddings (use this for recall)",
    )
    bench.add_argument(
        "--anchors", type=_positive_int, default=1500, help="real passages embedded for --vectors anchored"
    )
    bench.add_argument("--ingest", metavar="DIR", help="instead: ingestion throughput vs raw encode on DIR")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        return args.func(args, settings)
    except ConfigError as e:
        print(f"pgkb: {args.command}: {e}", file=sys.stderr)
        return 2
    except (ClusterError, MigrationError, EmbeddingError, ChunkingError, FileNotFoundError) as e:
        print(f"pgkb: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pgkb: interrupted", file=sys.stderr)
        return 130
    except psycopg.OperationalError as e:
        print(f"pgkb: cannot reach the database: {e}", file=sys.stderr)
        return 1
    except psycopg.DatabaseError as e:
        print(f"pgkb: error: {e.diag.message_primary or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
