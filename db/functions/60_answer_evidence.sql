-- Answer evidence: absolute signals of how well retrieved chunks can answer a question, read by the
-- not-found gate (61_answer_gate.sql). Never the DBSF-fused score, which is relative per query.
-- Only chunks the caller may read count: hits are looked up among kb.visible_kb_ids()'s chunks only, so a
-- hand-crafted hits array naming other users' chunk ids learns nothing, not even from counters (no oracle).

-- Evidence over the hits the caller may see, as jsonb: vector_score (best cosine the hits carry),
-- coverage (best share of the question's idf mass -- distinct kb_internal.query_terms, idf as in the BM25 legs
-- over the visible hits' knowledge bases, unseen terms at the maximum idf -- present in a chunk's terms (kb.chunk_terms),
-- a term also present when all the terms of one of its translations are, kb_internal.query_translations, each
-- also as one of its English inflections, kb_internal.english_inflections; its
-- idf then its concept's when the term itself is unseen), the chunk it came from, top_coverage (first visible
-- hit), top_known_coverage (its share of the terms the knowledge bases hold or translate only), per_hit,
-- counts. With also (other phrasings of the question) each measure is the best over the phrasings. Raises on
-- a bad question or also.
create or replace function kb.answer_evidence(question text, hits kb.search_result[], also text[] default null)
returns jsonb
language plpgsql stable security definer
set search_path = pg_catalog, public, pg_temp
as $$
begin
    perform kb.check_search_input(question, 1, also);
    if coalesce(cardinality(hits), 0) > 1000 then
        raise exception 'hits holds % rows; at most 1000 are accepted', cardinality(hits)
            using errcode = 'program_limit_exceeded';
    end if;
    return kb_internal.hits_evidence(question, hits, also, kb.visible_kb_ids());
end
$$;

-- Internal: kb.answer_evidence over the chunks of knowledge bases kb_ids (the caller's visible ones; the
-- question log's settling, kb_internal.settle_questions, passes the knowledge bases a logged question
-- searched). No input check: callers check or pass what they logged.
create or replace function kb_internal.hits_evidence(
    question text, hits kb.search_result[], also text[], kb_ids integer[]
)
returns jsonb
language plpgsql stable
set search_path = pg_catalog, public, pg_temp
as $$
declare
    given constant integer := coalesce(cardinality(hits), 0);
    result jsonb;
begin
    with given_hits as (
        -- first occurrence of each chunk id, in the caller's order
        select distinct on (h.chunk_id) h.chunk_id, h.ordinality as ord, h.vector_score, h.vector_used, h.lexical_score
        from unnest(hits) with ordinality as h
        where h.chunk_id is not null
        order by h.chunk_id, h.ordinality
    ),
    seen as (
        -- the visible ones only; everything else about them comes from the database, not the caller
        select g.chunk_id, g.ord, c.kb_id, (
                -- its terms, with its document's title read by primary key (no other document is read)
                select coalesce(array_agg(t.term), '{}')
                from kb.documents as d
                cross join lateral kb.chunk_terms(d.title, c.heading_path, c.content) as t
                where d.id = c.document_id
            ) as terms,
            case when g.vector_score between -1 and 1 then g.vector_score end as vector_score,
            coalesce(g.vector_used, false) as vector_used,
            case when g.lexical_score between 0 and 1e9 then g.lexical_score end as lexical_score
        from given_hits as g
        -- looked up among the visible knowledge bases only (chunks_kb_chunk_idx; id + 0: never by primary key,
        -- which would fetch another user's chunk row before dropping it)
        join kb.chunks as c on c.kb_id = any(kb_ids) and c.id + 0 = g.chunk_id
    ),
    kbs as (
        select coalesce(array_agg(distinct s.kb_id), '{}') as ids from seen as s
    ),
    corpus as (
        select greatest(coalesce(sum(k.chunk_count), 0), 1)::double precision as n_chunks
        from kb.knowledge_bases as k, kbs where k.id = any(kbs.ids)
    ),
    phrasings as (
        select p.n, p.q from unnest(array[question] || coalesce(also, '{}')) with ordinality as p (q, n)
    ),
    query_terms as (
        select distinct p.n, t.term from phrasings as p cross join unnest(kb_internal.query_terms(p.q)) as t (term)
    ),
    -- each translation (its terms) with the query terms its source covers and its concept's df
    translations as (
        select p.n, x.covers, x.translation, array_agg(x.term) as terms, max(x.concept_df) as concept_df
        from phrasings as p
        cross join kbs
        cross join lateral kb_internal.query_translations(p.q, kbs.ids) as x
        group by p.n, x.source, x.covers, x.translation
    ),
    -- each translation term's forms a passage may hold it in (the lexicon's expire, the text's expires), once
    inflected as materialized (
        select distinct x.term, kb_internal.english_inflections(x.term) as forms
        from translations as t cross join unnest(t.terms) as x (term)
    ),
    concepts as (
        select t.n, c.term, max(t.concept_df) as concept_df
        from translations as t cross join unnest(t.covers) as c (term)
        group by t.n, c.term
    ),
    weighted as (
        select q.n, q.term, q.df, c.concept_df is not null as translated,
            ln(1 + (corpus.n_chunks - case when q.df = 0 and c.concept_df is not null then c.concept_df else q.df end
                + 0.5) / (case when q.df = 0 and c.concept_df is not null then c.concept_df else q.df end + 0.5)) as idf
        from (
            select q.n, q.term, coalesce(sum(st.df), 0) as df
            from query_terms as q
            cross join kbs
            left join lateral kb_internal.term_counts(kbs.ids, array[q.term]) as st on true
            group by q.n, q.term
        ) as q
        cross join corpus
        left join concepts as c on c.n = q.n and c.term = q.term
    ),
    mass as (
        select w.n, coalesce(sum(w.idf), 0) as total, count(*) as n_terms,
            count(*) filter (where w.df = 0 and not w.translated) as unseen,
            coalesce(sum(w.idf) filter (where w.df > 0 or w.translated), 0) as known
        from weighted as w group by w.n
    ),
    -- per chunk and phrasing: the idf of the terms it holds, itself or through a translation
    held as (
        select s.chunk_id, w.n, w.idf, w.df > 0 or w.translated as known
        from seen as s
        cross join weighted as w
        where w.term = any(s.terms) or exists (
            select from translations as t
            where t.n = w.n and w.term = any(t.covers)
                -- each of the translation's terms, itself or inflected
                and not exists (
                    select from unnest(t.terms) as x (term)
                    join inflected as f on f.term = x.term
                    where not s.terms && f.forms
                )
        )
    ),
    scored as (
        select s.chunk_id, s.ord, s.vector_score, s.vector_used, s.lexical_score,
            coalesce(max(case when m.total > 0 then coalesce(h.idf, 0) / m.total else 0 end), 0) as coverage,
            coalesce(max(case when m.known > 0 then coalesce(h.known_idf, 0) / m.known else 0 end), 0) as known_coverage
        from seen as s
        cross join mass as m
        left join lateral (
            select sum(h.idf) as idf, sum(h.idf) filter (where h.known) as known_idf
            from held as h where h.chunk_id = s.chunk_id and h.n = m.n
        ) as h on true
        group by s.chunk_id, s.ord, s.vector_score, s.vector_used, s.lexical_score
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
        'query_terms', coalesce(mass.n_terms, 0),
        'unseen_terms', coalesce(mass.unseen, 0),
        'translated_terms', (select count(*) from weighted as w where w.n = 1 and w.translated),
        'per_hit', coalesce((
            select jsonb_agg(jsonb_build_object(
                'chunk_id', s.chunk_id, 'coverage', round(s.coverage::numeric, 4), 'vector_score', s.vector_score
            ) order by s.ord)
            from scored as s
        ), '[]')
    )
    into result
    from (select 1) as one
    left join mass on mass.n = 1;
    return result;
end
$$;
