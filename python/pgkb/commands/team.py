"""`pgkb team add|list|add-member|remove-member`: teams and who is in them (kb.create_team, kb.list_teams,
kb.add_team_member, kb.remove_team_member). The database decides who may do what: administrators make teams and
change their members; a user may leave a team of their own; everyone lists the teams they may see."""

from __future__ import annotations

import json
import sys

USAGE = {"add": "TEAM", "add-member": "TEAM USER", "remove-member": "TEAM USER"}


def register(sub) -> None:
    parser = sub.add_parser("team", help="teams: add, list, add-member, remove-member")
    parser.add_argument("action", choices=["add", "list", "add-member", "remove-member"])
    parser.add_argument("names", nargs="*", help="add: TEAM; add-member, remove-member: TEAM USER")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.db import connect, database_url, read_database_url
    from pgkb.rows import one

    wanted = len(USAGE.get(args.action, "").split())
    if len(args.names) != wanted:
        print(f"pgkb: team {args.action} needs {USAGE.get(args.action, 'no names')}", file=sys.stderr)
        return 2
    url = read_database_url(settings) if args.action == "list" else database_url(settings, writable=True)
    with connect(url, vector=False) as conn:
        if args.action == "add":
            (team,) = args.names
            tid = one(conn.execute("select kb.create_team(%s)", [team]))[0]
            print(json.dumps({"team": team, "id": tid}) if args.json else f"pgkb: team {team}")
        elif args.action == "add-member":
            team, user = args.names
            conn.execute("select kb.add_team_member(%s, %s)", [team, user])
            print(
                json.dumps({"team": team, "user": user, "member": True}) if args.json else f"pgkb: {user} is in {team}"
            )
        elif args.action == "remove-member":
            team, user = args.names
            was = one(conn.execute("select kb.remove_team_member(%s, %s)", [team, user]))[0]
            said = f"pgkb: {user} removed from {team}" if was else f"pgkb: {user} was not in {team}"
            print(json.dumps({"team": team, "user": user, "removed": was}) if args.json else said)
        else:
            rows = conn.execute("select name, members, created_at from kb.list_teams()").fetchall()
            if args.json:
                records = [{"name": n, "members": m, "created_at": c.isoformat()} for n, m, c in rows]
                print(json.dumps(records, ensure_ascii=False))
                return 0
            for name, members, _created in rows:
                print(f"{name:<24} {', '.join(members) if members is not None else '(members: administrators only)'}")
            if not rows:
                print("no teams you may see")
    return 0
