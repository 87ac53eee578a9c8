"""examples/etl: documents written with SQL only, embedded by `pgkb worker --once`, found by hybrid search."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pgkb.cluster import find_pg_bindir
from pgvector import Vector

pytestmark = pytest.mark.slow  # runs the ETL example, then the worker

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "etl" / "runbooks.sql"


def psql(info, *args: str) -> subprocess.CompletedProcess:
    dsn = f"host={info.host} port={info.port} user={info.user} dbname={info.dbname}"
    cmd = [str(find_pg_bindir() / "psql"), dsn, "-v", "ON_ERROR_STOP=1", "-X", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)


def test_sql_only_etl_then_worker_then_search(db, embedder):
    out = psql(db.info, "-f", str(SCRIPT)).stdout
    assert "runbooks/payment-timeout.md" in out
    queued = db.execute("select count(*) from kb.embedding_queue").fetchone()[0]
    assert queued == 3
    assert {r[0] for r in db.execute("select status from kb.documents").fetchall()} == {"embedding"}

    env = dict(os.environ, PGKB_DATABASE_URL=db.info.dsn)
    worker = subprocess.run(
        [sys.executable, "-m", "pgkb.cli", "worker", "--once"], env=env, capture_output=True, text=True, timeout=300
    )
    assert worker.returncode == 0, worker.stderr
    assert db.execute("select count(*) from kb.embedding_queue").fetchone()[0] == 0
    assert {r[0] for r in db.execute("select status from kb.documents").fetchall()} == {"ready"}

    query = "支付回调超时了怎么办"
    vec = Vector(embedder.embed(["query: " + query])[0])
    top = db.execute(
        "select doc_key, heading_path, vector_rank"
        " from kb.hybrid_search(%s, 3, kb => 'runbooks', query_embedding => %s)",
        [query, vec],
    ).fetchone()
    assert top[0] == "runbooks/payment-timeout.md" and top[2] is not None

    # re-running the ETL is a no-op: unchanged content hashes
    again = psql(db.info, "-At", "-F", ",", "-f", str(SCRIPT)).stdout
    assert ",f,0" in again and ",t," not in again
