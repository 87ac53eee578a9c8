"""`pgkb bench`: search latency by mode, HNSW recall, index builds, concurrency, MCP overhead; or ingestion
throughput (--ingest DIR)."""

from __future__ import annotations

import argparse
import sys


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def client_counts(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated client counts like 1,4,16, got {text!r}")
    return tuple(positive_int(p) for p in parts)


def register(sub) -> None:
    parser = sub.add_parser(
        "bench", help="search benchmark: latency by mode, HNSW recall, index builds, concurrency, MCP overhead"
    )
    parser.add_argument("--chunks", type=positive_int, default=100_000, help="synthetic chunks to load")
    parser.add_argument("--queries", type=positive_int, default=200, help="queries to time per mode")
    parser.add_argument("--datasets", default="../shared/datasets", help="folder with the BEIR sets")
    parser.add_argument("--kb", default="bench", help="knowledge base to (re)load")
    parser.add_argument("--out", default=None, help="append a Markdown report to this file")
    parser.add_argument(
        "--load",
        choices=["bulk", "replace"],
        default="bulk",
        help="bulk: SQL + COPY, indexes built after the load (timed); replace: through kb.replace_document",
    )
    parser.add_argument("--recall-queries", type=positive_int, default=200, help="queries for HNSW recall@10")
    parser.add_argument(
        "--clients", type=client_counts, default=(1, 4, 16), help="concurrency sweep client counts (default 1,4,16)"
    )
    parser.add_argument("--client-queries", type=positive_int, default=50, help="queries per client in the sweep")
    parser.add_argument(
        "--mcp-calls", type=non_negative_int, default=200, help="timed MCP search_knowledge calls (0: skip)"
    )
    parser.add_argument(
        "--set-queries",
        type=non_negative_int,
        default=400,
        help="questions per shared question set timed through kb.lexical_search (0: skip)",
    )
    parser.add_argument(
        "--maintenance-work-mem", default="4GB", help="maintenance_work_mem for the index builds of a bulk load"
    )
    parser.add_argument(
        "--vectors",
        choices=["uniform", "anchored"],
        default="uniform",
        help="chunk embeddings: uniform random unit vectors (worst case for HNSW, cost only) or anchored on "
        "real passage embeddings of the default model, with real query embeddings (use this for recall)",
    )
    parser.add_argument(
        "--anchors", type=positive_int, default=1500, help="real passages embedded for --vectors anchored"
    )
    parser.add_argument(
        "--allow-shared-database",
        action="store_true",
        help="bulk-load even when the database holds other knowledge bases (their searches lose the chunk and "
        "embedding indexes until the load ends; refused by default)",
    )
    parser.add_argument("--ingest", metavar="DIR", help="instead: ingestion throughput vs raw encode on DIR")
    parser.add_argument(
        "--dimension",
        type=positive_int,
        help="instead: a model of this many dimensions stored as vector against halfvec, on the chunks of the "
        "bench knowledge base already loaded (index size and build, recall@10, plain and hybrid p95)",
    )
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    if args.ingest:
        from pgkb.bench.ingest import run_ingest_bench

        run_ingest_bench(args.ingest, kb_name=args.kb, out=args.out)
        return 0
    from pgkb.bench.load import SharedDatabase

    if args.dimension:
        from pgkb.bench.precision import run_precision_bench

        try:
            run_precision_bench(
                args.dimension,
                kb_name=args.kb,
                datasets=args.datasets,
                queries=args.queries,
                recall_queries=args.recall_queries,
                maintenance_work_mem=args.maintenance_work_mem,
                anchors=args.anchors,
                out=args.out,
                settings=settings,
            )
        except (SharedDatabase, RuntimeError) as e:
            print(f"pgkb bench: error: {e}", file=sys.stderr)
            return 2
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
        set_queries=args.set_queries,
        maintenance_work_mem=args.maintenance_work_mem,
        vectors=args.vectors,
        anchors=args.anchors,
        allow_shared_database=args.allow_shared_database,
    )
    try:
        options.check()
    except ValueError as e:
        print(f"pgkb bench: error: {e}", file=sys.stderr)
        return 2
    try:
        run_search_bench(options, settings=settings)
    except SharedDatabase as e:
        print(f"pgkb bench: error: {e}", file=sys.stderr)
        return 2
    return 0
