-- 034 chunks read by knowledge base first (issue 32, finding 6d): kb.answer_evidence and kb.store_embeddings
-- looked a given chunk id up by primary key and only then dropped it when the caller could not see (or
-- write) its knowledge base, so another user's chunk id fetched one row where a missing id fetched none.
-- They now look ids up among the caller's knowledge bases only, through this index: (id + 0) is an
-- expression the primary key cannot serve, so the planner has no by-id path that reaches other rows. It
-- also serves everything chunks_kb_idx did (kb_id first).

create index chunks_kb_chunk_idx on kb.chunks (kb_id, (id + 0));
drop index kb.chunks_kb_idx;
