-- 011 embeddings slice index: kb.vector_leg falls back to an exact scan of the caller's visible slice
-- (model, knowledge bases) when the HNSW index yields fewer rows than asked for; this btree serves it.

create index if not exists embeddings_model_kb_idx on kb.embeddings (model_id, kb_id);
