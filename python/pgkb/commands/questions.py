"""`pgkb questions`: the question log (kb.my_questions, kb.question_log), and `pgkb questions log|purge`
to turn a knowledge base's log on or off and delete what it holds (kb.set_question_log,
kb.purge_question_log). The database decides who sees what: a user their own questions, a knowledge base's
owner its part of each question without who asked, administrators everything."""

from __future__ import annotations

import json
import sys

MINE = (
    "select question_id, asked_at, question, mode, entry_point, found, top_score, latency_ms, knowledge_bases,"
    " documents, helpful, note from kb.my_questions(%s::interval, %s)"
)
OF_KB = (
    "select question_id, knowledge_base, asked_at, question, mode, entry_point, found, top_score, latency_ms,"
    " documents, helpful, note, asked_by from kb.question_log(%s, %s::interval, %s)"
)


def register(sub) -> None:
    parser = sub.add_parser(
        "questions", help="the question log: what was asked and found; log: turn a kb's log on/off; purge"
    )
    parser.add_argument(
        "action", nargs="?", default="list", choices=["list", "log", "purge"],
        help="list (default): your questions, or --kb's log (its owner, administrators); log NAME DAYS|off: "
        "keep NAME's questions DAYS days (1..3650) or stop logging; purge NAME: delete what NAME's log holds",
    )  # fmt: skip
    parser.add_argument("names", nargs="*", help="log: NAME DAYS|off; purge: NAME")
    parser.add_argument("--kb", help="list: this knowledge base's log (its owner or an administrator)")
    parser.add_argument("--all", action="store_true", help="list: every knowledge base's log (administrators)")
    parser.add_argument("--since", default="7 days", help="list: how far back (an interval: 7d, 24h; default 7 days)")
    parser.add_argument("--limit", type=int, default=100, help="list: at most this many (1..1000, default 100)")
    parser.add_argument("--before", help="purge: only what was asked before this time (default: everything)")
    parser.add_argument("--yes", action="store_true", help="purge: yes, delete it")
    parser.add_argument("--user", help="act as this pgkb user (the connection must be a member of pgkb_service)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def _record(columns, row) -> dict:
    record = dict(zip(columns, row, strict=True))
    record["asked_at"] = record["asked_at"].isoformat()
    return record


def run(args, settings) -> int:
    from pgkb.db import connect, database_url
    from pgkb.rows import one
    from pgkb.search import acting

    wanted = {"list": 0, "log": 2, "purge": 1}[args.action]
    if len(args.names) != wanted:
        usage = {"list": "no NAME (use --kb)", "log": "NAME DAYS|off", "purge": "NAME"}[args.action]
        print(f"pgkb: questions {args.action} needs {usage}", file=sys.stderr)
        return 2
    if args.action == "purge" and not args.yes:
        print(
            f"pgkb: questions purge deletes what the question log of {args.names[0]} holds: pass --yes",
            file=sys.stderr,
        )
        return 2
    if args.action == "log":
        days_given = args.names[1].strip().lower()
        if days_given not in ("off", "0") and not days_given.isdigit():
            print(f"pgkb: questions log: DAYS must be a number of days or off, got {args.names[1]!r}", file=sys.stderr)
            return 2
    # the log is written by searches on the primary; it is read there too (a standby may lag behind it)
    with connect(database_url(settings, writable=True), vector=False) as conn, acting(conn, args.user, 0):
        if args.action == "log":
            name = args.names[0]
            days = 0 if days_given == "off" else int(days_given)
            kept = one(conn.execute("select kb.set_question_log(%s, %s)", [name, days]))[0]
            if args.json:
                print(json.dumps({"kb": name, "question_log_days": kept}))
            elif kept is None:
                print(f"pgkb: question log of {name} off (what it holds stays until purged: pgkb questions purge)")
            else:
                print(f"pgkb: question log of {name} on: questions kept {kept} days")
            return 0
        if args.action == "purge":
            name = args.names[0]
            deleted = one(conn.execute("select kb.purge_question_log(%s, %s::timestamptz)", [name, args.before]))[0]
            print(
                json.dumps({"kb": name, "deleted": deleted})
                if args.json
                else f"pgkb: {deleted} questions of {name} deleted"
            )
            return 0
        if args.kb or args.all:
            cursor = conn.execute(OF_KB, [None if args.all else args.kb, args.since, args.limit])
        else:
            cursor = conn.execute(MINE, [args.since, args.limit])
        columns = [c.name for c in cursor.description or []]
        records = [_record(columns, row) for row in cursor.fetchall()]
    if args.json:
        print(json.dumps(records, ensure_ascii=False))
        return 0
    if not records:
        print("no logged questions" + (f" of {args.kb}" if args.kb else "") + f" in the last {args.since}")
        return 0
    for r in records:
        verdict = {True: "found", False: "NOT FOUND", None: "not judged yet"}[r["found"]]  # None: read-only
        rating = {True: ", rated helpful", False: ", rated unhelpful", None: ""}[r["helpful"]]
        who = f" by {r['asked_by']}" if r.get("asked_by") else ""
        print(f"{r['question_id']:>6}  {r['asked_at'][:19]}  {verdict}{rating}  ({r['mode']}, {r['entry_point']}{who})")
        print(f"        {r['question']}")
        if r["documents"]:
            print(f"        -> {', '.join(r['documents'][:3])}")
    return 0
