-- Fusion: kb_internal.search, the one search implementation, runs the legs (50_search_legs.sql) and fuses them
-- (distribution-based score fusion, or weighted Reciprocal Rank Fusion); kb.search_defaults holds its
-- defaults. The public functions are its wrappers in 54_search_api.sql.

-- The search defaults: every NULL setting of kb_internal.search (and so of hybrid_search and the single-leg
-- wrappers, whose parameters default to NULL) takes its value from kb.settings' search_* rows (seeded by
-- migration 029 with the values the sweeps in docs/quality.md tuned; kb_internal.setting_rules bounds
-- them). candidates: rows per leg before fusion (at least top_k when left NULL).
create or replace function kb.search_defaults()
returns table (
    vector_weight double precision, lexical_weight double precision, fuzzy_weight double precision,
    rrf_k double precision, candidates integer, bm25_k1 double precision, bm25_b double precision, fusion text
)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    -- the keys read at once (kb_internal.settings_of): every search starts here, and a SQL function reading
    -- them one by one, planned at every call, cost about 0.25 ms of it
    k constant text[] := array[
        'search_vector_weight', 'search_lexical_weight', 'search_fuzzy_weight', 'search_rrf_k', 'search_candidates',
        'search_bm25_k1', 'search_bm25_b', 'search_fusion'
    ];
    raw constant text[] := kb_internal.settings_of(k);
begin
    return query select kb_internal.as_number(k[1], raw[1]), kb_internal.as_number(k[2], raw[2]),
        kb_internal.as_number(k[3], raw[3]), kb_internal.as_number(k[4], raw[4]), kb_internal.as_int(k[5], raw[5]),
        kb_internal.as_number(k[6], raw[6]), kb_internal.as_number(k[7], raw[7]), btrim(raw[8]);
end
$$;

-- The one search implementation: fill NULL settings from kb.search_defaults, validate, resolve
-- visibility and model, embed the query if needed, run each leg whose weight is > 0 and fuse. Phrasings: the
-- query and also (kb.check_search_input bounds them); every leg runs for every phrasing (embeddings: query_embedding
-- and also_embeddings, the missing ones embedded in one request), each (leg, phrasing) is spread on its own, and a
-- chunk counts in a leg with its best share over the phrasings; then the legs are fused once. fusion 'dbsf'
-- (default): distribution-based score fusion, each leg's scores mapped by (score - (mean - 3 sd)) / (6 sd) over its own hits, times the leg weight,
-- summed; 'rrf': weighted reciprocal rank fusion, sum(weight / (rrf_k + rank)). Raises on bad input
-- (blank or oversized query, top_k outside 1..100, NaN / infinite / out-of-range weights or BM25 / RRF
-- parameters, unknown kb, model or fusion, wrong dimension or zero norm of query_embedding, a bad
-- metadata_condition). filter and metadata_condition restrict the documents inside every leg. The fuzzy
-- leg is BM25 over the query's terms and their corrections (kb_internal.fuzzy_expansions); a query with none has
-- no fuzzy leg beside a BM25 leg, and alone gets the BM25 ranking.
-- The term legs (BM25, fuzzy) cannot match text in a script no phrasing is written in, beyond the translations
-- they add (kb.chunks.heading_script: the script of the chunk's title and headings, stored at write time; an
-- English question, Chinese documents), so for such a chunk each term leg counts its share or the vector
-- leg's, whichever is larger (as if it agreed with the vector leg; a term hit never lowers a chunk) — for a
-- query of three terms or more: one or two are keywords or identifiers, which a text in another script may
-- hold. Other chunks are fused as before.
-- vector_used is false when no query embedding could be had (lexical legs only). Chunks of the same text
-- (kb.chunks.content_hash, stored at write time) are one result, the best-scored copy, also_in naming the other
-- copies' documents among the candidates (kb://<kb>/<doc_key>, its own left out). Fusion ranks on ids and
-- scores; kb.chunks is read only for the candidates that may reach the top_k (the others too when copies of
-- one text crowd them), and only the final top_k reads content, documents and knowledge bases. heading_path
-- and source_url are as kb_internal.heading_trail and kb_internal.openable_source show them.
create or replace function kb_internal.search(
    query text,
    top_k integer,
    kb text,
    query_embedding vector,
    model text,
    vector_weight double precision,
    lexical_weight double precision,
    fuzzy_weight double precision,
    rrf_k double precision,
    candidates integer,
    filter jsonb,
    bm25_k1 double precision,
    bm25_b double precision,
    fusion text,
    metadata_condition jsonb default null,
    also text[] default null,
    also_embeddings vector[] default null
)
returns setof kb.search_result
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
-- one plan per statement for the session, here and in every function it calls that does not choose its own
-- (the vector leg's EXECUTE and the fuzzy leg's lookups plan per call): planning the fusion statement at every call
-- cost about 2 ms of a 10 ms kb.vector_search (docs/benchmarks.md, "Generic plans")
set plan_cache_mode = force_generic_plan
-- every read of kb.chunks, kb.documents and kb.knowledge_bases an index lookup (by id, or keyed by kb_ids): a
-- sequential scan, cheaper on a small table, would read other knowledge bases' rows, and its counters would
-- tell how many there are; index and bitmap scans on, whatever the caller set
set enable_seqscan = off
set enable_indexscan = on
set enable_bitmapscan = on
-- a sequential scan that cannot be avoided (the visible knowledge bases are read whole) costs 1e10 with them
-- off, which made PostgreSQL JIT-compile it: 90 ms a call in a new session
set jit = off
as $$
declare
    kb_ids integer [];
    target kb.embedding_models;
    phrasings text [];          -- query, then also
    embeddings vector [];       -- one per phrasing, or NULL
    missing text [];            -- the phrasings without an embedding
    fresh vector [];            -- their embeddings
    translated text;            -- the question's offline translation (kb_internal.translated_question)
    expansions jsonb;           -- per phrasing, the fuzzy leg's corrections of its terms (JSON null: none)
    defaults record;
    doc_filter jsonb;
    query_scripts text [];
begin
    select * into defaults from kb.search_defaults();
    vector_weight := coalesce(vector_weight, defaults.vector_weight);
    lexical_weight := coalesce(lexical_weight, defaults.lexical_weight);
    fuzzy_weight := coalesce(fuzzy_weight, defaults.fuzzy_weight);
    rrf_k := coalesce(rrf_k, defaults.rrf_k);
    candidates := coalesce(candidates, greatest(defaults.candidates, top_k));
    bm25_k1 := coalesce(bm25_k1, defaults.bm25_k1);
    bm25_b := coalesce(bm25_b, defaults.bm25_b);
    fusion := coalesce(fusion, defaults.fusion);
    perform kb.check_search_input(query, top_k, also);
    phrasings := array[query] || coalesce(also, '{}');
    if also_embeddings is not null and (also is null
        or cardinality(also_embeddings) <> cardinality(also) or array_ndims(also_embeddings) <> 1) then
        raise exception 'also_embeddings must hold one embedding for each phrasing in also (%), got %',
            coalesce(cardinality(also), 0), cardinality(also_embeddings) using errcode = 'invalid_parameter_value';
    end if;
    -- a question, not a keyword or an identifier (which a text in another script may well contain): the
    -- scripts of the phrasings of three terms or more; read only when the vector leg and a term leg both run
    -- (the cross-script rule compares them)
    if vector_weight > 0 and (lexical_weight > 0 or fuzzy_weight > 0) then
        query_scripts := array(
            select distinct x.script from unnest(phrasings) as p (q)
            cross join lateral unnest(kb_internal.text_scripts(p.q)) as x (script)
            where cardinality(kb_internal.query_terms(p.q)) >= 3
        );
    end if;
    if candidates is null or candidates not between 1 and kb_internal.api_limit('candidates') then
        raise exception 'candidates must be between 1 and %, got %', kb_internal.api_limit('candidates'),
            coalesce(candidates::text, 'NULL') using errcode = 'invalid_parameter_value';
    end if;
    -- 'NaN' sorts above every number (so "< 0" lets it pass) and 'Infinity' passes any lower bound:
    -- every float is checked against both ends of a finite range
    if not coalesce(vector_weight between 0 and 1e6 and lexical_weight between 0 and 1e6
        and fuzzy_weight between 0 and 1e6 and vector_weight + lexical_weight + fuzzy_weight > 0, false) then
        raise exception 'leg weights must be >= 0 and not all 0 (finite numbers up to 1e6), got %, %, %',
            coalesce(vector_weight::text, 'NULL'), coalesce(lexical_weight::text, 'NULL'),
            coalesce(fuzzy_weight::text, 'NULL') using errcode = 'invalid_parameter_value';
    end if;
    if not coalesce(rrf_k > 0 and rrf_k <= 1e6 and bm25_k1 between 0 and 1e6 and bm25_b between 0 and 1, false) then
        raise exception 'rrf_k must be > 0, bm25_k1 >= 0 (both finite, up to 1e6) and bm25_b in [0, 1], '
            'got %, %, %', coalesce(rrf_k::text, 'NULL'), coalesce(bm25_k1::text, 'NULL'),
            coalesce(bm25_b::text, 'NULL') using errcode = 'invalid_parameter_value';
    end if;
    if fusion is null or fusion not in ('dbsf', 'rrf') then
        raise exception 'fusion must be ''dbsf'' or ''rrf'', got %', coalesce(fusion, 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
    if filter is not null and jsonb_typeof(filter) <> 'object' then
        raise exception 'filter must be a JSON object (matched with @> against document metadata)'
            using errcode = 'invalid_parameter_value';
    end if;
    doc_filter := kb_internal.document_filter(filter, metadata_condition);

    if search.kb is null then
        kb_ids := kb.visible_kb_ids();
    else
        kb_ids := array[kb.resolve_kb(search.kb)];
    end if;

    if vector_weight > 0 then
        target := kb.resolve_model(model);
        embeddings := array[query_embedding] || coalesce(also_embeddings, '{}');
        if exists (select from unnest(embeddings) as e where e is not null and vector_dims(e) <> target.dimension) then
            raise exception 'query_embedding has % dimensions; model "%" has %', (
                select vector_dims(e) from unnest(embeddings) as e
                where e is not null and vector_dims(e) <> target.dimension limit 1
            ), target.name, target.dimension using errcode = 'data_exception';
        end if;
        if exists (
            select from unnest(embeddings) as e
            where e is not null and not kb_internal.storable_embedding(e, target.storage)
        ) then
            raise exception 'query_embedding has a zero or degenerate norm (or values beyond half precision for a '
                'halfvec model); cosine distance to it is undefined'
                using errcode = 'data_exception';
        end if;
        -- the phrasings without an embedding, embedded in one request; a question embedded here without
        -- phrasings is blended with its offline translation's embedding (kb.query_translation,
        -- kb.blend_query_embeddings), as the Python clients do
        missing := array(select p.q from unnest(phrasings, embeddings) as p (q, e) where p.e is null);
        if cardinality(missing) > 0 then
            translated := case when query_embedding is null then kb_internal.translated_question(query, kb_ids, also) end;
            fresh := kb_internal.embed_queries(missing || array_remove(array[translated], null), target);
            embeddings := array(
                select coalesce(p.e, fresh[(count(*) filter (where p.e is null) over (order by p.n))::integer])
                from unnest(embeddings) with ordinality as p (e, n) order by p.n
            );
            if translated is not null then
                embeddings[1] := kb.blend_query_embeddings(embeddings[1], fresh[cardinality(missing) + 1]);
            end if;
        end if;
    end if;

    if fuzzy_weight > 0 then
        expansions := (
            select jsonb_agg(coalesce(kb_internal.fuzzy_expansions(p.q, kb_ids), 'null'::jsonb) order by p.n)
            from unnest(phrasings) with ordinality as p (q, n)
        );
    end if;

    return query
    with phrasing as (
        select p.n::integer as n, p.q, nullif(expansions -> (p.n::integer - 1), 'null'::jsonb) as expanded
        from unnest(phrasings) with ordinality as p (q, n)
    ),
    -- every leg for every phrasing (n)
    vector_hits as (
        select p.n::integer as n, v.* from unnest(embeddings) with ordinality as p (e, n)
        cross join lateral kb_internal.vector_leg(p.e, target, kb_ids, candidates, doc_filter) as v
        where vector_weight > 0 and p.e is not null
    ),
    -- the BM25 legs: 'lexical' rows, and 'fuzzy' rows when the phrasing has corrections. Without any the
    -- fuzzy leg would rank as the BM25 leg does: alone (kb.fuzzy_search) it reuses those rows; beside a
    -- BM25 leg it adds nothing, which would only count BM25 twice
    bm25_hits as (
        select p.n, p.expanded is null as plain_only, l.*
        from phrasing as p
        cross join lateral kb_internal.lexical_hits(p.q, kb_ids, candidates, doc_filter, bm25_k1, bm25_b, p.expanded,
            lexical_weight > 0 or p.expanded is null) as l
        where lexical_weight > 0 or fuzzy_weight > 0
    ),
    hits as (
        select 'vector' as leg, vector_weight as weight, v.* from vector_hits as v
        union all
        select 'lexical', lexical_weight, l.n, l.chunk_id, l.rank, l.score from bm25_hits as l
        where lexical_weight > 0 and l.leg = 'lexical'
        union all
        select 'fuzzy', fuzzy_weight, f.n, f.chunk_id, f.rank, f.score from bm25_hits as f
        where fuzzy_weight > 0 and (f.leg = 'fuzzy' or f.plain_only and lexical_weight = 0)
    ),
    -- per chunk and leg, its share before the leg's weight: RRF's 1 / (k + rank), or DBSF's place in the
    -- spread of its leg for its phrasing (the window: one pass, no join back); the best over the phrasings (two
    -- phrasings that find it count once)
    fused as (
        select h.chunk_id,
            coalesce(max(h.share) filter (where h.leg = 'vector'), 0) as v_share,
            coalesce(max(h.share) filter (where h.leg = 'lexical'), 0) as l_share,
            coalesce(max(h.share) filter (where h.leg = 'fuzzy'), 0) as f_share,
            min(h.rank) filter (where h.leg = 'vector') as v_rank,
            min(h.rank) filter (where h.leg = 'lexical') as l_rank,
            min(h.rank) filter (where h.leg = 'fuzzy') as f_rank,
            max(h.score) filter (where h.leg = 'vector') as v_score,
            max(h.score) filter (where h.leg = 'lexical') as l_score,
            max(h.score) filter (where h.leg = 'fuzzy') as f_score
        from (
            select h.leg, h.chunk_id, h.rank, h.score, case
                    when fusion = 'rrf' then 1 / (rrf_k + h.rank)
                    when h.sd > 0 then (h.score - (h.mean - 3 * h.sd)) / (6 * h.sd)
                    else 1.0        -- a leg whose hits all score alike: each counts as its best
                end as share
            from (
                select h.*, avg(h.score) over per_leg as mean, stddev_pop(h.score) over per_leg as sd
                from hits as h
                window per_leg as (partition by h.leg, h.n)
            ) as h
        ) as h
        group by h.chunk_id
    ),
    -- the weights of the legs that returned hits: a chunk in a script the query lacks has no term in common
    -- with it, so the term legs' silence about it is no evidence against it (see the contract above)
    legs_run as (
        select coalesce(max(h.weight) filter (where h.leg = 'vector'), 0) as w_vector,
            coalesce(max(h.weight) filter (where h.leg = 'lexical'), 0) as w_lexical,
            coalesce(max(h.weight) filter (where h.leg = 'fuzzy'), 0) as w_fuzzy
        from hits as h
    ),
    -- each fused chunk's score from its shares alone: base, their weighted sum, and raised, what the
    -- cross-script rule can make of it (the rule reads the chunk's heading script: below, where it matters)
    scored as materialized (
        select fused.*, s.base, case
                when legs_run.w_vector > 0 and cardinality(query_scripts) > 0
                    and (legs_run.w_lexical > 0 and fused.v_share > fused.l_share
                        or legs_run.w_fuzzy > 0 and fused.v_share > fused.f_share)
                    then legs_run.w_vector * fused.v_share
                    + legs_run.w_lexical * greatest(fused.l_share, fused.v_share)
                    + legs_run.w_fuzzy * greatest(fused.f_share, fused.v_share)
                else s.base
            end as raised
        from fused
        cross join legs_run
        cross join lateral (
            select legs_run.w_vector * fused.v_share + legs_run.w_lexical * fused.l_share
                + legs_run.w_fuzzy * fused.f_share as base
        ) as s
    ),
    -- the top_k-th best base score: a chunk whose raised score is below it cannot be among the top_k, unless
    -- copies of one text above it leave fewer than top_k texts there
    bar as (
        select min(t.base) as bar from (select s.base from scored as s order by s.base desc limit top_k) as t
    ),
    -- each candidate with its document, content hash and final score (the cross-script rule reads its heading
    -- script), one kb.chunks lookup per row, whatever the row estimates (offset 0: never a join that reads the
    -- whole table); not materialized, so each use below reads only the rows it keeps; the legs return visible
    -- chunks only, the kb_id check keeps it so whatever a leg returns
    looked_up as not materialized (
        select s.chunk_id, s.v_rank, s.l_rank, s.f_rank, s.v_score, s.l_score, s.f_score, s.raised, c.document_id,
            c.content_hash, case when c.heading_script <> all(query_scripts) then s.raised else s.base end as fused_score
        from scored as s
        cross join lateral (
            select c.document_id, c.content_hash, c.heading_script from kb.chunks as c
            where c.id = s.chunk_id and c.kb_id = any(kb_ids) offset 0
        ) as c
    ),
    -- the chunks at the bar or above: the only ones kb.chunks is read for, as a rule (no content, document or
    -- knowledge base is read before the final top_k: late materialisation)
    near as materialized (
        select l.* from looked_up as l where l.raised >= (select b.bar from bar as b)
    ),
    -- and the others, read only when those hold fewer than top_k texts at the bar or above
    placed as (
        select * from near
        union all
        select l.* from looked_up as l
        where l.raised < (select b.bar from bar as b) and (
            select count(distinct n.content_hash) from near as n where n.fused_score >= (select b.bar from bar as b)
        ) < top_k
    ),
    -- each chunk's place among the candidates read of the same text (1: the best)
    copies as materialized (
        select p.*, row_number() over same_text as place
        from placed as p
        window same_text as (
            partition by p.content_hash order by p.fused_score desc, coalesce(p.v_rank, p.l_rank, p.f_rank),
                p.chunk_id
        )
    ),
    best as materialized (
        select r.* from copies as r
        where r.place = 1
        order by r.fused_score desc, coalesce(r.v_rank, r.l_rank, r.f_rank), r.chunk_id
        limit top_k
    )
    -- the final top_k, materialised: content, document, knowledge base, and where else its text is (the
    -- other visible documents among the candidates that hold it)
    select r.chunk_id, k.name, d.doc_key, d.title, kb_internal.heading_trail(d.title, c.heading_path), c.ordinal,
        c.content, kb_internal.openable_source(d.source_url), c.chunk_type, c.metadata, r.fused_score, r.v_rank,
        r.l_rank, r.f_rank, r.v_score, r.l_score, r.f_score, coalesce(embeddings[1] is not null, false),
        array(
            -- the other candidates of the same text, found by it in the searched knowledge bases alone
            -- (chunks_kb_content_hash_idx, which holds id and document_id: an index-only read of each copy);
            -- offset 0: the candidates' ids only filter what it finds -- as an index condition they made a
            -- generic plan probe the primary key once per candidate, 0.14 ms a row. Most texts have no copy
            select distinct kb.document_uri(ok.name, od.doc_key)
            from (
                select o.id, o.document_id from kb.chunks as o
                where o.kb_id = any(kb_ids) and o.content_hash = r.content_hash and o.id <> r.chunk_id
                    and o.document_id <> r.document_id
                offset 0
            ) as o
            cross join lateral (
                select od.doc_key, od.kb_id from kb.documents as od where od.id = o.document_id offset 0
            ) as od
            cross join lateral (select ok.name from kb.knowledge_bases as ok where ok.id = od.kb_id offset 0) as ok
            where o.id = any(array(select s.chunk_id from scored as s))
            order by 1
        )
    from best as r
    cross join lateral (
        select c.heading_path, c.ordinal, c.content, c.chunk_type, c.metadata from kb.chunks as c
        where c.id = r.chunk_id offset 0
    ) as c
    cross join lateral (
        select d.doc_key, d.title, d.source_url, d.kb_id from kb.documents as d where d.id = r.document_id offset 0
    ) as d
    cross join lateral (select k.name from kb.knowledge_bases as k where k.id = d.kb_id offset 0) as k
    order by r.fused_score desc, coalesce(r.v_rank, r.l_rank, r.f_rank), r.chunk_id;
end
$$;
