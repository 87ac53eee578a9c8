"""`pgkb user add|list|remove`: pgkb users (kb.create_user, kb.list_users, kb.remove_user). The database decides
who may do what: administrators add and remove users, everyone lists what they may see (an administrator
everyone, a user themselves). `add --login ROLE` also creates that login role when it is missing, in the same
transaction, and prints how to connect as it."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    parser = sub.add_parser("user", help="pgkb users: add (with a login role), list, remove")
    parser.add_argument("action", choices=["add", "list", "remove"])
    parser.add_argument(
        "name",
        nargs="?",
        help="add, remove: the pgkb user's name (add on an existing user sets its login and admin flag)",
    )
    parser.add_argument(
        "--login",
        metavar="ROLE",
        help="add: the database login role that acts as this user (created when missing, made a member of pgkb_user)",
    )
    parser.add_argument("--admin", action="store_true", help="add: the user administers pgkb")
    parser.add_argument(
        "--transfer-to",
        metavar="USER",
        help="remove: the user who gets the removed user's knowledge bases (without it, removing one who owns "
        "any is refused)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def _iso(value):
    return value.isoformat() if value is not None else None


def run(args, settings) -> int:
    from pgkb.db import connect, database_url, read_database_url
    from pgkb.rows import one

    if args.action in ("add", "remove") and not args.name:
        print(f"pgkb: user {args.action} needs NAME", file=sys.stderr)
        return 2
    url = read_database_url(settings) if args.action == "list" else database_url(settings, writable=True)
    with connect(url, vector=False) as conn:
        conn.add_notice_handler(lambda notice: print(notice.message_primary, file=sys.stderr))
        if args.action == "add":
            return _add(conn, args, url, settings)
        if args.action == "remove":
            handed = one(conn.execute("select kb.remove_user(%s, %s)", [args.name, args.transfer_to]))[0]
            if args.json:
                print(json.dumps({"removed": args.name, "transferred": handed, "transfer_to": args.transfer_to}))
            else:
                moved = (
                    f" ({handed} knowledge base{'s' if handed != 1 else ''} now {args.transfer_to}'s)" if handed else ""
                )
                print(f"pgkb: user {args.name} removed{moved}")
            return 0
        rows = conn.execute(
            "select name, db_role, is_admin, teams, knowledge_bases, created_at from kb.list_users()"
        ).fetchall()
    if args.json:
        fields = ("name", "db_role", "is_admin", "teams", "knowledge_bases", "created_at")
        print(json.dumps([dict(zip(fields, (*r[:5], _iso(r[5])), strict=True)) for r in rows], ensure_ascii=False))
        return 0
    if not rows:
        print("no pgkb users you may see (an unmapped login role sees none)")
        return 0
    print(f"{'name':<20} {'login role':<20} {'admin':<5}  {'teams':<24} knowledge bases")
    for name, role, admin, teams, kbs, _created in rows:
        print(
            f"{name:<20} {role or '-':<20} {'yes' if admin else 'no':<5}  {','.join(teams) or '-':<24} {','.join(kbs)}"
        )
    return 0


def _add(conn, args, url: str, settings) -> int:
    from psycopg import sql

    from pgkb.rows import one
    from pgkb.service_role import login_url

    created = False
    with conn.transaction():  # a login role made here goes again if the user cannot be made
        conn.execute("select kb.require_admin('create users')")
        if args.login and not conn.execute("select 1 from pg_roles where rolname = %s", [args.login]).fetchone():
            conn.execute(sql.SQL("create role {} login").format(sql.Identifier(args.login)))
            created = True
        uid = one(conn.execute("select kb.create_user(%s, %s, %s)", [args.name, args.login, args.admin]))[0]
    connect_url = login_url(url, args.login) if args.login else None
    if args.json:
        record = {"name": args.name, "id": uid, "is_admin": args.admin, "login": args.login, "login_created": created}
        print(json.dumps({**record, "url": connect_url}, ensure_ascii=False))
        return 0
    role = f"login role {args.login}{', created' if created else ''}" if args.login else "no login role"
    print(f"pgkb: user {args.name} ({role}{', administrator' if args.admin else ''})")
    if connect_url:
        print(
            f'next: connect as {args.login}:\n  psql "{connect_url}"\n  PGKB_DATABASE_URL="{connect_url}" pgkb kb list'
        )
        if created and settings.database_url:
            print(f"  if the server asks for a password, give the role one: ALTER ROLE \"{args.login}\" PASSWORD '…';")
    else:
        print(
            f"next: it has no login of its own; pgkb serve and pgkb mcp act for it with an API key "
            f"(pgkb key create <what for> --user {args.name}), or give it one: pgkb user add {args.name} --login ROLE"
        )
    return 0
