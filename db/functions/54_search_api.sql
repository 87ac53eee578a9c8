-- The search API: kb.hybrid_search and the single legs kb.vector_search / lexical_search / fuzzy_search,
-- thin wrappers of kb_internal.search (51_search_fusion.sql) with the same columns, and kb.check_search_input,
-- which clients ask before they embed a query. Each logs its question where a searched knowledge base keeps a
-- question log (kb_internal.logged_hits, 39_question_log.sql).

-- Raise unless query, top_k and also are acceptable to every search function: a query that is not blank
-- (white space and invisible characters do not count) of at most kb.limits() query_chars characters,
-- top_k in 1..kb.limits() top_k, and also (other phrasings of the question: a translation, a rewording)
-- NULL or a one-dimensional array of at most kb.limits() phrasings - 1 such queries. Clients call it before
-- they spend time embedding a query the search would refuse.
create or replace function kb.check_search_input(query text, top_k integer, also text[] default null)
returns void
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    max_chars integer := kb_internal.api_limit('query_chars');
    max_top_k integer := kb_internal.api_limit('top_k');
    max_phrasings integer := kb_internal.api_limit('phrasings');
    phrasing record;
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
    if also is null then
        return;
    end if;
    if array_ndims(also) is distinct from 1 and cardinality(also) > 0 then
        raise exception 'also must be a one-dimensional array of phrasings' using errcode = 'invalid_parameter_value';
    end if;
    if cardinality(also) > max_phrasings - 1 then
        raise exception 'also holds % phrasings; at most % are accepted beside the query', cardinality(also),
            max_phrasings - 1 using errcode = 'program_limit_exceeded';
    end if;
    for phrasing in select x.q, x.n from unnest(also) with ordinality as x (q, n) loop
        if phrasing.q is null or kb_internal.is_blank(phrasing.q) then
            raise exception 'also[%] must not be empty (white space and invisible characters alone do not count)',
                phrasing.n using errcode = 'invalid_parameter_value';
        end if;
        if length(phrasing.q) > max_chars then
            raise exception 'also[%] is % characters long; at most % are accepted', phrasing.n, length(phrasing.q),
                max_chars using errcode = 'program_limit_exceeded';
        end if;
    end loop;
end
$$;

-- Hybrid search: vector + BM25 + fuzzy legs fused (see kb_internal.search: distribution-based score fusion by
-- default, fusion => 'rrf' for weighted RRF); higher score is better. Settings left NULL take
-- kb.search_defaults() (the search_* rows of kb.settings).
-- Embeds the query in the database when query_embedding is NULL (see kb_internal.embed_query), blended with
-- its offline translation's (kb.query_translation) when no also is given; without an
-- embedding it searches the lexical legs only (vector_used = false, and a NOTICE). filter: document
-- metadata must contain it (@>); metadata_condition: Dify-style conditions (kb.check_metadata_condition).
-- also: other phrasings of the question (a translation into the knowledge's language, a rewording; at most
-- kb.limits() phrasings in all), each searched by every leg, fused once; also_embeddings: theirs, in order
-- (missing ones are embedded in one request).
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
    metadata_condition jsonb default null,
    also text[] default null,
    also_embeddings vector[] default null
)
returns setof kb.search_result
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
begin
    return query select * from kb_internal.logged_hits('search', query, also, kb, array(
        select h from kb_internal.search(
            query, top_k, kb, query_embedding, model, vector_weight, lexical_weight, fuzzy_weight,
            rrf_k, candidates, filter, bm25_k1, bm25_b, fusion, metadata_condition, also, also_embeddings
        ) as h
    ));
end
$$;

-- (PL/pgSQL, these wrappers: a SQL function with a SET clause is planned again at every call.)
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
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
begin
    return query select * from kb_internal.logged_hits('vector', query, null, kb, array(
        select h from kb_internal.search(query, top_k, kb, query_embedding, model, 1, 0, 0, null, top_k,
            filter, null, null, 'rrf') as h
    ));
end
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
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
begin
    return query select * from kb_internal.logged_hits('lexical', query, null, kb, array(
        select h from kb_internal.search(query, top_k, kb, null, null, 0, 1, 0, null, top_k,
            filter, bm25_k1, bm25_b, 'rrf') as h
    ));
end
$$;

-- Fuzzy leg alone (same columns; fuzzy_score is the BM25 score of the query with its corrections).
create or replace function kb.fuzzy_search(
    query text,
    top_k integer default 5,
    kb text default null,
    filter jsonb default null
)
returns setof kb.search_result
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
begin
    return query select * from kb_internal.logged_hits('fuzzy', query, null, kb, array(
        select h from kb_internal.search(query, top_k, kb, null, null, 0, 0, 1, null, top_k,
            filter, null, null, 'rrf') as h
    ));
end
$$;
