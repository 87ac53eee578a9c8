"""`pgkb gaps --kb NAME`: what was asked of a knowledge base and not found, or answered unhelpfully, grouped into
topics (kb.knowledge_gaps: its owner or an administrator; the knowledge base must keep a question log)."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    parser = sub.add_parser("gaps", help="what was asked of a knowledge base and not found, grouped into topics")
    parser.add_argument("--kb", required=True, help="the knowledge base (its owner or an administrator)")
    parser.add_argument("--since", default="7 days", help="how far back (an interval: 7d, 24h; default 7 days)")
    parser.add_argument("--user", help="act as this pgkb user (the connection must be a member of pgkb_service)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.db import connect, database_url
    from pgkb.rows import one
    from pgkb.search import acting

    with connect(database_url(settings, writable=True), vector=False) as conn, acting(conn, args.user, 0):
        days = one(conn.execute("select kb.question_log_days(%s)", [args.kb]))[0]
        cursor = conn.execute("select * from kb.knowledge_gaps(%s, %s::interval)", [args.kb, args.since])
        columns = [c.name for c in cursor.description or []]
        topics = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    for topic in topics:
        topic["last_asked"] = topic["last_asked"].isoformat()
    if args.json:
        print(json.dumps(topics, ensure_ascii=False))
        return 0
    if days is None:
        print(f"pgkb: gaps: {args.kb} keeps no question log (pgkb questions log {args.kb} 30)", file=sys.stderr)
    if not topics:
        print(f"no unanswered questions of {args.kb} in the last {args.since}")
        return 0
    for t in topics:
        unhelpful = f", {t['unhelpful']} rated unhelpful" if t["unhelpful"] else ""
        print(
            f"{t['topic']:>3}. {t['questions']} question{'s' if t['questions'] != 1 else ''}{unhelpful}, "
            f"last {t['last_asked'][:16]}"
        )
        for example in t["examples"]:
            print(f"       - {example}")
        if t["closest_documents"]:
            print(f"       closest: {', '.join(t['closest_documents'])}")
    return 0
