-- 019 lexical query term cap: the lexical legs score at most this many distinct query terms, the rarest
-- (kb.lexical_query_terms). A 4000-character query holds up to ~1400 distinct terms; each costs its
-- postings, so without a cap one query could cost as much as a thousand (issue 20).

insert into kb.settings (key, value, description) values
(
    'lexical_max_query_terms', '256',
    'the most distinct query terms the lexical legs score (the rarest, highest idf, are kept)'
)
on conflict (key) do nothing;
