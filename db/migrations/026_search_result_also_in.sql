-- 026 search result also_in: exact duplicates (the same chunk text in several chunks, documents or knowledge
-- bases) collapse into one search result, the best-scored copy, whose also_in lists where the other copies
-- are, as kb://<kb>/<doc_key> URIs (kb.search, db/functions/50_search.sql). The attribute goes last, so a
-- client reading result columns by name sees no change. kb.retrieve returns it too (a new result column:
-- its old definition is dropped here, db/functions creates the new one).

alter type kb.search_result add attribute also_in text[];
drop function if exists kb.retrieve(text, integer, text, vector, text, jsonb, double precision);
