-- Retrieval with an absolute relevance score, for clients that threshold scores (Dify's External
-- Knowledge API: score in 0..1, records below score_threshold dropped). kb.hybrid_search's fused score is
-- relative to each query's own hits, so a threshold on it means nothing across queries.

-- kb.hybrid_search's hits in its order, each with relevance = the greater of (a) its query-term coverage
-- (share of the query's distinct kb_internal.query_terms found in the chunk, title and headings; with also, the
-- best phrasing's) and (b) its cosine
-- similarity mapped from [relevance_cosine_floor, 1] to [0, 1]; score = the lowest relevance at or above its
-- rank, so scores never rise down the list and those >= score_threshold are a prefix of pgkb's ranking.
-- also_in: kb.hybrid_search's (other documents holding the same text). vector_weight 0: the lexical legs
-- only, and the database does not embed the query (a caller whose own embedding failed). Logged as mode
-- 'retrieve' where a searched knowledge base keeps a question log (kb_internal.log_question).
create or replace function kb.retrieve(
    query text,
    top_k integer default 5,
    kb text default null,
    query_embedding vector default null,
    model text default null,
    metadata_condition jsonb default null,
    score_threshold double precision default 0,
    vector_weight double precision default null,
    also text[] default null,
    also_embeddings vector[] default null
)
returns table (
    chunk_id bigint, knowledge_base text, doc_key text, title text, heading_path text[], chunk_index integer,
    content text, source_url text, chunk_metadata jsonb, document_metadata jsonb,
    fused_score double precision, relevance double precision, score double precision, also_in text[]
)
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
declare
    floor_raw text := kb_internal.setting('relevance_cosine_floor');
    cos_floor double precision;
    phrasing_terms jsonb;   -- per phrasing, its distinct query terms
    target kb.embedding_models;
    found_hits kb.search_result [];    -- kb_internal.search's, in its order
begin
    perform kb.check_search_input(query, top_k, also);  -- first: no work on an input it refuses
    if not coalesce(score_threshold between 0 and 1, false) then
        raise exception 'score_threshold must be between 0 and 1, got %', coalesce(score_threshold::text, 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
    if floor_raw !~ '^\s*0?\.\d+\s*$' then
        raise exception 'setting "relevance_cosine_floor" must be a number in [0, 1), not "%"', left(floor_raw, 50)
            using errcode = 'invalid_parameter_value';
    end if;
    cos_floor := floor_raw::double precision;
    phrasing_terms := (
        select jsonb_agg(to_jsonb(array(select distinct t.term from unnest(kb_internal.query_terms(p.q)) as t (term))))
        from unnest(array[query] || coalesce(also, '{}')) as p (q)
    );
    -- the cosine of (b) only where the search used (and so checked) the embedding: with vector_weight 0 it is
    -- neither checked nor part of the ranking
    if query_embedding is not null
        and coalesce(retrieve.vector_weight, kb_internal.setting_number('search_vector_weight')) > 0 then
        target := kb.resolve_model(model);
    end if;
    found_hits := array(
        select h from kb_internal.search(
            query, top_k, retrieve.kb, query_embedding, model, retrieve.vector_weight, null, null, null, null, null,
            null, null, null, metadata_condition, also, also_embeddings
        ) as h
    );
    perform kb_internal.log_question(query, also, retrieve.kb, 'retrieve', found_hits, null, null);
    return query
    with hits as (
        select h.chunk_id, h.kb, h.doc_key, h.title, h.heading_path, h.chunk_index, h.content, h.source_url,
            h.metadata, h.score, h.vector_score, h.also_in, h.ordinality as ord
        from unnest(found_hits) with ordinality as h
    ),
    scored as (
        select hits.*, d.metadata as doc_metadata,
            greatest(
                -- the best phrasing's coverage
                coalesce((
                    select max((
                        select count(*) from jsonb_array_elements_text(p.terms) as q (term) where q.term = any(ct.terms)
                    )::double precision / jsonb_array_length(p.terms))
                    from jsonb_array_elements(phrasing_terms) as p (terms) where jsonb_array_length(p.terms) > 0
                ), 0),
                least(1, greatest(0, (coalesce(greatest(
                    (select 1 - coalesce(e.embedding <=> query_embedding, e.half <=> query_embedding::halfvec)
                        from kb.embeddings as e
                        where e.chunk_id = hits.chunk_id and e.model_id = target.id and target.id is not null),
                    hits.vector_score
                ), 0) - cos_floor) / (1 - cos_floor)))
            ) as rel
        from hits
        join kb.chunks as c on c.id = hits.chunk_id
        join kb.documents as d on d.id = c.document_id
        cross join lateral (
            select array_agg(t.term) as terms from kb.chunk_terms(d.title, c.heading_path, c.content) as t
        ) as ct
    ),
    ranked as (
        select scored.*, min(scored.rel) over (order by scored.ord rows unbounded preceding) as monotone
        from scored
    )
    select r.chunk_id, r.kb, r.doc_key, r.title, r.heading_path, r.chunk_index, r.content, r.source_url,
        r.metadata, r.doc_metadata, r.score, r.rel, r.monotone, r.also_in
    from ranked as r
    where r.monotone >= score_threshold
    order by r.ord;
end
$$;
