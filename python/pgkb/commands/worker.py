"""`pgkb worker`: embed the chunks queued without embeddings."""

from __future__ import annotations


def register(sub) -> None:
    parser = sub.add_parser("worker", help="embed queued chunks (written without embeddings) until stopped")
    parser.add_argument("--once", action="store_true", help="exit when nothing is due")
    parser.add_argument("--batch", type=int, default=None, help="chunks per claim (default PGKB_EMBED_BATCH)")
    parser.add_argument("--model", default=None, help="registry model (default PGKB_EMBED_MODEL, else the default)")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.worker import run_cli

    return run_cli(settings, once=args.once, batch=args.batch, model=args.model)
