-- 041 half-precision vectors for large models (issue 33): a model registered with more than 512 dimensions
-- stores and indexes its embeddings as halfvec (2 bytes a dimension, half of vector's 4) unless its
-- registration says otherwise. kb.embedding_models.storage names the choice; each kb.embeddings row holds its
-- embedding in the column of its model's storage (embedding: vector, half: halfvec) and NULL in the other.
-- Models registered before this keep 'vector': their rows and indexes are not rewritten.

alter table kb.embedding_models add column storage text not null default 'vector';
alter table kb.embedding_models add constraint embedding_models_storage_check check (storage in ('vector', 'halfvec'));
-- HNSW indexes hold vector up to 2,000 dimensions and halfvec up to 4,000
alter table kb.embedding_models drop constraint embedding_models_dimension_check;
alter table kb.embedding_models add constraint embedding_models_dimension_check check (
    dimension between 1 and case storage when 'halfvec' then 4000 else 2000 end
);

alter table kb.embeddings alter column embedding drop not null;
alter table kb.embeddings add column half halfvec;
alter table kb.embeddings add constraint embeddings_one_vector check ((embedding is null) <> (half is null));

-- the functions whose signatures gain the storage (db/functions creates them again)
drop function if exists kb_internal.hnsw_index_definition(integer, integer, integer, integer, integer);
drop function if exists kb.register_embedding_model(text, integer, text, text, boolean, integer, integer);
drop function if exists kb.embedding_status(text);
