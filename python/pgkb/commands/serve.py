"""`pgkb serve`: the search page for employees and Dify's External Knowledge API (127.0.0.1:8767)."""

from __future__ import annotations


def register(sub) -> None:
    from pgkb.serving.config import DEFAULT_HOST
    from pgkb.web.app import DEFAULT_PORT

    parser = sub.add_parser(
        "serve", help="search page and Dify external knowledge API over HTTP (127.0.0.1:8767; PGKB_MCP_TOKENS)"
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--verbose", action="store_true", help="log every request's stages to stderr")
    parser.add_argument("--no-rerank", action="store_true", help="ignore PGKB_RERANK_URL / PGKB_RERANK_MODEL")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.web.app import serve

    return serve(settings, host=args.host, port=args.port, verbose=args.verbose, rerank=not args.no_rerank)
