"""examples/dbt: a dbt project turns a support-ticket table into pgkb documents through kb.replace_document.

Runs real dbt (dbt-core + dbt-postgres) as a subprocess, twice unchanged, then with one ticket edited and one
deleted; `pgkb worker --once` embeds what was queued and kb.hybrid_search finds a ticket by a Chinese query."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pgvector import Vector
from psycopg import sql

pytestmark = pytest.mark.slow  # dbt seed / dbt build against a database

pytest.importorskip("dbt.adapters.postgres", reason="dbt-postgres is not installed (pip install -e '.[dbt]')")

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "dbt"
SEED = Path("seeds") / "support_tickets.csv"
KB = "support-tickets"
EDITED, DELETED, OPEN = "T-1017", "T-1005", "T-1019"
NEW_RESOLUTION = "注销申请提交后有 30 天冷静期，期间在设置页点击“撤销注销”即可恢复账号；超过 30 天数据会被永久删除。"


# the `dbt` console script beside this interpreter (what a data engineer types), else dbt's entry point
_script = shutil.which("dbt", path=str(Path(sys.executable).parent))
DBT = [_script] if _script else [sys.executable, "-c", "import sys; from dbt.cli.main import cli; sys.exit(cli())"]


def no_network_prefix() -> list[str]:
    """`unshare --net` where this process may create a network namespace (root): dbt then runs with no
    network at all (the database is reached over its unix socket). Elsewhere dbt runs as it is."""
    if shutil.which("unshare") and subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0:
        return ["unshare", "--net"]
    return []


class Dbt:
    """Runs dbt commands against the test database with profiles, target/ and logs/ in a temporary dir."""

    def __init__(self, db, tmp: Path, user: str) -> None:
        self.db, self.tmp = db, tmp
        self.profiles = tmp / "profiles"
        self.profiles.mkdir()
        shutil.copy(PROJECT / "profiles.yml", self.profiles / "profiles.yml")
        info = db.info
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DBT_", "PGKB_"))}
        self.env.update(
            PGKB_DB_HOST=info.host, PGKB_DB_PORT=str(info.port), PGKB_DB_USER=user, PGKB_DB_NAME=info.dbname
        )
        self.prefix = no_network_prefix()

    def __call__(self, *args: str, project: Path = PROJECT) -> tuple[str, dict]:
        """Run `dbt ARGS`; returns its stdout and target/run_results.json."""
        target = self.tmp / "target"
        cmd = [
            *self.prefix, *DBT, *args,
            "--project-dir", str(project), "--profiles-dir", str(self.profiles),
            "--target-path", str(target), "--log-path", str(self.tmp / "logs"),
        ]  # fmt: skip
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        return done.stdout, json.loads((target / "run_results.json").read_text())

    def seed_and_build(self, project: Path = PROJECT) -> tuple[str, str]:
        """`dbt seed` then `dbt build` of the models (tests gate the publish); returns the build's stdout and
        its invocation id."""
        self("seed", project=project)
        out, results = self("build", "--exclude", "resource_type:seed", project=project)
        statuses = {r["unique_id"].split(".")[-1]: r["status"] for r in results["results"]}
        assert statuses["kb_ticket_documents"] == "success" and statuses["stg_support_tickets"] == "success"
        assert all(s in ("success", "pass") for s in statuses.values()), statuses
        return out, results["metadata"]["invocation_id"]

    def publish_log(self, invocation_id: str) -> dict[str, tuple]:
        rows = self.db.execute(
            "select doc_key, action, chunk_count, queued from pgkb_dbt.pgkb_publish_log where invocation_id = %s",
            [invocation_id],
        ).fetchall()
        log = {r[0]: r[1:] for r in rows}
        assert len(log) == len(rows), "one log row per document and run"
        return log


def documents(db) -> dict[str, tuple]:
    rows = db.execute(
        "select d.doc_key, d.id, d.updated_at, d.content_hash, d.source_type, d.metadata ->> 'dbt_model'"
        " from kb.documents d join kb.knowledge_bases k on k.id = d.kb_id where k.name = %s",
        [KB],
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def run_worker(db, endpoint) -> None:
    env = dict(os.environ, PGKB_DATABASE_URL=db.info.dsn, PGKB_EMBED_PROVIDER="http", PGKB_EMBED_URL=endpoint.url)
    worker = subprocess.run(
        [sys.executable, "-m", "pgkb.cli", "worker", "--once"], env=env, capture_output=True, text=True, timeout=300
    )
    assert worker.returncode == 0, worker.stderr
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    assert {r[0] for r in db.execute("select status from kb.documents").fetchall()} == {"ready"}


def test_dbt_writes_tickets_incrementally_then_worker_then_search(db, connect_as, embedder, fake_embeddings, tmp_path):
    # dbt runs as an ordinary pgkb user that may create schemas, not as an administrator
    db.execute("select kb.create_user('alice', 'alice')")
    db.execute(sql.SQL("grant create on database {} to alice").format(sql.Identifier(db.info.dbname)))
    dbt = Dbt(db, tmp_path, user="alice")
    endpoint = fake_embeddings(embedder.embed)  # real vectors of the offline model, over HTTP
    repo_files = sorted(p.relative_to(PROJECT) for p in PROJECT.rglob("*"))
    with (PROJECT / SEED).open(newline="", encoding="utf-8") as f:
        tickets = list(csv.DictReader(f))
    solved = {"tickets/" + t["ticket_id"] for t in tickets if t["status"] == "resolved"}
    assert 15 <= len(solved) < len(tickets) and "tickets/" + OPEN not in solved

    # run 1: every solved ticket becomes a document with two chunks, queued for embedding
    out, first = dbt.seed_and_build()
    log = dbt.publish_log(first)
    assert set(log) == solved
    assert all(entry == ("replaced", 2, 2) for entry in log.values())
    assert f"{len(solved)} replaced, 0 unchanged, 0 deleted; {2 * len(solved)} chunks queued" in out
    docs = documents(db)
    assert set(docs) == solved
    assert {(d[3], d[4]) for d in docs.values()} == {("dbt", "kb_ticket_documents")}
    owner = db.execute(
        "select k.visibility, u.name from kb.knowledge_bases k join kb.users u on u.id = k.owner_id where k.name = %s",
        [KB],
    ).fetchone()
    assert owner == ("private", "alice")
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 2 * len(solved)
    run_worker(db, endpoint)
    embedded = db.execute("select count(*) from kb.embeddings").fetchone()[0]
    assert embedded == 2 * len(solved)

    # run 2: nothing changed, so nothing is written: changed = false for every row, updated_at kept
    out, second = dbt.seed_and_build()
    assert second != first
    log = dbt.publish_log(second)
    assert set(log) == solved and {entry[0] for entry in log.values()} == {"unchanged"}
    assert {entry[2] for entry in log.values()} == {0}
    assert f"0 replaced, {len(solved)} unchanged, 0 deleted; 0 chunks queued" in out
    assert documents(db) == docs
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    # dbt wrote its target/, logs/ and nothing else into the temporary dir, nothing into the repository
    assert sorted(p.relative_to(PROJECT) for p in PROJECT.rglob("*")) == repo_files
    assert (tmp_path / "target" / "manifest.json").exists() and (tmp_path / "logs" / "dbt.log").exists()
    assert sorted(p.name for p in dbt.profiles.iterdir()) == ["profiles.yml"]  # no usage-tracking id

    # the source changes: one ticket's resolution is edited, another ticket is deleted
    changed_project = tmp_path / "project"
    shutil.copytree(PROJECT, changed_project)
    for t in tickets:
        if t["ticket_id"] == EDITED:
            t["resolution"] = NEW_RESOLUTION
    with (changed_project / SEED).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(tickets[0]))
        writer.writeheader()
        writer.writerows(t for t in tickets if t["ticket_id"] != DELETED)

    # run 3: exactly those two documents change
    out, third = dbt.seed_and_build(changed_project)
    log = dbt.publish_log(third)
    assert log.pop("tickets/" + EDITED) == ("replaced", 2, 2)
    assert log.pop("tickets/" + DELETED) == ("deleted", None, None)
    assert set(log) == solved - {"tickets/" + EDITED, "tickets/" + DELETED}
    assert {entry[0] for entry in log.values()} == {"unchanged"}
    assert f"1 replaced, {len(solved) - 2} unchanged, 1 deleted; 2 chunks queued" in out
    after = documents(db)
    assert set(after) == solved - {"tickets/" + DELETED}
    assert after["tickets/" + EDITED][0] == docs["tickets/" + EDITED][0]  # same document, new version
    assert after["tickets/" + EDITED][1] > docs["tickets/" + EDITED][1]
    assert after["tickets/" + EDITED][2] != docs["tickets/" + EDITED][2]
    assert {k: v for k, v in after.items() if k != "tickets/" + EDITED} == {
        k: v for k, v in docs.items() if k not in ("tickets/" + EDITED, "tickets/" + DELETED)
    }
    queued_docs = db.execute(
        "select distinct d.doc_key from kb.embedding_queue q join kb.chunks c on c.id = q.chunk_id"
        " join kb.documents d on d.id = c.document_id"
    ).fetchall()
    assert queued_docs == [("tickets/" + EDITED,)]
    content = db.execute(
        "select c.content from kb.chunks c join kb.documents d on d.id = c.document_id"
        " where d.doc_key = %s and c.metadata ->> 'part' = 'resolution'",
        ["tickets/" + EDITED],
    ).fetchone()[0]
    assert content == NEW_RESOLUTION

    # the worker embeds the edited ticket; a Chinese question (alice's, the knowledge base is hers) finds it by
    # its new resolution
    run_worker(db, endpoint)
    assert db.execute("select count(*) from kb.embeddings").fetchone()[0] == embedded - 2
    query = "账号注销以后怎么撤销"
    vec = Vector(embedder.embed(["query: " + query])[0])
    alice = connect_as("alice")
    top = alice.execute(
        "select doc_key, heading_path, vector_rank from kb.hybrid_search(%s, 3, kb => %s, query_embedding => %s)",
        [query, KB, vec],
    ).fetchone()
    assert top[0] == "tickets/" + EDITED and top[2] is not None
