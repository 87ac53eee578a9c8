-- requires: plpython3u
-- The BM25 leg at compiled speed: the same exact Okapi BM25 top n as kb_internal.lexical_leg, computed by numpy
-- in the server's Python over the posting blocks' payloads (format in 31_postings.sql). Skipped by
-- `pgkb db migrate` where plpython3u is not available; kb_admin.lexical_engine() then picks the SQL leg.
create extension if not exists plpython3u;

-- True when the server's Python can import numpy (python3-numpy on Debian / Ubuntu; `make setup`
-- installs it). Cached per backend: the first import costs about 0.3 s, later calls nothing.
create or replace function kb_internal.numpy_available()
returns boolean
language plpython3u stable
set search_path = pg_catalog, pg_temp
as $$
if "numpy_ok" not in GD:
    try:
        import numpy  # noqa: F401
        GD["numpy_ok"] = True
    except ImportError:
        GD["numpy_ok"] = False
return GD["numpy_ok"]
$$;

-- The BM25 legs' top n (kb_internal.lexical_hits's rows: leg 'lexical' for the query's terms when plain or
-- expansions is NULL, leg 'fuzzy' for the query's terms and its corrections when expansions is not NULL;
-- see kb_internal.lexical_query_terms) over the given (visible) knowledge bases, ties by chunk id: df, N and
-- avgdl from those knowledge bases only; every posting of the terms (blocks and recent postings) read once
-- in a few statements, decoded and scored with numpy, summed per chunk for each leg and cut to the n best:
-- exact BM25 while a leg's terms' postings fit kb.settings.lexical_numpy_posting_budget; beyond it the
-- most common terms are left out, and when not even the rarest fits, the SQL leg (kb_internal.lexical_leg, within
-- its own budget) answers. With doc_filter, candidates are tested best first until n pass it, at most
-- lexical_posting_budget of them. Rank 1 = best; score = BM25. No MaxScore: its rounds cost more than
-- they saved at 100k chunks.
create or replace function kb_internal.lexical_legs_numpy(
    query text, kb_ids integer[], n integer, doc_filter jsonb, k1 double precision, b double precision,
    expansions jsonb, plain boolean
)
returns table (leg text, chunk_id bigint, rank integer, score double precision)
language plpython3u stable
set search_path = pg_catalog, pg_temp
as $$
import numpy as np

if "plans" not in SD:
    SD["plans"] = {
        # the SQL leg, for a query whose rarest term alone exceeds the numpy leg's budget
        "sql_leg": plpy.prepare(
            "select chunk_id, rank, score"
            " from kb_internal.lexical_leg($1, $2, $3, $4, $5, $6, kb_internal.setting_int('lexical_posting_budget'), $7)",
            ["text", "integer[]", "integer", "jsonb", "float8", "float8", "jsonb"],
        ),
        # N, total length, and the most candidates a document filter is tested on
        "size": plpy.prepare(
            "select greatest(coalesce(sum(k.chunk_count), 0), 1)::float8 as n_chunks,"
            " greatest(coalesce(sum(k.term_total), 0), 1)::float8 as total,"
            " kb_internal.setting_int('lexical_posting_budget') as filter_budget"
            " from kb.knowledge_bases as k where k.id = any($1)",
            ["integer[]"],
        ),
        # the query terms the legs take (kb_internal.lexical_query_terms: capped, the rarest) with their df over
        # the visible knowledge bases, and per visible knowledge base their recent postings. Both reads
        # below are a lateral subquery with OFFSET 0: one index lookup per term, keyed by the visible
        # kb_ids, whatever the row estimates (a join was planned as a hash join over every row)
        # kept_all / kept_plain: the rarest terms (of all / of the query's) while their postings fit
        # lexical_numpy_posting_budget
        "terms": plpy.prepare(
            "select q.term, q.df::float8 as df, q.weight, q.in_query, q.kept_all, q.kept_plain,"
            " s.recent_ids, s.recent_tfs, s.recent_dls"
            " from (select t.term, t.df, t.weight, t.in_query,"
            " sum(t.df) over w <= kb_internal.setting_int('lexical_numpy_posting_budget') as kept_all,"
            " t.in_query and coalesce(sum(t.df) filter (where t.in_query) over w, 0)"
            " <= kb_internal.setting_int('lexical_numpy_posting_budget') as kept_plain"
            " from kb_internal.lexical_query_terms($1, $2, $3) as t window w as (order by t.df, t.term)) as q"
            " cross join lateral (select s.recent_ids, s.recent_tfs, s.recent_dls from kb.term_stats as s"
            " where s.kb_id = any($2) and s.term = q.term offset 0) as s",
            ["text", "integer[]", "jsonb"],
        ),
        # every block of the terms in one row: the blocks' fields as binary arrays (one aggregate node
        # feeds all of them in one order) and their payloads concatenated in that order
        "blocks": plpy.prepare(
            "select array_send(array_agg(q.i::integer)) as term_no, array_send(array_agg(p.tier::integer)) as tier,"
            " array_send(array_agg(p.first_chunk)) as first_chunk, array_send(array_agg(p.n::integer)) as n,"
            " array_send(array_agg(octet_length(p.payload))) as length, string_agg(p.payload, ''::bytea) as payload"
            " from unnest($1::text[]) with ordinality as q (term, i)"
            " cross join lateral (select p.tier, p.first_chunk, p.n, p.payload from kb.postings as p"
            " where p.kb_id = any($2) and p.term = q.term offset 0) as p",
            ["text[]", "integer[]"],
        ),
        # which candidates pass doc_filter, tested on documents of the searched knowledge bases only
        "eligible": plpy.prepare(
            "select array_agg(c.id) as ids from kb.chunks as c"
            " inner join kb.documents as d on d.id = c.document_id"
            " where c.id = any($1) and d.kb_id = any($3)"
            " and kb_internal.visible_document_matches(d.kb_id, $3, d.metadata, $2)",
            ["bigint[]", "jsonb", "integer[]"],
        ),
    }
    # per tier (kb_internal.posting_fields): tf bytes, length bytes, the tf a tier fixes, the length floor
    SD["fields"] = (
        np.array([0 if t // 10 <= 1 else (1 if t // 10 <= 4 else 4) for t in range(60)]),
        np.array([1 if t % 10 <= 8 else 4 for t in range(60)]),
        np.array([t // 10 + 1 for t in range(60)], dtype=np.float64),
        np.array([(0, 45, 64, 91, 128, 181, 256, 362, 512, 724)[t % 10] for t in range(60)]),
    )
plans = SD["plans"]
TF_BYTES, DL_BYTES, TF_FIXED, DL_MIN = SD["fields"]
FULL = 256  # kb_internal.posting_block_size()


def binary_array(raw, element):
    """The elements of a one-dimensional array_send() of int4 (element ">i4") or int8 (">i8")."""
    return np.frombuffer(raw, dtype=np.dtype([("len", ">i4"), ("v", element)]), offset=20)["v"].astype(np.int64)


def column(m, start, width):
    """A field of full blocks: FULL unsigned big-endian integers of width bytes from byte start of every row
    of m (one block a row), as int64. Copied first: numpy before 1.23 changes the item size of C-contiguous
    arrays only."""
    return np.ascontiguousarray(m[:, start : start + FULL * width]).view(f">u{width}").astype(np.int64)


def uint_at(buf, offsets, widths):
    """Unsigned big-endian integers at the byte offsets, each of its width (1, 2, 4 or 8; below 2^63)."""
    out = np.zeros(len(offsets), dtype=np.int64)
    for width in (1, 2, 4, 8):
        sel = widths == width
        if not sel.any():
            continue
        every = sel.all()
        at = offsets if every else offsets[sel]
        v = buf[at].astype(np.int64)
        for j in range(1, width):
            v = (v << 8) | buf[at + j]
        if every:
            return v
        out[sel] = v
    return out


size = plpy.execute(plans["size"], [kb_ids])[0]
n_chunks = size["n_chunks"]
c1 = k1 * (1 - b)
c2 = k1 * b / (size["total"] / n_chunks)  # k1 * b / avgdl

# the legs asked for, each with the column saying which terms it keeps
legs = [("lexical", "kept_plain")] if plain or expansions is None else []
if expansions is not None:
    legs.append(("fuzzy", "kept_all"))
rows = plpy.execute(plans["terms"], [query, kb_ids, expansions])
out = []
for name, kept in list(legs):
    members = [r for r in rows if r["in_query"] or name == "fuzzy"]
    if members and not any(r[kept] for r in members):  # bounded work: not even the rarest term fits the budget
        sql_terms = expansions if name == "fuzzy" else None
        out += [(name, r["chunk_id"], r["rank"], r["score"])
                for r in plpy.execute(plans["sql_leg"], [query, kb_ids, n, doc_filter, k1, b, sql_terms])]
        legs.remove((name, kept))
rows = [r for r in rows if any(r[kept] for _, kept in legs)]
if not rows:
    return out
terms = sorted({r["term"] for r in rows})  # a row per term and knowledge base
term_no = {t: i for i, t in enumerate(terms)}
by_term = {r["term"]: r for r in rows}
idf = np.array([
    by_term[t]["weight"] * np.log(1 + (n_chunks - by_term[t]["df"] + 0.5) / (by_term[t]["df"] + 0.5)) for t in terms
])
recent = [(r["term"], r["recent_ids"], r["recent_tfs"], r["recent_dls"]) for r in rows if r["recent_ids"]]

parts_ids, parts_w, parts_t = [], [], []


def add(ids, tfs, dls, idfs, term_nos):
    """Collect the BM25 addends of postings (tfs, dls and idfs: arrays or one value for all) and their terms."""
    parts_ids.append(ids)
    parts_w.append(idfs * (k1 + 1) * tfs / (tfs + c1 + c2 * dls))
    parts_t.append(np.broadcast_to(term_nos, ids.shape))


for t, ids, tfs, dls in recent:
    add(np.asarray(ids, dtype=np.int64), np.asarray(tfs, dtype=np.float64), np.asarray(dls, dtype=np.float64),
        idf[term_no[t]], term_no[t])

row = plpy.execute(plans["blocks"], [terms, kb_ids])[0]
if row["n"] is not None:
    term_of = binary_array(row["term_no"], ">i4") - 1
    tier = binary_array(row["tier"], ">i4")
    first = binary_array(row["first_chunk"], ">i8")
    count = binary_array(row["n"], ">i4")
    length = binary_array(row["length"], ">i4")
    buf = np.frombuffer(row["payload"], dtype=np.uint8)
    start = np.cumsum(length) - length
    tf_bytes, dl_bytes = TF_BYTES[tier], DL_BYTES[tier]
    id_bytes = length // count - tf_bytes - dl_bytes
    full = count == FULL
    # full blocks, by layout (field widths): one 2-d array each, its fields big-endian views of its columns
    layout = (tf_bytes * 16 + dl_bytes) * 16 + id_bytes
    blocks = np.flatnonzero(full)
    blocks = blocks[np.argsort(layout[blocks], kind="stable")]
    cuts = (np.flatnonzero(np.diff(layout[blocks])) + 1).tolist()
    for a, z in zip([0, *cuts], [*cuts, len(blocks)]) if len(blocks) else ():
        sel = blocks[a:z]
        width = int(length[sel[0]])
        tb, db, ib = int(tf_bytes[sel[0]]), int(dl_bytes[sel[0]]), int(id_bytes[sel[0]])
        m = buf[start[sel][:, None] + np.arange(width)]
        ids = (first[sel][:, None] + column(m, 0, ib)).ravel()
        if tb:
            tfs = column(m, FULL * ib, tb).ravel().astype(np.float64)
        else:
            tfs = np.repeat(TF_FIXED[tier[sel]], FULL)
        dls = (column(m, FULL * (ib + tb), db) + DL_MIN[tier[sel]][:, None]).ravel()
        add(ids, tfs, dls, np.repeat(idf[term_of[sel]], FULL), np.repeat(term_of[sel], FULL))
    # the other blocks (a list's last one, small lists): a byte offset per posting and field
    part = np.flatnonzero(~full)
    if len(part):
        per = count[part]
        blk = np.repeat(part, per)
        pos = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
        base, n_blk, ib, tb, db = start[blk], count[blk], id_bytes[blk], tf_bytes[blk], dl_bytes[blk]
        ids = first[blk] + uint_at(buf, base + pos * ib, ib)
        tfs = TF_FIXED[tier[blk]]
        stored = tb > 0
        if stored.any():
            tfs[stored] = uint_at(buf, (base + n_blk * ib + pos * tb)[stored], tb[stored])
        dls = DL_MIN[tier[blk]] + uint_at(buf, base + n_blk * (ib + tb) + pos * db, db)
        add(ids, tfs, dls, idf[term_of[blk]], term_of[blk])

if not parts_ids:  # df > 0 but no postings: a knowledge base between kb_internal.clear_postings and its build
    return out
all_ids = np.concatenate(parts_ids)
all_w = np.concatenate(parts_w)
all_t = np.concatenate(parts_t)


def best(ids, scores, k):
    """The k best (score descending, then id ascending) of ids / scores, in that order."""
    if len(ids) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= kth
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


def top(ids, weights):
    """The n best chunks of the postings (ids, BM25 addends): summed per chunk (densely over the id range
    when it is not much wider than the postings), then, with doc_filter, tested best first in growing
    batches until n pass it or lexical_posting_budget were tested."""
    if not len(ids):
        return np.empty(0, dtype=np.int64), np.empty(0)
    lo = int(ids.min())
    span = int(ids.max()) - lo + 1
    if span <= 4 * len(ids) + 65536:
        acc = np.bincount(ids - lo, weights=weights, minlength=span)
        cand_ids = np.flatnonzero(acc)
        cand_scores = acc[cand_ids]
        cand_ids = cand_ids + lo
    else:
        cand_ids, inverse = np.unique(ids, return_inverse=True)
        cand_scores = np.bincount(inverse, weights=weights)
    if doc_filter is None:
        return best(cand_ids, cand_scores, n)
    got_ids, got_scores = [], []
    want = max(4 * n, 256)
    tested = 0
    remaining_ids, remaining_scores = cand_ids, cand_scores
    while len(remaining_ids) and sum(len(x) for x in got_ids) < n and tested < size["filter_budget"]:
        want = min(want, size["filter_budget"] - tested)
        tested += want
        batch_ids, batch_scores = best(remaining_ids, remaining_scores, want)
        ok = plpy.execute(plans["eligible"], [batch_ids.tolist(), doc_filter, kb_ids])[0]["ids"] or []
        keep = np.isin(batch_ids, np.asarray(ok, dtype=np.int64))
        got_ids.append(batch_ids[keep])
        got_scores.append(batch_scores[keep])
        rest = ~np.isin(remaining_ids, batch_ids)
        remaining_ids, remaining_scores = remaining_ids[rest], remaining_scores[rest]
        want *= 4
    top_ids = np.concatenate(got_ids)[:n] if got_ids else np.empty(0, dtype=np.int64)
    top_scores = np.concatenate(got_scores)[:n] if got_scores else np.empty(0)
    return top_ids, top_scores


for name, kept in legs:
    keep = np.array([bool(by_term[t][kept]) for t in terms])[all_t]
    ids, scores = top(all_ids[keep], all_w[keep])
    out += [(name, int(i), r + 1, float(s)) for r, (i, s) in enumerate(zip(ids, scores))]
return out
$$;


-- The numpy BM25 leg alone (chunk_id, rank, score): the 'fuzzy' ranking of kb_internal.lexical_legs_numpy when
-- expansions is not NULL, else its 'lexical' one. The same ranking as kb_internal.lexical_leg / lexical_leg_scan
-- with the same arguments (tests compare them).
create or replace function kb_internal.lexical_leg_numpy(
    query text, kb_ids integer[], n integer, doc_filter jsonb, k1 double precision, b double precision,
    expansions jsonb default null
)
returns table (chunk_id bigint, rank integer, score double precision)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select x.chunk_id, x.rank, x.score from kb_internal.lexical_legs_numpy(query, kb_ids, n, doc_filter, k1, b, expansions, false) as x
$$;
