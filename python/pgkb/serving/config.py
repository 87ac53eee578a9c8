"""Configuration of the servers (`pgkb mcp`, `pgkb serve`) from the environment (PGKB_USER, PGKB_MCP_TOKENS,
PGKB_MCP_POOL_SIZE, …; PGKB_METRICS_ACCESS for the embed server too) and the limits every part of them shares."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pgkb.config import ConfigError, Settings
from pgkb.db import service_read_url
from pgkb.search import SearchOptions

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8766
MCP_MAX_TOP_K = 20
# a string argument (query, question, kb, doc_id) longer than this is refused before any work (transport
# hygiene); the rules for each (kb.limits(): query length, name lengths ...) are SQL's, and its errors say them
MAX_ARGUMENT_CHARS = 10_000
# a note's body for save_knowledge is refused above this before any work; kb.save_knowledge's bound
# (kb.settings save_max_chars) is the rule
MAX_NOTE_CHARS = 1_000_000
RESPONSE_BUDGET_CHARS = 60_000  # ~20k tokens for the whole tool result (text + structured content)
RESOURCE_BUDGET_CHARS = 1_000_000  # a document read as a resource
MAX_WINDOW = 20
EMBEDDER_RETRY_SECONDS = 60  # after a failed embedder load, searches run lexical-only this long before retrying
DEFAULT_POOL_SIZE = 8  # PGKB_MCP_POOL_SIZE: most connections the pool opens
# PGKB_MCP_MAX_CONCURRENT: tool calls served at once (default twice the pool); a call that finds every slot
# taken for SLOT_WAIT_SECONDS is turned away with a "busy" tool error instead of queueing behind the others
SLOT_WAIT_SECONDS = 1.0
POOL_MIN_SIZE = 1  # connections the pool keeps open (fewer when PGKB_MCP_POOL_SIZE is smaller)
CONNECT_TIMEOUT_SECONDS = 10
POOL_QUICK_WAIT_SECONDS = 2.0  # waited for a pooled connection before checking whether the database is up
POOL_WAIT_SECONDS = 30.0  # most a call waits for a free pooled connection (all busy) in total
READY_CONNECT_SECONDS = 3  # /readyz: the database must accept a connection this fast (libpq's minimum is 2)
METRICS_WAIT_SECONDS = 1.0  # /metrics: most it waits for a pooled connection to read the embedding backlog
LOOPBACK = ("localhost", "127.0.0.1", "::1")
MAX_CHUNK_INDEX = 2_000_000_000  # chunk ordinals are 32-bit integers
SHOWN_CHARS = 200  # a value echoed in a message shows at most this many characters, then "…"
MAX_MESSAGE_CHARS = 2000  # an error message as a whole
DEFAULT_EMBED_TIMEOUT_MS = 5000  # PGKB_MCP_EMBED_TIMEOUT_MS: longest a query embedding may take (0: no limit)
EMBED_WORKERS = 2  # query embeddings running at once (an abandoned one finishes in the background)
# a database API key's verdict (its user, or refused) is reused this long: a revoked or expired key is refused
# within it, and the MCP guard and the tool it lets through ask the database once, not twice
API_KEY_CACHE_SECONDS = 0.5
API_KEY_CACHE_SIZE = 10_000  # verdicts kept at most (the cache is emptied when full)
_SURROGATE = re.compile("[\ud800-\udfff]")
METRICS_ACCESS_ENV = "PGKB_METRICS_ACCESS"
METRICS_ACCESS = ("loopback", "token", "open")  # who may read /metrics: see pgkb.serving.monitoring


def parse_tokens(raw: str) -> dict[str, str]:
    """``"token1:alice,token2:bob"`` -> {token: user}; ConfigError for malformed entries. These tokens are
    for development (no expiry, revoked by a restart); people use API keys kept in the database."""
    tokens: dict[str, str] = {}
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        token, sep, user = entry.rpartition(":")
        if not sep or not token.strip() or not user.strip():
            raise ConfigError('PGKB_MCP_TOKENS must look like "token1:alice,token2:bob"')
        tokens[token.strip()] = user.strip()
    return tokens


@dataclass
class ServiceConfig:
    settings: Settings
    database_url: str
    default_user: str | None = None
    tokens: dict[str, str] = field(default_factory=dict)
    allowed_origins: tuple[str, ...] = ()
    options: SearchOptions = field(default_factory=SearchOptions)
    query_log: Path | None = None
    verbose: bool = False
    pool_size: int = DEFAULT_POOL_SIZE
    embed_timeout_ms: int = DEFAULT_EMBED_TIMEOUT_MS
    max_concurrent: int = 2 * DEFAULT_POOL_SIZE
    metrics_access: str = "loopback"
    allow_writes: bool = False  # `pgkb mcp --allow-writes`: the save_knowledge tool is offered

    @classmethod
    def from_env(
        cls, settings: Settings, env: Mapping[str, str] | None = None, *, verbose: bool = False
    ) -> ServiceConfig:
        env = os.environ if env is None else env
        log_path = env.get("PGKB_QUERY_LOG", "").strip()
        pool_size = _whole_number(env, "PGKB_MCP_POOL_SIZE", DEFAULT_POOL_SIZE, 1)
        max_concurrent = _whole_number(env, "PGKB_MCP_MAX_CONCURRENT", 2 * pool_size, 1)
        embed_timeout_ms = _whole_number(env, "PGKB_MCP_EMBED_TIMEOUT_MS", DEFAULT_EMBED_TIMEOUT_MS, 0)
        return cls(
            settings=settings,
            database_url=service_read_url(settings),
            default_user=env.get("PGKB_USER", "").strip() or None,
            tokens=parse_tokens(env.get("PGKB_MCP_TOKENS", "")),
            allowed_origins=tuple(o.strip() for o in env.get("PGKB_MCP_ALLOWED_ORIGINS", "").split(",") if o.strip()),
            options=SearchOptions.from_env(env),
            query_log=Path(log_path) if log_path else None,
            verbose=verbose,
            pool_size=pool_size,
            embed_timeout_ms=embed_timeout_ms,
            max_concurrent=max_concurrent,
            metrics_access=metrics_access(env),
        )


def metrics_access(env=None) -> str:
    """PGKB_METRICS_ACCESS (default loopback); ConfigError for a value not in METRICS_ACCESS."""
    raw = (os.environ if env is None else env).get(METRICS_ACCESS_ENV, "").strip().lower() or "loopback"
    if raw not in METRICS_ACCESS:
        raise ConfigError(f"{METRICS_ACCESS_ENV} must be one of {', '.join(METRICS_ACCESS)}, got {raw[:40]!r}")
    return raw


def _whole_number(env, name: str, default: int, minimum: int) -> int:
    """An integer environment variable of at least ``minimum`` (``default`` when unset or empty)."""
    raw = env.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ConfigError(f"{name} must be a whole number >= {minimum}, got {raw!r}")
    return value
