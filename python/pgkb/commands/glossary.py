"""`pgkb glossary add|list|remove`: a knowledge base's glossary -- terms that mean the same there (发版 = 上线 =
release), which searches expand a query with, both ways (kb.glossary_add, kb.glossary, kb.glossary_remove).
The database decides who may do what: the knowledge base's write rules for add and remove, its visibility for
list."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    parser = sub.add_parser("glossary", help="a knowledge base's aliases and translations: add, list, remove")
    parser.add_argument("action", choices=["add", "list", "remove"])
    parser.add_argument(
        "terms", nargs="*", help="add: the terms that mean the same (2 to 8); remove: the entry's id (see list)"
    )
    parser.add_argument("--kb", default=None, help="the knowledge base (list: default every one you can read)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.db import connect, database_url, read_database_url
    from pgkb.rows import one

    if args.action in ("add", "remove") and not args.kb:
        print(f"pgkb: glossary {args.action} needs --kb", file=sys.stderr)
        return 2
    if args.action == "remove" and (len(args.terms) != 1 or not args.terms[0].isdigit()):
        print("pgkb: glossary remove needs the entry's id (see pgkb glossary list)", file=sys.stderr)
        return 2
    url = read_database_url(settings) if args.action == "list" else database_url(settings, writable=True)
    with connect(url, vector=False) as conn:
        if args.action == "add":
            entry = one(conn.execute("select kb.glossary_add(%s, %s)", [args.kb, args.terms]))[0]
            said = f"pgkb: glossary entry {entry} in {args.kb}"
            print(json.dumps({"id": entry, "kb": args.kb}) if args.json else said)
        elif args.action == "remove":
            conn.execute("select kb.glossary_remove(%s, %s)", [args.kb, int(args.terms[0])])
            print(f"pgkb: glossary entry {args.terms[0]} removed from {args.kb}")
        else:
            rows = conn.execute("select id, knowledge_base, terms from kb.glossary(%s)", [args.kb]).fetchall()
            if args.json:
                print(json.dumps([{"id": i, "kb": k, "terms": t} for i, k, t in rows], ensure_ascii=False))
                return 0
            for entry, kb, terms in rows:
                print(f"{entry:>6}  {kb}  {' = '.join(terms)}")
            if not rows:
                print("no glossary entries" + (f" in {args.kb}" if args.kb else ""))
    return 0
