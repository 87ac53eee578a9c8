-- The indexes pgkb expects: the ones db/migrations create and one HNSW index per registered embedding
-- model for each knowledge base of at least kb.settings.vector_exact_chunks chunks (smaller ones are searched
-- exactly). Searches fall back to slower scans without them, so `pgkb db status` reports a missing or invalid
-- one (kb_admin.index_problems) and `pgkb db migrate` re-creates it (kb_internal.restore_indexes), and drops
-- an HNSW index no longer expected (its knowledge base is gone or small).

-- The HNSW index of each model in each knowledge base (only kb_id's, or model_id's, when given), expected or
-- not, and the statement that creates it: with the model's hnsw_m / hnsw_ef_construction or else kb.settings'.
-- expected: the knowledge base holds at least kb.settings.vector_exact_chunks chunks.
create or replace function kb_internal.vector_index_definitions(kb_id integer default null, model_id integer default null)
returns table (index_name text, definition text, expected boolean)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select
        kb.hnsw_index_name(m.id, k.id),
        kb_internal.hnsw_index_definition(
            m.id, k.id, m.dimension, m.storage,
            coalesce(m.hnsw_m, kb_internal.setting_int('hnsw_m')),
            coalesce(m.hnsw_ef_construction, kb_internal.setting_int('hnsw_ef_construction'))
        ),
        k.chunk_count >= kb_internal.setting_int('vector_exact_chunks')
    from kb.embedding_models as m cross join kb.knowledge_bases as k
    where (vector_index_definitions.kb_id is null or k.id = vector_index_definitions.kb_id)
        and (vector_index_definitions.model_id is null or m.id = vector_index_definitions.model_id)
$$;

-- Every index pgkb expects in schema kb and the statement that creates it (a model's HNSW index in each
-- knowledge base, with the model's hnsw_m / hnsw_ef_construction or else kb.settings'). Keep it in step with
-- db/migrations: a test compares it with what they create.
create or replace function kb_internal.expected_indexes()
returns table (index_name text, definition text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select x.index_name, x.definition
    from (values
        ('memberships_user_idx', 'create index memberships_user_idx on kb.memberships (user_id)'),
        ('chunks_kb_chunk_idx', 'create index chunks_kb_chunk_idx on kb.chunks (kb_id, (id + 0))'),
        (
            'chunks_kb_content_hash_idx',
            'create index chunks_kb_content_hash_idx on kb.chunks (kb_id, content_hash) include (id, document_id)'
        ),
        (
            'term_stats_bigram_end_idx',
            'create index term_stats_bigram_end_idx on kb.term_stats (kb_id, right(term, 1))'
            || ' where length(term) = 2 and octet_length(term) > 2'
        ),
        (
            'embedding_models_one_default',
            'create unique index embedding_models_one_default on kb.embedding_models (is_default) where is_default'
        ),
        (
            'embedding_queue_ready_idx',
            'create index embedding_queue_ready_idx on kb.embedding_queue (model_id, next_attempt_at)'
            || ' where not parked'
        ),
        ('embeddings_model_kb_idx', 'create index embeddings_model_kb_idx on kb.embeddings (model_id, kb_id)'),
        ('glossary_kb_idx', 'create index glossary_kb_idx on kb.glossary (kb_id)'),
        (
            'knowledge_saves_user_idx',
            'create index knowledge_saves_user_idx on kb.knowledge_saves (user_id, saved_at)'
        ),
        ('knowledge_saves_kb_idx', 'create index knowledge_saves_kb_idx on kb.knowledge_saves (kb_id)'),
        ('questions_user_idx', 'create index questions_user_idx on kb.questions (user_id, asked_at)'),
        ('question_kbs_question_idx', 'create index question_kbs_question_idx on kb.question_kbs (question_id)'),
        (
            'question_kbs_kb_time_idx',
            'create index question_kbs_kb_time_idx on kb.question_kbs (kb_id, asked_at)'
        ),
        (
            'question_kbs_unjudged_idx',
            'create index question_kbs_unjudged_idx on kb.question_kbs (kb_id, asked_at) where hits is not null'
        ),
        (
            'questions_unjudged_idx',
            'create index questions_unjudged_idx on kb.questions (user_id, asked_at) where hits is not null'
        ),
        (
            'answer_ratings_question_idx',
            'create unique index answer_ratings_question_idx on kb.answer_ratings (question_id)'
            || ' where question_id is not null'
        ),
        ('answer_ratings_user_idx', 'create index answer_ratings_user_idx on kb.answer_ratings (user_id, rated_at)'),
        ('answer_ratings_kb_idx', 'create index answer_ratings_kb_idx on kb.answer_ratings (kb_id, rated_at)')
    ) as x (index_name, definition)
    -- a schema before the migration that made the table (032 the glossary, 035 knowledge_saves, 036 the log)
    where to_regclass(substring(x.definition from ' on (kb\.[a-z_]+) ')) is not null
    union all
    select v.index_name, v.definition from kb_internal.vector_index_definitions() as v where v.expected
$$;

-- Create the expected HNSW indexes of one knowledge base (kb_id) or one model (model_id) that do not exist;
-- returns how many it created. kb.register_embedding_model calls it (an administrator's transaction), and
-- kb.create_knowledge_base, for which nothing is expected yet (no chunks) unless vector_exact_chunks is 0.
-- Each CREATE INDEX reads all of kb.embeddings under its SHARE lock, held to the end of the caller's
-- transaction: writes of embeddings wait, reads go on.
create or replace function kb_internal.create_vector_indexes(kb_id integer default null, model_id integer default null)
returns integer
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    v record;
    created integer := 0;
begin
    for v in
        select x.index_name, x.definition from kb_internal.vector_index_definitions(kb_id, model_id) as x
        where x.expected and to_regclass('kb.' || quote_ident(x.index_name)) is null
    loop
        execute v.definition;
        created := created + 1;
    end loop;
    return created;
end
$$;

-- Admin: the expected indexes that are missing, or present but not valid (a failed CREATE INDEX
-- CONCURRENTLY or REINDEX leaves one that no query uses), with the statement that creates them, and the
-- per-knowledge-base HNSW indexes no longer expected ('stale': the knowledge base or model is gone, or the
-- knowledge base fell below vector_exact_chunks; with the statement that drops them); by name. Runs as the
-- owner, who may call kb_internal.expected_indexes.
create or replace function kb_admin.index_problems()
returns table (index_name text, problem text, definition text)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select
        e.index_name,
        case when i.indexrelid is null then 'missing' else 'invalid' end,
        e.definition
    from kb_internal.expected_indexes() as e
    left join pg_class as c
        on c.relname = e.index_name and c.relnamespace = 'kb'::regnamespace and c.relkind = 'i'
    left join pg_index as i on c.oid = i.indexrelid
    where i.indexrelid is null or not (i.indisvalid and i.indisready)
    union all
    select c.relname::text, 'stale', format('drop index kb.%I', c.relname)
    from pg_class as c
    where c.relnamespace = 'kb'::regnamespace and c.relkind = 'i' and c.relname ~ '^embeddings_hnsw_model_\d+_kb_\d+$'
        and not exists (select from kb_internal.expected_indexes() as e where e.index_name = c.relname)
    order by 1
$$;

-- Re-create the missing expected indexes and rebuild the invalid ones (REINDEX keeps their own definition),
-- but the per-knowledge-base HNSW ones: those pgkb.migrate.maintain_vector_indexes builds and drops
-- CONCURRENTLY, outside any transaction, so no search waits for them. Returns each with what was done.
-- Takes each table's SHARE lock while it builds: reads go on, writes wait.
create or replace function kb_internal.restore_indexes()
returns table (index_name text, action text)
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    p record;
begin
    for p in
        select * from kb_admin.index_problems() as x where x.index_name !~ '^embeddings_hnsw_model_\d+_kb_\d+$'
    loop
        if p.problem = 'invalid' then
            execute format('reindex index kb.%I', p.index_name);
            index_name := p.index_name;
            action := 'rebuilt (was invalid)';
        else
            execute p.definition;
            index_name := p.index_name;
            action := 'created (was missing)';
        end if;
        return next;
    end loop;
end
$$;
