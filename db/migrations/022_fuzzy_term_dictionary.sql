-- 022 fuzzy term dictionary: the fuzzy leg no longer matches query text against all chunk text through a
-- trigram index over every knowledge base's content. It corrects the query's terms that the searched
-- knowledge bases do not hold against their vocabulary (kb.term_stats: one edit, a longer word it begins,
-- or a Chinese bigram with one character changed) and scores the corrected terms through the BM25 engine
-- (kb.fuzzy_expansions, db/functions/49_fuzzy_terms.sql). Issue 19.
-- - chunks_trgm_idx goes: nothing reads it (it was 1.7 GB and 21 minutes of build at 1M chunks, and every
--   chunk written paid for it).
-- - Chinese bigrams are looked up by their second character through a partial index keyed by kb_id (by
--   their first, through the primary key).
-- - The lexical legs take the corrections as an argument; their old signatures are dropped so that the
--   new ones (db/functions) are not ambiguous with them.

drop index if exists kb.chunks_trgm_idx;

create index if not exists term_stats_bigram_end_idx on kb.term_stats (kb_id, right(term, 1))
where length(term) = 2 and octet_length(term) > 2;

drop function if exists kb.fuzzy_leg(text, integer[], integer, jsonb);
drop function if exists kb.lexical_query_terms(text, integer[]);
drop function if exists kb.lexical_hits(text, integer[], integer, jsonb, double precision, double precision);
drop function if exists kb.lexical_leg_numpy(
    text, integer[], integer, jsonb, double precision, double precision
);
drop function if exists kb.lexical_leg(
    text, integer[], integer, jsonb, double precision, double precision, integer
);
drop function if exists kb.lexical_leg_scan(
    text, integer[], integer, jsonb, double precision, double precision, integer
);

delete from kb.settings
where key in ('fuzzy_max_query_chars', 'fuzzy_max_query_words');

insert into kb.settings (key, value, description) values
(
    'fuzzy_max_terms', '8',
    'fuzzy leg: the most query terms (absent from the searched knowledge bases; the longest first) it '
    'looks up corrections for'
),
(
    'fuzzy_term_expansions', '3',
    'fuzzy leg: the most corrections it keeps per query term (closest first, then the most frequent)'
)
on conflict (key) do nothing;
