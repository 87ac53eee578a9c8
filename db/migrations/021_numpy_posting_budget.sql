-- 021 numpy posting budget: the numpy BM25 leg reads every posting of the query's terms; this bounds
-- how many (memory and time per call, issue 20's rule), dropping the most common terms beyond it.

insert into kb.settings (key, value, description) values
(
    'lexical_numpy_posting_budget', '2000000',
    'BM25 leg (numpy): postings read at most per query; query terms are taken rarest first while their '
    'postings fit (the first always), so only very common terms of very long queries are left out'
)
on conflict (key) do nothing;
