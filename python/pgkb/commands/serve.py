"""`pgkb serve`: the search page for employees and Dify's External Knowledge API (127.0.0.1:8767)."""

from __future__ import annotations


def register(sub) -> None:
    from pgkb.commands import add_server_options
    from pgkb.web.app import DEFAULT_PORT

    parser = sub.add_parser(
        "serve", help="search page and Dify external knowledge API over HTTP (127.0.0.1:8767; pgkb key create)"
    )
    add_server_options(parser, DEFAULT_PORT)
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.web.app import serve

    return serve(settings, host=args.host, port=args.port, verbose=args.verbose, rerank=not args.no_rerank)
