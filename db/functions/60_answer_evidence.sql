-- Answer evidence: absolute signals of how well retrieved chunks can answer a question, read by the
-- not-found gate (61_answer_gate.sql). Never the DBSF-fused score, which is relative per query.
-- Only chunks the caller may read count: hits are re-checked against kb.visible_kb_ids(), so a
-- hand-crafted hits array naming other users' chunk ids learns nothing (it is no oracle).

-- Evidence over the hits the caller may see, as jsonb: vector_score (best cosine the hits carry),
-- coverage (best share of the question's idf mass -- distinct kb.lexical_terms, idf as in kb_internal.lexical_leg
-- over the visible hits' knowledge bases, unseen terms at the maximum idf -- present in a chunk's
-- term_freqs), the chunk it came from, top_coverage (first visible hit), top_known_coverage (its share of
-- the terms the knowledge bases hold only), per_hit, counts. Raises on a bad question.
create or replace function kb.answer_evidence(question text, hits kb.search_result[])
returns jsonb
language plpgsql stable security definer
set search_path = pg_catalog, public, pg_temp
as $$
declare
    visible integer [] := kb.visible_kb_ids();
    given integer := coalesce(cardinality(hits), 0);
    result jsonb;
begin
    perform kb.check_search_input(question, 1);
    if given > 1000 then
        raise exception 'hits holds % rows; at most 1000 are accepted', given
            using errcode = 'program_limit_exceeded';
    end if;

    with given_hits as (
        -- first occurrence of each chunk id, in the caller's order
        select distinct on (h.chunk_id) h.chunk_id, h.ordinality as ord, h.vector_score, h.vector_used, h.lexical_score
        from unnest(hits) with ordinality as h
        where h.chunk_id is not null
        order by h.chunk_id, h.ordinality
    ),
    seen as (
        -- the visible ones only; everything else about them comes from the database, not the caller
        select g.chunk_id, g.ord, c.kb_id, c.term_freqs,
            case when g.vector_score between -1 and 1 then g.vector_score end as vector_score,
            coalesce(g.vector_used, false) as vector_used,
            case when g.lexical_score between 0 and 1e9 then g.lexical_score end as lexical_score
        from given_hits as g
        join kb.chunks as c on c.id = g.chunk_id
        where c.kb_id = any(visible)
    ),
    kbs as (
        select coalesce(array_agg(distinct s.kb_id), '{}') as ids from seen as s
    ),
    corpus as (
        select greatest(coalesce(sum(k.chunk_count), 0), 1)::double precision as n_chunks
        from kb.knowledge_bases as k, kbs where k.id = any(kbs.ids)
    ),
    query_terms as (
        select distinct t.term from unnest(kb_internal.query_terms(question)) as t (term)
    ),
    weighted as (
        select q.term, coalesce(sum(st.df), 0) as df,
            ln(1 + (corpus.n_chunks - coalesce(sum(st.df), 0) + 0.5) / (coalesce(sum(st.df), 0) + 0.5)) as idf
        from query_terms as q
        cross join corpus
        cross join kbs
        left join kb.term_stats as st on st.term = q.term and st.kb_id = any(kbs.ids)
        group by q.term, corpus.n_chunks
    ),
    mass as (
        select coalesce(sum(w.idf), 0) as total, count(*) as n_terms, count(*) filter (where w.df = 0) as unseen,
            coalesce(sum(w.idf) filter (where w.df > 0), 0) as known
        from weighted as w
    ),
    scored as (
        select s.chunk_id, s.ord, s.vector_score, s.vector_used, s.lexical_score,
            case when mass.total > 0 then coalesce((
                select sum(w.idf) from weighted as w where s.term_freqs ? w.term
            ), 0) / mass.total else 0 end as coverage,
            case when mass.known > 0 then coalesce((
                select sum(w.idf) from weighted as w where w.df > 0 and s.term_freqs ? w.term
            ), 0) / mass.known else 0 end as known_coverage
        from seen as s cross join mass
    ),
    best as (
        select s.chunk_id, s.coverage from scored as s order by s.coverage desc, s.ord limit 1
    )
    select jsonb_build_object(
        'hits', given,
        'visible_hits', (select count(*) from scored),
        'vector_used', coalesce((select bool_or(s.vector_used) from scored as s), false),
        'vector_score', (select max(s.vector_score) from scored as s),
        'lexical_score', (select max(s.lexical_score) from scored as s),
        'coverage', coalesce((select b.coverage from best as b), 0),
        'coverage_chunk_id', (select b.chunk_id from best as b),
        'top_coverage', (select s.coverage from scored as s order by s.ord limit 1),
        'top_known_coverage', coalesce((select s.known_coverage from scored as s order by s.ord limit 1), 0),
        'query_terms', mass.n_terms,
        'unseen_terms', mass.unseen,
        'per_hit', coalesce((
            select jsonb_agg(jsonb_build_object(
                'chunk_id', s.chunk_id, 'coverage', round(s.coverage::numeric, 4), 'vector_score', s.vector_score
            ) order by s.ord)
            from scored as s
        ), '[]')
    )
    into result
    from mass;
    return result;
end
$$;
