"""`pgkb up`: database, embed-server and MCP server started, documents ingested (what `make run` runs)."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    parser = sub.add_parser("up", help="start database, embed-server and MCP server, ingest docs (make run)")
    parser.add_argument("--docs", help="folder to ingest (default: examples/kb)")
    parser.add_argument("--kb", default="team-docs", help="knowledge base (public) to ingest into")
    parser.add_argument("--user", default="dev", help="pgkb user the MCP server acts for")
    parser.add_argument("--embed-port", type=int, default=8765)
    parser.add_argument("--mcp-port", type=int, default=8766)
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.launcher import up

    return up(Path(args.docs) if args.docs else None, args.kb, args.user, args.embed_port, args.mcp_port)
