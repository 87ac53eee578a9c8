"""Loading the synthetic knowledge base for ``pgkb bench``, in one of two ways:

* ``replace`` -- every document through ``kb.replace_document`` (the real write path: tokenising, BM25
  statistics and all indexes maintained per document). About 70 chunks/s on 2 cores.
* ``bulk`` -- the same rows written directly as the superuser: documents with one INSERT per batch,
  chunk texts by COPY into a temporary table and then one INSERT ... SELECT that computes ``term_count`` and
  the terms' document frequencies with the SQL tokenizer exactly as ``kb.replace_document`` does
  (``kb.lexical_terms(kb.indexed_text(title, heading_path, content))``), embeddings by
  binary COPY. ``kb.term_stats`` and the knowledge base's ``chunk_count`` / ``term_total`` are computed from
  the loaded chunks at the end (per-batch document frequencies summed in an unlogged staging table), the
  postings (``kb.postings`` blocks and the recent postings in ``kb.term_stats``, the BM25 leg's lists) by
  ``kb_internal.build_postings``, timed. The
  knowledge base's HNSW index of the model is dropped before the load and recreated afterwards from its own
  definition with a large ``maintenance_work_mem``; the build is timed. The bulk path writes as the
  superuser around ``kb.replace_document``, so it (and the embeddings rewrite below) refuses a database that
  holds other knowledge bases than the bench's own (SharedDatabase) unless ``allow_shared``: benchmarks load
  into a cluster of their own. Whatever ends it -- an error, Ctrl-C, SIGTERM or SIGHUP (turned into
  SystemExit meanwhile; psycopg cancels the statement in flight) -- the loading threads are stopped and the
  dropped index rebuilt before the process exits. Only SIGKILL leaves it dropped: ``pgkb db status`` says
  so and ``pgkb db migrate`` re-creates it.

Both paths run on LOAD_THREADS connections and leave a knowledge base that ``kb.replace_document`` would
have produced from the same documents, except ``content_hash`` (a hash of the bulk rows) -- a test
compares them. The load report is kept as JSON in the knowledge base's description, so a rerun that
reuses the knowledge base still reports how it was loaded and how long the indexes took to build. A
bulk-loaded knowledge base with the right chunks but other embeddings (``--vectors``, or the anchored
generator's density at another size) gets only its embeddings rewritten and its HNSW index rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import psycopg
from pgvector import HalfVector

from pgkb.bench.data import (
    Document,
    Model,
    Pools,
    VectorSource,
    doc_key,
    document_sizes,
    document_vectors,
    log,
    make_document,
)
from pgkb.db import connect
from pgkb.rows import one

__all__ = ["LOAD_METHODS", "LoadReport", "SharedDatabase", "prepare_kb", "refuse_shared"]

LOAD_METHODS = ("bulk", "replace")
LOAD_THREADS = 2  # loading connections
BATCH_DOCUMENTS = 20  # documents per bulk transaction
STAGING_TABLE = "public.pgkb_bench_df"
REWRITE_DOCUMENTS = 1000  # documents per COPY when embeddings are rewritten


class SharedDatabase(RuntimeError):
    """The bulk load would drop the indexes other knowledge bases search with; the message says how to go on."""


@dataclass
class LoadReport:
    """How the knowledge base got its rows: method, seconds, and (bulk) index build seconds by index."""

    method: str
    chunks: int
    seconds: float
    vacuum_seconds: float
    index_builds: dict[str, float] = field(default_factory=dict)
    maintenance_work_mem: str = ""
    vectors: str = "uniform"  # VectorSource.describe() of the chunk embeddings
    reused: bool = False

    def describe(self) -> str:
        rate = self.chunks / self.seconds if self.seconds else 0.0
        if self.method == "replace":
            how = (
                f"through `kb.replace_document` from {LOAD_THREADS} connections (HNSW index and BM25 "
                "statistics maintained per document)"
            )
        else:
            how = (
                f"in bulk from {LOAD_THREADS} connections (SQL tokenizer + COPY, BM25 statistics computed "
                f"after the load, indexes built afterwards with maintenance_work_mem = {self.maintenance_work_mem})"
            )
        text = f"{self.chunks} chunks ({self.vectors} embeddings) loaded {how} "
        text += f"in {self.seconds:.0f} s ({rate:.0f} chunks/s); "
        text += f"vacuum analyze {self.vacuum_seconds:.0f} s"
        return ("reused the knowledge base: " if self.reused else "") + text


# --------------------------------------------------------------------------------------------------
# Shared


def _kb_state(conn: psycopg.Connection, kb_name: str, model: Model) -> tuple[int | None, int, int, str]:
    """(kb id or None, chunks, embeddings of the model, description) of the knowledge base."""
    row = conn.execute("select id, description from kb.knowledge_bases where name = %s", [kb_name]).fetchone()
    if row is None:
        return None, 0, 0, ""
    kb_id, description = row
    n_chunks = one(conn.execute("select count(*) from kb.chunks where kb_id = %s", [kb_id]))[0]
    n_emb = one(
        conn.execute("select count(*) from kb.embeddings where kb_id = %s and model_id = %s", [kb_id, model.id])
    )[0]
    return kb_id, n_chunks, n_emb, description


def refuse_shared(conn: psycopg.Connection, kb_name: str) -> None:
    """SharedDatabase when the database holds knowledge bases other than ``kb_name``."""
    rows = conn.execute("select name from kb.knowledge_bases where name <> %s order by name", [kb_name]).fetchall()
    others = [r[0] for r in rows]
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise SharedDatabase(
            f"the database holds other knowledge bases ({shown}); the bulk load writes as the superuser around "
            "kb.replace_document and drops and rebuilds indexes. Run the bench on a database of its own "
            "(PGKB_DATA_DIR and PGKB_PORT for another embedded cluster, or PGKB_DATABASE_URL), use --load replace, "
            "or pass --allow-shared-database"
        )


@contextlib.contextmanager
def _signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) in the main thread meanwhile (SIGINT raises
    KeyboardInterrupt anyway), so that the finally blocks that rebuild dropped indexes run. Only a signal
    that would kill the process is caught (one ignored, as under nohup, stays ignored); nothing changes
    outside the main thread, where Python cannot set signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, _frame) -> None:
        log(f"{signal.Signals(signum).name}: stopping; rebuilding the dropped indexes first")
        raise SystemExit(128 + signum)

    fatal = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is signal.SIG_DFL]
    previous = {s: signal.signal(s, leave) for s in fatal}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run_workers(
    n_items: int, sizes: list[int], url: str, work: Callable[[psycopg.Connection, int], None], total: int
) -> None:
    """Run work(conn, item) for items 0..n_items-1 on LOAD_THREADS connections; progress by chunk count.
    Interrupted (Ctrl-C, SIGTERM), it lets each thread finish its item and stop before it re-raises."""
    todo: queue.Queue[int] = queue.Queue()
    for i in range(n_items):
        todo.put(i)
    errors: list[BaseException] = []
    stop = threading.Event()
    done = [0]
    lock = threading.Lock()
    start = time.perf_counter()

    def worker() -> None:
        try:
            with connect(url) as wconn:
                while not errors and not stop.is_set():
                    try:
                        i = todo.get_nowait()
                    except queue.Empty:
                        return
                    work(wconn, i)
                    with lock:
                        done[0] += sizes[i]
                        n = done[0]
                    if n % 10000 < sizes[i] or n == total:
                        rate = n / (time.perf_counter() - start)
                        log(f"loaded {n}/{total} chunks ({rate:.0f}/s, ~{(total - n) / rate:.0f} s left)")
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(LOAD_THREADS)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:
        stop.set()
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]


# --------------------------------------------------------------------------------------------------
# Through kb.replace_document


def _load_replace(url: str, kb_name: str, chunks: int, pools: Pools, model: Model, vectors: VectorSource) -> None:
    sizes = document_sizes(chunks)

    def work(conn: psycopg.Connection, i: int) -> None:
        doc = make_document(i, pools, model.dimension, sizes[i], vectors)
        payload = [{"content": c, "embedding": e} for c, e in zip(doc.contents, doc.embeddings.tolist(), strict=True)]
        conn.execute(
            "select * from kb.replace_document(%s, %s, %s, %s::jsonb, model => %s)",
            [kb_name, doc.doc_key, doc.title, json.dumps(payload, ensure_ascii=False), model.name],
        ).fetchall()

    _run_workers(len(sizes), sizes, url, work, chunks)


# --------------------------------------------------------------------------------------------------
# Bulk


def _index_definitions(conn: psycopg.Connection, model: Model, kb_id: int, chunks: int) -> dict[str, str]:
    """{index name: CREATE INDEX statement} of the indexes the bulk load drops and rebuilds: knowledge base
    kb_id's HNSW index of the model, when pgkb expects one (the knowledge base holds at least
    kb.settings.vector_exact_chunks of its `chunks` once loaded)."""
    return _hnsw_definition(conn, model, kb_id, chunks)


def _hnsw_definition(conn: psycopg.Connection, model: Model, kb_id: int, chunks: int | None = None) -> dict[str, str]:
    """{name: CREATE INDEX statement} of knowledge base kb_id's HNSW index of the model if pgkb expects it at
    `chunks` chunks (default: what kb_id holds), else {}."""
    row = conn.execute(
        "select v.index_name, v.definition,"
        " coalesce(%s, k.chunk_count) >= kb_internal.setting_int('vector_exact_chunks')"
        " from kb_internal.vector_index_definitions(%s, %s) as v, kb.knowledge_bases as k where k.id = %s",
        [chunks, kb_id, model.id, kb_id],
    ).fetchone()
    return {row[0]: row[1]} if row and row[2] else {}


def _bulk_batch(conn: psycopg.Connection, kb_id: int, model: Model, docs: list[Document]) -> int:
    """Write one batch of documents in one transaction; returns the batch's total term count."""
    with conn.transaction():
        rows = conn.execute(
            "insert into kb.documents (kb_id, doc_key, title, content_hash, chunk_count)"
            " select %s, k, t, h, n from unnest(%s::text[], %s::text[], %s::text[], %s::int[]) as x (k, t, h, n)"
            " returning id, doc_key",
            [
                kb_id,
                [d.doc_key for d in docs],
                [d.title for d in docs],
                [hashlib.sha256(json.dumps([d.title, d.contents]).encode()).hexdigest() for d in docs],
                [len(d.contents) for d in docs],
            ],
        ).fetchall()
        doc_ids = {key: did for did, key in rows}
        with conn.cursor().copy("copy pg_temp.bench_stage (document_id, ordinal, title, content) from stdin") as cp:
            for d in docs:
                for j, content in enumerate(d.contents):
                    cp.write_row((doc_ids[d.doc_key], j, d.title, content))
        inserted = conn.execute(
            f"""
            with terms as materialized (
                select s.*, kb.lexical_terms(kb.indexed_text(s.title, '{{}}', s.content)) as list
                from pg_temp.bench_stage as s
            ),
            ins as (
                insert into kb.chunks as c (
                    document_id, kb_id, ordinal, content, heading_path, chunk_type, char_count, metadata,
                    term_count, heading_script
                )
                select t.document_id, %(kb)s, t.ordinal, t.content, '{{}}', 'text', length(t.content), '{{}}',
                    cardinality(t.list), kb_internal.heading_script(t.title, '{{}}')
                from terms as t
                returning c.id, c.document_id, c.ordinal, c.term_count
            ),
            df as (
                insert into {STAGING_TABLE} (term, n)
                select x.term, count(*)
                from terms as t cross join lateral (select distinct u.term from unnest(t.list) as u (term)) as x
                group by x.term
            )
            select id, document_id, ordinal, term_count from ins
            """,
            {"kb": kb_id},
        ).fetchall()
        by_doc = {did: d for d in docs for did in [doc_ids[d.doc_key]]}
        half = model.storage == "halfvec"  # the model's column (kb.register_embedding_model)
        column = "half" if half else "embedding"
        with conn.cursor().copy(
            f"copy kb.embeddings (chunk_id, model_id, kb_id, {column}) from stdin (format binary)"
        ) as cp:
            cp.set_types(["int8", "int4", "int4", "halfvec" if half else "vector"])
            for chunk_id, document_id, ordinal, _ in inserted:
                v = by_doc[document_id].embeddings[ordinal]
                cp.write_row((chunk_id, model.id, kb_id, HalfVector(v) if half else v))
        conn.execute("truncate pg_temp.bench_stage")
    return sum(r[3] for r in inserted)


def _build_postings(conn: psycopg.Connection, kb_id: int) -> None:
    """kb_internal.build_postings, one call: with numpy it reads the chunks once and writes each list once (at 1M
    chunks about ten minutes)."""
    log("building the postings (kb_internal.build_postings)")
    conn.execute("select kb_internal.build_postings(%s)", [kb_id])


def _store_report(conn: psycopg.Connection, kb_id: int, report: LoadReport) -> None:
    """Keep `report` (how the knowledge base was loaded) in its description, for the next run's reuse."""
    stored = {k: v for k, v in asdict(report).items() if k != "reused"}
    conn.execute("update kb.knowledge_bases set description = %s where id = %s", [json.dumps(stored), kb_id])


def _rewrite_vectors(
    conn: psycopg.Connection,
    kb_id: int,
    report: LoadReport,
    model: Model,
    maintenance_work_mem: str,
    vectors: VectorSource,
) -> None:
    """Give bulk-loaded knowledge base kb_id's chunks the embeddings `vectors` makes (chunk j of document i
    gets vectors.chunk_vectors(i)[j], as a fresh load would write): the vectors are staged with COPY, then
    one transaction drops the knowledge base's HNSW index of the model, writes them and records them in `report`
    and the description; the table is rewritten (VACUUM FULL) and the index, if pgkb expects one, rebuilt (timed
    in report.index_builds).
    A failure leaves either the old vectors or the new ones, described as they are, and the index back."""
    sizes = document_sizes(report.chunks)
    hnsw = one(conn.execute("select kb.hnsw_index_name(%s, %s)", [model.id, kb_id]))[0]
    ddl = _hnsw_definition(conn, model, kb_id).get(hnsw)  # None: a knowledge base searched exactly has none
    conn.execute("create temp table if not exists bench_vectors (chunk_id bigint, embedding vector)")
    conn.execute("truncate pg_temp.bench_vectors")
    t0 = time.perf_counter()
    for b in range(0, len(sizes), REWRITE_DOCUMENTS):
        index = {doc_key(i): i for i in range(b, min(b + REWRITE_DOCUMENTS, len(sizes)))}
        rows = conn.execute(
            "select d.doc_key, array_agg(c.id order by c.ordinal) from kb.documents d"
            " join kb.chunks c on c.document_id = d.id where d.kb_id = %s and d.doc_key = any(%s) group by d.doc_key",
            [kb_id, list(index)],
        ).fetchall()
        if len(rows) != len(index):
            raise RuntimeError(f"documents {min(index)}..{max(index)}: {len(rows)} of {len(index)} found")
        with conn.cursor().copy("copy pg_temp.bench_vectors (chunk_id, embedding) from stdin (format binary)") as cp:
            cp.set_types(["int8", "vector"])
            for key, chunk_ids in rows:
                i = index[key]
                if len(chunk_ids) != sizes[i]:
                    raise RuntimeError(f"document {key} has {len(chunk_ids)} chunks, expected {sizes[i]}")
                for chunk_id, v in zip(chunk_ids, document_vectors(i, sizes[i], model.dimension, vectors), strict=True):
                    cp.write_row((chunk_id, v))
        log(f"vectors: {min(b + REWRITE_DOCUMENTS, len(sizes))}/{len(sizes)} documents staged")
    conn.execute("analyze pg_temp.bench_vectors")
    # the model's column (kb.register_embedding_model: halfvec above 512 dimensions)
    column_set = "half = v.embedding::halfvec" if model.storage == "halfvec" else "embedding = v.embedding"
    with conn.transaction():
        conn.execute(f"drop index if exists kb.{hnsw}")
        written = conn.execute(
            f"update kb.embeddings as e set {column_set} from pg_temp.bench_vectors as v"
            " where e.chunk_id = v.chunk_id and e.model_id = %s",
            [model.id],
        ).rowcount
        if written != report.chunks:
            raise RuntimeError(f"wrote {written} embeddings, expected {report.chunks}")
        report.vectors = vectors.describe()
        report.index_builds.pop(hnsw, None)
        _store_report(conn, kb_id, report)
    conn.execute("drop table pg_temp.bench_vectors")
    try:
        conn.execute("select set_config('maintenance_work_mem', %s, false)", [maintenance_work_mem])
        conn.execute("vacuum full analyze kb.embeddings")
        log(f"vectors rewritten in {time.perf_counter() - t0:.0f} s")
        if ddl is not None:
            log(f"building {hnsw}")
            t0 = time.perf_counter()
            conn.execute(ddl)
            report.index_builds[hnsw] = time.perf_counter() - t0
            log(f"built {hnsw} in {report.index_builds[hnsw]:.1f} s")
        _store_report(conn, kb_id, report)
    finally:
        if ddl is not None and hnsw not in report.index_builds:  # never leave the database without its index
            conn.execute(ddl)
        conn.execute("reset maintenance_work_mem")


def _vacuum(conn: psycopg.Connection) -> float:
    """VACUUM (ANALYZE) the tables the benchmark wrote; returns seconds."""
    t0 = time.perf_counter()
    for table in (
        "kb.knowledge_bases",
        "kb.documents",
        "kb.chunks",
        "kb.embeddings",
        "kb.term_stats",
        "kb.term_blocks",
        "kb.postings",
    ):
        conn.execute(f"vacuum (analyze) {table}")
    return time.perf_counter() - t0


def _load_bulk(
    conn: psycopg.Connection,
    url: str,
    kb_id: int,
    chunks: int,
    pools: Pools,
    model: Model,
    maintenance_work_mem: str,
    vectors: VectorSource,
) -> tuple[float, float, dict[str, float]]:
    """Bulk-load into knowledge base kb_id (see the module docstring); returns (load seconds, vacuum
    seconds, index build seconds by index)."""
    sizes = document_sizes(chunks)
    batches = [list(range(b, min(b + BATCH_DOCUMENTS, len(sizes)))) for b in range(0, len(sizes), BATCH_DOCUMENTS)]
    batch_chunks = [sum(sizes[i] for i in batch) for batch in batches]
    defs = _index_definitions(conn, model, kb_id, chunks)
    term_total = [0]
    lock = threading.Lock()
    builds: dict[str, float] = {}

    def work(wconn: psycopg.Connection, b: int) -> None:
        if not one(wconn.execute("select to_regclass('pg_temp.bench_stage')"))[0]:
            wconn.execute(
                "create temp table bench_stage (document_id bigint, ordinal integer, title text, content text)"
            )
        docs = [make_document(i, pools, model.dimension, sizes[i], vectors) for i in batches[b]]
        n = _bulk_batch(wconn, kb_id, model, docs)
        with lock:
            term_total[0] += n

    start = time.perf_counter()
    try:  # from the first drop on: whatever happens, the finally block puts the indexes back
        conn.execute(f"drop table if exists {STAGING_TABLE}")
        conn.execute(f"create unlogged table {STAGING_TABLE} (term text not null, n integer not null)")
        for name in defs:
            conn.execute(f"drop index if exists kb.{name}")
        _run_workers(len(batches), batch_chunks, url, work, chunks)
        t0 = time.perf_counter()
        with conn.transaction():
            conn.execute(
                f"insert into kb.term_stats (kb_id, term, df) select %s, term, sum(n) from {STAGING_TABLE}"
                " group by term",
                [kb_id],
            )
            conn.execute(
                "update kb.knowledge_bases set chunk_count = %s, term_total = %s, updated_at = now() where id = %s",
                [chunks, term_total[0], kb_id],
            )
            # the language profile, as kb_internal.adjust_term_stats counts it on every other write path
            conn.execute(
                "update kb.knowledge_bases as k set zh_chunks = p.zh, en_chunks = p.en, other_chunks = p.other"
                " from (select count(*) filter (where l = 'zh') as zh, count(*) filter (where l = 'en') as en,"
                " count(*) filter (where l = 'other') as other from (select kb_internal.text_language(c.content)"
                " as l from kb.chunks as c where c.kb_id = %s) as x) as p where k.id = %s",
                [kb_id, kb_id],
            )
            conn.execute(
                "insert into kb.embedding_queue (chunk_id, model_id, kb_id)"
                " select c.id, m.id, c.kb_id from kb.chunks c cross join kb.embedding_models m"
                " where c.kb_id = %s and m.id <> %s on conflict do nothing",
                [kb_id, model.id],
            )
        log(f"BM25 statistics in {time.perf_counter() - t0:.1f} s")
        conn.execute(f"drop table {STAGING_TABLE}")
        t0 = time.perf_counter()
        _build_postings(conn, kb_id)
        # the build folded the dictionary into blocks (kb_internal.compact_terms): the rows' indexes hold only
        # dead entries, as after `pgkb db migrate` compacts
        conn.execute("reindex table kb.term_stats")
        builds["kb.postings"] = time.perf_counter() - t0
        log(f"built the postings in {builds['kb.postings']:.1f} s")
        seconds = time.perf_counter() - start
        vacuum = _vacuum(conn)
        conn.execute(f"set maintenance_work_mem = '{maintenance_work_mem}'")
        for name, ddl in defs.items():
            log(f"building {name}")
            t0 = time.perf_counter()
            conn.execute(ddl)
            builds[name] = time.perf_counter() - t0
            log(f"built {name} in {builds[name]:.1f} s")
    finally:
        for name, ddl in defs.items():  # after a failure: never leave the database without its indexes
            if name not in builds:
                log(f"rebuilding {name}")
                conn.execute(ddl.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))
        conn.execute("reset maintenance_work_mem")
        conn.execute(f"drop table if exists {STAGING_TABLE}")
    return seconds, vacuum, builds


# --------------------------------------------------------------------------------------------------
# Entry point


def prepare_kb(
    conn: psycopg.Connection,
    url: str,
    kb_name: str,
    chunks: int,
    pools: Pools,
    model: Model,
    method: str = "bulk",
    maintenance_work_mem: str = "4GB",
    vectors: VectorSource | None = None,
    allow_shared: bool = False,
) -> tuple[int, LoadReport]:
    """Make the (public) knowledge base hold exactly `chunks` bench chunks; returns (kb id, load report).

    A knowledge base that already holds exactly that many chunks and embeddings of the same kind (`vectors`,
    default uniform) is reused; a bulk-loaded one with that many chunks but other embeddings gets only its
    embeddings rewritten (_rewrite_vectors); otherwise it is deleted outright and reloaded with `method`
    ("bulk" or "replace"). Both the bulk load and the rewrite drop shared indexes: SharedDatabase when
    other knowledge bases are there, unless `allow_shared`."""
    vectors = vectors or VectorSource()
    if method not in LOAD_METHODS:
        raise ValueError(f"unknown load method {method!r}: expected one of {', '.join(LOAD_METHODS)}")
    kb_id, n_chunks, n_emb, description = _kb_state(conn, kb_name, model)
    try:
        stored_report: LoadReport | None = LoadReport(**json.loads(description))
    except (ValueError, TypeError):
        stored_report = None
    stored_vectors = stored_report.vectors if stored_report else "uniform"
    if (
        kb_id is not None
        and n_chunks == chunks
        and n_emb == chunks
        and stored_report is not None
        and stored_report.method == "bulk"
        and stored_vectors != vectors.describe()
    ):
        # the same chunks (document i is a function of i) with other embeddings: rewrite only those
        log(f"knowledge base {kb_name!r}: embeddings {stored_vectors}, wanted {vectors.describe()}; rewriting them")
        if not allow_shared:
            refuse_shared(conn, kb_name)
        with _signals_exit():
            _rewrite_vectors(conn, kb_id, stored_report, model, maintenance_work_mem, vectors)
        stored_vectors = stored_report.vectors
    if kb_id is not None and n_chunks == chunks and n_emb == chunks and stored_vectors == vectors.describe():
        log(f"reusing knowledge base {kb_name!r} ({chunks} chunks)")
        report = stored_report or LoadReport(method="unknown", chunks=chunks, seconds=0.0, vacuum_seconds=0.0)
        report.reused = True
        return kb_id, report
    if method == "bulk" and not allow_shared:
        refuse_shared(conn, kb_name)
    if kb_id is not None:
        log(f"dropping knowledge base {kb_name!r} ({n_chunks} chunks, {n_emb} embeddings)")
        conn.execute("delete from kb.knowledge_bases where id = %s", [kb_id])
    log(f"loading {chunks} chunks into {kb_name!r} ({method})")
    kb_id = one(conn.execute("select kb.create_knowledge_base(%s, 'public')", [kb_name]))[0]
    builds: dict[str, float] = {}
    if method == "replace":
        start = time.perf_counter()
        _load_replace(url, kb_name, chunks, pools, model, vectors)
        seconds = time.perf_counter() - start
        vacuum = _vacuum(conn)
    else:
        with _signals_exit():
            seconds, vacuum, builds = _load_bulk(conn, url, kb_id, chunks, pools, model, maintenance_work_mem, vectors)
    report = LoadReport(
        method=method,
        chunks=chunks,
        seconds=seconds,
        vacuum_seconds=vacuum,
        index_builds=builds,
        maintenance_work_mem=maintenance_work_mem if method == "bulk" else "",
        vectors=vectors.describe(),
    )
    log(report.describe())
    _, n_chunks, n_emb, _ = _kb_state(conn, kb_name, model)
    if n_chunks != chunks or n_emb != chunks:
        raise RuntimeError(f"load ended with {n_chunks} chunks / {n_emb} embeddings, expected {chunks}")
    _store_report(conn, kb_id, report)
    return kb_id, report
