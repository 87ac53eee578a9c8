"""Who is calling and from where: the pgkb user of a bearer token (``bearer_user``: a PGKB_MCP_TOKENS token,
else an API key kept in the database), and the Origin and Host checks against cross-site requests and DNS
rebinding that every HTTP endpoint applies."""

from __future__ import annotations

import hashlib
import hmac
import re
from urllib.parse import urlsplit

from pgkb.serving.config import LOOPBACK


def origin_allowed(origin: str, allowed: tuple[str, ...]) -> bool:
    """Localhost origins always; others only when listed (or ``*``)."""
    if "*" in allowed or origin in allowed:
        return True
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in LOOPBACK


def host_allowed(host_header: str | None) -> bool:
    """A Host header naming a loopback address (what a server bound to loopback accepts)."""
    return (host_header or "").rsplit(":", 1)[0].strip("[]") in LOOPBACK


def request_refusal(headers, allowed_origins: tuple[str, ...], loopback: bool) -> tuple[int, str] | None:
    """(HTTP status, message) for a request to refuse, or None: 403 for an ``Origin`` that is neither the
    server's own (``http://<Host>``), a loopback one nor listed in ``allowed_origins``; on a ``loopback``
    bind, 421 for a ``Host`` that names no loopback address (DNS rebinding)."""
    host, origin = headers.get("host"), headers.get("origin")
    if origin and origin != f"http://{host}" and not origin_allowed(origin, allowed_origins):
        return 403, f"Origin {origin[:200]} is not allowed (PGKB_MCP_ALLOWED_ORIGINS)"
    if loopback and not host_allowed(host):
        return 421, "Host must be localhost, 127.0.0.1 or [::1]"
    return None


def bearer(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value; None when absent or another scheme."""
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def user_for_token(tokens: dict[str, str], token: str | None) -> str | None:
    """The pgkb user a token maps to, or None; every known token is compared in constant time."""
    found = None
    for known, user in tokens.items():
        if token is not None and hmac.compare_digest(token.encode(), known.encode()):
            found = user
    return found


API_KEY = re.compile(r"pgkb_([0-9a-f]{16})_([0-9a-f]{64})")  # what kb.create_api_key hands out


def api_key_parts(token: str) -> tuple[str, bytes] | None:
    """(key_id, SHA-256 of the secret) of a token shaped like a pgkb API key, else None: all the database is
    told, so the secret itself never reaches it (nor its logs)."""
    match = API_KEY.fullmatch(token)
    if match is None:
        return None
    return match.group(1), hashlib.sha256(match.group(2).encode()).digest()


def bearer_user(backend, token: str | None) -> str | None:
    """The pgkb user a bearer token acts as, or None -- the one answer to "who is this" for the page, Dify's
    API and the MCP server: a PGKB_MCP_TOKENS token first (for development), then an API key kept in the
    database (``backend.api_key_user``: kb_service.verify_api_key; revoked and expired keys are None). Blocks on the
    database: call it from a worker thread. ServiceError when the database cannot answer."""
    if token is None:
        return None
    user = user_for_token(backend.config.tokens, token)
    if user is not None:
        return user
    parts = api_key_parts(token)
    return backend.api_key_user(*parts) if parts is not None else None


def accepts_token(backend):
    """``token -> bool``: whether the server's routes accept a bearer token (bearer_user), for /metrics in
    token mode; a database that cannot answer accepts none. Blocks: call from a worker thread."""
    from pgkb.serving.arguments import ServiceError

    def accepts(token: str | None) -> bool:
        try:
            return bearer_user(backend, token) is not None
        except ServiceError:
            return False

    return accepts
