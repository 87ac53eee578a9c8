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
-- avgdl from those knowledge bases only; every posting of the terms (blocks and recent postings) read once,
-- one statement per set of legs a term counts in, decoded and scored with numpy (a tier's full blocks as
-- one 2-d array), summed per chunk once per such set and per leg, and cut to the n best (candidates: the
-- chunks scoring at least the n-th best of the rarest terms' chunks): exact BM25 while a leg's terms'
-- postings fit kb.settings.lexical_numpy_posting_budget; beyond it the most common terms are left out, and
-- when not even the rarest fits, the SQL leg (kb_internal.lexical_leg, within its own budget) answers. With
-- doc_filter, candidates are tested best first until n pass it, at most lexical_posting_budget of them.
-- Rank 1 = best; score = BM25. No MaxScore: see docs/benchmarks.md, "Issue 19's goals, 1M".
create or replace function kb_internal.lexical_legs_numpy(
    query text, kb_ids integer[], n integer, doc_filter jsonb, k1 double precision, b double precision,
    expansions jsonb, plain boolean
)
returns table (leg text, chunk_id bigint, rank integer, score double precision)
language plpython3u stable
set search_path = pg_catalog, pg_temp
-- every read is an index lookup keyed by kb_ids: a sequential scan, cheaper on a small table (compact
-- payloads make kb.postings small), would read every knowledge base's blocks
set enable_seqscan = off
as $$
import numpy as np

if "heap_mb" not in GD:
    # once per backend: glibc's malloc keeps up to lexical_numpy_heap_mb of freed memory (and takes arrays
    # below 32 MB from its heap) instead of returning it to the OS, so the next search's arrays do not
    # fault their pages in again (at a million chunks that halved this leg's time); 0: malloc as it was
    import ctypes

    kept = plpy.execute("select kb_internal.setting_int('lexical_numpy_heap_mb') as mb")[0]["mb"]
    GD["heap_mb"] = max(0, min(kept, 2047))  # mallopt takes a C int of bytes
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc's; absent elsewhere
    if GD["heap_mb"] > 0 and mallopt is not None:
        mallopt(-3, min(GD["heap_mb"], 32) << 20)  # M_MMAP_THRESHOLD
        mallopt(-1, GD["heap_mb"] << 20)  # M_TRIM_THRESHOLD

if "plans" not in SD:
    SD["plans"] = {
        # the SQL leg, for a query whose rarest term alone exceeds the numpy leg's budget
        "sql_leg": plpy.prepare(
            "select chunk_id, rank, score"
            " from kb_internal.lexical_leg($1, $2, $3, $4, $5, $6, kb_internal.setting_int('lexical_posting_budget'), $7)",
            ["text", "integer[]", "integer", "jsonb", "float8", "float8", "jsonb"],
        ),
        # N, total length, the most candidates a document filter is tested on, and the postings budget
        "size": plpy.prepare(
            "select greatest(coalesce(sum(k.chunk_count), 0), 1)::float8 as n_chunks,"
            " greatest(coalesce(sum(k.term_total), 0), 1)::float8 as total,"
            " kb_internal.setting_int('lexical_posting_budget') as filter_budget,"
            " kb_internal.setting_int('lexical_numpy_posting_budget') as posting_budget"
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
            " sum(t.df) over w <= $4 as kept_all,"
            " t.in_query and coalesce(sum(t.df) filter (where t.in_query) over w, 0) <= $4 as kept_plain"
            " from kb_internal.lexical_query_terms($1, $2, $3) as t window w as (order by t.df, t.term)) as q"
            " cross join lateral (select s.recent_ids, s.recent_tfs, s.recent_dls"
            " from kb_internal.term_entries($2, array[q.term]) as s offset 0) as s",
            ["text", "integer[]", "jsonb", "bigint"],
        ),
        # every block of the terms in one row: the blocks' fields as binary arrays and their payloads
        # concatenated, all in one order (one aggregate node over one sort): full blocks first, by tier and
        # size, so that the full blocks of a tier and id width are one 2-d array of bytes
        "blocks": plpy.prepare(
            "select array_send(array_agg(p.i)) as term_no, array_send(array_agg(p.tier)) as tier,"
            " array_send(array_agg(p.first_chunk)) as first_chunk, array_send(array_agg(p.n)) as n,"
            " array_send(array_agg(p.length)) as length, string_agg(p.payload, ''::bytea) as payload"
            " from (select q.i::integer as i, p.tier::integer as tier, p.first_chunk, p.n::integer as n,"
            " octet_length(p.payload) as length, p.payload"
            " from unnest($1::text[]) with ordinality as q (term, i)"
            " cross join lateral (select p.tier, p.first_chunk, p.n, p.payload from kb.postings as p"
            " where p.kb_id = any($2) and p.term = q.term offset 0) as p"
            " order by p.n < kb_internal.posting_block_size(), p.tier, octet_length(p.payload)) as p",
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
    of m (one block a row), one row per block (a view for width 1; wider ones copied first: numpy before
    1.23 changes the item size of C-contiguous arrays only)."""
    if width == 1:
        return m[:, start : start + FULL]
    return np.ascontiguousarray(m[:, start : start + FULL * width]).view(f">u{width}")


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
rows = plpy.execute(plans["terms"], [query, kb_ids, expansions, size["posting_budget"]])
out = []
for name, kept in list(legs):
    members = [r for r in rows if r["in_query"] or name == "fuzzy"]
    if members and not any(r[kept] for r in members):  # bounded work: not even the rarest term fits the budget
        sql_terms = expansions if name == "fuzzy" else None
        out += [(name, r["chunk_id"], r["rank"], r["score"])
                for r in plpy.execute(plans["sql_leg"], [query, kb_ids, n, doc_filter, k1, b, sql_terms])]
        legs.remove((name, kept))
# a term's class: the set of legs that score it (bit i: legs[i]); a row per term and visible knowledge base
classes = {}
for r in rows:
    mask = sum(1 << i for i, (_, kept) in enumerate(legs) if r[kept])
    if mask:
        classes[r["term"]] = mask
if not classes:
    return out
by_term = {}
for r in rows:
    by_term.setdefault(r["term"], []).append(r)


tables = {}


def tf_part(t):
    """BM25's tf part in tier t (a fixed tf) for each length of its floor plus 0..255, for this k1, b."""
    if t not in tables:
        dls = DL_MIN[t] + np.arange(256, dtype=np.float64)
        tables[t] = (k1 + 1) * TF_FIXED[t] / (TF_FIXED[t] + c1 + c2 * dls)
    return tables[t]


def read_class(terms):
    """Every posting of terms (blocks and recent postings): chunk ids and BM25 addends, and the starts and
    ends of the slices of those arrays that hold a block's or a term's recent postings, rarest term first."""
    df = np.array([by_term[t][0]["df"] for t in terms])
    weight = np.array([by_term[t][0]["weight"] for t in terms])
    idf = weight * np.log(1 + (n_chunks - df + 0.5) / (df + 0.5))
    row = plpy.execute(plans["blocks"], [terms, kb_ids])[0]
    recent = [(i, r) for i, t in enumerate(terms) for r in by_term[t] if r["recent_ids"]]
    count = binary_array(row["n"], ">i4") if row["n"] is not None else np.zeros(0, dtype=np.int64)
    total = int(count.sum()) + sum(len(r["recent_ids"]) for _, r in recent)
    ids = np.empty(total, dtype=np.int64)
    w = np.empty(total)
    spans = [np.zeros(0, dtype=np.int64)] * 3  # term index, start, end of each block's postings
    at = 0
    if len(count):
        term_of = binary_array(row["term_no"], ">i4") - 1
        tier = binary_array(row["tier"], ">i4")
        first = binary_array(row["first_chunk"], ">i8")
        length = binary_array(row["length"], ">i4")
        buf = np.frombuffer(row["payload"], dtype=np.uint8)
        start = np.cumsum(length) - length
        out_at = np.cumsum(count) - count
        spans = [term_of, out_at, out_at + count]
        tf_bytes, dl_bytes = TF_BYTES[tier], DL_BYTES[tier]
        id_bytes = length // count - tf_bytes - dl_bytes
        n_full = int(np.count_nonzero(count == FULL))  # the full blocks come first, by tier and size
        cuts = (np.flatnonzero(np.diff(tier[:n_full] * (1 << 20) + length[:n_full])) + 1).tolist()
        for a, z in zip([0, *cuts], [*cuts, n_full]) if n_full else ():
            t, width, tb, db, ib = int(tier[a]), int(length[a]), int(tf_bytes[a]), int(dl_bytes[a]), int(id_bytes[a])
            m = buf[start[a] : start[a] + (z - a) * width].reshape(z - a, width)
            done = at + (z - a) * FULL
            out_ids = ids[at:done].reshape(-1, FULL)
            np.cumsum(column(m, 0, ib), axis=1, dtype=np.int64, out=out_ids)  # gaps (0 first): offsets from first
            out_ids += first[a:z, None]
            out_w = w[at:done].reshape(-1, FULL)
            if tb == 0 and db == 1:  # the tier fixes tf and the length is its floor plus one byte: a table
                np.take(tf_part(t), m[:, FULL * ib : FULL * (ib + 1)], out=out_w, mode="clip")
            else:
                tfs = column(m, FULL * ib, tb) if tb else TF_FIXED[t]
                dls = column(m, FULL * (ib + tb), db) + DL_MIN[t]
                np.divide((k1 + 1) * tfs, tfs + c1 + c2 * dls, out=out_w)
            out_w *= idf[term_of[a:z], None]
            at = done
        # the other blocks (a list's last one): a byte offset per posting and field
        per = count[n_full:]
        if len(per):
            blk = np.repeat(np.arange(n_full, len(count)), per)
            pos = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
            base, n_blk, ib, tb, db = start[blk], count[blk], id_bytes[blk], tf_bytes[blk], dl_bytes[blk]
            tfs = TF_FIXED[tier[blk]]
            stored = tb > 0
            if stored.any():
                tfs[stored] = uint_at(buf, (base + n_blk * ib + pos * tb)[stored], tb[stored])
            dls = DL_MIN[tier[blk]] + uint_at(buf, base + n_blk * (ib + tb) + pos * db, db)
            done = at + len(blk)
            gaps = np.cumsum(uint_at(buf, base + pos * ib, ib))  # running over all these blocks: each
            ids[at:done] = first[blk] + gaps - np.repeat(gaps[np.cumsum(per) - per], per)  # starts at its 0
            w[at:done] = idf[term_of[blk]] * (k1 + 1) * tfs / (tfs + c1 + c2 * dls)
            at = done
    slices = []
    for i, r in recent:
        tfs = np.asarray(r["recent_tfs"], dtype=np.float64)
        done = at + len(tfs)
        ids[at:done] = r["recent_ids"]
        w[at:done] = idf[i] * (k1 + 1) * tfs / (tfs + c1 + c2 * np.asarray(r["recent_dls"], dtype=np.float64))
        slices.append((i, at, done))
        at = done
    if slices:  # and each term's recent postings
        spans = [np.concatenate([x, np.array(y, dtype=np.int64)]) for x, y in zip(spans, zip(*slices))]
    order = np.argsort(-idf[spans[0]], kind="stable")
    return ids, w, (spans[1][order], spans[2][order])


reads = {}
for mask in sorted(set(classes.values())):
    terms = sorted(t for t, m in classes.items() if m == mask)
    reads[mask] = read_class(terms)
all_ids = [x[0] for x in reads.values() if len(x[0])]
if not all_ids:  # df > 0 but no postings: a knowledge base between kb_internal.clear_postings and its build
    return out
lo = min(int(x.min()) for x in all_ids)
span = max(int(x.max()) for x in all_ids) - lo + 1
postings = sum(len(x) for x in all_ids)
# sums per chunk: over the id range (an array of span floats, about 1 ns a slot) unless it is much wider
# than the postings, else over the distinct ids (a sort: about 100 ns a posting with numpy 1.24)
if span <= 64 * postings + (1 << 20):
    slot = {mask: ids - lo for mask, (ids, _, _) in reads.items()}
    chunk_of = None
    width = span
else:
    distinct, inverse = np.unique(np.concatenate(all_ids), return_inverse=True)
    bounds = np.cumsum([0, *(len(ids) for ids, _, _ in reads.values())])
    slot = {mask: inverse[a:z] for mask, a, z in zip(reads, bounds[:-1], bounds[1:])}
    chunk_of = distinct
    width = len(distinct)


def best(ids, scores, k):
    """The k best (score descending, then id ascending) of ids / scores, in that order."""
    if len(ids) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= kth
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


def top(acc, pivots):
    """The n best chunks of one leg (acc: its sums per slot), candidates first cut to the slots scoring at
    least the n-th best of some slots' sums (pivots: the slots of the rarest terms' postings; any n distinct
    chunks' scores bound the n-th best from below); with doc_filter, tested best first in growing
    batches until n pass it or lexical_posting_budget were tested."""
    cand = None
    if doc_filter is None and len(pivots) >= n:
        kth = np.partition(acc[pivots], len(pivots) - n)[len(pivots) - n]
        if kth > 0:
            cand = np.flatnonzero(acc >= kth)
    if cand is None:
        cand = np.flatnonzero(acc != 0)
    cand_scores = acc[cand]
    cand_ids = cand + lo if chunk_of is None else chunk_of[cand]
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


sums = {mask: np.bincount(slot[mask], weights=w, minlength=width) for mask, (_, w, _) in reads.items()}
for i, (name, _) in enumerate(legs):
    mine = [mask for mask in sums if mask >> i & 1]
    if not mine:
        continue
    acc = sums[mine[0]] if len(mine) == 1 else sum(sums[mask] for mask in mine)
    # pivots: the slots of the rarest terms' postings of this leg (per set of legs), at least 4n of them
    picked = []
    for mask in mine:
        starts, ends = reads[mask][2]
        last = int(np.searchsorted(np.cumsum(ends - starts), 4 * n))
        picked += [slot[mask][a:z] for a, z in zip(starts[: last + 1].tolist(), ends[: last + 1].tolist())]
    pivots = np.unique(np.concatenate(picked)) if picked else np.empty(0, dtype=np.int64)
    ids, scores = top(acc, pivots)
    out += [(name, int(c), r + 1, float(s)) for r, (c, s) in enumerate(zip(ids, scores))]
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
