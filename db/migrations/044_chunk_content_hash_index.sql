-- 044 an index of each chunk's content hash in its knowledge base (issue 33): fusion reads kb.chunks only for
-- the candidates that may be among the top_k, and finds the other candidates of a hit's text (also_in) through
-- this index, keyed by the searched knowledge bases (no entry of another one is read), one lookup per hit,
-- instead of reading every candidate's hash; it holds id and document_id, so each copy of a text is read from the
-- index alone. About 6 MB per 100,000 chunks.

create index chunks_kb_content_hash_idx on kb.chunks (kb_id, content_hash) include (id, document_id);
