"""`pgkb down`: stop what `pgkb up` started."""

from __future__ import annotations


def register(sub) -> None:
    parser = sub.add_parser("down", help="stop the MCP server, embed-server and embedded database")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.launcher import down

    return down()
