-- requires: plpython3u
-- The BM25 leg at compiled speed: the same exact Okapi BM25 top n as kb.lexical_leg, computed by numpy
-- in the server's Python over the posting blocks' payloads (format in 31_postings.sql). Skipped by
-- `pgkb db migrate` where plpython3u is not available; kb.lexical_engine() then picks the SQL leg.
create extension if not exists plpython3u;

-- True when the server's Python can import numpy (python3-numpy on Debian / Ubuntu; `make setup`
-- installs it). Cached per backend: the first import costs about 0.3 s, later calls nothing.
create or replace function kb.numpy_available()
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

-- Exact Okapi BM25 top n of query over the given (visible) knowledge bases, ties by chunk id: df, N and
-- avgdl from those knowledge bases only, every posting of the query's terms read (blocks and recent
-- postings) in a few statements, decoded and scored with numpy, summed per chunk and cut to the n best;
-- with doc_filter, candidates are taken best first until n pass it. Rank 1 = best; score = BM25.
create or replace function kb.lexical_leg_numpy(
    query text, kb_ids integer[], n integer, doc_filter jsonb, k1 double precision, b double precision
)
returns table (chunk_id bigint, rank integer, score double precision)
language plpython3u stable
set search_path = pg_catalog, pg_temp
as $$
import numpy as np

if "plans" not in SD:
    SD["plans"] = {
        "size": plpy.prepare(
            "select greatest(coalesce(sum(k.chunk_count), 0), 1)::float8 as n_chunks,"
            " greatest(coalesce(sum(k.term_total), 0), 1)::float8 as total"
            " from kb.knowledge_bases as k where k.id = any($1)",
            ["integer[]"],
        ),
        # per visible knowledge base and query term: df and the recent postings
        "terms": plpy.prepare(
            "select q.term, s.df::float8 as df, s.recent_ids, s.recent_tfs, s.recent_dls"
            " from (select distinct t.term from unnest(kb.lexical_terms($1)) as t (term)) as q"
            " inner join kb.term_stats as s on s.term = q.term and s.kb_id = any($2)"
            " where s.df > 0",
            ["text", "integer[]"],
        ),
        # every block of the terms, one row per (term, tier), blocks of one layout together (same order in
        # every aggregate: ties on (length, n) are equal layouts, so any order among them lines up)
        "blocks": plpy.prepare(
            "select q.i::integer as i, p.tier::integer as tier,"
            " array_agg(p.first_chunk order by octet_length(p.payload), p.n) as firsts,"
            " array_agg(p.n::integer order by octet_length(p.payload), p.n) as ns,"
            " array_agg(octet_length(p.payload) order by octet_length(p.payload), p.n) as lens,"
            " string_agg(p.payload, ''::bytea order by octet_length(p.payload), p.n) as payload"
            " from unnest($1::text[]) with ordinality as q (term, i)"
            " inner join kb.postings as p on p.kb_id = any($2) and p.term = q.term"
            " group by q.i, p.tier",
            ["text[]", "integer[]"],
        ),
        "eligible": plpy.prepare(
            "select array_agg(c.id) as ids from kb.chunks as c"
            " inner join kb.documents as d on d.id = c.document_id"
            " where c.id = any($1) and kb.document_matches(d.metadata, $2)",
            ["bigint[]", "jsonb"],
        ),
    }
plans = SD["plans"]


def fields(tier):
    """(tf_bytes, dl_bytes, tf_fixed, dl_min) of a tier's blocks, as kb.posting_fields."""
    tf_class, dl_class = divmod(tier, 10)
    return (
        0 if tf_class <= 1 else (1 if tf_class <= 4 else 4),
        1 if dl_class <= 8 else 4,
        tf_class + 1,
        (0, 45, 64, 91, 128, 181, 256, 362, 512, 724)[dl_class],
    )


def decode(tier, firsts, ns, lens, payload):
    """(chunk ids, tfs or None when the tier fixes tf, lengths) of a (term, tier) list's blocks, laid out
    as kb.encode_postings writes them. Blocks of one layout (n and payload length) come in runs (the
    query orders them so); each run is one 2-d view, its fields big-endian views of its columns."""
    tf_bytes, dl_bytes, _, dl_min = fields(tier)
    buf = np.frombuffer(payload, dtype=np.uint8)
    firsts = np.asarray(firsts, dtype=np.int64)
    ns = np.asarray(ns, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    cuts = (np.flatnonzero((np.diff(lens) != 0) | (np.diff(ns) != 0)) + 1).tolist()
    ids, tfs, dls = [], [], []
    offset = 0
    for a, z in zip([0, *cuts], [*cuts, len(ns)]):
        n, length = int(ns[a]), int(lens[a])
        m = buf[offset : offset + (z - a) * length].reshape(z - a, length)
        offset += (z - a) * length
        id_bytes = length // n - tf_bytes - dl_bytes
        ids.append((firsts[a:z, None] + m[:, : n * id_bytes].view(f">u{id_bytes}")).ravel())
        if tf_bytes:
            tfs.append(m[:, n * id_bytes : n * (id_bytes + tf_bytes)].view(f">u{tf_bytes}").ravel())
        dls.append(m[:, n * (id_bytes + tf_bytes) :].view(f">u{dl_bytes}").ravel())
    dl = np.concatenate(dls).astype(np.int64) + dl_min  # no uint8 wrap-around under any numpy
    return np.concatenate(ids), (np.concatenate(tfs) if tf_bytes else None), dl


size = plpy.execute(plans["size"], [kb_ids])[0]
n_chunks = size["n_chunks"]
avgdl = size["total"] / n_chunks

df = {}
recent = []
for row in plpy.execute(plans["terms"], [query, kb_ids]):
    df[row["term"]] = df.get(row["term"], 0.0) + row["df"]
    if row["recent_ids"]:
        recent.append((row["term"], row["recent_ids"], row["recent_tfs"], row["recent_dls"]))
if not df:
    return []
terms = sorted(df)
idf = {t: float(np.log(1 + (n_chunks - df[t] + 0.5) / (df[t] + 0.5))) for t in terms}

parts_ids = []
parts_w = []


def add(term, ids, tfs, dls):
    """Collect the BM25 addends of a term's postings (tfs: an array, or one tf for all)."""
    parts_ids.append(ids)
    parts_w.append(idf[term] * (k1 + 1) * tfs / (tfs + k1 * (1 - b) + (k1 * b / avgdl) * dls))


for term, ids, tfs, dls in recent:
    add(term, np.asarray(ids, dtype=np.int64), np.asarray(tfs, dtype=np.float64), np.asarray(dls, dtype=np.float64))
for row in plpy.execute(plans["blocks"], [terms, kb_ids]):
    ids, tfs, dls = decode(row["tier"], row["firsts"], row["ns"], row["lens"], row["payload"])
    add(terms[row["i"] - 1], ids, float(fields(row["tier"])[2]) if tfs is None else tfs.astype(np.float64), dls)

all_ids = np.concatenate(parts_ids)
all_w = np.concatenate(parts_w)
lo = int(all_ids.min())
span = int(all_ids.max()) - lo + 1
if span <= 4 * len(all_ids) + 65536:
    acc = np.bincount(all_ids - lo, weights=all_w, minlength=span)
    cand_ids = np.flatnonzero(acc)
    cand_scores = acc[cand_ids]
    cand_ids = cand_ids + lo
else:
    cand_ids, inverse = np.unique(all_ids, return_inverse=True)
    cand_scores = np.bincount(inverse, weights=all_w)


def best(ids, scores, k):
    """The k best (score descending, then id ascending) of ids / scores, in that order."""
    if len(ids) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= kth
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


if doc_filter is None:
    top_ids, top_scores = best(cand_ids, cand_scores, n)
else:
    # best first, in growing batches, until n candidates pass the filter
    got_ids, got_scores = [], []
    want = max(4 * n, 256)
    remaining_ids, remaining_scores = cand_ids, cand_scores
    while len(remaining_ids) and sum(len(x) for x in got_ids) < n:
        batch_ids, batch_scores = best(remaining_ids, remaining_scores, want)
        ok = plpy.execute(plans["eligible"], [batch_ids.tolist(), doc_filter])[0]["ids"] or []
        keep = np.isin(batch_ids, np.asarray(ok, dtype=np.int64))
        got_ids.append(batch_ids[keep])
        got_scores.append(batch_scores[keep])
        rest = ~np.isin(remaining_ids, batch_ids)
        remaining_ids, remaining_scores = remaining_ids[rest], remaining_scores[rest]
        want *= 4
    top_ids = np.concatenate(got_ids)[:n] if got_ids else np.empty(0, dtype=np.int64)
    top_scores = np.concatenate(got_scores)[:n] if got_scores else np.empty(0)

return [(int(i), r + 1, float(s)) for r, (i, s) in enumerate(zip(top_ids, top_scores))]
$$;
