-- The search API: kb.hybrid_search and the single legs kb.vector_search / lexical_search / fuzzy_search,
-- thin wrappers of kb_internal.search (51_search_fusion.sql) with the same columns, and kb.check_search_input,
-- which clients ask before they embed a query.

-- Raise unless query and top_k are acceptable to every search function: a query that is not blank
-- (white space and invisible characters do not count) of at most kb.limits() query_chars characters,
-- top_k in 1..kb.limits() top_k. Clients call it before they spend time embedding a query the search
-- would refuse.
create or replace function kb.check_search_input(query text, top_k integer)
returns void
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    max_chars integer := kb_internal.api_limit('query_chars');
    max_top_k integer := kb_internal.api_limit('top_k');
begin
    if query is null or kb_internal.is_blank(query) then
        raise exception 'query must not be empty (white space and invisible characters alone do not count)'
            using errcode = 'invalid_parameter_value';
    end if;
    if length(query) > max_chars then
        raise exception 'query is % characters long; at most % are accepted', length(query), max_chars
            using errcode = 'program_limit_exceeded';
    end if;
    if top_k is null or top_k not between 1 and max_top_k then
        raise exception 'top_k must be between 1 and %, got %', max_top_k, coalesce(top_k::text, 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
end
$$;

-- Hybrid search: vector + BM25 + fuzzy legs fused (see kb_internal.search: distribution-based score fusion by
-- default, fusion => 'rrf' for weighted RRF); higher score is better. Settings left NULL take
-- kb.search_defaults() (the search_* rows of kb.settings).
-- Embeds the query in the database when query_embedding is NULL (see kb_internal.embed_query); without an
-- embedding it searches the lexical legs only (vector_used = false, and a NOTICE). filter: document
-- metadata must contain it (@>); metadata_condition: Dify-style conditions (kb.check_metadata_condition).
create or replace function kb.hybrid_search(
    query text,
    top_k integer default 5,
    kb text default null,
    query_embedding vector default null,
    model text default null,
    vector_weight double precision default null,
    lexical_weight double precision default null,
    fuzzy_weight double precision default null,
    rrf_k double precision default null,
    candidates integer default null,
    filter jsonb default null,
    bm25_k1 double precision default null,
    bm25_b double precision default null,
    fusion text default null,
    metadata_condition jsonb default null
)
returns setof kb.search_result
language sql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
    select * from kb_internal.search(
        query, top_k, kb, query_embedding, model, vector_weight, lexical_weight, fuzzy_weight,
        rrf_k, candidates, filter, bm25_k1, bm25_b, fusion, metadata_condition
    )
$$;

-- Single legs, same columns as hybrid_search. With one leg the order is that leg's rank, so each leg is
-- asked for top_k rows only.
-- Vector leg alone (score = 1 / (rrf_k + rank)). Needs a query embedding or plpython3u.
create or replace function kb.vector_search(
    query text,
    top_k integer default 5,
    kb text default null,
    query_embedding vector default null,
    model text default null,
    filter jsonb default null
)
returns setof kb.search_result
language sql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
    select * from kb_internal.search(query, top_k, kb, query_embedding, model, 1, 0, 0, null, top_k,
        filter, null, null, 'rrf')
$$;

-- BM25 leg alone (same columns; lexical_score is the BM25 score).
create or replace function kb.lexical_search(
    query text,
    top_k integer default 5,
    kb text default null,
    filter jsonb default null,
    bm25_k1 double precision default null,
    bm25_b double precision default null
)
returns setof kb.search_result
language sql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
    select * from kb_internal.search(query, top_k, kb, null, null, 0, 1, 0, null, top_k,
        filter, bm25_k1, bm25_b, 'rrf')
$$;

-- Fuzzy leg alone (same columns; fuzzy_score is the BM25 score of the query with its corrections).
create or replace function kb.fuzzy_search(
    query text,
    top_k integer default 5,
    kb text default null,
    filter jsonb default null
)
returns setof kb.search_result
language sql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
    select * from kb_internal.search(query, top_k, kb, null, null, 0, 0, 1, null, top_k,
        filter, null, null, 'rrf')
$$;
