"""The bounds the SQL API enforces (query length, top_k, candidates, norms, name lengths ...), as the database
states them in ``kb.limits()``: Python reads them, never restates them (tests/test_limits.py checks that no
literal bound is written in the package)."""

from __future__ import annotations

import threading
import weakref

_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def api_limits(conn) -> dict[str, float]:
    """kb.limits() as ``{name: value}``, read once per connection (a pooled connection keeps its copy)."""
    with _lock:
        cached = _cache.get(conn)
    if cached is None:
        cached = dict(conn.execute("select name, value from kb.limits()").fetchall())
        with _lock:
            _cache[conn] = cached
    return cached


def api_limit(conn, name: str) -> int:
    """One whole-number bound of kb.limits() (top_k, query_chars ...)."""
    return int(api_limits(conn)[name])
