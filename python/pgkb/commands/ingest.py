"""`pgkb ingest DIR --kb NAME`: sync a folder of documents into a knowledge base."""

from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    parser = sub.add_parser("ingest", help="sync a folder of documents into a knowledge base")
    parser.add_argument("path", help="folder to ingest (document keys are paths relative to it)")
    parser.add_argument("--kb", required=True, help="knowledge base name (created if missing)")
    parser.add_argument("--include", action="append", default=[], help="glob of files to take (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], help="glob of files/folders to skip (repeatable)")
    parser.add_argument("--no-delete", action="store_true", help="keep documents whose files are gone")
    parser.add_argument("--defer-embedding", action="store_true", help="queue chunks for `pgkb worker`")
    parser.add_argument("--base-url", help="source URL prefix, e.g. https://git.example.com/docs/blob/main")
    parser.add_argument("--max-chars", type=int, default=800, help="chunk size limit in characters")
    parser.add_argument("--overlap", type=int, default=0, help="characters repeated from the previous chunk")
    parser.add_argument("--heading-levels", type=int, default=3, help="heading levels that open sections")
    parser.add_argument("--max-file-mb", type=float, default=20, help="larger files are skipped as failures")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.chunking import ChunkingOptions
    from pgkb.db import connect, database_url
    from pgkb.ingest import DEFAULT_EXCLUDE, DEFAULT_INCLUDE, IngestAborted, IngestOptions, ingest
    from pgkb.migrate import maintain_vector_indexes
    from pgkb.models.embedding import load_embedder, model_spec
    from pgkb.models.vision import load_captioner

    options = IngestOptions(
        include=tuple(args.include) or DEFAULT_INCLUDE,
        exclude=DEFAULT_EXCLUDE + tuple(args.exclude),
        delete=not args.no_delete,
        defer_embedding=args.defer_embedding,
        base_url=args.base_url,
        max_file_bytes=int(args.max_file_mb * 1024 * 1024),
        chunking=ChunkingOptions(max_chars=args.max_chars, overlap=args.overlap, heading_levels=args.heading_levels),
    )
    url = database_url(settings, writable=True)  # refuses a read-only database (a standby)
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
                captioner=load_captioner(settings),
            )
        except IngestAborted as e:  # the database connection was lost for good: still report what was done
            summary = e.summary
        else:
            for name, action in maintain_vector_indexes(conn):  # a knowledge base grown past exact search
                print(f"pgkb: index kb.{name} {action}", file=sys.stderr)
    if args.json:
        print(summary.as_json())
    else:
        for failure in summary.failures:
            print(f"pgkb: failed {failure['doc_key']}: {failure['error']}", file=sys.stderr)
        print(f"pgkb: {summary.line()}")
    if summary.stopped:
        print(f"pgkb: ingest stopped early: {summary.stopped}", file=sys.stderr)
    if summary.vision_down and not args.json:
        print(f"pgkb: {summary.vision_down}", file=sys.stderr)
    # bad images are listed and counted (summary.images.failed) but, like failed captions, do not fail the run
    return 1 if summary.failed or summary.stopped else 0
