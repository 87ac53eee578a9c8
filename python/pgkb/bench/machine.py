"""What the benchmark ran on: the machine, the server settings that shape search cost, and the sizes of
the relations the search reads (shared by ``pgkb bench`` and ``pgkb bench --ingest``).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psycopg

from pgkb.bench.data import Model
from pgkb.rows import one

__all__ = ["SETTINGS", "machine_info", "relation_sizes", "server_settings"]

SETTINGS = (
    "shared_buffers",
    "effective_cache_size",
    "work_mem",
    "maintenance_work_mem",
    "jit",
    "max_parallel_workers_per_gather",
    "max_parallel_maintenance_workers",
    "random_page_cost",
    "hnsw.ef_search",
    "hnsw.iterative_scan",
    "plan_cache_mode",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip(chr(34))}, Linux {platform.release()}"
    except OSError:
        pass
    return platform.platform()


def machine_info(conn: psycopg.Connection) -> dict[str, str]:
    pg = one(conn.execute("select version()"))[0]
    vec = conn.execute("select extversion from pg_extension where extname = 'vector'").fetchone()
    trgm = conn.execute("select extversion from pg_extension where extname = 'pg_trgm'").fetchone()
    return {
        "CPU": _cpu_model(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "RAM": _ram(),
        "OS": _os_name(),
        "PostgreSQL": pg.split(" on ")[0] if " on " in pg else pg,
        "pgvector": vec[0] if vec else "not installed",
        "pg_trgm": trgm[0] if trgm else "not installed",
        "client": f"Python {platform.python_version()}, psycopg {psycopg.__version__}, same host",
        "load average (1/5/15 min, at report time)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def server_settings(conn: psycopg.Connection) -> dict[str, str]:
    out = {}
    for name in SETTINGS:
        row = conn.execute("select current_setting(%s, true)", [name]).fetchone()
        out[name] = row[0] if row and row[0] is not None else "(unset)"
    return out


def relation_sizes(conn: psycopg.Connection, model: Model, kb_id: int) -> dict[str, tuple[str, str]]:
    """{label: (relation, pretty size)} of the tables and the indexes a search of knowledge base kb_id reads."""
    index = one(conn.execute("select kb.hnsw_index_name(%s, %s)", [model.id, kb_id]))[0]
    rels = {
        "kb.chunks (heap + TOAST)": ("kb.chunks", "pg_table_size('kb.chunks')"),
        "kb.embeddings (heap + TOAST)": ("kb.embeddings", "pg_table_size('kb.embeddings')"),
        # none below kb.settings.vector_exact_chunks (that knowledge base is searched exactly): 0 bytes
        f"HNSW index {index}": (index, f"coalesce(pg_relation_size(to_regclass('kb.{index}')), 0)"),
        "fuzzy leg's bigram index term_stats_bigram_end_idx": (
            "term_stats_bigram_end_idx",
            "pg_relation_size('kb.term_stats_bigram_end_idx')",
        ),
        "kb.term_blocks (the term dictionary in compressed blocks: table + TOAST + index)": (
            "kb.term_blocks",
            "pg_total_relation_size('kb.term_blocks')",
        ),
        "kb.term_stats (the dictionary's entries written since its compaction: table + TOAST + indexes)": (
            "kb.term_stats",
            "pg_total_relation_size('kb.term_stats')",
        ),
        "kb.postings (posting blocks: table + TOAST + index)": (
            "kb.postings",
            "pg_total_relation_size('kb.postings')",
        ),
        "chunk text (sum of octet_length(content))": ("content", "(select sum(octet_length(content)) from kb.chunks)"),
    }
    return {label: (rel, one(conn.execute(f"select pg_size_pretty({expr})"))[0]) for label, (rel, expr) in rels.items()}


def lexical_storage(conn: psycopg.Connection) -> tuple[int, int]:
    """(bytes, bytes): every lexical structure of the database -- the term dictionary (kb.term_blocks and
    kb.term_stats) and kb.postings with their TOAST and indexes (chunks keep no terms of their own since migration
    047) -- and the chunk text (octet_length of content)."""
    return one(
        conn.execute(
            "select pg_total_relation_size('kb.term_blocks') + pg_total_relation_size('kb.term_stats')"
            " + pg_total_relation_size('kb.postings'),"
            " (select coalesce(sum(octet_length(content)), 0) from kb.chunks)"
        )
    )
