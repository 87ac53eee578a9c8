-- Writing knowledge: kb.replace_document (atomic per document, no-op on an unchanged content hash),
-- kb.delete_document, kb.store_embeddings (used by ingestion and the embedding worker), and the BM25
-- statistics they keep current. All run as the owner (SECURITY DEFINER) after a write-permission check.

-- Internal: add (sign = 1) or remove (sign = -1) the given chunks of one knowledge base to / from its
-- BM25 statistics (document frequencies, N, total length). Callers hold the knowledge base's row lock,
-- so writers of one knowledge base are serialised and cannot deadlock on term rows.
create or replace function kb.adjust_term_stats(target_kb integer, chunk_ids bigint[], sign integer)
returns void
language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    insert into kb.term_stats as s (kb_id, term, df)
    select target_kb, t.term, sign * count(*)
    from kb.chunks as c, jsonb_object_keys(c.term_freqs) as t (term)
    where c.id = any(chunk_ids)
    group by t.term
    order by t.term
    on conflict (kb_id, term) do update set df = s.df + excluded.df;

    update kb.knowledge_bases as k
    set chunk_count = k.chunk_count + sign * totals.n, term_total = k.term_total + sign * totals.terms,
        updated_at = now()
    from (
        select count(*) as n, coalesce(sum(c.term_count), 0) as terms
        from kb.chunks as c where c.id = any(chunk_ids)
    ) as totals
    where k.id = target_kb;
$$;

-- Internal: check a chunks array and return it as rows. Raises (changing nothing) on anything malformed.
create or replace function kb.parse_chunks(chunks jsonb)
returns table (
    ordinal integer, content text, heading_path text[], chunk_type text, metadata jsonb, embedding jsonb
)
language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    item jsonb;
    i integer := 0;
    ordinals integer [] := '{}';
begin
    if chunks is null or jsonb_typeof(chunks) <> 'array' then
        raise exception 'chunks must be a JSON array of objects, got %', coalesce(jsonb_typeof(chunks), 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
    if jsonb_array_length(chunks) > 100000 then
        raise exception 'too many chunks (%): at most 100000 per document', jsonb_array_length(chunks)
            using errcode = 'program_limit_exceeded';
    end if;
    for item in select value from jsonb_array_elements(chunks) loop
        if jsonb_typeof(item) <> 'object' then
            raise exception 'chunk % must be a JSON object, got %', i, jsonb_typeof(item)
                using errcode = 'invalid_parameter_value';
        end if;
        if jsonb_typeof(item -> 'content') is distinct from 'string' or btrim(item ->> 'content') = '' then
            raise exception 'chunk % needs a non-empty "content" string', i using errcode = 'invalid_parameter_value';
        end if;
        if item ? 'ordinal' and (jsonb_typeof(item -> 'ordinal') <> 'number'
            or (item ->> 'ordinal') !~ '^[0-9]{1,9}$') then
            raise exception 'chunk %: "ordinal" must be a non-negative integer', i
                using errcode = 'invalid_parameter_value';
        end if;
        if item ? 'heading_path' and (jsonb_typeof(item -> 'heading_path') <> 'array' or exists (
            select from jsonb_array_elements(item -> 'heading_path') as h where jsonb_typeof(h) <> 'string'
        )) then
            raise exception 'chunk %: "heading_path" must be an array of strings', i
                using errcode = 'invalid_parameter_value';
        end if;
        if coalesce(item ->> 'chunk_type', 'text') not in ('text', 'table', 'code', 'faq', 'image_caption') then
            raise exception 'chunk %: unknown chunk_type "%" (text, table, code, faq, image_caption)',
                i, left(item ->> 'chunk_type', 50) using errcode = 'invalid_parameter_value';
        end if;
        if item ? 'metadata' and jsonb_typeof(item -> 'metadata') <> 'object' then
            raise exception 'chunk %: "metadata" must be an object', i using errcode = 'invalid_parameter_value';
        end if;
        if item ? 'embedding' and (jsonb_typeof(item -> 'embedding') <> 'array' or exists (
            select from jsonb_array_elements(item -> 'embedding') as x where jsonb_typeof(x) <> 'number'
        )) then
            raise exception 'chunk %: "embedding" must be an array of numbers', i
                using errcode = 'invalid_parameter_value';
        end if;
        ordinal := coalesce((item ->> 'ordinal')::integer, i);
        if ordinal = any(ordinals) then
            raise exception 'duplicate chunk ordinal %', ordinal using errcode = 'unique_violation';
        end if;
        ordinals := ordinals || ordinal;
        content := item ->> 'content';
        heading_path := coalesce(
            (select array_agg(h order by n) from jsonb_array_elements_text(item -> 'heading_path')
                with ordinality as x (h, n)),
            '{}');
        chunk_type := coalesce(item ->> 'chunk_type', 'text');
        metadata := coalesce(item -> 'metadata', '{}');
        embedding := item -> 'embedding';
        return next;
        i := i + 1;
    end loop;
end
$$;

-- Replace a document's chunks in one transaction: readers see the old or the new version, never a mix.
-- Creates the knowledge base (private, owned by the caller) if missing and the caller may. Unchanged
-- content_hash -> no-op (changed = false). Chunks without an "embedding" are queued for every model.
-- Returns the document id, its chunk count, whether anything changed and how many chunks were queued.
create or replace function kb.replace_document(
    kb text,
    doc_key text,
    title text,
    chunks jsonb,
    source_url text default null,
    metadata jsonb default '{}',
    source_type text default 'markdown',
    content_hash text default null,
    model text default null
)
returns table (document_id bigint, chunk_count integer, changed boolean, queued integer)
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
declare
    target_kb integer;
    doc kb.documents;
    new_hash text;
    old_chunk_ids bigint [];
    new_chunk_ids bigint [];
    target_model kb.embedding_models;
    n_queued integer := 0;
begin
    if doc_key is null or btrim(doc_key) = '' or length(doc_key) > 1000 then
        raise exception 'doc_key must be a non-empty string of at most 1000 characters'
            using errcode = 'invalid_parameter_value';
    end if;
    if metadata is null or jsonb_typeof(metadata) <> 'object' then
        raise exception 'metadata must be a JSON object' using errcode = 'invalid_parameter_value';
    end if;
    if source_type is null or source_type !~ '^[a-z][a-z0-9_-]{0,30}$' then
        raise exception 'invalid source_type "%"', left(source_type, 50) using errcode = 'invalid_parameter_value';
    end if;
    if length(title) > 1000 then
        raise exception 'title is longer than 1000 characters' using errcode = 'invalid_parameter_value';
    end if;
    -- validate everything before touching anything
    perform count(*) from kb.parse_chunks(chunks);
    if model is not null or jsonb_path_exists(chunks, '$[*].embedding') then
        target_model := kb.resolve_model(model);
        if exists (
            select from kb.parse_chunks(chunks) as p
            where p.embedding is not null and jsonb_array_length(p.embedding) <> target_model.dimension
        ) then
            raise exception 'embedding dimension does not match model "%" (% dimensions)',
                target_model.name, target_model.dimension using errcode = 'data_exception';
        end if;
    end if;
    new_hash := coalesce(nullif(content_hash, ''), encode(sha256(convert_to(
        jsonb_build_array(title, source_url, metadata, source_type, chunks)::text, 'UTF8')), 'hex'));

    select k.id into target_kb from kb.knowledge_bases as k where k.name = replace_document.kb;
    if target_kb is null then
        begin
            target_kb := kb.create_knowledge_base(replace_document.kb);
        exception when unique_violation then    -- created concurrently by another writer
            select k.id into target_kb from kb.knowledge_bases as k where k.name = replace_document.kb;
        end;
    end if;
    if not kb.can_write_kb(target_kb) then
        -- a name taken by a knowledge base the caller cannot see: the same answer create_knowledge_base gives
        if not target_kb = any(kb.visible_kb_ids()) then
            raise exception 'knowledge base name "%" is not available', replace_document.kb
                using errcode = 'unique_violation',
                    hint = 'knowledge base names are unique across pgkb; choose another name';
        end if;
        raise exception 'you may not write to knowledge base "%"', replace_document.kb
            using errcode = 'insufficient_privilege';
    end if;

    -- unchanged document: report without taking any lock
    select * into doc from kb.documents as d
    where d.kb_id = target_kb and d.doc_key = replace_document.doc_key and d.content_hash = new_hash;
    if doc.id is not null then
        return query select doc.id, doc.chunk_count, false, 0;
        return;
    end if;
    -- writers of one knowledge base serialise on its row (BM25 statistics), then lock the document row
    perform from kb.knowledge_bases as k where k.id = target_kb for no key update;
    insert into kb.documents as d (kb_id, doc_key, content_hash)
    values (target_kb, doc_key, '')
    on conflict on constraint documents_kb_id_doc_key_key do nothing;
    select * into doc from kb.documents as d
    where d.kb_id = target_kb and d.doc_key = replace_document.doc_key
    for update;
    if doc.content_hash = new_hash then
        return query select doc.id, doc.chunk_count, false, 0;
        return;
    end if;

    select coalesce(array_agg(c.id), '{}') into old_chunk_ids from kb.chunks as c where c.document_id = doc.id;
    perform kb.adjust_term_stats(target_kb, old_chunk_ids, -1);
    -- old chunks go with their embeddings and queue entries (ON DELETE CASCADE)
    delete from kb.chunks as c where c.id = any(old_chunk_ids);

    with inserted as (
        insert into kb.chunks as c (
            document_id, kb_id, ordinal, content, heading_path, chunk_type, char_count, metadata,
            term_freqs, term_count
        )
        select doc.id, target_kb, p.ordinal, p.content, p.heading_path, p.chunk_type, length(p.content),
            p.metadata, kb.term_freqs(terms.list), cardinality(terms.list)
        from kb.parse_chunks(chunks) as p,
            lateral (select kb.lexical_terms(kb.indexed_text(title, p.heading_path, p.content)) as list) as terms
        returning c.id
    )
    select coalesce(array_agg(inserted.id), '{}') into new_chunk_ids from inserted;

    perform kb.adjust_term_stats(target_kb, new_chunk_ids, 1);

    if target_model.id is not null then
        insert into kb.embeddings (chunk_id, model_id, kb_id, embedding)
        select c.id, target_model.id, target_kb, p.embedding::text::vector
        from kb.parse_chunks(chunks) as p
        join kb.chunks as c on c.document_id = doc.id and c.ordinal = p.ordinal
        where p.embedding is not null;
    end if;
    insert into kb.embedding_queue (chunk_id, model_id, kb_id)
    select c.id, m.id, target_kb
    from kb.chunks as c cross join kb.embedding_models as m
    where c.document_id = doc.id
        and not exists (select from kb.embeddings as e where e.chunk_id = c.id and e.model_id = m.id);
    get diagnostics n_queued = row_count;
    if n_queued > 0 then
        perform pg_notify('pgkb_embedding_queue', target_kb::text);
    end if;

    update kb.documents as d
    set title = coalesce(replace_document.title, ''), source_url = replace_document.source_url,
        source_type = replace_document.source_type, content_hash = new_hash,
        metadata = replace_document.metadata, chunk_count = cardinality(new_chunk_ids),
        status = case when n_queued > 0 then 'embedding' else 'ready' end, updated_at = now()
    where d.id = doc.id;
    delete from kb.ingest_failures as f where f.kb_id = target_kb and f.doc_key = replace_document.doc_key;
    return query select doc.id, cardinality(new_chunk_ids), true, n_queued;
end
$$;

-- Delete a document and everything derived from it. Returns true if it existed.
create or replace function kb.delete_document(kb text, doc_key text)
returns boolean
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer := kb.resolve_kb(delete_document.kb);
    doc_id bigint;
    old_chunk_ids bigint [];
begin
    if not kb.can_write_kb(target_kb) then
        raise exception 'you may not write to knowledge base "%"', delete_document.kb
            using errcode = 'insufficient_privilege';
    end if;
    perform from kb.knowledge_bases as k where k.id = target_kb for no key update;
    select d.id into doc_id from kb.documents as d
    where d.kb_id = target_kb and d.doc_key = delete_document.doc_key
    for update;
    if doc_id is null then
        return false;
    end if;
    select coalesce(array_agg(c.id), '{}') into old_chunk_ids from kb.chunks as c where c.document_id = doc_id;
    perform kb.adjust_term_stats(target_kb, old_chunk_ids, -1);
    delete from kb.documents as d where d.id = doc_id;
    delete from kb.ingest_failures as f where f.kb_id = target_kb and f.doc_key = delete_document.doc_key;
    return true;
end
$$;

-- Store embeddings computed outside the database (ingestion, worker) for one model: checks the
-- dimension, skips chunks that no longer exist, removes their queue entries and marks documents ready.
-- Returns the number of embeddings stored.
create or replace function kb.store_embeddings(model text, chunk_ids bigint[], embeddings vector[])
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
declare
    target kb.embedding_models := kb.resolve_model(model);
    stored integer;
begin
    if cardinality(chunk_ids) is distinct from cardinality(embeddings) then
        raise exception 'chunk_ids and embeddings differ in length' using errcode = 'invalid_parameter_value';
    end if;
    if exists (select from unnest(embeddings) as e where e is null or vector_dims(e) <> target.dimension) then
        raise exception 'embedding dimension does not match model "%" (% dimensions)',
            target.name, target.dimension using errcode = 'data_exception';
    end if;
    if exists (
        select from kb.chunks as c
        where c.id = any(chunk_ids) and not kb.can_write_kb(c.kb_id)
    ) then
        raise exception 'you may not write to these chunks' using errcode = 'insufficient_privilege';
    end if;
    insert into kb.embeddings as e (chunk_id, model_id, kb_id, embedding)
    select c.id, target.id, c.kb_id, x.embedding
    from unnest(chunk_ids, embeddings) as x (chunk_id, embedding)
    join kb.chunks as c on c.id = x.chunk_id
    on conflict (chunk_id, model_id) do update set embedding = excluded.embedding, created_at = now();
    get diagnostics stored = row_count;
    delete from kb.embedding_queue as q where q.model_id = target.id and q.chunk_id = any(chunk_ids);
    update kb.documents as d set status = 'ready'
    where d.status = 'embedding'
        and d.id in (select c.document_id from kb.chunks as c where c.id = any(chunk_ids))
        and not exists (
            select from kb.embedding_queue as q join kb.chunks as c on c.id = q.chunk_id
            where c.document_id = d.id
        );
    return stored;
end
$$;

-- Record why a document could not be ingested (kept until it is replaced or deleted). Needs write access
-- to the knowledge base; the error text is truncated to 2000 characters.
create or replace function kb.record_ingest_failure(kb text, doc_key text, error text)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer := kb.resolve_kb(record_ingest_failure.kb);
begin
    if not kb.can_write_kb(target_kb) then
        raise exception 'you may not write to knowledge base "%"', record_ingest_failure.kb
            using errcode = 'insufficient_privilege';
    end if;
    if doc_key is null or btrim(doc_key) = '' or length(doc_key) > 1000 then
        raise exception 'doc_key must be a non-empty string of at most 1000 characters'
            using errcode = 'invalid_parameter_value';
    end if;
    insert into kb.ingest_failures as f (kb_id, doc_key, error)
    values (target_kb, doc_key, left(coalesce(error, 'unknown error'), 2000))
    on conflict on constraint ingest_failures_pkey do update set error = excluded.error, failed_at = now();
end
$$;
