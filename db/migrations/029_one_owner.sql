-- 029 one owner for each rule (issue 23, items 1 and 2). kb.ask takes the caller's query embedding (and
-- model, vector weight) as kb.hybrid_search does, and kb.retrieve a vector weight, so a client whose own
-- embedding failed turns the vector leg off instead of having the database try again: new signatures,
-- re-created by db/functions (66_ask.sql, 58_retrieve.sql) in this same `pgkb db migrate`.

drop function if exists kb.ask(text, integer, text, jsonb, text, boolean);
drop function if exists kb_internal.ask_answer(text, integer, text, jsonb, text, boolean);
drop function if exists kb.retrieve(text, integer, text, vector, text, jsonb, double precision);

-- The search defaults move from kb.search_defaults()' literals to kb.settings (the single place a default
-- lives), with the values tuned in docs/quality.md; kb.search_defaults() reads them.
insert into kb.settings (key, value, description) values
('search_vector_weight', '1.0', 'Search: weight of the vector leg when the caller passes none'),
('search_lexical_weight', '0.6', 'Search: weight of the BM25 leg when the caller passes none'),
('search_fuzzy_weight', '0.25', 'Search: weight of the fuzzy leg when the caller passes none'),
('search_rrf_k', '60', 'Search: k of reciprocal rank fusion (fusion rrf) when the caller passes none'),
('search_candidates', '80', 'Search: rows per leg before fusion (at least top_k) when the caller passes none'),
('search_bm25_k1', '1.2', 'Search: BM25 k1 when the caller passes none'),
('search_bm25_b', '0.75', 'Search: BM25 b when the caller passes none'),
('search_fusion', 'dbsf', 'Search: fusion method (dbsf or rrf) when the caller passes none')
on conflict (key) do nothing;
