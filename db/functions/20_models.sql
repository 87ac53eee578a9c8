-- The embedding-model registry: registering a model (its own partial HNSW index, backfill queue),
-- switching the default, and resolving a model name for callers. Models of different dimensions live
-- side by side in kb.embeddings; nothing is dropped when the default changes.

-- Resolve a model name (NULL: the default model) to its registry row; raises for unknown names.
create or replace function kb.resolve_model(model text default null)
returns kb.embedding_models
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    found kb.embedding_models;
begin
    if model is null then
        select * into found from kb.embedding_models as m where m.is_default;
        if found.id is null then
            raise exception 'no default embedding model is registered'
                using errcode = 'no_data_found', hint = 'SELECT kb.register_embedding_model(...)';
        end if;
    else
        select * into found from kb.embedding_models as m where m.name = model;
        if found.id is null then
            raise exception 'unknown embedding model "%"', left(model, 200)
                using errcode = 'no_data_found', hint = 'SELECT name FROM kb.embedding_models';
        end if;
    end if;
    return found;
end
$$;

-- Name of the HNSW index that serves one model in one knowledge base.
create or replace function kb.hnsw_index_name(model_id integer, kb_id integer)
returns text
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select 'embeddings_hnsw_model_' || model_id || '_kb_' || kb_id
$$;

-- How a model's stored embeddings are read, by its storage and dimension: 'column' the typed expression
-- ((embedding::vector(384)), (half::halfvec(1024))), 'ops' that with its cosine operator class (an HNSW
-- index's key), 'cast' the type a query vector is cast to (vector(384), halfvec(1024)). The one place that
-- maps a storage to its column, type and operators: the vector leg, retrieve and the indexes use it.
create or replace function kb_internal.vector_expression(storage text, dimension integer, part text)
returns text
language plpgsql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    -- PL/pgSQL: a SQL function with a search_path is planned again at every call (the vector leg calls this
    -- twice a search)
    col constant text := case storage when 'halfvec' then 'half' else 'embedding' end;
    typ constant text := case storage when 'halfvec' then 'halfvec' else 'vector' end;
begin
    return case part
        when 'column' then format('(%s::%s(%s))', col, typ, dimension)
        when 'ops' then format('(%s::%s(%s)) %s_cosine_ops', col, typ, dimension, typ)
        when 'cast' then format('%s(%s)', typ, dimension)
    end;
end
$$;

-- The statement that creates one model's partial HNSW expression index (cosine) over one knowledge base's
-- embeddings, with these parameters: kb_internal.expected_indexes lists it, kb_internal.create_vector_indexes
-- runs it. Only that knowledge base's rows are in it, so a scan of it never reads another's. storage: the
-- model's (kb.embedding_models.storage), which column it indexes (embedding: vector; half: halfvec).
create or replace function kb_internal.hnsw_index_definition(
    model_id integer, kb_id integer, dimension integer, storage text, m integer, ef_construction integer
)
returns text
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select format(
        'create index if not exists %I on kb.embeddings using hnsw (%s)'
        ' with (m = %s, ef_construction = %s) where model_id = %s and kb_id = %s',
        kb.hnsw_index_name(model_id, kb_id), kb_internal.vector_expression(storage, dimension, 'ops'),
        m, ef_construction, model_id, kb_id
    )
$$;

-- Admin: register an embedding model (idempotent for identical settings). Creates its partial HNSW
-- expression index in every knowledge base (cosine; m / ef_construction from the arguments, kept with the
-- model for later knowledge bases, or kb.settings) and queues every existing chunk for backfill. make_default
-- switches at once; otherwise call kb.use_embedding_model later. storage: 'vector' (4 bytes a dimension, up to
-- 2,000) or 'halfvec' (2 bytes, up to 4,000); NULL chooses halfvec above 512 dimensions (BGE-M3's 1024: the
-- HNSW index a third of the size, the same recall: docs/benchmarks.md), vector otherwise. A registered model keeps its
-- storage: asking for another raises.
create or replace function kb.register_embedding_model(
    name text,
    dimension integer,
    query_prefix text default '',
    passage_prefix text default '',
    make_default boolean default false,
    hnsw_m integer default null,
    hnsw_ef_construction integer default null,
    storage text default null
)
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
declare
    existing kb.embedding_models;
    mid integer;
    m integer := coalesce(hnsw_m, kb_internal.setting_int('hnsw_m'));
    efc integer := coalesce(hnsw_ef_construction, kb_internal.setting_int('hnsw_ef_construction'));
    chosen constant text := coalesce(storage, case when dimension > 512 then 'halfvec' else 'vector' end);
begin
    perform kb.require_admin('register embedding models');
    if name is null or btrim(name) = '' or length(name) > 200 then
        raise exception 'invalid model name' using errcode = 'invalid_parameter_value';
    end if;
    if chosen not in ('vector', 'halfvec') then
        raise exception 'invalid storage "%": vector or halfvec', left(chosen, 50)
            using errcode = 'invalid_parameter_value';
    end if;
    if dimension is null or dimension not between 1 and (case chosen when 'halfvec' then 4000 else 2000 end) then
        raise exception 'invalid dimension %: HNSW indexes support 1..2000 (vector), 1..4000 (halfvec)', dimension
            using errcode = 'invalid_parameter_value';
    end if;
    if m not between 2 and 100 or efc not between 4 and 1000 or efc < 2 * m then
        raise exception 'invalid HNSW parameters m=% ef_construction=% (need 2<=m<=100, ef_construction>=2*m)',
            m, efc using errcode = 'invalid_parameter_value';
    end if;
    select * into existing from kb.embedding_models as e where e.name = register_embedding_model.name;
    if existing.id is not null then
        if existing.dimension <> dimension then
            raise exception 'model "%" is registered with dimension %, not %', name, existing.dimension, dimension
                using errcode = 'invalid_parameter_value';
        end if;
        if storage is not null and existing.storage <> storage then
            raise exception 'model "%" is stored as %, not %', name, existing.storage, storage
                using errcode = 'invalid_parameter_value';
        end if;
        update kb.embedding_models as e
        set query_prefix = coalesce(register_embedding_model.query_prefix, ''),
            passage_prefix = coalesce(register_embedding_model.passage_prefix, '')
        where e.id = existing.id;
        mid := existing.id;
    else
        insert into kb.embedding_models as e (
            name, dimension, query_prefix, passage_prefix, hnsw_m, hnsw_ef_construction, storage
        )
        values (
            name, dimension, coalesce(query_prefix, ''), coalesce(passage_prefix, ''),
            register_embedding_model.hnsw_m, register_embedding_model.hnsw_ef_construction, chosen
        )
        returning e.id into mid;
        perform kb_internal.create_vector_indexes(model_id => mid);
        insert into kb.embedding_queue (chunk_id, model_id, kb_id)
        select c.id, mid, c.kb_id from kb.chunks as c
        on conflict do nothing;
        perform pg_notify('pgkb_embedding_queue', mid::text);
    end if;
    if make_default then
        perform kb.use_embedding_model(name, force => true);
    end if;
    return mid;
end
$$;

-- Admin: make a registered model the default for search and ingestion. Refuses while chunks still
-- lack its embeddings (backfill first) unless force is true. Returns the number of chunks missing one.
create or replace function kb.use_embedding_model(name text, force boolean default false)
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target kb.embedding_models := kb.resolve_model(name);
    missing bigint;
begin
    perform kb.require_admin('change the default embedding model');
    select count(*) into missing
    from kb.chunks as c
    where not exists (select from kb.embeddings as e where e.chunk_id = c.id and e.model_id = target.id);
    if missing > 0 and not force then
        raise exception '% chunks have no "%" embedding yet', missing, target.name
            using errcode = 'object_not_in_prerequisite_state',
                hint = 'run pgkb worker until the queue is empty, or pass force => true (pgkb model use --force)';
    end if;
    update kb.embedding_models as e set is_default = false where e.is_default and e.id <> target.id;
    update kb.embedding_models as e set is_default = true where e.id = target.id;
    return missing;
end
$$;

-- True when cosine distance to this vector is meaningful: its norm is neither 0 (no direction; every
-- distance to it is NaN, and one NaN score turns every fused score NaN) nor so small or large (outside
-- 1e-15 .. 1e15) that pgvector's float4 arithmetic under- or overflows. NaN and infinite components
-- never get this far: pgvector refuses them on input.
create or replace function kb_internal.usable_embedding(embedding vector)
returns boolean
language plpgsql immutable strict parallel safe
set search_path = pg_catalog, public, pg_temp
as $$
begin
    return vector_norm(embedding) between 1e-15 and 1e15;
end
$$;

-- True when an embedding can be stored in a model of this storage and searched: kb_internal.usable_embedding,
-- and for halfvec every component within its range (±65504) and a norm that does not vanish once rounded to
-- half precision (components below about 6e-8 become 0).
create or replace function kb_internal.storable_embedding(embedding vector, storage text)
returns boolean
language plpgsql immutable strict parallel safe
set search_path = pg_catalog, public, pg_temp
as $$
begin
    -- (PL/pgSQL: every search checks its query vectors, and a SQL function is planned at every call)
    if not kb_internal.usable_embedding(embedding) then
        return false;
    elsif storage <> 'halfvec' then
        return true;
    end if;
    -- the cast raises beyond the range, so the range is tested first
    if (select max(abs(x)) from unnest(embedding::real[]) as x) > 65504 then
        return false;
    end if;
    return l2_norm(embedding::halfvec) > 0;
end
$$;
