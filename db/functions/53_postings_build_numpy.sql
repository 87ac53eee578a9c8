-- requires: plpython3u
-- The posting build at compiled speed: kb_internal.build_postings_batch's work (db/functions/31_postings.sql) done
-- by numpy in the server's Python, writing the same rows: the same blocks, byte for byte (payload format
-- 1), the same recent postings, tiers and blocked_to (a test compares the two builders). Skipped by
-- `pgkb db migrate` where plpython3u is not available; kb_internal.build_postings_batch then builds in SQL.

-- kb_internal.build_postings_batch for the chunks of target_kb above after_id up to and including up_to (the
-- caller's batch; every id already in the lists is below them), with numpy: term frequencies read once
-- per chunk (term_freqs as text, parsed in Python), postings of terms with a document frequency of at
-- least kb_internal.recent_postings_limit() sorted by (term, tier, id) and cut into blocks of
-- kb_internal.posting_block_size(), each encoded as kb_internal.encode_postings does; the others appended to their terms'
-- recent postings. Returns the postings written.
create or replace function kb_internal.build_postings_numpy(target_kb integer, after_id bigint, up_to bigint)
returns bigint
language plpython3u volatile
set search_path = pg_catalog, pg_temp
as $$
import json
from array import array

import numpy as np

if "build_plans" not in SD:
    SD["build_plans"] = {
        "limits": plpy.prepare(
            "select kb_internal.posting_block_size() as block_size, kb_internal.recent_postings_limit() as recent_limit", []
        ),
        "vocabulary": plpy.prepare(
            "select array_agg(s.term order by s.term) as terms, array_agg(s.df order by s.term) as dfs"
            " from kb.term_stats as s where s.kb_id = $1",
            ["integer"],
        ),
        "chunks": plpy.prepare(
            "select c.id, c.term_count, c.term_freqs::text as freqs from kb.chunks as c"
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
        "stats": plpy.prepare(
            "update kb.term_stats as s"
            " set tiers = s.tiers | x.tiers,"
            " recent_ids = s.recent_ids || coalesce($6[x.o + 1 : x.o + x.k], '{}'),"
            " recent_tfs = s.recent_tfs || coalesce($7[x.o + 1 : x.o + x.k], '{}'),"
            " recent_dls = s.recent_dls || coalesce($8[x.o + 1 : x.o + x.k], '{}'),"
            " blocked_to = greatest(s.blocked_to, x.blocked_to)"
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

vocab = plpy.execute(plans["vocabulary"], [target_kb])[0]
vocab_terms = vocab["terms"] or []
term_index = {t: i for i, t in enumerate(vocab_terms)}
blocked_term = np.asarray(vocab["dfs"] or [], dtype=np.int64) >= recent_limit

# every posting of the batch: term number, chunk id, tf, chunk length
t_parts, tf_parts = array("q"), array("q")
ids, lengths, counts = array("q"), array("q"), array("q")
cursor = plpy.cursor(plans["chunks"], [target_kb, after_id, up_to])
while True:
    batch = cursor.fetch(2000)
    if not batch:
        break
    for c in batch:
        freqs = json.loads(c["freqs"])
        t_parts.extend(map(term_index.__getitem__, freqs.keys()))
        tf_parts.extend(freqs.values())
        ids.append(c["id"])
        lengths.append(c["term_count"])
        counts.append(len(freqs))
per_chunk = np.frombuffer(counts, dtype=np.int64)
term = np.frombuffer(t_parts, dtype=np.int64)
tf = np.frombuffer(tf_parts, dtype=np.int64)
chunk_ids = np.frombuffer(ids, dtype=np.int64)
chunk_dls = np.frombuffer(lengths, dtype=np.int64)
if not len(term):  # chunks without terms
    return 0

# tiers by kb_internal.posting_tier itself, asked once for every distinct tf with every distinct chunk length
tf_values = np.flatnonzero(np.bincount(tf))
dl_values, dl_of_chunk = np.unique(chunk_dls, return_inverse=True)
grid = plpy.execute(plans["tiers"], [np.repeat(tf_values, len(dl_values)).tolist(),
                                     np.tile(dl_values, len(tf_values)).tolist()])[0]["tiers"]
grid = np.asarray(grid, dtype=np.int64).reshape(len(tf_values), len(dl_values))
tf_row = np.zeros(int(tf_values[-1]) + 1, dtype=np.int64)
tf_row[tf_values] = np.arange(len(tf_values))
tier = grid[tf_row[tf], np.repeat(dl_of_chunk, per_chunk)]
cid = np.repeat(chunk_ids, per_chunk)
dl = np.repeat(chunk_dls, per_chunk)

# per term (postings read in id order; a stable sort by term keeps it): its tiers, the highest id going
# to blocks, and the recent postings of the other terms
order = np.argsort(term, kind="stable")
term, tier, cid, tf, dl = term[order], tier[order], cid[order], tf[order], dl[order]
starts = np.flatnonzero(np.r_[True, term[1:] != term[:-1]])
touched = term[starts]
tier_bits = np.bitwise_or.reduceat(np.left_shift(1, tier), starts)
blocked = blocked_term[term]
is_blocked_term = blocked_term[touched]
ends = np.r_[starts[1:], len(term)]
recent_mask = ~blocked
recent_count = np.where(is_blocked_term, 0, ends - starts)
recent_offset = np.cumsum(recent_count) - recent_count
blocked_to = np.where(is_blocked_term, cid[ends - 1], 0)
plpy.execute(plans["stats"], [
    target_kb, [vocab_terms[t] for t in touched.tolist()], tier_bits.tolist(), recent_offset.tolist(),
    recent_count.tolist(), cid[recent_mask].tolist(), tf[recent_mask].tolist(), dl[recent_mask].tolist(),
    [None if not b else int(x) for b, x in zip(is_blocked_term.tolist(), blocked_to.tolist())],
])

# blocks: the blocked terms' postings by (term, tier, id) (a stable sort by term and tier keeps the ids'
# order), up to block_size each
sel = np.flatnonzero(blocked)
order = sel[np.argsort(term[sel] * 64 + tier[sel], kind="stable")]
b_term, b_tier, b_id, b_tf, b_dl = term[order], tier[order], cid[order], tf[order], dl[order]
new_list = np.r_[True, (b_term[1:] != b_term[:-1]) | (b_tier[1:] != b_tier[:-1])] if len(b_id) else np.zeros(0, bool)
list_start = np.maximum.accumulate(np.where(new_list, np.arange(len(b_id)), 0))
new_block = new_list | ((np.arange(len(b_id)) - list_start) % block_size == 0)
block_start = np.flatnonzero(new_block)
block_end = np.r_[block_start[1:], len(b_id)]
out_terms, out_tiers, out_first, out_n, out_payload = [], [], [], [], []


def flush():
    if out_terms:
        plpy.execute(plans["insert"], [target_kb, out_terms, out_tiers, out_first, out_n, out_payload])
    for part in (out_terms, out_tiers, out_first, out_n, out_payload):
        part.clear()


for a, z in zip(block_start.tolist(), block_end.tolist()):
    t = int(b_tier[a])
    first = int(b_id[a])
    span = int(b_id[z - 1]) - first
    id_bytes = 2 if span < 65536 else (4 if span < 4294967296 else 8)
    tb, db = int(TF_BYTES[t]), int(DL_BYTES[t])
    payload = (b_id[a:z] - first).astype(f">u{id_bytes}").tobytes()
    if tb:
        payload += b_tf[a:z].astype(f">u{tb}").tobytes()
    payload += (b_dl[a:z] - DL_MIN[t]).astype(f">u{db}").tobytes()
    out_terms.append(vocab_terms[int(b_term[a])])
    out_tiers.append(t)
    out_first.append(first)
    out_n.append(z - a)
    out_payload.append(payload)
    if len(out_terms) >= 20000:
        flush()
flush()
return len(cid)
$$;
