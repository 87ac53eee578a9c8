"""`pgkb rate QUESTION_ID up|down`: say whether an answer helped (kb.rate_answer): a logged question of yours
(`pgkb ask` and `pgkb search` print its id), or, with --question, an answer whose question was not logged."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    parser = sub.add_parser("rate", help="rate an answer helpful (up) or not (down), with an optional note")
    parser.add_argument("target", nargs="+", metavar="[QUESTION_ID] up|down", help="the question's id and up or down")
    parser.add_argument("--note", help="what was wrong or missing")
    parser.add_argument("--question", help="instead of QUESTION_ID: the question asked (it was not logged)")
    parser.add_argument("--kb", help="with --question: the knowledge base it was asked of")
    parser.add_argument("--user", help="act as this pgkb user (the connection must be a member of pgkb_service)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.db import connect, database_url
    from pgkb.rows import one
    from pgkb.search import acting

    *ids, verdict = args.target
    if verdict not in ("up", "down") or len(ids) > 1 or (ids and not ids[0].isdigit()):
        print("pgkb: rate needs QUESTION_ID up|down (or --question TEXT up|down)", file=sys.stderr)
        return 2
    question_id = int(ids[0]) if ids else None
    with connect(database_url(settings, writable=True), vector=False) as conn, acting(conn, args.user, 0):
        rating = one(conn.execute(
            "select kb.rate_answer(%s, question_id => %s, note => %s, question => %s, kb => %s)",
            [verdict == "up", question_id, args.note, args.question, args.kb],
        ))[0]  # fmt: skip
    if args.json:
        print(json.dumps({"rating_id": rating, "question_id": question_id, "helpful": verdict == "up"}))
    else:
        what = f"question {question_id}" if question_id is not None else "the answer (kept alone)"
        print(f"pgkb: rated {what} {'helpful' if verdict == 'up' else 'unhelpful'}")
    return 0
