-- Search legs: vector (HNSW) and BM25 (posting blocks, kb_internal.lexical_hits; the numpy engine is
-- 52_lexical_numpy.sql), each the top n (chunk_id, rank, score) of the knowledge bases kb_ids; the fuzzy
-- leg is BM25 of the query's terms with their corrections (kb_internal.fuzzy_expansions, 49_fuzzy_terms.sql).
-- Visibility is applied by the legs themselves (kb_ids from kb.visible_kb_ids) so indexes stay usable
-- under row-level security; the legs are not executable by pgkb users. Their doc_filter is a
-- kb_internal.document_filter (containment and metadata conditions, see 48_metadata_filter.sql), tested on the
-- documents of kb_ids only (kb_internal.visible_document_matches), once per document when the planner hashes them.

-- Vector leg: cosine distance over each knowledge base's own partial HNSW index (one scan per knowledge
-- base of kb_ids, naming its model and knowledge base as literals so the planner matches that index;
-- iterative with a doc_filter, so the filter still fills n rows, or when more rows are asked for than
-- ef_search; otherwise the scan's ef_search candidates fill them, iterating cost about 0.3 ms a call, and a
-- scan that comes up short is iterated again), then the nearest n of them all. Knowledge bases of
-- fewer than kb.settings.vector_exact_chunks chunks are searched exactly instead, together, in one scan of
-- the slice btree (model_id, kb_id). No scan reads another knowledge base's rows, so what the leg reads never
-- depends on text the caller cannot see. The scans are asked for at least 40 rows (the first n are
-- returned): when they yield fewer (a filter holds fewer, or a graph lost them), an exact scan of the slice
-- answers instead. Rank 1 = nearest; score = cosine similarity. hnsw.ef_search comes from
-- kb.settings.hnsw_ef_search, for this call only. The plan never follows a caller's settings: the planner's
-- switches and cost constants are pinned to PostgreSQL's defaults, pgvector's scan settings to its own
-- (ef_search and iterative_scan as said), and sequential scans (of every knowledge base's rows), parallel
-- workers and JIT are off. Its own statements keep the caller's plan_cache_mode (EXECUTE plans every call).
create or replace function kb_internal.vector_leg(
    query_embedding vector, model kb.embedding_models, kb_ids integer[], n integer, doc_filter jsonb
)
returns table (chunk_id bigint, rank integer, score double precision)
language plpgsql stable
set search_path = pg_catalog, public, pg_temp
-- restored at exit, with what set_config sets below
set "hnsw.ef_search" = 40
set "hnsw.iterative_scan" = off
set "hnsw.max_scan_tuples" = 20000
set "hnsw.scan_mem_multiplier" = 1
set enable_seqscan = off
set max_parallel_workers_per_gather = 0
set jit = off
set enable_indexscan = on
set enable_indexonlyscan = on
set enable_bitmapscan = on
set enable_sort = on
set enable_incremental_sort = on
set enable_nestloop = on
set enable_hashjoin = on
set enable_mergejoin = on
set enable_material = on
set enable_memoize = on
set enable_hashagg = on
set seq_page_cost = 1
set random_page_cost = 4
set cpu_tuple_cost = 0.01
set cpu_index_tuple_cost = 0.005
set cpu_operator_cost = 0.0025
set effective_cache_size = '4GB'
as $$
declare
    -- the candidates of one knowledge base (%2$s: its id) or of them all (%2$s: 'any($2)'); %3$s is empty
    -- for the HNSW scan, ' + 0, e.chunk_id' orders by an expression no index serves (exact, ties by id); %1$s
    -- the model's stored column as its index reads it, %5$s the type the query is cast to
    -- (kb_internal.vector_expression: vector(384), or halfvec(1024) for a model stored in half precision)
    candidates_sql constant text := $sql$
        select e.chunk_id, (%1$s <=> $1::%5$s)::double precision as distance
        from kb.embeddings as e
        where e.model_id = %4$s and e.kb_id = %2$s
            and ($4::jsonb is null or exists (
                select from kb.chunks as c join kb.documents as d on d.id = c.document_id
                where c.id = e.chunk_id and d.kb_id = any($2)
                    and kb_internal.visible_document_matches(d.kb_id, $2, d.metadata, $4)
            ))
        order by (%1$s <=> $1::%5$s)%3$s
        limit $3
    $sql$;
    -- the nearest of them all; distance + 0: sorted here, never merged as if each scan's order were exact (a
    -- relaxed_order scan's is not)
    nearest_sql constant text := $sql$
        select coalesce(array_agg(nearest.chunk_id order by nearest.distance, nearest.chunk_id), '{}'),
            coalesce(array_agg(nearest.distance order by nearest.distance, nearest.chunk_id), '{}')
        from (select u.* from (%s) as u order by u.distance + 0, u.chunk_id limit $3) as nearest
    $sql$;
    fetch_n constant integer := greatest(n, 40);
    ef_search constant integer := kb_internal.setting_int('hnsw_ef_search');
    exact_below constant integer := kb_internal.setting_int('vector_exact_chunks');
    stored constant text := kb_internal.vector_expression(model.storage, model.dimension, 'column');
    query_type constant text := kb_internal.vector_expression(model.storage, model.dimension, 'cast');
    per_kb text;
    hnsw_scans boolean;     -- per_kb holds an HNSW scan
    ids bigint [];
    distances double precision [];
begin
    if coalesce(cardinality(kb_ids), 0) = 0 then
        return;
    end if;
    select string_agg(k.scan, ' union all '), bool_or(k.hnsw) into per_kb, hnsw_scans
    from (
        select format('(' || candidates_sql || ')', stored, k.id, '', model.id, query_type) as scan, true as hnsw
        from kb.knowledge_bases as k
        where k.id = any(kb_ids) and k.chunk_count >= exact_below
        union all
        select format(
            '(' || candidates_sql || ')', stored, format('any(%L::integer[])', array_agg(k.id)),
            ' + 0, e.chunk_id', model.id, query_type
        ), false
        from kb.knowledge_bases as k
        where k.id = any(kb_ids) and k.chunk_count < exact_below
        having count(*) > 0
    ) as k;
    if per_kb is null then
        return;
    end if;
    perform set_config('hnsw.ef_search', ef_search::text, true);
    -- iterative when a filter may drop rows or more rows are asked for than a scan's ef_search candidates
    if doc_filter is not null or fetch_n > ef_search then
        perform set_config('hnsw.iterative_scan', 'relaxed_order', true);
    end if;
    execute format(nearest_sql, per_kb) into ids, distances using query_embedding, kb_ids, fetch_n, doc_filter;
    if cardinality(ids) < fetch_n and hnsw_scans and current_setting('hnsw.iterative_scan') = 'off' then
        -- short without a filter: dead entries (rewritten documents not vacuumed yet) took candidates' places;
        -- an iterative scan goes on past them
        perform set_config('hnsw.iterative_scan', 'relaxed_order', true);
        execute format(nearest_sql, per_kb) into ids, distances using query_embedding, kb_ids, fetch_n, doc_filter;
    end if;
    if cardinality(ids) < fetch_n then
        execute format(nearest_sql, format(candidates_sql, stored, 'any($2)', ' + 0, e.chunk_id', model.id, query_type))
        into ids, distances using query_embedding, kb_ids, fetch_n, doc_filter;
    end if;
    return query select x.chunk_id, x.ord::integer, 1 - x.distance
    from unnest(ids[1:n], distances[1:n]) with ordinality as x (chunk_id, distance, ord);
end
$$;

-- The query terms the lexical legs score: the distinct kb_internal.query_terms of query (in_query, weight 1), their
-- translations (kb_internal.query_translations: glossary aliases and lexicon translations found in the
-- vocabulary, in_query, weighted below them with one idf per source concept) and the terms of expansions
-- ({term: weight}, the fuzzy leg's corrections, kb_internal.fuzzy_expansions) that occur in the knowledge bases
-- kb_ids, with their document frequency there, their posting tiers and weight (the legs multiply a term's idf
-- by it). A term that is several of these is a query term before a translation before a correction, at the
-- highest weight. At most kb.settings.lexical_max_query_terms query terms: the rarest (highest idf; ties by
-- term), so a long query costs what its most telling terms cost; translations and corrections are bounded by
-- their own settings. Rarest first. in_query: scored by the BM25 leg as well as the fuzzy one.
-- (plpgsql: its body is not checked against an older schema.)
create or replace function kb_internal.lexical_query_terms(query text, kb_ids integer[], expansions jsonb default null)
returns table (term text, df bigint, tiers bigint, weight double precision, in_query boolean)
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    max_terms constant integer := kb_internal.setting_int('lexical_max_query_terms');
    terms constant text[] := kb_internal.query_terms(query);
begin
    return query
    select r.term, r.df, r.tiers, r.weight, r.in_query
    from (
        select q.term, s.df, s.tiers, q.weight, q.kind < 2 as in_query,
            row_number() over (partition by q.kind = 0 order by s.df, q.term) as pos, q.kind
        from (
            -- kind 0: a query term, 1: a translation (its df and tiers read with it), 2: a correction
            select x.term, max(x.weight) filter (where x.kind = min_kind) as weight, min(x.kind) as kind,
                max(x.df) as df, max(x.tiers) as tiers
            from (
                select x.*, min(x.kind) over (partition by x.term) as min_kind
                from (
                    select t.term, 1::double precision as weight, 0 as kind, null::bigint as df, null::bigint as tiers
                    from unnest(terms) as t (term)
                    union all
                    select t.term, t.weight, 1, t.df, t.tiers
                    from kb_internal.query_translations(query, kb_ids, null, terms) as t
                    union all
                    select e.key, e.value::double precision, 2, null, null from jsonb_each_text(expansions) as e
                ) as x
            ) as x
            group by x.term
        ) as q
        -- a translation's df and tiers as query_translations read them; one index lookup for each other term,
        -- keyed by kb_ids, whatever the row estimates (none for a translation: a one-time filter)
        cross join lateral (
            select coalesce(q.df, sum(s.df))::bigint as df, coalesce(q.tiers, bit_or(s.tiers)) as tiers
            from kb_internal.term_counts(kb_ids, array[q.term]) as s
            where q.df is null
        ) as s
        where s.df > 0
    ) as r
    where r.kind <> 0 or r.pos <= max_terms
    order by r.df, r.term;
end
$$;

-- Lexical leg: the exact Okapi BM25 top n (the ranking of kb_internal.lexical_leg_scan without a probe budget),
-- df / N / avgdl from the visible knowledge bases' statistics, read from the posting blocks (kb.postings)
-- and the terms' recent postings (kb_internal.term_entries) without scoring every chunk that holds a query term. Each (term, tier) sublist bounds the score its
-- postings can add (idf * the tf part at the tier's tf ceiling and length floor, for the k1 / b given).
-- Sublists are read highest bound first, in rounds that grow about 4x, until the n-th best partial score
-- beats the bound of every chunk in no sublist read (MaxScore: rare terms carry the candidates, common
-- ones only add to them); the candidates that might still reach it get their missing terms from their
-- text (kb.chunk_terms, once per chunk, priced by its length; or, when those lookups would cost more, every
-- remaining sublist is read). Cost grows with n, the query terms and the postings above the bound; at worst
-- (many common terms of similar weight) with all the query terms' postings. docs/benchmarks.md, "Lexical leg
-- design" and "One stored copy of each chunk's terms".
create or replace function kb_internal.lexical_leg(
    query text, kb_ids integer[], n integer, doc_filter jsonb, k1 double precision, b double precision,
    posting_budget integer default null, expansions jsonb default null
)
returns table (chunk_id bigint, rank integer, score double precision)
language plpgsql stable
set search_path = pg_catalog, pg_temp
-- the rounds' aggregates are planned with tiny row estimates (arrays of unknown length); a parallel plan
-- then adds a Gather Merge and a sort of every posting read (~15% of a long query), for no gain
set max_parallel_workers_per_gather = 0
-- every read is an index lookup keyed by kb_ids: a sequential scan, cheaper on a small table, would read
-- every knowledge base's blocks and statistics
set enable_seqscan = off
-- its reads planned for their arrays of terms and sublists (PostgreSQL's default choice), also when
-- kb_internal.search forces generic plans: a generic plan reads the posting blocks by bitmap
set plan_cache_mode = auto
as $$
declare
    n_chunks double precision;
    avgdl double precision;
    terms text [];                  -- query terms occurring in the visible knowledge bases
    idfs double precision [];
    s_term integer [];              -- sublists, highest bound first: index into terms,
    s_tier integer [];              -- tier,
    s_est double precision [];      -- estimated postings (df / tiers of the term),
    s_rest double precision [];     -- bound of a chunk in none of the sublists before this one
    term_rest double precision [];  -- per term: bound of its first unread sublist (0: all read)
    total integer;
    m integer;                      -- sublists 1..m are read
    est double precision;
    want integer;
    want_est double precision;
    top_ids bigint [];              -- the n best chunks by partial score
    c_ids bigint [];                -- candidates: chunk ids,
    c_l double precision [];        -- partial scores,
    c_unread double precision [];   -- bounds of what their unread terms can add (0: score complete),
    c_dl integer [];                -- lengths in terms
    f_ids bigint [] := '{}';        -- chunks whose full score a lookup gave (each is looked up once):
    f_scores double precision [] := '{}';   -- their scores
    rest double precision;          -- bound of a chunk in none of the sublists read
    unresolved double precision;    -- what looking up the open candidates would cost, in postings
    theta double precision;         -- a lower bound of the n-th best score
    total_est double precision;     -- postings of all sublists (estimated)
    budget double precision := coalesce(posting_budget, 'infinity'::double precision);
    -- a lookup (a chunk's text tokenised by kb.chunk_terms) costs what reading, decoding and scoring one posting
    -- costs per this many terms of the chunk: about 1.7 us each on the 100k bench (docs/benchmarks.md, "One
    -- stored copy of each chunk's terms")
    terms_per_posting constant double precision := 1;
begin
    select greatest(coalesce(sum(k.chunk_count), 0), 1), greatest(coalesce(sum(k.term_total), 0), 1)
    into n_chunks, avgdl
    from kb.knowledge_bases as k where k.id = any(kb_ids);
    avgdl := avgdl / n_chunks;

    with weighted as (
        select * from kb_internal.lexical_query_terms(query, kb_ids, expansions)
    ),
    numbered as (
        select w.term, w.df, w.tiers, w.weight * ln(1 + (n_chunks - w.df + 0.5) / (w.df + 0.5)) as idf,
            row_number() over (order by w.term)::integer as i
        from weighted as w
    ),
    sublists as (
        select q.i, x.tier, q.df / bit_count(q.tiers::bit(64)) as est,
            q.idf * case when l.tf_max is null then k1 + 1
                else l.tf_max * (k1 + 1) / (l.tf_max + k1 * (1 - b + b * l.dl_min / avgdl)) end as bound
        from numbered as q
        cross join generate_series(0, 59) as x (tier)
        cross join lateral kb_internal.posting_tier_limits(x.tier) as l
        where (q.tiers >> x.tier) & 1 = 1
    ),
    ordered as (
        select u.i, u.tier, u.est,
            u.bound - coalesce(lead(u.bound) over (partition by u.i order by u.bound desc, u.tier), 0) as delta,
            row_number() over (order by u.bound desc, u.i, u.tier) as pos
        from sublists as u
    )
    select (select array_agg(q.term order by q.i) from numbered as q),
        (select array_agg(q.idf order by q.i) from numbered as q),
        array_agg(o.i order by o.pos), array_agg(o.tier order by o.pos), array_agg(o.est order by o.pos),
        array_agg(o.rest order by o.pos)
    into terms, idfs, s_term, s_tier, s_est, s_rest
    from (
        select v.*, sum(v.delta) over (order by v.pos rows between current row and unbounded following) as rest
        from ordered as v
    ) as o;

    if terms is null then
        return;     -- no query term occurs in the visible knowledge bases
    end if;
    total := cardinality(s_term);
    total_est := (select sum(e.v) from unnest(s_est) as e (v));

    -- first round: the highest sublists up to about 4n postings (at least one sublist)
    m := 1;
    est := s_est[1];
    while m < total and est < 4 * n loop
        m := m + 1;
        est := est + s_est[m];
    end loop;
    loop
        -- per term, the bound of its first unread sublist (sublists are in bound order)
        term_rest := array_fill(0::double precision, array[cardinality(terms)]);
        for i in m + 1 .. total loop
            term_rest[s_term[i]] := term_rest[s_term[i]] + s_rest[i] - coalesce(s_rest[i + 1], 0);
        end loop;
        rest := coalesce(s_rest[m + 1], 0);
        -- one pass over sublists 1..m: each chunk's partial score l and the bound h of its full score;
        -- the n best by l give theta, the chunks whose h reaches theta are the candidates
        with seen as materialized (
            select p.id, sum(idfs[p.ti] * p.tf * (k1 + 1) / (p.tf + k1 * (1 - b + b * p.dl / avgdl))) as l,
                greatest(rest - sum(term_rest[p.ti]), 0) as unread, max(p.dl) as dl
            from (
                select s.ti, d.chunk_id as id, d.tf, d.dl
                from unnest(s_term[1:m], s_tier[1:m]) as s (ti, tier)
                cross join lateral (   -- lateral: one index lookup per sublist, whatever the statistics
                    select pb.first_chunk, pb.n, pb.payload from kb.postings as pb
                    where pb.kb_id = any(kb_ids) and pb.term = terms[s.ti] and pb.tier = s.tier
                ) as pb
                cross join lateral kb_internal.decode_postings(s.tier, pb.first_chunk, pb.n, pb.payload) as d
                union all
                -- a term's recent postings (any tier) with its first sublist read: the bounds stay bounds
                select r.ti, unnest(ts.recent_ids), unnest(ts.recent_tfs), unnest(ts.recent_dls)
                from (select distinct x.ti from unnest(s_term[1:m]) as x (ti)) as r
                cross join lateral kb_internal.term_entries(kb_ids, array[terms[r.ti]]) as ts
            ) as p
            group by p.id
        ),
        eligible as materialized (
            select x.id, x.l, x.unread, x.dl from seen as x
            where doc_filter is null or exists (
                select from kb.chunks as c inner join kb.documents as d on c.document_id = d.id
                where c.id = x.id and d.kb_id = any(kb_ids)
                    and kb_internal.visible_document_matches(d.kb_id, kb_ids, d.metadata, doc_filter)
            )
        ),
        top as (
            select x.id, x.l from eligible as x order by x.l desc, x.id limit n
        ),
        bar as (
            select case when count(*) = n then min(t.l) end as theta from top as t
        )
        select (select array_agg(t.id) from top as t), bar.theta, array_agg(x.id) filter (where x.id is not null),
            array_agg(x.l) filter (where x.id is not null), array_agg(x.unread) filter (where x.id is not null),
            array_agg(x.dl) filter (where x.id is not null)
        into top_ids, theta, c_ids, c_l, c_unread, c_dl
        from bar left join eligible as x on (x.l + x.unread) * (1 + 1e-9) >= coalesce(bar.theta, 0)
        group by bar.theta;
        if theta is not null and m < total then
            -- the full scores of the n best bound the n-th best higher: a complete partial score as it is,
            -- the others from a lookup of their terms (once per chunk: kept in f_ids / f_scores)
            with looked_up as (
                select c.id, sum(idfs[q.i] * t.tf * (k1 + 1) / (t.tf + k1 * (1 - b + b * c.term_count / avgdl))) as bm25
                from kb.chunks as c
                inner join kb.documents as d on c.document_id = d.id
                cross join lateral kb.chunk_terms(d.title, c.heading_path, c.content) as t
                inner join unnest(terms) with ordinality as q (term, i) on t.term = q.term
                where c.id in (
                    select x.id from unnest(c_ids, c_unread) as x (id, unread)
                    where x.id = any(top_ids) and x.unread > 1e-12 and x.id <> all(f_ids)
                )
                group by c.id
            )
            select f_ids || coalesce(array_agg(l.id), '{}'), f_scores || coalesce(array_agg(l.bm25), '{}')
            into f_ids, f_scores
            from looked_up as l;
            select greatest(theta, min(coalesce(f.score, x.l))) into theta
            from unnest(c_ids, c_l, c_unread) as x (id, l, unread)
            left join unnest(f_ids, f_scores) as f (id, score) on f.id = x.id and x.unread > 1e-12
            where x.id = any(top_ids);
            select sum(x.dl) / terms_per_posting into unresolved
            from unnest(c_ids, c_l, c_unread, c_dl) as x (id, l, unread, dl)
            where x.unread > 1e-12 and (x.l + x.unread) * (1 + 1e-9) >= theta and x.id <> all(f_ids);
        end if;
        -- float sums differ in the last bits with their order: bounds and theta keep a 1e-9 margin
        exit when m = total;
        if theta > rest * (1 + 1e-9) then
            -- no unread chunk can enter the top n; finish with lookups of their terms, unless reading the
            -- remaining sublists is cheaper and within the budget
            exit when coalesce(unresolved, 0) <= total_est - est or total_est > budget;
            m := total;
            continue;
        end if;
        -- the budget is spent: finish with the best candidates so far (their lookups bounded below)
        exit when est + s_est[m + 1] > budget;
        -- next: the fewest sublists that put every unread chunk below theta, at most 4x the postings so far
        want := m + 1;
        want_est := est + s_est[want];
        while want < total and (theta is null or s_rest[want + 1] * (1 + 1e-9) >= theta) and want_est < 4 * est
            and want_est + s_est[want + 1] <= budget loop
            want := want + 1;
            want_est := want_est + s_est[want];
        end loop;
        if want_est * 2 >= total_est and total_est <= budget then
            want := total;    -- most of the postings anyway: read them all, no lookups at the end
        end if;
        m := want;
        est := want_est;
    end loop;

    return query
    select top.id, (row_number() over (order by top.bm25 desc, top.id))::integer, top.bm25
    from (
        select x.id, case when x.unread <= 1e-12 then x.l else coalesce(
            (select f.score from unnest(f_ids, f_scores) as f (id, score) where f.id = x.id),
            (
                -- an unresolved candidate: its full score from its terms (kb.chunk_terms of its text)
                select sum(idfs[q.i] * t.tf * (k1 + 1) / (t.tf + k1 * (1 - b + b * c.term_count / avgdl)))
                from kb.chunks as c
                inner join kb.documents as d on c.document_id = d.id
                cross join lateral kb.chunk_terms(d.title, c.heading_path, c.content) as t
                inner join unnest(terms) with ordinality as q (term, i) on t.term = q.term
                where c.id = x.id
            )
        ) end as bm25
        from (
            -- complete scores, and the unresolved candidates that may still reach theta: all of them, or
            -- within a budget the best by partial score (the highest-bound sublists, read first) while their
            -- lookups cost at most posting_budget postings (and at least n of them; a chunk looked up already
            -- costs nothing, as in the cost the loop's exit compared)
            select x.*, sum(case when x.id = any(f_ids) then 0 else x.dl end) over w / terms_per_posting as reach_cost,
                row_number() over w as reach_rank
            from (
                select x.*, x.unread > 1e-12 and (x.l + x.unread) * (1 + 1e-9) >= coalesce(theta, 0) as open
                from unnest(c_ids, c_l, c_unread, c_dl) as x (id, l, unread, dl)
            ) as x
            window w as (partition by x.open order by x.l desc, x.id rows unbounded preceding)
        ) as x
        where x.unread <= 1e-12
            or (x.open and (posting_budget is null or x.reach_rank <= n or x.reach_cost <= posting_budget))
        order by bm25 desc, x.id
        limit n
    ) as top;
end
$$;

-- Lexical leg, scan method (kb.settings.lexical_leg = 'scan', and the reference the tests compare the
-- posting-block leg with): Okapi BM25 over kb.lexical_terms, with df / N / avgdl from the visible
-- knowledge bases' statistics, by reading and tokenising every chunk of kb_ids (kb.chunk_terms, about 0.5 ms
-- a chunk: for small knowledge bases and checks; it reads no posting). Candidates are the chunks holding one
-- of the rarest query terms, taken until their postings would exceed probe_budget (the rarest term is always
-- probed; common terms still count in the score of every candidate). Candidates stream through a top-n sort.
-- Exact BM25 when probe_budget >= the sum of the query terms' document frequencies.
create or replace function kb_internal.lexical_leg_scan(
    query text, kb_ids integer[], n integer, doc_filter jsonb,
    k1 double precision, b double precision, probe_budget integer, expansions jsonb default null
)
returns table (chunk_id bigint, rank integer, score double precision)
language plpgsql stable
set search_path = pg_catalog, pg_temp
-- its reads planned for their arrays of terms (PostgreSQL's default choice), also when kb_internal.search
-- forces generic plans
set plan_cache_mode = auto
as $$
declare
    n_chunks double precision;
    avgdl double precision;
    terms text [];
    idfs double precision [];
    probe text [];
begin
    select greatest(coalesce(sum(k.chunk_count), 0), 1), greatest(coalesce(sum(k.term_total), 0), 1)
    into n_chunks, avgdl
    from kb.knowledge_bases as k where k.id = any(kb_ids);
    avgdl := avgdl / n_chunks;

    with weighted as (
        select w.term, w.df, w.weight from kb_internal.lexical_query_terms(query, kb_ids, expansions) as w
    ),
    probed as (
        select w.term, w.df, sum(w.df) over (order by w.df, w.term) - w.df as before
        from weighted as w where w.df > 0
    )
    select array_agg(w.term order by w.term),
        array_agg(w.weight * ln(1 + (n_chunks - w.df + 0.5) / (w.df + 0.5)) order by w.term),
        (select array_agg(p.term) from probed as p where p.before = 0 or p.before + p.df <= probe_budget)
    into terms, idfs, probe
    from weighted as w where w.df > 0;

    if probe is null then
        return;     -- no query term occurs in the visible knowledge bases
    end if;

    return query
    select scored.id, (row_number() over (order by scored.bm25 desc, scored.id))::integer, scored.bm25
    from (
        select c.id, (
            select sum(w.idf * tf.f * (k1 + 1) / (tf.f + k1 * (1 - b + b * c.term_count / avgdl)))
            from unnest(terms, idfs) as w (term, idf)
            cross join lateral (select (c.term_freqs ->> w.term)::double precision as f) as tf
        ) as bm25
        from (
            -- each chunk's query terms with their frequencies, computed once from its text (OFFSET 0 keeps
            -- the planner from computing them again for every term); candidates stream, nothing is materialised
            select c.id, f.term_freqs, c.term_count
            from kb.chunks as c
            -- its document by primary key (never a scan of other knowledge bases' documents)
            cross join lateral (
                select d.kb_id, d.title, d.metadata from kb.documents as d where d.id = c.document_id offset 0
            ) as d
            cross join lateral (
                select jsonb_object_agg(t.term, t.tf) as term_freqs
                from kb.chunk_terms(d.title, c.heading_path, c.content) as t where t.term = any(terms)
            ) as f
            where c.kb_id = any(kb_ids) and f.term_freqs ?| probe
                and (doc_filter is null
                    or kb_internal.visible_document_matches(d.kb_id, kb_ids, d.metadata, doc_filter))
            offset 0
        ) as c
        order by bm25 desc, c.id
        limit n
    ) as scored;
end
$$;

-- Admin: which BM25 leg serves and why (kb.settings.lexical_leg): 'numpy' (kb_internal.lexical_leg_numpy),
-- 'blocks' (kb_internal.lexical_leg) or 'scan' (kb_internal.lexical_leg_scan); 'auto', the default, is numpy
-- where the server has plpython3u and numpy, else blocks. Raises for an unknown value, and for 'numpy' on a
-- server without it. The one place of this rule: searches (kb_admin.lexical_engine) and `pgkb db status`
-- read it. Runs as the owner, who may call kb_internal's functions.
create or replace function kb_admin.lexical_engine_choice(out engine text, out reason text)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    method constant text := kb_internal.setting('lexical_leg');
    has_python constant boolean := to_regprocedure('kb_internal.numpy_available()') is not null;
begin
    if method not in ('auto', 'numpy', 'blocks', 'scan') then
        raise exception 'setting "lexical_leg" must be ''auto'', ''numpy'', ''blocks'' or ''scan'', not "%"',
            left(method, 50) using errcode = 'invalid_parameter_value';
    end if;
    if method in ('blocks', 'scan') then
        engine := method;
        reason := 'kb.settings.lexical_leg chooses it';
        return;
    end if;
    -- kb_internal.numpy_available exists only where plpython3u does (52_lexical_numpy.sql); a separate IF, so
    -- the call is planned only where it exists
    if has_python then
        if kb_internal.numpy_available() then
            engine := 'numpy';
            reason := 'posting blocks scored inside the server';
            return;
        end if;
    end if;
    if method = 'numpy' then
        raise exception 'setting "lexical_leg" is ''numpy'', but this server has no plpython3u with numpy'
            using errcode = 'feature_not_supported',
            hint = 'install python3-numpy for the server (make setup), or set lexical_leg to ''auto''';
    end if;
    engine := 'blocks';
    reason := case when has_python
        then 'the server''s Python has no numpy: install python3-numpy (make setup)'
        else 'this server has no plpython3u' end;
end
$$;

-- The BM25 leg that serves (kb_admin.lexical_engine_choice without its reason).
create or replace function kb_admin.lexical_engine()
returns text
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    return (select c.engine from kb_admin.lexical_engine_choice() as c);
end
$$;

-- The BM25 legs' top n by the engine kb_admin.lexical_engine() picks, with that engine's budget setting
-- (lexical_posting_budget for blocks, lexical_probe_budget for scan; numpy reads its own,
-- lexical_numpy_posting_budget): rows (leg, chunk_id, rank, score) of leg 'lexical' (the query's terms;
-- when plain, or when expansions is NULL) and of leg 'fuzzy' (when expansions is not NULL: the query's
-- terms and their corrections, {term: weight} from kb_internal.fuzzy_expansions, each correction's idf times its
-- weight). Every engine scores the same BM25 over the same visible statistics and returns the exact top n
-- whenever its budget holds the query's postings; numpy ranks both legs from one read of the postings.
create or replace function kb_internal.lexical_hits(
    query text, kb_ids integer[], n integer, doc_filter jsonb, k1 double precision, b double precision,
    expansions jsonb default null, plain boolean default true
)
returns table (leg text, chunk_id bigint, rank integer, score double precision)
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    engine constant text := kb_admin.lexical_engine();
    budget integer;
    leg_name text;
begin
    if engine = 'numpy' then
        return query select * from kb_internal.lexical_legs_numpy(query, kb_ids, n, doc_filter, k1, b, expansions, plain);
        return;
    end if;
    if engine = 'blocks' then
        budget := kb_internal.setting_int('lexical_posting_budget');
        if budget < 1 then
            raise exception 'setting "lexical_posting_budget" must be at least 1, not %', budget
                using errcode = 'invalid_parameter_value';
        end if;
    else
        budget := kb_internal.setting_int('lexical_probe_budget');
    end if;
    foreach leg_name in array array_remove(array[
        case when plain or expansions is null then 'lexical' end, case when expansions is not null then 'fuzzy' end
    ], null) loop
        if engine = 'blocks' then
            return query select leg_name, x.* from kb_internal.lexical_leg(
                query, kb_ids, n, doc_filter, k1, b, budget, case when leg_name = 'fuzzy' then expansions end
            ) as x;
        else
            return query select leg_name, x.* from kb_internal.lexical_leg_scan(
                query, kb_ids, n, doc_filter, k1, b, budget, case when leg_name = 'fuzzy' then expansions end
            ) as x;
        end if;
    end loop;
end
$$;
