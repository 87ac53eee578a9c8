-- 004 search result: the row every search function returns (kb.hybrid_search and the single legs).

create type kb.search_result as (
    chunk_id bigint,
    kb text,
    doc_key text,
    title text,
    heading_path text [],
    chunk_index integer,
    content text,
    source_url text,
    chunk_type text,
    metadata jsonb,
    score double precision,         -- fused RRF score (single-leg functions: the same formula, one leg)
    vector_rank integer,            -- rank in each leg; NULL where the leg did not return the chunk
    lexical_rank integer,
    fuzzy_rank integer,
    vector_score double precision,  -- cosine similarity
    lexical_score double precision, -- BM25
    fuzzy_score double precision,   -- pg_trgm word_similarity
    vector_used boolean             -- false: no query embedding could be had, lexical legs only
);
