-- requires: plpython3u
-- The posting build at compiled speed: kb_internal.build_postings's work (db/functions/31_postings.sql) done by
-- numpy in the server's Python, writing the same rows as its SQL steps (kb_internal.build_postings_batch): the same
-- blocks, byte for byte (payload format 3, lists cut into full blocks from their start), the same recent
-- postings, tiers and blocked_to (a test compares the two builders). Skipped by `pgkb db migrate` where
-- plpython3u is not available; kb_internal.build_postings then builds in SQL.

-- kb_internal.build_postings for target_kb, with numpy: its blocks deleted and its dictionary entries out of their
-- blocks (kb_internal.expand_terms), then built in two passes so that memory
-- stays bounded and each (term, tier) list is written once, in full blocks: (1) the chunks in id order,
-- `step` (at most 65,536) at a time: term frequencies computed once per chunk (kb.chunk_terms, as arrays read in
-- Python), each term's tiers and recent postings (terms with a document frequency below
-- kb_internal.recent_postings_limit()) noted, the other postings sorted by (term, tier, id) and staged in a
-- temporary table, per range of terms holding about 4 million postings; (2) per range, its staged
-- postings merged, cut into blocks of kb_internal.posting_block_size(), encoded as kb_internal.encode_postings does and
-- inserted in key order; then every kb.term_stats row of target_kb written once (not reset first: one
-- dead version a row). Returns the postings built.
create or replace function kb_internal.build_postings_numpy(target_kb integer, step integer default 25000)
returns bigint
language plpython3u volatile
set search_path = pg_catalog, pg_temp
as $$
from array import array
from operator import itemgetter

import numpy as np

if not 1 <= step <= 65536:  # a chunk's number in its step is staged in 16 bits
    plpy.error(f"step must be between 1 and 65536, not {step}")
RANGE = 4000000  # postings per range of terms in pass 2
if "build_plans" not in SD:
    SD["build_plans"] = {
        "limits": plpy.prepare(
            "select kb_internal.posting_block_size() as block_size, kb_internal.recent_postings_limit() as recent_limit", []
        ),
        "delete": plpy.prepare("delete from kb.postings as p where p.kb_id = $1", ["integer"]),
        # every dictionary entry out of its block: each one is rewritten (29_term_dictionary.sql)
        "expand": plpy.prepare("select kb_internal.expand_terms($1)", ["integer"]),
        "vocabulary": plpy.prepare(
            "select array_agg(s.term order by s.term) as terms, array_agg(s.df order by s.term) as dfs"
            " from kb.term_stats as s where s.kb_id = $1",
            ["integer"],
        ),
        # one pass-1 step: the highest id of the next chunks, then those chunks in id order (a range of the
        # primary key: with a LIMIT instead, the planner may sort every chunk's text)
        "step_end": plpy.prepare(
            "select max(c.id) as hi from (select c.id from kb.chunks as c"
            " where c.kb_id = $1 and c.id > $2 order by c.id limit $3) as c",
            ["integer", "bigint", "integer"],
        ),
        "chunks": plpy.prepare(
            "select c.id, c.term_count, t.terms, t.tfs from kb.chunks as c"
            " inner join kb.documents as d on c.document_id = d.id"
            " cross join lateral (select coalesce(array_agg(x.term), '{}') as terms, coalesce(array_agg(x.tf), '{}') as tfs"
            " from kb.chunk_terms(d.title, c.heading_path, c.content) as x) as t"
            " where c.kb_id = $1 and c.id > $2 and c.id <= $3 order by c.id",
            ["integer", "bigint", "bigint"],
        ),
        # the tier of each distinct (tf, length) pair, by kb_internal.posting_tier itself
        "tiers": plpy.prepare(
            "select array_agg(kb_internal.posting_tier(x.tf, x.dl)::integer order by x.o) as tiers"
            " from unnest($1::integer[], $2::integer[]) with ordinality as x (tf, dl, o)",
            ["integer[]", "integer[]"],
        ),
        "fields": plpy.prepare(
            "select array_agg(f.tf_bytes order by t) as tf_bytes, array_agg(f.dl_bytes order by t) as dl_bytes,"
            " array_agg(f.dl_min order by t) as dl_min"
            " from generate_series(0, 59) as t cross join lateral kb_internal.posting_fields(t) as f",
            [],
        ),
        "insert": plpy.prepare(
            "insert into kb.postings (kb_id, term, tier, first_chunk, n, payload)"
            " select $1, x.term, x.tier, x.first_chunk, x.n, x.payload"
            " from unnest($2::text[], $3::smallint[], $4::bigint[], $5::smallint[], $6::bytea[])"
            " as x (term, tier, first_chunk, n, payload)",
            ["integer", "text[]", "smallint[]", "bigint[]", "smallint[]", "bytea[]"],
        ),
        # x.o / x.k: a term's recent postings in $6..$8 (offset, count)
        "stats": plpy.prepare(
            "update kb.term_stats as s"
            " set tiers = x.tiers,"
            " recent_ids = coalesce($6[x.o + 1 : x.o + x.k], '{}'),"
            " recent_tfs = coalesce($7[x.o + 1 : x.o + x.k], '{}'),"
            " recent_dls = coalesce($8[x.o + 1 : x.o + x.k], '{}'),"
            " blocked_to = x.blocked_to"
            " from unnest($2::text[], $3::bigint[], $4::integer[], $5::integer[], $9::bigint[])"
            " as x (term, tiers, o, k, blocked_to)"
            " where s.kb_id = $1 and s.term = x.term",
            ["integer", "text[]", "bigint[]", "integer[]", "integer[]", "bigint[]", "integer[]", "integer[]",
             "bigint[]"],
        ),
    }
plans = SD["build_plans"]
limits = plpy.execute(plans["limits"])[0]
block_size, recent_limit = limits["block_size"], limits["recent_limit"]
fields = plpy.execute(plans["fields"])[0]
TF_BYTES, DL_BYTES, DL_MIN = (np.array(fields[k], dtype=np.int64) for k in ("tf_bytes", "dl_bytes", "dl_min"))

plpy.execute(plans["delete"], [target_kb])
plpy.execute(plans["expand"], [target_kb])
vocab = plpy.execute(plans["vocabulary"], [target_kb])[0]
vocab_terms = vocab["terms"] or []
term_index = {t: i for i, t in enumerate(vocab_terms)}
dfs = np.asarray(vocab["dfs"] or [], dtype=np.int64)
blocked_term = dfs >= recent_limit
# pass 2's ranges: consecutive terms whose blocked postings add up to about RANGE
range_of_term = (np.cumsum(np.where(blocked_term, dfs, 0)) - np.where(blocked_term, dfs, 0)) // RANGE
ranges = int(range_of_term[-1]) + 1 if len(dfs) else 0

# the staged postings: per pass-1 step and range, the (term, tier) runs' keys (term * 64 + tier) and
# lengths, and per posting its chunk's number in the step and its tf (bytes of `tf_width`)
if plpy.execute("select to_regclass('pg_temp.pgkb_posting_runs') is not null as left_over")[0]["left_over"]:
    plpy.execute("drop table pg_temp.pgkb_posting_runs")  # from a call in this transaction whose error was caught
plpy.execute(
    "create temporary table pgkb_posting_runs (part integer, step integer, keys bytea, counts bytea,"
    " chunks bytea, tfs bytea, tf_width integer)"
)
for column in ("keys", "counts", "chunks", "tfs"):  # large values, stored as they are
    plpy.execute(f"alter table pg_temp.pgkb_posting_runs alter column {column} set storage external")
stage = plpy.prepare(
    "insert into pg_temp.pgkb_posting_runs values ($1, $2, $3, $4, $5, $6, $7)",
    ["integer", "integer", "bytea", "bytea", "bytea", "bytea", "integer"],
)
staged = plpy.prepare(
    "select step, keys, counts, chunks, tfs, tf_width from pg_temp.pgkb_posting_runs where part = $1 order by step",
    ["integer"],
)


def stable_order(key):
    """The stable ascending order of non-negative int64 keys: two 16-bit radix passes below 2^32."""
    if len(key) and int(key.max()) >= 1 << 32:
        return np.argsort(key, kind="stable")
    order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((key[order] >> 16).astype(np.uint16), kind="stable")]


def numbers(keys):
    """The vocabulary numbers of terms (one dictionary lookup each, in C)."""
    if len(keys) == 1:
        return [term_index[keys[0]]]
    return itemgetter(*keys)(term_index) if keys else ()


steps = []  # per pass-1 step: its chunks' ids and lengths
# per vocabulary term, over all steps: its tiers (bits) and highest id in blocks (-1: none); and the
# recent postings (terms below the limit), per step
term_tiers = np.zeros(len(vocab_terms), dtype=np.int64)
term_blocked_to = np.full(len(vocab_terms), -1, dtype=np.int64)
recent_parts = [(np.zeros(0, dtype=np.int64),) * 4]


def first_pass(step_no, term, tf, per_chunk, chunk_ids, chunk_dls):
    """One step's postings: their tiers, their terms' tiers and recent postings noted, the others staged."""
    # tiers by kb_internal.posting_tier itself, asked once for every distinct tf with every distinct chunk length
    tf_values = np.flatnonzero(np.bincount(tf))
    dl_values, dl_of_chunk = np.unique(chunk_dls, return_inverse=True)
    grid = plpy.execute(plans["tiers"], [np.repeat(tf_values, len(dl_values)).tolist(),
                                         np.tile(dl_values, len(tf_values)).tolist()])[0]["tiers"]
    grid = np.asarray(grid, dtype=np.int64).reshape(len(tf_values), len(dl_values))
    tf_row = np.zeros(int(tf_values[-1]) + 1, dtype=np.int64)
    tf_row[tf_values] = np.arange(len(tf_values))
    chunk_no = np.repeat(np.arange(len(chunk_ids), dtype=np.int64), per_chunk)
    tier = grid[tf_row[tf], dl_of_chunk[chunk_no]]
    # by (term, tier), ids ascending within (postings were read in id order; the sort is stable)
    order = stable_order(term * 64 + tier)
    term, tier, chunk_no, tf = term[order], tier[order], chunk_no[order], tf[order]
    starts = np.flatnonzero(np.r_[True, term[1:] != term[:-1]])
    touched = term[starts]
    term_tiers[touched] |= np.bitwise_or.reduceat(np.left_shift(1, tier), starts)
    highest = np.maximum.reduceat(chunk_ids[chunk_no], starts)
    term_blocked_to[touched] = np.where(blocked_term[touched], highest, term_blocked_to[touched])
    blocked = blocked_term[term]
    recent = ~blocked
    recent_parts.append((term[recent], chunk_ids[chunk_no[recent]], tf[recent], chunk_dls[chunk_no[recent]]))
    # the blocked postings, per range of terms: their runs and per posting its chunk number and tf
    sel = np.flatnonzero(blocked)
    b_term, b_key, b_chunk, b_tf = term[sel], term[sel] * 64 + tier[sel], chunk_no[sel], tf[sel]
    part = range_of_term[b_term]
    cuts = np.flatnonzero(np.diff(part)) + 1
    for a, z in zip([0, *cuts.tolist()], [*cuts.tolist(), len(sel)]) if len(sel) else ():
        key = b_key[a:z]
        run = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        tf_width = 1 if b_tf[a:z].max() < 256 else (2 if b_tf[a:z].max() < 65536 else 4)
        plpy.execute(stage, [
            int(part[a]), step_no, key[run].astype(np.int64).tobytes(),
            np.diff(np.r_[run, z - a]).astype(np.int32).tobytes(), b_chunk[a:z].astype(np.uint16).tobytes(),
            b_tf[a:z].astype(f"u{tf_width}").tobytes(), tf_width,
        ])


def uint_into(out, offsets, values, widths):
    """Write each value unsigned big-endian in its width (1, 2, 4 or 8 bytes) at its byte offset of out."""
    for width in (1, 2, 4, 8):
        sel = widths == width
        if not sel.any():
            continue
        at, v = offsets[sel], values[sel]
        for j in range(width):
            out[at + j] = (v >> (8 * (width - 1 - j))) & 0xFF


def second_pass(part):
    """The blocks of one range of terms from its staged postings: inserted in (term, tier, first chunk)
    order."""
    keys, ids, tfs, dls = [], [], [], []
    for r in plpy.execute(staged, [part]):
        ids_of_step, dls_of_step = steps[r["step"]]
        chunk = np.frombuffer(r["chunks"], dtype=np.uint16)
        keys.append(np.repeat(np.frombuffer(r["keys"], dtype=np.int64), np.frombuffer(r["counts"], dtype=np.int32)))
        ids.append(ids_of_step[chunk])
        dls.append(dls_of_step[chunk])
        tfs.append(np.frombuffer(r["tfs"], dtype=f"u{r['tf_width']}").astype(np.int64))
    if not keys:
        return
    # steps in id order, each sorted by key: a stable sort by key keeps ids ascending within a list
    order = np.argsort(np.concatenate(keys), kind="stable")
    key, cid, tf, dl = (np.concatenate(x)[order] for x in (keys, ids, tfs, dls))
    tier = key & 63
    count = len(key)
    new_list = np.r_[True, key[1:] != key[:-1]]
    list_start = np.maximum.accumulate(np.where(new_list, np.arange(count), 0))
    start = np.flatnonzero(new_list | ((np.arange(count) - list_start) % block_size == 0))
    n = np.diff(np.r_[start, count])
    first = cid[start]
    gap = np.diff(cid, prepend=cid[:1])
    gap[start] = 0  # each block's ids as gaps, its first 0 (kb_internal.encode_postings)
    widest = np.maximum.reduceat(gap, start)
    b_tier = tier[start]
    ib = np.where(widest < 256, 1, np.where(widest < 65536, 2, np.where(widest < 4294967296, 4, 8)))
    tb, db = TF_BYTES[b_tier], DL_BYTES[b_tier]
    length = n * (ib + tb + db)
    at = np.cumsum(length) - length
    # per posting: its block and place in it, then each field written at its offsets
    blk = np.repeat(np.arange(len(start)), n)
    pos = np.arange(count) - start[blk]
    out = np.zeros(int(length.sum()), dtype=np.uint8)
    uint_into(out, at[blk] + pos * ib[blk], gap, ib[blk])
    stored = tb[blk] > 0
    uint_into(out, (at[blk] + n[blk] * ib[blk] + pos * tb[blk])[stored], tf[stored], tb[blk][stored])
    uint_into(out, at[blk] + n[blk] * (ib[blk] + tb[blk]) + pos * db[blk], dl - DL_MIN[tier], db[blk])
    raw = out.tobytes()
    ends = (at + length).tolist()
    terms = [vocab_terms[t] for t in (key[start] >> 6).tolist()]
    for a in range(0, len(start), 20000):
        z = min(a + 20000, len(start))
        plpy.execute(plans["insert"], [
            target_kb, terms[a:z], b_tier[a:z].tolist(), first[a:z].tolist(), n[a:z].tolist(),
            [raw[s:e] for s, e in zip(at[a:z].tolist(), ends[a:z])],
        ])


built = 0
done_to = -1  # the highest chunk id read
while (hi := plpy.execute(plans["step_end"], [target_kb, done_to, step])[0]["hi"]) is not None:
    terms, tfs = array("q"), array("q")
    ids, lengths, counts = array("q"), array("q"), array("q")
    cursor = plpy.cursor(plans["chunks"], [target_kb, done_to, hi])
    while fetched := cursor.fetch(2000):
        keys = []
        for c in fetched:
            keys.extend(c["terms"])
            tfs.extend(c["tfs"])
            ids.append(c["id"])
            lengths.append(c["term_count"])
            counts.append(len(c["terms"]))
        terms.extend(numbers(keys))  # numbers, not the strings, are kept
    done_to = hi
    chunk_ids = np.frombuffer(ids, dtype=np.int64)
    chunk_dls = np.frombuffer(lengths, dtype=np.int64)
    steps.append((chunk_ids, chunk_dls))
    term = np.frombuffer(terms, dtype=np.int64)
    if len(term):
        first_pass(len(steps) - 1, term, np.frombuffer(tfs, dtype=np.int64), np.frombuffer(counts, dtype=np.int64),
                   chunk_ids, chunk_dls)
    built += len(term)
for part in range(ranges):
    second_pass(part)
plpy.execute("drop table pg_temp.pgkb_posting_runs")
# kb.term_stats: every row of the knowledge base written once (tiers, recent postings by term, blocked_to)
if len(vocab_terms):
    r_term, r_id, r_tf, r_dl = (np.concatenate(x) for x in zip(*recent_parts))
    order = np.argsort(r_term, kind="stable")
    recent_count = np.bincount(r_term, minlength=len(vocab_terms))
    plpy.execute(plans["stats"], [
        target_kb, vocab_terms, term_tiers.tolist(), (np.cumsum(recent_count) - recent_count).tolist(),
        recent_count.tolist(), r_id[order].tolist(), r_tf[order].tolist(), r_dl[order].tolist(),
        [None if h < 0 else h for h in term_blocked_to.tolist()],
    ])
return built
$$;
