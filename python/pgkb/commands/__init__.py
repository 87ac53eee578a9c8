"""The `pgkb` commands, one module each. Every module has ``register(sub)``: it adds its parser to the
subparsers ``sub`` and sets ``func`` to its ``run(args, settings) -> int``. Modules import what their command
needs inside ``run``, so `pgkb --help` and a quick command load little."""

from __future__ import annotations

import importlib

# in the order `pgkb --help` lists them
NAMES = (
    "up",
    "down",
    "db",
    "ingest",
    "worker",
    "model",
    "search",
    "ask",
    "rate",
    "questions",
    "gaps",
    "mcp",
    "serve",
    "key",
    "user",
    "team",
    "kb",
    "glossary",
    "embed_server",
    "eval",
    "sweep",
    "bench",
)


def add_server_options(parser, default_port: int) -> None:
    """The options every HTTP server command takes: --host, --port, --verbose, --no-rerank."""
    from pgkb.serving.config import DEFAULT_HOST

    parser.add_argument("--host", default=DEFAULT_HOST, help=f"HTTP address (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=default_port, help=f"HTTP port (default {default_port})")
    parser.add_argument("--verbose", action="store_true", help="log every stage to stderr")
    parser.add_argument("--no-rerank", action="store_true", help="ignore PGKB_RERANK_URL / PGKB_RERANK_MODEL")


def register_all(sub) -> None:
    """Add every command's parser to the argparse subparsers ``sub``."""
    for name in NAMES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
