-- 006 search settings: knobs of kb.search that trade latency for recall (see README, docs/benchmarks.md).

insert into kb.settings (key, value, description) values
(
    'lexical_probe_budget', '2000',
    'BM25 leg: probe the rarest query terms while their postings stay within this many chunks'
),
(
    'fuzzy_max_query_chars', '32',
    'Trigram leg runs only for queries up to this many characters (typos, identifiers)'
)
on conflict (key) do nothing;
