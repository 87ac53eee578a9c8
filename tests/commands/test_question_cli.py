"""`pgkb questions`, `pgkb rate` and `pgkb gaps` (pgkb.commands.questions, rate, gaps) against the real database,
logged in as ordinary users (PGKB_DATABASE_URL naming their role), with `pgkb ask` and `pgkb search` writing the
log: the owner turns it on, a reader's questions land in it as entry point 'cli', the reader rates one, the
owner reads their part without who asked and the unhelpful answer among the gaps; others are refused, and
usage mistakes exit 2 before the database is asked."""

from __future__ import annotations

import json
import re

import fixture_docs
import pytest
from pgkb.cli import main

pytestmark = pytest.mark.slow  # embeds queries with the offline model in-process


def dsn(db, user: str | None = None) -> str:
    info = db.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user={user or info.user}"


@pytest.fixture
def pgkb(db, embedder, monkeypatch, capsys):
    """pgkb(*args, role) -> (exit code, stdout, stderr) of `pgkb *args` logged in as ``role``."""
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("select kb.create_knowledge_base('team-docs', 'public', owner => 'alice')")
    fixture_docs.load(db, embedder)
    monkeypatch.setenv("PGKB_EMBED_PROVIDER", "offline")

    def run(*args: str, role: str) -> tuple[int, str, str]:
        monkeypatch.setenv("PGKB_DATABASE_URL", dsn(db, role))
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def as_json(result: tuple[int, str, str]):
    code, out, err = result
    assert code == 0, err
    return json.loads(out)


def test_a_reader_asks_rates_and_the_owner_sees_the_gap(pgkb, db):
    assert as_json(pgkb("questions", "log", "team-docs", "30", "--json", role="alice")) == {
        "kb": "team-docs", "question_log_days": 30
    }  # fmt: skip
    code, _, err = pgkb("ask", "火星基地的氧气配额是多少？", "--kb", "team-docs", role="bob")
    assert code == 0, err
    (qid,) = re.findall(r"logged as question (\d+): rate it with `pgkb rate \1 up\|down`", err)
    code, _, err = pgkb("search", "退款", "--kb", "team-docs", role="bob")
    assert code == 0 and "logged as question" in err, err
    assert pgkb("rate", qid, "down", "--note", "没有这方面的文档", role="bob")[0] == 0

    mine = as_json(pgkb("questions", "--json", role="bob"))
    assert [(q["mode"], q["entry_point"], q["found"], q["helpful"]) for q in mine] == [
        ("search", "cli", True, None), ("ask", "cli", False, False)
    ]  # fmt: skip
    assert mine[1]["question_id"] == int(qid) and mine[1]["note"] == "没有这方面的文档"
    theirs = as_json(pgkb("questions", "--kb", "team-docs", "--json", role="alice"))
    assert [q["asked_by"] for q in theirs] == [None, None] and theirs[1]["helpful"] is False
    assert as_json(pgkb("questions", "--json", role="alice")) == []  # alice asked nothing herself

    gaps = as_json(pgkb("gaps", "--kb", "team-docs", "--since", "1d", "--json", role="alice"))
    assert [(g["questions"], g["unhelpful"], g["examples"]) for g in gaps] == [(1, 1, ["火星基地的氧气配额是多少？"])]
    code, out, _ = pgkb("gaps", "--kb", "team-docs", role="alice")
    assert code == 0 and "1 question, 1 rated unhelpful" in out and "火星基地" in out

    # bob reads team-docs but does not own it: refused, and nothing changes
    for args in (
        ("gaps", "--kb", "team-docs"),
        ("questions", "--kb", "team-docs"),
        ("questions", "log", "team-docs", "off"),
    ):
        code, _, err = pgkb(*args, role="bob")
        assert code == 1 and 'only the owner of knowledge base "team-docs"' in err, (args, err)
    assert pgkb("rate", "1", "up", role="alice")[0] == 1  # bob's question, not alice's

    # usage mistakes: exit 2, nothing asked
    for args in (
        ("rate", "x", "up"), ("rate", qid, "maybe"), ("questions", "log", "team-docs", "soon"),
        ("questions", "log", "team-docs"), ("questions", "purge", "team-docs"),
    ):  # fmt: skip
        assert pgkb(*args, role="alice")[0] == 2, args

    assert as_json(pgkb("questions", "purge", "team-docs", "--yes", "--json", role="alice")) == {
        "kb": "team-docs", "deleted": 2
    }  # fmt: skip
    code, out, _ = pgkb("questions", "log", "team-docs", "off", role="alice")
    assert code == 0 and "off" in out
    assert db.execute("select count(*) from kb.questions").fetchone()[0] == 0
    assert pgkb("search", "退款", "--kb", "team-docs", role="bob")[0] == 0
    assert db.execute("select count(*) from kb.questions").fetchone()[0] == 0  # off: nothing written
