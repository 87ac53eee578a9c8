"""The `pgkb` command line: the commands (pgkb.commands, one module each) and how their errors end."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

import psycopg

from pgkb.chunking import ChunkingError
from pgkb.cluster import ClusterError
from pgkb.commands import register_all
from pgkb.config import ConfigError, Settings
from pgkb.migrate import MigrationError
from pgkb.models.embedding import EmbeddingError


def version() -> str:
    """The installed distribution's version: pyproject.toml's, the one source of truth."""
    try:
        return metadata.version("pgkb")
    except metadata.PackageNotFoundError:  # run from a checkout through PYTHONPATH, never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgkb", description="A knowledge base inside PostgreSQL.")
    parser.add_argument("--version", action="version", version=f"pgkb {version()}")
    register_all(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        return args.func(args, settings)
    except ConfigError as e:
        print(f"pgkb: {args.command}: {e}", file=sys.stderr)
        return 2
    except (ClusterError, MigrationError, EmbeddingError, ChunkingError, FileNotFoundError) as e:
        print(f"pgkb: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pgkb: interrupted", file=sys.stderr)
        return 130
    except psycopg.DatabaseError as e:
        # a connection that failed or was lost has no SQLSTATE, or one of class 08 / 57P (admin shutdown);
        # psycopg files refusals such as 55000 (object not in prerequisite state) under OperationalError too
        state = e.sqlstate or ""
        if isinstance(e, psycopg.OperationalError) and (not state or state.startswith(("08", "57P"))):
            print(f"pgkb: cannot reach the database: {e}", file=sys.stderr)
            return 1
        hint = e.diag.message_hint
        print(f"pgkb: error: {e.diag.message_primary or e}" + (f" ({hint})" if hint else ""), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
