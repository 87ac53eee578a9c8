-- Reading what the caller may see. End-user roles (pgkb_user, pgkb_service) have no SELECT on the tables
-- that hold knowledge: a user's own predicate evaluated next to a row-level-security policy leaks through
-- EXPLAIN ANALYZE (leakproof operators run before the policy). Every read goes through these SECURITY
-- DEFINER functions instead: they are never inlined, so visibility is applied before any caller predicate.

-- Who the caller is: the pgkb user it acts as (NULL for an unmapped role), whether it administers pgkb,
-- and its teams. Never fails; an unmapped role gets (NULL, false, {}).
create or replace function kb.whoami()
returns table (username text, is_admin boolean, teams text[])
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select
        (select u.name from kb.users as u where u.id = kb.current_user_id()),
        kb.current_is_admin(),
        coalesce((
            select array_agg(t.name order by t.name)
            from kb.memberships as m join kb.teams as t on t.id = m.team_id
            where m.user_id = kb.current_user_id()
        ), '{}')
$$;

-- The knowledge bases the caller may read, with their size, their language profile (kb.language_profile:
-- shares of chunks in Chinese, English, other, and the main language), whether the caller may write to
-- them and whether they may manage them (owner or administrator: kb_internal.can_manage_kb). Owner and team
-- names are shown only for knowledge bases the caller can see (this list).
create or replace function kb.list_knowledge_bases()
returns table (
    name text, visibility text, owner text, team text, description text, document_count bigint,
    chunk_count bigint, can_write boolean, created_at timestamptz, last_updated timestamptz, languages jsonb,
    can_manage boolean
)
language sql stable security definer
set search_path = pg_catalog, pg_temp
rows 20
as $$
    select k.name, k.visibility, u.name, t.name, k.description,
        (select count(*) from kb.documents as d where d.kb_id = k.id),
        k.chunk_count, kb.can_write_kb(k.id), k.created_at,
        greatest(k.updated_at, (select max(d.updated_at) from kb.documents as d where d.kb_id = k.id)),
        kb.language_profile(k.zh_chunks, k.en_chunks, k.other_chunks), kb_internal.can_manage_kb(k.id)
    from kb.knowledge_bases as k
    left join kb.users as u on u.id = k.owner_id
    left join kb.teams as t on t.id = k.team_id
    where k.id = any(kb.visible_kb_ids())
    order by k.name
$$;

-- The documents of one knowledge base the caller may read (unknown and invisible names raise the same
-- error), with the content hash incremental ingestion compares and any recorded ingest failure.
-- source_url as kb_internal.openable_source shows it (a server file path is NULL).
create or replace function kb.list_documents(kb text)
returns table (
    doc_key text, title text, source_url text, source_type text, content_hash text, status text,
    chunk_count integer, metadata jsonb, updated_at timestamptz
)
language sql stable security definer
set search_path = pg_catalog, pg_temp
rows 1000
as $$
    select d.doc_key, d.title, kb_internal.openable_source(d.source_url), d.source_type, d.content_hash, d.status,
        d.chunk_count, d.metadata, d.updated_at
    from kb.documents as d
    where d.kb_id = kb.resolve_kb(list_documents.kb)
    order by d.doc_key
$$;

-- The recorded ingest failures of one readable knowledge base (NULL: of every readable one).
create or replace function kb.list_ingest_failures(kb text default null)
returns table (kb text, doc_key text, error text, failed_at timestamptz)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select k.name, f.doc_key, f.error, f.failed_at
    from kb.ingest_failures as f join kb.knowledge_bases as k on k.id = f.kb_id
    where f.kb_id = any(
        case when list_ingest_failures.kb is null then kb.visible_kb_ids()
            else array[kb.resolve_kb(list_ingest_failures.kb)] end
    )
    order by k.name, f.doc_key
$$;

-- Internal: the id of the readable document doc_key (kb NULL: in any readable knowledge base), after
-- checking chunk_index / chunk_window. Unknown and invisible documents raise the same error; a key in
-- several readable knowledge bases raises listing them; a chunk_index past the end raises with the count.
create or replace function kb_internal.find_document(
    doc_key text, kb text, chunk_index integer, chunk_window integer
)
returns bigint
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    scope integer [];
    found_ids bigint [];
    n_chunks integer;
begin
    if doc_key is null or btrim(doc_key) = '' then
        raise exception 'doc_key must not be empty' using errcode = 'invalid_parameter_value';
    end if;
    if chunk_index is null or chunk_index < -1 or chunk_window is null or chunk_window not between 0 and 50 then
        raise exception 'chunk_index must be -1 (the whole document) or >= 0, chunk_window between 0 and 50'
            using errcode = 'invalid_parameter_value';
    end if;
    scope := case when kb is null then kb.visible_kb_ids() else array[kb.resolve_kb(kb)] end;
    select array_agg(d.id order by d.id) into found_ids
    from kb.documents as d
    where d.kb_id = any(scope) and d.doc_key = normalize(find_document.doc_key, nfc);
    if found_ids is null then
        raise exception 'unknown document "%"%', left(doc_key, 200),
            case when kb is null then '' else format(' in knowledge base "%s"', left(kb, 200)) end
            using errcode = 'no_data_found', hint = 'use the doc_key of a search result';
    end if;
    if cardinality(found_ids) > 1 then
        raise exception 'document "%" exists in several knowledge bases (%): pass kb', left(doc_key, 200),
            (select string_agg(k.name, ', ' order by k.name) from kb.documents as d
                join kb.knowledge_bases as k on k.id = d.kb_id where d.id = any(found_ids))
            using errcode = 'ambiguous_parameter';
    end if;
    if chunk_index >= 0 and not exists (
        select from kb.chunks as c where c.document_id = found_ids[1] and c.ordinal = chunk_index
    ) then
        select d.chunk_count into n_chunks from kb.documents as d where d.id = found_ids[1];
        raise exception 'document "%" has no chunk % (it has % chunks; chunk_index -1 returns the whole document)',
            left(doc_key, 200), chunk_index, n_chunks using errcode = 'invalid_parameter_value';
    end if;
    return found_ids[1];
end
$$;

-- One readable document with its chunks (jsonb array of {chunk_index, heading_path, chunk_type, content,
-- metadata}): the whole document for chunk_index -1, else chunks chunk_index ± chunk_window. kb NULL
-- looks in every readable knowledge base. Errors as kb_internal.find_document (unknown = invisible). source_url and
-- heading_path as readers are shown them (kb_internal.openable_source, kb_internal.heading_trail).
create or replace function kb.get_document(
    doc_key text, kb text default null, chunk_index integer default -1, chunk_window integer default 0
)
returns table (
    kb text, doc_key text, title text, source_url text, source_type text, metadata jsonb, status text,
    chunk_count integer, updated_at timestamptz, chunks jsonb
)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select k.name, d.doc_key, d.title, kb_internal.openable_source(d.source_url), d.source_type, d.metadata, d.status,
        d.chunk_count, d.updated_at,
        coalesce((
            select jsonb_agg(jsonb_build_object(
                'chunk_index', c.ordinal, 'heading_path', to_jsonb(kb_internal.heading_trail(d.title, c.heading_path)),
                'chunk_type', c.chunk_type,
                'content', c.content, 'metadata', c.metadata
            ) order by c.ordinal)
            from kb.chunks as c
            where c.document_id = d.id
                and ($3 = -1 or c.ordinal between $3 - $4 and $3 + $4)
        ), '[]')
    from kb.documents as d join kb.knowledge_bases as k on k.id = d.kb_id
    where d.id = kb_internal.find_document($1, $2, $3, $4)
$$;

-- Embedding progress per registered model over the knowledge bases the caller may read (admins: all):
-- chunks embedded, waiting, parked, and seconds until the next backed-off entry is due (NULL: none); storage:
-- how its embeddings are stored and indexed (vector or halfvec, kb.register_embedding_model).
create or replace function kb.embedding_status(model text default null)
returns table (
    model text, dimension integer, is_default boolean, query_prefix text, passage_prefix text,
    embedded bigint, queued bigint, parked bigint, next_due_in double precision, storage text
)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    with scope as (select kb.visible_kb_ids() as ids)
    select m.name, m.dimension, m.is_default, m.query_prefix, m.passage_prefix,
        (select count(*) from kb.embeddings as e, scope where e.model_id = m.id and e.kb_id = any(scope.ids)),
        (select count(*) from kb.embedding_queue as q, scope
            where q.model_id = m.id and q.kb_id = any(scope.ids) and not q.parked),
        (select count(*) from kb.embedding_queue as q, scope
            where q.model_id = m.id and q.kb_id = any(scope.ids) and q.parked),
        (select extract(epoch from min(q.next_attempt_at) - clock_timestamp())::float8
            from kb.embedding_queue as q, scope
            where q.model_id = m.id and q.kb_id = any(scope.ids) and not q.parked
                and q.next_attempt_at > clock_timestamp()),
        m.storage
    from kb.embedding_models as m
    where embedding_status.model is null or m.id = (kb.resolve_model(embedding_status.model)).id
    order by m.id
$$;
