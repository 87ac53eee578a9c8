"""`pgkb embed-server`: the OpenAI-compatible embedding / rerank HTTP server (127.0.0.1:8765)."""

from __future__ import annotations

import sys


def register(sub) -> None:
    from pgkb.embed_server import (
        DEFAULT_HOST,
        DEFAULT_MAX_PENDING,
        DEFAULT_MAX_PER_CLIENT,
        DEFAULT_PORT,
        LOCAL_PROVIDERS,
        RERANK_ENV,
        TOKEN_ENV,
    )

    parser = sub.add_parser("embed-server", help="OpenAI-compatible embedding/rerank HTTP server (127.0.0.1:8765)")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--token", default=None, help=f"bearer token clients must send (default: ${TOKEN_ENV})")
    parser.add_argument(
        "--provider", choices=LOCAL_PROVIDERS, default=None, help="embedding provider (default: offline)"
    )
    parser.add_argument("--model", default=None, help="sentence-transformers model name or path")
    parser.add_argument(
        "--served-name",
        action="append",
        default=[],
        help="model name clients may ask for (the registry name); repeatable, the first is reported",
    )
    parser.add_argument("--rerank-model", default=None, help=f"CrossEncoder name or path (default: ${RERANK_ENV})")
    parser.add_argument("--batch-size", type=int, default=None, help="texts per model call (default: PGKB_EMBED_BATCH)")
    parser.add_argument(
        "--max-pending",
        type=int,
        default=DEFAULT_MAX_PENDING,
        help=f"requests in progress at once; more get 503 + Retry-After (default {DEFAULT_MAX_PENDING})",
    )
    parser.add_argument(
        "--max-per-client",
        type=int,
        default=DEFAULT_MAX_PER_CLIENT,
        help=f"requests in progress per client address; more get 429 (default {DEFAULT_MAX_PER_CLIENT})",
    )
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    """Serve until SIGTERM/SIGINT; a bad configuration or a taken port prints and returns 1."""
    from pgkb import embed_server
    from pgkb.config import ConfigError
    from pgkb.models.embedding import EmbeddingError

    try:
        return embed_server.serve(
            args.host,
            args.port,
            args.token,
            provider=args.provider,
            model=args.model,
            served_names=args.served_name,
            rerank_model=args.rerank_model,
            batch_size=args.batch_size,
            max_pending=args.max_pending,
            max_per_client=args.max_per_client,
        )
    except (ConfigError, EmbeddingError, OSError) as e:
        print(f"pgkb: embed-server: {e}", file=sys.stderr)
        return 1
