-- The fuzzy leg's term dictionary: corrections of the query terms that the searched knowledge bases do
-- not hold, taken from their vocabulary (29_term_dictionary.sql), never from chunk text. kb_internal.search scores the query
-- with its corrections through the BM25 engine (kb_internal.lexical_hits with expansions) as the fuzzy leg. Every
-- lookup is keyed by the searched kb_ids (the dictionary's readers: kb_internal.term_counts, term_range and
-- bigrams_ending), so no other knowledge base's vocabulary is read.

-- Corrections of query's terms absent from the knowledge bases kb_ids, as {term: weight}, or NULL when
-- there is none. A word (ASCII, 4 to 32 characters, with a letter) is corrected to the vocabulary's words
-- one edit away (a letter deleted, inserted, replaced, or two neighbours swapped: weight 1 - 1 / the
-- longer length) and to words it begins up to twice its length (weight: its share of the longer word).
-- In Chinese one character is replaced (weight 0.5 for each bigram it makes): inside a run when both its
-- bigrams are absent, by a character that makes both known bigrams; in a run of two characters (absent),
-- either one, by a character that makes a known bigram. (At a longer run's end one known bigram is too
-- weak a sign: everyday question words, 哪些 or 什么, got "corrected" in half the cmrc questions; and a
-- question word ends a run.) At most
-- kb.settings.fuzzy_max_terms words and characters (words first, the longest first) get
-- fuzzy_term_expansions corrections each (the highest weight, then the most frequent; for a character,
-- by its rarer bigram), and each lookup reads at most 1000 vocabulary rows: the work is bounded. When the
-- vocabulary holds every such term of the query, or no absent one is to be corrected (an absent Chinese
-- bigram beside a known one, or touching a question word), there is nothing to correct: NULL, after one
-- lookup per term and without the lookups of corrections.
create or replace function kb_internal.fuzzy_expansions(query text, kb_ids integer[])
returns jsonb
language plpgsql stable
set search_path = pg_catalog, pg_temp
-- every read is an index lookup keyed by kb_ids: a sequential scan, cheaper on a small table, would read
-- every knowledge base's vocabulary
set enable_seqscan = off
-- the edits' row estimates (generate_series x letters) pass JIT's threshold: compiling costs ~130 ms, the
-- statement a few
set jit = off
-- one plan per statement for the session, but the lookups (below)
set plan_cache_mode = force_generic_plan
as $$
declare
    -- the terms a correction is looked for (words of 4 to 32 characters with a letter, Chinese bigrams), in
    -- query order, and whether the vocabulary of kb_ids holds each
    checked constant jsonb := (
        select coalesce(jsonb_agg(jsonb_build_object('term', t.term, 'k', t.k, 'known', s.known is not null)
            order by t.k), '[]')
        from (
            select t.term, min(t.k) as k
            from unnest(kb.lexical_terms(query)) with ordinality as t (term, k)
            where t.term ~ '^[a-z0-9_]{4,32}$' and t.term ~ '[a-z]'
                or length(t.term) = 2 and octet_length(t.term) > 2
            group by t.term
        ) as t
        left join lateral (
            select true as known from kb_internal.term_counts(kb_ids, array[t.term]) limit 1
        ) as s on true
    );
    to_correct jsonb;   -- the terms to correct, [{kind, source, next}]
begin
    -- every term known: nothing to correct, and no lookup of the vocabulary's neighbours
    if not jsonb_path_exists(checked, '$[*] ? (@.known == false)') then
        return null;
    end if;
    -- what to correct: kind 'word' (source = the word), 'inner' (the middle character of source || next),
    -- 'first' / 'last' (that character of source); none (most absent Chinese bigrams are a question's
    -- words meeting, with a known bigram beside them): NULL, without the vocabulary's neighbours
    to_correct := (
    with query_terms as (
        select q.term, q.k, q.known
        from jsonb_to_recordset(checked) as q (term text, k bigint, known boolean)
    ),
    -- Chinese bigrams in query order with their neighbours in the same run (NULL at a run's end). A
    -- question word (哪边, 何时, 什么, 多少) ends a run: documents rarely hold it, so the bigrams touching it
    -- are absent, yet they are the question's form, no sign of a misspelling
    bigrams as (
        select b.term, b.known, b.k,
            case when right(b.prev, 1) = left(b.term, 1) then b.prev_known end as prev_known,
            case when left(b.next, 1) = right(b.term, 1) then b.next end as next,
            case when left(b.next, 1) = right(b.term, 1) then b.next_known end as next_known
        from (
            select q.term, q.known, q.k, lag(q.term) over w as prev, lag(q.known) over w as prev_known,
                lead(q.term) over w as next, lead(q.known) over w as next_known
            from query_terms as q where q.term !~ '^[a-z0-9_]+$' and q.term !~ '[哪何谁几怎什么吗呢啥咋少]'
            window w as (order by q.k)
        ) as b
    )
    select jsonb_agg(jsonb_build_object('kind', x.kind, 'source', x.source, 'next', x.next)) from (
        select x.* from (
            select 'word' as kind, q.term as source, null::text as next, 0 as pos, -length(q.term) as sort_key
            from query_terms as q where not q.known and q.term ~ '^[a-z0-9_]+$'
            union all
            select 'inner', b.term, b.next, 1, b.k::integer from bigrams as b
            where not b.known and b.next is not null and not b.next_known
            union all
            -- a run of two characters: either may be the wrong one
            select 'first', b.term, null, 2, b.k::integer from bigrams as b
            where not b.known and b.prev_known is null and b.next is null
            union all
            select 'last', b.term, null, 3, b.k::integer from bigrams as b
            where not b.known and b.prev_known is null and b.next is null
        ) as x
        order by x.pos, x.sort_key, x.source
        limit kb_internal.setting_int('fuzzy_max_terms')
    ) as x
    );
    if to_correct is null then
        return null;
    end if;
    -- the lookups planned for the query's own suspects, as a SQL function was: a generic plan was slower
    -- (the caller's setting comes back when this function returns, through its SET plan_cache_mode clause)
    perform set_config('plan_cache_mode', 'force_custom_plan', true);
    return (
    with suspects as (
        select a.kind, a.source, a.next from jsonb_to_recordset(to_correct) as a (kind text, source text, next text)
    ),
    -- every string one edit away from an absent word, with the letters terms are made of
    edits as (
        select a.source, array_agg(v.variant) as variants
        from suspects as a
        cross join lateral (
            select left(a.source, i - 1) || substr(a.source, i + 1)
            from generate_series(1, length(a.source)) as i
            union
            select left(a.source, i - 1) || substr(a.source, i + 1, 1) || substr(a.source, i, 1)
                || substr(a.source, i + 2)
            from generate_series(1, length(a.source) - 1) as i
            union
            select left(a.source, i - 1) || l.c || substr(a.source, i + 1)
            from generate_series(1, length(a.source)) as i,
                regexp_split_to_table('abcdefghijklmnopqrstuvwxyz0123456789_', '') as l (c)
            union
            select left(a.source, i) || l.c || substr(a.source, i + 1)
            from generate_series(0, length(a.source)) as i,
                regexp_split_to_table('abcdefghijklmnopqrstuvwxyz0123456789_', '') as l (c)
        ) as v (variant)
        where a.kind = 'word' and v.variant <> a.source and length(v.variant) >= 3
        group by a.source
    ),
    -- the known Chinese bigrams that begin / end with a suspect's neighbouring character
    starting as (
        select a.source, a.next, s.term, s.df
        from suspects as a
        cross join lateral (
            -- Chinese terms are bigrams or single characters: past the character itself, all are bigrams
            select s.term, s.df from kb_internal.term_range(kb_ids, left(a.source, 1), left(a.source, 1) || chr(1114111)) as s
            where left(s.term, 1) = left(a.source, 1)
            limit 1000
        ) as s
        where a.kind in ('inner', 'last')
    ),
    ending as (
        select a.source, a.next, s.term, s.df
        from suspects as a
        cross join lateral (
            select s.term, s.df from kb_internal.bigrams_ending(kb_ids, right(coalesce(a.next, a.source), 1)) as s
            limit 1000
        ) as s
        where a.kind in ('inner', 'first')
    ),
    -- candidates: (suspect, the terms a correction adds, weight, df for the order)
    found as (
        select e.source, array[s.term] as terms, 1 - 1 / greatest(length(e.source), length(s.term))::float8 as weight,
            s.df::bigint as df
        from edits as e
        cross join lateral (
            select s.term, s.df from kb_internal.term_counts(kb_ids, e.variants) as s
        ) as s
        union all
        select a.source, array[s.term], length(a.source) / length(s.term)::float8, s.df
        from suspects as a
        cross join lateral (
            select s.term, s.df from kb_internal.term_range(kb_ids, a.source, a.source || chr(1114111)) as s
            where left(s.term, length(a.source)) = a.source and length(s.term) <= 2 * length(a.source)
            limit 256
        ) as s
        where a.kind = 'word'
        union all
        select l.source, array[l.term, r.term], 0.5, least(l.df, r.df)
        from starting as l
        inner join ending as r on r.source = l.source and left(r.term, 1) = right(l.term, 1)
        where l.next is not null and right(l.term, 1) <> right(l.source, 1)
        union all
        select l.source, array[l.term], 0.5, l.df from starting as l where l.next is null
        union all
        select r.source, array[r.term], 0.5, r.df from ending as r where r.next is null
    ),
    ranked as (
        select f.terms, f.weight,
            row_number() over (partition by f.source order by f.weight desc, sum(f.df) desc, f.terms) as pos
        from found as f
        group by f.source, f.terms, f.weight
    )
    select jsonb_object_agg(x.term, x.weight)
    from (
        select t.term, max(r.weight) as weight
        from ranked as r, unnest(r.terms) as t (term)
        where r.pos <= kb_internal.setting_int('fuzzy_term_expansions')
        group by t.term
    ) as x
    );
end
$$;
