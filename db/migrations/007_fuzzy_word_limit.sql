-- 007 fuzzy word limit: the trigram leg is for typos and identifiers, which are one or two words; on
-- sentence-like queries its GIN index returns a large share of the table for word_similarity rechecks.

insert into kb.settings (key, value, description) values
(
    'fuzzy_max_query_words', '2',
    'Trigram leg runs only for queries of at most this many whitespace-separated words'
)
on conflict (key) do nothing;
