"""Reliability 6: access control under randomized trials -- users x teams x visibility x entry points.

A seeded random world: 8 pgkb users (alice, bob, carol with login roles; five more reachable only through
the service), 3 teams with random members, 12 knowledge bases of random visibility, owner and team, each
holding documents that carry the knowledge base's unique marker word (also in its name) plus shared words.
Each trial picks a principal, an entry point -- SQL as a login role (hybrid_search, the three legs, direct
SELECTs or the read functions that replace them), SQL as the service acting for a user, MCP stdio (one
server per user) and MCP HTTP (one bearer token per user) -- a query and a knowledge-base argument
(visible, invisible, nonexistent, none), and checks: 0 rows of an invisible knowledge base (by marker,
anywhere in the row), an invisible name refused exactly like a nonexistent one, and a visible marker found.
Separately: the scores a user sees do not move when someone else's private knowledge base gains or loses
documents that match the same query.

Fast: ~500 trials; long (PGKB_SOAK=1): >= 10,000 trials and 200 score probes. PGKB_SOAK_SEED picks another
world.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import string
import time
from collections import Counter

import numpy as np
import psycopg
import pytest
import relhelpers as rh
from anyio.from_thread import start_blocking_portal
from pgvector import Vector
from pgvector.psycopg import register_vector

pytestmark = pytest.mark.reliability

SEED = int(os.environ.get("PGKB_SOAK_SEED", "20261130"))  # another seed: another random world
LOGIN_USERS = ["alice", "bob", "carol"]
SERVICE_USERS = ["dave", "erin", "frank", "grace", "heidi"]
USERS = LOGIN_USERS + SERVICE_USERS
TEAMS = ["t0", "t1", "t2"]
N_KBS = 12
MARKER = re.compile(r"mk[a-z]{2}x")


def marker(i: int) -> str:
    return f"mk{string.ascii_lowercase[i // 26]}{string.ascii_lowercase[i % 26]}x"


class World:
    """The random world and the visibility model the database must agree with."""

    def __init__(self, rng: random.Random) -> None:
        self.members = {t: {u for u in USERS if rng.random() < 0.4} for t in TEAMS}
        self.kbs = {}  # name -> (marker, visibility, owner, team)
        for i in range(N_KBS):
            visibility = rng.choice(["private", "private", "team", "public"])
            owner = rng.choice(USERS)
            team = rng.choice([t for t in TEAMS if owner in self.members[t]] or [None])
            if visibility == "team" and team is None:
                visibility = "private"
            self.kbs[f"kb-{marker(i)}"] = (marker(i), visibility, owner, team if visibility == "team" else None)

    def visible(self, user: str | None) -> set[str]:
        """Markers the user may read (None: an unmapped role or no acting user -- public only)."""
        out = set()
        for m, visibility, owner, team in self.kbs.values():
            if (
                visibility == "public"
                or owner == user
                or (visibility == "team" and user is not None and user in self.members[team])
            ):
                out.add(m)
        return out


def build(db, rng: random.Random) -> World:
    world = World(rng)
    db.execute("select kb.create_user('carol', 'carol')")
    for user in SERVICE_USERS:
        db.execute("select kb.create_user(%s)", [user])
    for team, members in world.members.items():
        db.execute("select kb.create_team(%s)", [team])
        for user in sorted(members):
            db.execute("select kb.add_team_member(%s, %s)", [team, user])
    for name, (m, visibility, owner, team) in world.kbs.items():
        db.execute("select kb.create_knowledge_base(%s, %s, team => %s, owner => %s)", [name, visibility, team, owner])
        for d in range(2):
            content = f"{m} sharedword 退款 审核 第{d}段 {m}"
            chunks = [{"content": content, "embedding": rh.fake_vector(content)}, {"content": f"{m} 附录 sharedword"}]
            db.execute(
                "select * from kb.replace_document(%s, %s, %s, %s, metadata => %s)",
                [name, f"doc-{m}-{d}.md", f"{m} 标题", json.dumps(chunks), json.dumps({"d": d})],
            )
    db.execute("grant pgkb_user to mallory")  # a login role mapped to no pgkb user: public only
    return world


def markers_in(rows) -> set[str]:
    return {m for row in rows for m in MARKER.findall(str(row))}


class Trials:
    def __init__(self) -> None:
        self.count: Counter = Counter()
        self.leaks: list[str] = []
        self.problems: list[str] = []

    def check(self, label: str, seen: set[str], visible: set[str], must: str | None) -> None:
        self.count[label] += 1
        if seen - visible:
            self.leaks.append(f"{label}: saw {sorted(seen - visible)}")
        if must is not None and must not in seen:
            self.problems.append(f"{label}: did not find visible {must}")


def refusal(message: str, name: str) -> str:
    """An error message with the knowledge-base name taken out, to compare invisible with nonexistent."""
    return message.replace(name, "<name>")


QVEC = Vector(rh.fake_vector("query: sharedword"))
SQL_READS = {
    "hybrid": "select * from kb.hybrid_search(%s, top_k => 100, kb => %s, query_embedding => %s)",
    "vector": "select * from kb.vector_search(%s, top_k => 100, kb => %s, query_embedding => %s)",
    "lexical": "select * from kb.lexical_search(%s, top_k => 100, kb => %s)",
    "fuzzy": "select * from kb.fuzzy_search(%s, top_k => 100, kb => %s)",
}


def sql_trial(conn, trials: Trials, rng: random.Random, world: World, who: str, visible: set[str]) -> None:
    kind = rng.choice([*SQL_READS, "tables", "functions"])
    kb_name, must, query = pick_target(rng, world, visible)
    label = f"sql:{who}:{kind}"
    if kind == "tables":
        rows = []
        for table in ("knowledge_bases", "documents", "chunks"):
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):  # closed to users: functions instead
                rows += conn.execute(f"select t::text from kb.{table} as t").fetchall()
        trials.check(label, markers_in(rows), visible, None)
        return
    if kind == "functions":  # the reading functions (they replace direct SELECTs for end users)
        rows = []
        name = kb_name or rng.choice(list(world.kbs))
        doc = f"doc-{world.kbs[name][0]}-{rng.randint(0, 1)}.md" if name in world.kbs else "doc-mknox-0.md"
        calls = [
            ("kb.list_knowledge_bases()", []),
            ("kb.list_documents(%s)", [name]),
            ("kb.get_document(%s, %s)", [doc, kb_name]),
        ]
        for call, params in calls:
            if not conn.execute("select to_regproc(%s)", [call.split("(")[0]]).fetchone()[0]:
                continue  # not on this version
            with contextlib.suppress(psycopg.errors.NoDataFound):
                got = conn.execute(f"select t::text from {call} as t", params).fetchall()
                rows += got
                if call.startswith("kb.list_knowledge_bases") and markers_in(got) != visible:
                    trials.problems.append(f"{label}: listed {sorted(markers_in(got))}, expected {sorted(visible)}")
        trials.check(label, markers_in(rows), visible, None)
        return
    sql = SQL_READS[kind]
    params = [query, kb_name] + ([QVEC] if "query_embedding" in sql else [])
    try:
        rows = conn.execute(sql, params).fetchall()
    except psycopg.errors.NoDataFound as e:
        trials.count[label] += 1
        if kb_name is None or (kb_name in world.kbs and world.kbs[kb_name][0] in visible):
            trials.problems.append(f"{label}: visible {kb_name} refused: {e}")
        elif kb_name != "kb-nosuchx":  # an invisible name: refused exactly like one that does not exist
            try:
                conn.execute(sql, [query, "kb-nosuchx", *params[2:]]).fetchall()
                trials.problems.append(f"{label}: a nonexistent knowledge base answered")
            except psycopg.errors.NoDataFound as missing:
                if refusal(str(e), kb_name) != refusal(str(missing), "kb-nosuchx"):
                    trials.problems.append(f"{label}: refusal differs: {e} / {missing}")
        return
    if kb_name is not None and (kb_name not in world.kbs or world.kbs[kb_name][0] not in visible):
        trials.leaks.append(f"{label}: {kb_name} answered ({len(rows)} rows)")
    trials.check(label, markers_in(rows), visible, must if kind in ("lexical", "hybrid") else None)


def pick_target(rng: random.Random, world: World, visible: set[str]) -> tuple[str | None, str | None, str]:
    """(kb argument, the marker that must be found or None, query)."""
    name = rng.choice(list(world.kbs))
    m = world.kbs[name][0]
    choice = rng.random()
    if choice < 0.35:
        return None, (m if m in visible else None), m  # search everything for one knowledge base's marker
    if choice < 0.5:
        return None, None, rng.choice(["sharedword", "退款 审核", "sharedword 附录"])
    if choice < 0.9:
        return name, (m if m in visible else None), rng.choice([m, "sharedword"]) if m in visible else m
    return "kb-nosuchx", None, "sharedword"


def mcp_trial(portal, client, trials: Trials, rng, world: World, who: str, visible: set[str]) -> None:
    kb_name, must, query = pick_target(rng, world, visible)
    tool = rng.choice(["search_knowledge", "search_knowledge", "get_document", "list_knowledge_bases"])
    label = f"{who}:{tool}"
    if tool == "list_knowledge_bases":
        result = portal.call(client.call_tool, tool, {})
        names = {k["name"] for k in result.structured_content["knowledge_bases"]}
        trials.check(label, markers_in(names), visible, None)
        if markers_in(names) != visible:
            trials.problems.append(f"{label}: listed {sorted(markers_in(names))}, expected {sorted(visible)}")
        return
    if tool == "get_document":
        name = kb_name or rng.choice(list(world.kbs))
        doc = f"doc-{world.kbs[name][0]}-0.md" if name in world.kbs else "doc-mknox-0.md"
        args = {"doc_id": doc} | ({"kb": name} if rng.random() < 0.7 else {})
        result = portal.call(client.call_tool, tool, args)
        answered = not result.is_error
        should = name in world.kbs and world.kbs[name][0] in visible
        trials.count[label] += 1
        if answered and not should:
            trials.leaks.append(f"{label}: {doc} of {name} answered")
        elif not answered and should:
            trials.problems.append(f"{label}: visible {doc} refused: {rh.text_of(result)[:200]}")
        elif not answered and "unknown" not in rh.text_of(result):
            trials.problems.append(f"{label}: odd refusal {rh.text_of(result)[:200]}")
        if answered:  # what came back (not the doc_id / kb the caller named itself)
            out = result.structured_content
            trials.check(label, markers_in([out["title"], *(c["content"] for c in out["chunks"])]), visible, None)
        return
    args = {"query": query, "top_k": 20} | ({"kb": kb_name} if kb_name else {})
    result = portal.call(client.call_tool, tool, args)
    trials.count[label] += 1
    if result.is_error:
        text = rh.text_of(result)
        if kb_name is None or (kb_name in world.kbs and world.kbs[kb_name][0] in visible):
            trials.problems.append(f"{label}: refused: {text[:200]}")
        elif "unknown knowledge base" not in text:
            trials.problems.append(f"{label}: odd refusal {text[:200]}")
        return
    if kb_name is not None and (kb_name not in world.kbs or world.kbs[kb_name][0] not in visible):
        trials.leaks.append(f"{label}: {kb_name} answered")
    hits = result.structured_content["results"]  # what came back (not the query echoed)
    seen = markers_in([(h["content"], h["title"], h["kb"], h["doc_id"], h["source"]) for h in hits])
    trials.check(label, seen, visible, must)


def test_randomized_access_trials(rdb, connect_as, dsn_of, fake, tmp_path):
    rng = random.Random(SEED)
    world = build(rdb, rng)
    n_trials = rh.scale(500, 10_000)
    trials = Trials()
    logins = {u: connect_as(u) for u in [*LOGIN_USERS, "mallory"]}
    service = connect_as("svc")
    stdio_users = ["alice", "dave", None]  # None: no PGKB_USER, public only
    server, base = rh.mcp_http_server(dsn_of("svc"), fake.url, tmp_path, {f"tok-{u}": u for u in USERS})
    started = time.monotonic()
    try:
        with start_blocking_portal() as portal:
            stdio = {}
            for user in stdio_users:
                extra = {"PGKB_USER": user} if user else {}
                cm = portal.wrap_async_context_manager(rh.stdio_client(dsn_of("svc"), fake.url, **extra))
                stdio[user] = (cm, cm.__enter__())
            http = {}
            for user in USERS:
                cm = portal.wrap_async_context_manager(rh.http_client(base, f"tok-{user}", read_timeout_seconds=60))
                http[user] = (cm, cm.__enter__())
            try:
                for _ in range(n_trials):
                    entry = rng.random()
                    if entry < 0.35:
                        who = rng.choice([*LOGIN_USERS, "mallory"])
                        visible = world.visible(None if who == "mallory" else who)
                        sql_trial(logins[who], trials, rng, world, who, visible)
                    elif entry < 0.6:
                        who = rng.choice([*USERS, ""])
                        service.execute("select set_config('pgkb.acting_user', %s, false)", [who])
                        sql_trial(service, trials, rng, world, f"svc-as-{who or 'nobody'}", world.visible(who or None))
                    elif entry < 0.8:
                        who = rng.choice(stdio_users)
                        visible = world.visible(who)
                        mcp_trial(portal, stdio[who][1], trials, rng, world, f"stdio-{who}", visible)
                    else:
                        who = rng.choice(USERS)
                        mcp_trial(portal, http[who][1], trials, rng, world, f"http-{who}", world.visible(who))
            finally:
                for cm, _ in [*stdio.values(), *http.values()]:
                    cm.__exit__(None, None, None)
    finally:
        server.stop()
        rdb.execute("revoke pgkb_user from mallory")
    total = sum(trials.count.values())
    by_entry = Counter(label.split(":")[0].split("-")[0] for label in trials.count.elements())
    rh.publish(
        "access-trials",
        trials=total,
        seed=SEED,
        by_entry_point=dict(by_entry),
        leaked=len(trials.leaks),
        other_problems=len(trials.problems),
        seconds=round(time.monotonic() - started, 1),
        world={
            "kbs": {n: v[1] for n, v in world.kbs.items()},
            "teams": {t: sorted(m) for t, m in world.members.items()},
        },
    )
    assert total >= n_trials
    assert trials.leaks == [], sorted(Counter(trials.leaks).items())[:20]
    assert trials.problems == []


def test_scores_do_not_move_with_others_private_knowledge_bases(rdb, connect_as):
    """alice's results and scores for a query are the same before and after a private knowledge base she
    cannot see gains documents full of the query's words, and after they are gone again."""
    rng = random.Random(SEED + 1)
    world = build(rdb, rng)
    rdb.execute("revoke pgkb_user from mallory")  # not needed here
    register_vector(rdb)
    probes = rh.scale(30, 200)
    conns = {u: connect_as(u) for u in LOGIN_USERS}
    hidden = {}  # user -> knowledge bases private to someone else
    for user in LOGIN_USERS:
        mine = world.visible(user)
        hidden[user] = [n for n, v in world.kbs.items() if v[0] not in mine]
    queries = ["sharedword", "退款 审核", "sharedword 附录 退款"]
    changed = []
    started = time.monotonic()
    for i in range(probes):
        user = rng.choice([u for u in LOGIN_USERS if hidden[u]] or LOGIN_USERS)
        if not hidden[user]:
            continue
        target = rng.choice(hidden[user])
        query = rng.choice(queries)
        sql = (
            "select chunk_id, score, vector_score, lexical_score, fuzzy_score from kb.hybrid_search(%s, top_k => 50,"
            " query_embedding => %s) order by chunk_id"
        )
        before = conns[user].execute(sql, [query, QVEC]).fetchall()
        lexical_before = (
            conns[user].execute("select chunk_id, score from kb.lexical_search(%s, 50)", [query]).fetchall()
        )
        flood = " ".join([query] * rng.randint(1, 30))
        # embeddings near the query's, each its own (identical ones: test_vector_leg_keeps_finding_...)
        base = np.asarray(rh.fake_vector("query: sharedword"))
        chunks = [
            {"content": flood, "embedding": [float(x) for x in base + 0.05 * np.asarray(rh.fake_vector(f"{i}-{j}"))]}
            for j in range(rng.randint(1, 20))
        ]
        rdb.execute("select * from kb.replace_document(%s, %s, 'T', %s)", [target, f"flood{i}.md", json.dumps(chunks)])
        during = conns[user].execute(sql, [query, QVEC]).fetchall()
        lexical_during = (
            conns[user].execute("select chunk_id, score from kb.lexical_search(%s, 50)", [query]).fetchall()
        )
        rdb.execute("select kb.delete_document(%s, %s)", [target, f"flood{i}.md"])
        after = conns[user].execute(sql, [query, QVEC]).fetchall()
        if not (before == during == after and lexical_before == lexical_during):
            diff = [(b, d) for b, d in zip(before, during, strict=False) if b != d][:3]
            changed.append(
                f"{user} / {query} / flood in {target}: {len(before)}/{len(during)} rows; {diff}"
                f" lexical same: {lexical_before == lexical_during}"
            )
    rh.publish(
        "access-score-isolation", probes=probes, changed=len(changed), seconds=round(time.monotonic() - started, 1)
    )
    assert changed == []


def test_vector_leg_keeps_finding_a_users_chunks_while_others_rewrite_duplicates(rdb, connect_as):
    """Found by this suite: other users' documents with identical embeddings, written and deleted again and
    again (what re-ingesting unchanged content does), left dead duplicate entries in the shared HNSW index
    that cut carol's 14 chunks off from the graph -- kb.vector_search returned 0 of them after 33 cycles,
    whatever hnsw.ef_search or iterative_scan, until VACUUM. The vector leg now falls back to an exact scan
    of the visible slice when HNSW yields fewer than n rows."""
    rng = random.Random(SEED + 1)
    world = build(rdb, rng)
    rdb.execute("revoke pgkb_user from mallory")
    carol = connect_as("carol")
    sql = "select count(*) from kb.vector_search('x', top_k => 100, query_embedding => %s)"
    hidden = [n for n, v in world.kbs.items() if v[0] not in world.visible("carol")]
    mine = carol.execute(sql, [QVEC]).fetchone()[0]
    assert mine > 0
    seen = []
    for i in range(40):
        target = rng.choice(hidden)
        chunks = [{"content": "flood sharedword", "embedding": rh.fake_vector("query: sharedword")}] * rng.randint(
            1, 20
        )
        rdb.execute("select * from kb.replace_document(%s, %s, 'T', %s)", [target, f"f{i}.md", json.dumps(chunks)])
        seen.append(carol.execute(sql, [QVEC]).fetchone()[0])
        rdb.execute("select kb.delete_document(%s, %s)", [target, f"f{i}.md"])
        seen.append(carol.execute(sql, [QVEC]).fetchone()[0])
    assert set(seen) == {mine}, seen
