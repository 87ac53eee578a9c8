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
    "mcp",
    "serve",
    "embed_server",
    "eval",
    "sweep",
    "bench",
)


def register_all(sub) -> None:
    """Add every command's parser to the argparse subparsers ``sub``."""
    for name in NAMES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
