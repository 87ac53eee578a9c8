"""`pgkb mcp`: the MCP server for IDE agents (stdio, or streamable HTTP on 127.0.0.1:8766)."""

from __future__ import annotations


def register(sub) -> None:
    from pgkb.serving.config import DEFAULT_HOST, DEFAULT_PORT

    parser = sub.add_parser("mcp", help="MCP server for IDE agents (stdio; --transport http on 127.0.0.1:8766)")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="default stdio")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"HTTP address (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})")
    parser.add_argument("--verbose", action="store_true", help="log every stage to stderr")
    parser.add_argument("--no-rerank", action="store_true", help="ignore PGKB_RERANK_URL / PGKB_RERANK_MODEL")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.mcp.server import serve

    return serve(
        settings, transport=args.transport, host=args.host, port=args.port, verbose=args.verbose,
        rerank=not args.no_rerank,
    )  # fmt: skip
