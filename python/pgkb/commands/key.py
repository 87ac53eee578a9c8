"""`pgkb key create|list|revoke`: API keys for `pgkb serve` and `pgkb mcp --transport http`, kept in the
database (kb.create_api_key, kb.list_api_keys, kb.revoke_api_key). The database decides who may do what:
a user manages their own keys, an administrator anyone's (--user)."""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timedelta, timezone

from pgkb.config import ConfigError

DEFAULT_EXPIRES = "90d"
_RELATIVE = re.compile(r"(\d{1,5})([dh])")  # at most 99999 days: within datetime's range
_KEY_ID = re.compile(r"(?:pgkb_)?([0-9a-f]{16})")


def register(sub) -> None:
    parser = sub.add_parser("key", help="API keys for pgkb serve and pgkb mcp --transport http: create, list, revoke")
    parser.add_argument("action", choices=["create", "list", "revoke"])
    parser.add_argument("name", nargs="?", help="create: what the key is for (e.g. laptop); revoke: its key_id")
    parser.add_argument("--user", help="the pgkb user whose keys (default: yours; others': administrators)")
    parser.add_argument(
        "--expires",
        default=DEFAULT_EXPIRES,
        help=f"create: days (90d), hours (12h) or a date / time (2027-01-31, 2027-01-31T18:00+08:00); "
        f"default {DEFAULT_EXPIRES}",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def expiry(text: str) -> datetime:
    """When a key made now with ``--expires text`` stops working; ConfigError for anything else (NaN, inf, …).
    A date or time without a zone is local time. Whether it lies in the future is the database's check."""
    relative = _RELATIVE.fullmatch(text.strip())
    if relative:
        count, unit = int(relative.group(1)), relative.group(2)
        return datetime.now(timezone.utc) + (timedelta(days=count) if unit == "d" else timedelta(hours=count))
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"--expires must be days (90d), hours (12h) or a date / time (2027-01-31, 2027-01-31T18:00+08:00), "
            f"got {text[:40]!r}"
        ) from None
    return when if when.tzinfo else when.astimezone()


def key_id(text: str) -> str:
    """The key_id of ``text``: a key_id, ``pgkb_<key_id>`` or a whole key (whose secret is dropped here, so it
    never reaches the database). Anything else goes to the database unchanged, which refuses it."""
    from pgkb.serving.auth import API_KEY

    whole = API_KEY.fullmatch(text.strip())
    if whole:
        return whole.group(1)
    short = _KEY_ID.fullmatch(text.strip())
    return short.group(1) if short else text


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def run(args, settings) -> int:
    from pgkb.db import connect, database_url, read_database_url
    from pgkb.rows import one

    if args.action in ("create", "revoke") and not args.name:
        what = "NAME (what the key is for)" if args.action == "create" else "KEY_ID (see pgkb key list)"
        print(f"pgkb: key {args.action} needs {what}", file=sys.stderr)
        return 2
    # list reads (PGKB_READ_DATABASE_URL when set); create and revoke write, so a read-only database is refused
    url = read_database_url(settings) if args.action == "list" else database_url(settings, writable=True)
    with connect(url, vector=False) as conn:
        if args.action == "create":
            expires = expiry(args.expires)
            made, api_key = one(
                conn.execute("select * from kb.create_api_key(%s, %s, %s)", [args.user, args.name, expires])
            )
            owner, name, expires_at = one(
                conn.execute("select owner, name, expires_at from kb.list_api_keys() where key_id = %s", [made])
            )
            if args.json:
                record = {"key_id": made, "api_key": api_key, "owner": owner, "name": name}
                print(json.dumps({**record, "expires_at": _iso(expires_at)}, ensure_ascii=False))
            else:
                print(api_key)
                print(
                    f"pgkb: API key {made} ({name!r}) for {owner}, expires {expires_at:%Y-%m-%d %H:%M %Z}. It is "
                    f"shown only this once; `pgkb key revoke {made}` revokes it.",
                    file=sys.stderr,
                )
        elif args.action == "revoke":
            revoked = one(conn.execute("select kb.revoke_api_key(%s)", [key_id(args.name)]))[0]
            print(f"pgkb: API key {key_id(args.name)} revoked ({revoked:%Y-%m-%d %H:%M:%S %Z})")
        else:
            rows = conn.execute(
                "select key_id, owner, name, status, created_at, expires_at, last_used_at, revoked_at"
                " from kb.list_api_keys(%s)",
                [args.user],
            ).fetchall()
            if args.json:
                fields = ("key_id", "owner", "name", "status", "created_at", "expires_at", "last_used_at", "revoked_at")
                records = [dict(zip(fields, (*row[:4], *map(_iso, row[4:])), strict=True)) for row in rows]
                print(json.dumps(records, ensure_ascii=False))
                return 0
            print(f"{'key_id':<16}  {'owner':<16} {'status':<8} {'expires':<16} {'last used':<16} name")
            for kid, owner, name, status, _created, expires_at, used, _revoked in rows:
                last = f"{used:%Y-%m-%d %H:%M}" if used else "never"
                print(f"{kid:<16}  {owner:<16} {status:<8} {expires_at:%Y-%m-%d %H:%M} {last:<16} {name}")
    return 0
