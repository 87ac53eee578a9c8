"""`pgkb kb create|list|share|visibility|delete`: knowledge bases (kb.create_knowledge_base,
kb.list_knowledge_bases, kb.set_knowledge_base_visibility, kb.delete_knowledge_base). The database decides who
may do what: a user creates their own, its owner and administrators change or delete it (its team's members
only write documents), and everyone lists what they may read."""

from __future__ import annotations

import json
import sys

USAGE = {"create": "NAME", "share": "NAME TEAM", "visibility": "NAME private|team|public", "delete": "NAME"}
FIELDS = (
    "name",
    "visibility",
    "owner",
    "team",
    "description",
    "documents",
    "chunks",
    "can_write",
    "created_at",
    "last_updated",
    "languages",
)
LISTED = (
    "select name, visibility, owner, team, description, document_count, chunk_count, can_write, created_at,"
    " last_updated, languages from kb.list_knowledge_bases()"
)


def register(sub) -> None:
    parser = sub.add_parser("kb", help="knowledge bases: create, list, share, visibility, delete")
    parser.add_argument("action", choices=["create", "list", "share", "visibility", "delete"])
    parser.add_argument(
        "names", nargs="*", help="create, delete: NAME; share: NAME TEAM; visibility: NAME private|team|public"
    )
    parser.add_argument(
        "--visibility",
        default="private",
        help="create: private (default), team or public (create on an existing one of yours sets its visibility, "
        "team and description, as kb.create_knowledge_base does)",
    )
    parser.add_argument("--team", help="create: its team; visibility: the team (default: the one it has)")
    parser.add_argument("--owner", help="create: its owner (administrators; default: you)")
    parser.add_argument("--description", help="create: what it holds")
    parser.add_argument("--yes", action="store_true", help="delete: yes, delete it and everything in it")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def _record(row) -> dict:
    record = dict(zip(FIELDS, row, strict=True))
    for key in ("created_at", "last_updated"):
        record[key] = record[key].isoformat() if record[key] is not None else None
    return record


def _show(conn, name: str, as_json: bool) -> None:
    """Print knowledge base ``name`` as kb.list_knowledge_bases shows it to the caller."""
    row = conn.execute(LISTED + " where name = %s", [name]).fetchone()
    if row is None:
        print(json.dumps({"name": name}) if as_json else f"pgkb: knowledge base {name}")
        return
    record = _record(row)
    if as_json:
        print(json.dumps(record, ensure_ascii=False))
        return
    team = f", team {record['team']}" if record["team"] else ""
    print(f"pgkb: knowledge base {name}: {record['visibility']}, owner {record['owner'] or '-'}{team}")


def run(args, settings) -> int:
    from pgkb.db import connect, database_url, read_database_url
    from pgkb.migrate import maintain_vector_indexes
    from pgkb.rows import one

    if args.action != "list" and len(args.names) != len(USAGE[args.action].split()):
        print(f"pgkb: kb {args.action} needs {USAGE[args.action]}", file=sys.stderr)
        return 2
    if args.action == "delete" and not args.yes:
        print(
            f"pgkb: kb delete removes {args.names[0]} and everything in it (documents, chunks, embeddings, "
            "glossary): pass --yes",
            file=sys.stderr,
        )
        return 2
    url = read_database_url(settings) if args.action == "list" else database_url(settings, writable=True)
    with connect(url, vector=False) as conn:
        conn.add_notice_handler(lambda notice: print(notice.message_primary, file=sys.stderr))
        if args.action == "create":
            (name,) = args.names
            conn.execute(
                "select kb.create_knowledge_base(%s, %s, team => %s, owner => %s, description => %s)",
                [name, args.visibility, args.team, args.owner, args.description],
            )
            _show(conn, name, args.json)
        elif args.action in ("share", "visibility"):
            name, value = args.names
            visibility, team = ("team", value) if args.action == "share" else (value, args.team)
            conn.execute("select kb.set_knowledge_base_visibility(%s, %s, %s)", [name, visibility, team])
            _show(conn, name, args.json)
        elif args.action == "delete":
            (name,) = args.names
            documents, chunks = one(conn.execute("select * from kb.delete_knowledge_base(%s)", [name]))
            # its HNSW indexes, dropped CONCURRENTLY when this session may (else by the next `pgkb db migrate`)
            for index, action in maintain_vector_indexes(conn):
                print(f"pgkb: index kb.{index} {action}", file=sys.stderr)
            if args.json:
                print(json.dumps({"deleted": name, "documents": documents, "chunks": chunks}, ensure_ascii=False))
            else:
                print(f"pgkb: knowledge base {name} deleted ({documents} documents, {chunks} chunks)")
        else:
            rows = conn.execute(LISTED).fetchall()
            if args.json:
                print(json.dumps([_record(r) for r in rows], ensure_ascii=False))
                return 0
            if not rows:
                print("no knowledge bases you may read")
                return 0
            print(f"{'name':<28} {'visibility':<10} {'owner':<16} {'team':<16} {'docs':>6} {'chunks':>8}  write")
            for name, visibility, owner, team, _d, docs, chunks, can_write, *_ in rows:
                print(
                    f"{name:<28} {visibility:<10} {owner or '-':<16} {team or '-':<16} {docs:>6} {chunks:>8}  "
                    f"{'yes' if can_write else 'no'}"
                )
    return 0
