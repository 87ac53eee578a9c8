"""`pgkb mcp`: the MCP server for IDE agents (stdio, or streamable HTTP on 127.0.0.1:8766)."""

from __future__ import annotations


def register(sub) -> None:
    from pgkb.commands import add_server_options
    from pgkb.serving.config import DEFAULT_PORT

    parser = sub.add_parser("mcp", help="MCP server for IDE agents (stdio; --transport http on 127.0.0.1:8766)")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="default stdio")
    add_server_options(parser, DEFAULT_PORT)
    parser.add_argument(
        "--allow-writes", action="store_true",
        help="offer the save_knowledge tool: agents save notes into knowledge bases their user may write",
    )  # fmt: skip
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.mcp.server import serve

    return serve(
        settings, transport=args.transport, host=args.host, port=args.port, verbose=args.verbose,
        rerank=not args.no_rerank, allow_writes=args.allow_writes,
    )  # fmt: skip
