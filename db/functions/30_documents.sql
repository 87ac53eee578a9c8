-- Writing knowledge: kb.replace_document (atomic per document, no-op on an unchanged content hash),
-- kb.delete_document, kb.store_embeddings (used by ingestion and the embedding worker), and the BM25
-- statistics they keep current. All run as the owner (SECURITY DEFINER) after a write-permission check.

-- Internal: array a without its element at position p (a itself when p is NULL). Neither STRICT nor a SET
-- clause, so that the planner inlines it into kb_internal.adjust_term_stats's per-term update; it names no object.
create or replace function kb_internal.array_without(a anyarray, p integer)
returns anyarray
language sql immutable parallel safe
as $$
    select case when p is null then a else a[:p - 1] || a[p + 1:] end
$$;

-- Internal: add (sign = 1) or remove (sign = -1) the given chunks of one knowledge base to / from its
-- BM25 statistics (document frequencies, tiers, N, total length), language profile and postings: added postings join their
-- terms' recent postings in kb.term_stats (moved to blocks at kb_internal.recent_postings_limit()); removed ones
-- leave them, or the blocks (probed only for terms with blocks). Terms whose document frequency drops to
-- 0 lose their row (kept at df 0 until the next compaction when a block holds them). The entries a slice changes
-- are copied out of their blocks first, and the dictionary is compacted when due (29_term_dictionary.sql). The chunks' terms come from their text (kb.chunk_terms, 5,000 chunks at a time), so the
-- tokenizer must be the one they were counted with (kb_internal.terms_version). Callers hold the knowledge
-- base's row lock, so writers of one knowledge base are serialised, cannot deadlock on term rows, and chunk
-- ids only grow within its posting lists.
create or replace function kb_internal.adjust_term_stats(target_kb integer, chunk_ids bigint[], sign integer)
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    -- false only on a schema older than migration 016, i.e. in tests that apply today's functions to an
    -- old schema (pgkb db migrate runs every migration before the functions)
    with_postings constant boolean := to_regclass('kb.postings') is not null;
    -- false on a schema older than migration 032 (no language profile)
    with_profile constant boolean := to_regclass('kb.glossary') is not null;
    -- false on a schema older than migration 049 (no term blocks)
    with_blocks constant boolean := to_regclass('kb.term_blocks') is not null;
    touched integer := 0;      -- the terms given a row in kb.term_stats, from above (distinct per slice)
    slice_terms text[];        -- a slice's distinct terms
    slice_size constant integer := 5000;   -- chunks whose postings are held at once (memory stays bounded)
    sorted constant bigint[] := array(select x.id from unnest(chunk_ids) as x (id) order by x.id);
    limit_reached text[];      -- terms whose recent postings move to blocks
    in_blocks text[];          -- terms whose removed postings may be in blocks
    p_ids bigint[];            -- a slice's postings (computed once from the chunks' text): chunk ids,
    p_terms text[];            -- terms,
    p_tfs integer[];           -- term frequencies,
    p_dls integer[];           -- and chunk lengths
begin
    -- slices in id order: each one's postings join their terms' recent postings after the slice before
    for lo in 1 .. cardinality(sorted) by slice_size loop
        select array_agg(c.id order by c.id, t.term), array_agg(t.term order by c.id, t.term),
            array_agg(t.tf order by c.id, t.term), array_agg(c.term_count order by c.id, t.term)
        into p_ids, p_terms, p_tfs, p_dls
        from kb.chunks as c
        -- its document's title by primary key (never a scan of other documents)
        cross join lateral (select d.title from kb.documents as d where d.id = c.document_id offset 0) as d
        cross join lateral kb.chunk_terms(d.title, c.heading_path, c.content) as t
        where c.id = any(sorted[lo:lo + slice_size - 1]);
        continue when p_ids is null;
        if with_blocks then
            -- the entries this slice changes, out of their blocks (29_term_dictionary.sql)
            slice_terms := array(select distinct x.term from unnest(p_terms) as x (term));
            perform kb_internal.checkout_terms(target_kb, slice_terms);
            touched := touched + cardinality(slice_terms);
        end if;

        if not with_postings then
            insert into kb.term_stats as s (kb_id, term, df)
            select target_kb, x.term, sign * count(*)
            from unnest(p_terms) as x (term)
            group by x.term
            order by x.term
            on conflict (kb_id, term) do update set df = s.df + excluded.df;
        elsif sign > 0 then
            with upserted as (
                insert into kb.term_stats as s (kb_id, term, df, tiers, recent_ids, recent_tfs, recent_dls)
                -- the three arrays in id order (a chunk holds a term once: aligned)
                select target_kb, x.term, count(*), bit_or(1::bigint << kb_internal.posting_tier(x.tf, x.dl)),
                    array_agg(x.id order by x.id), array_agg(x.tf order by x.id), array_agg(x.dl order by x.id)
                from unnest(p_ids, p_terms, p_tfs, p_dls) as x (id, term, tf, dl)
                group by x.term
                order by x.term
                on conflict (kb_id, term) do update
                set df = s.df + excluded.df, tiers = s.tiers | excluded.tiers,
                    recent_ids = s.recent_ids || excluded.recent_ids, recent_tfs = s.recent_tfs || excluded.recent_tfs,
                    recent_dls = s.recent_dls || excluded.recent_dls
                returning s.term, cardinality(s.recent_ids) as recent
            )
            select array_agg(u.term) into limit_reached
            from upserted as u where u.recent >= kb_internal.recent_postings_limit();
            if limit_reached is not null then
                perform kb_internal.flush_recent_postings(target_kb, limit_reached);
            end if;
        else
            with removed as (
                select x.term, count(*) as n, array_agg(x.id) as ids, min(x.id) as lo
                from unnest(p_ids, p_terms) as x (id, term)
                group by x.term
            ),
            updated as (
                -- a term in one removed chunk (most): cut its posting out at its position (none: in a block)
                update kb.term_stats as s
                set df = s.df - r.n,
                    recent_ids = case when r.n = 1
                        then kb_internal.array_without(s.recent_ids, array_position(s.recent_ids, r.lo))
                        else array(select x.id from unnest(s.recent_ids) as x (id) where x.id <> all(r.ids)) end,
                    recent_tfs = case when r.n = 1
                        then kb_internal.array_without(s.recent_tfs, array_position(s.recent_ids, r.lo))
                        else array(
                            select x.tf from unnest(s.recent_ids, s.recent_tfs) with ordinality as x (id, tf, o)
                            where x.id <> all(r.ids) order by x.o
                        ) end,
                    recent_dls = case when r.n = 1
                        then kb_internal.array_without(s.recent_dls, array_position(s.recent_ids, r.lo))
                        else array(
                            select x.dl from unnest(s.recent_ids, s.recent_dls) with ordinality as x (id, dl, o)
                            where x.id <> all(r.ids) order by x.o
                        ) end
                from removed as r
                where s.kb_id = target_kb and s.term = r.term
                returning s.term, r.lo <= s.blocked_to as blocked
            )
            select array_agg(u.term) into in_blocks from updated as u where u.blocked;
            if in_blocks is not null then
                perform kb_internal.remove_block_postings(target_kb, p_ids, p_terms, p_tfs, p_dls, in_blocks);
            end if;
        end if;

        -- a term in a block keeps its row at df 0 until the next compaction: it overrides the block's entry
        delete from kb.term_stats as s
        using (select distinct x.term from unnest(p_terms) as x (term)) as x
        where sign < 0 and s.kb_id = target_kb and s.df <= 0 and s.term = x.term
            and not (with_blocks and kb_internal.block_holds(target_kb, s.term));
    end loop;
    if with_blocks then
        perform kb_internal.compact_terms_if_due(target_kb, touched);
    end if;

    if not with_profile then
        update kb.knowledge_bases as k
        set chunk_count = k.chunk_count + sign * totals.n, term_total = k.term_total + sign * totals.terms,
            updated_at = now()
        from (
            select count(*) as n, coalesce(sum(c.term_count), 0) as terms
            from kb.chunks as c where c.id = any(chunk_ids)
        ) as totals
        where k.id = target_kb;
        return;
    end if;
    -- the language profile counts with N (kb_internal.text_language of each chunk's content)
    update kb.knowledge_bases as k
    set chunk_count = k.chunk_count + sign * totals.n, term_total = k.term_total + sign * totals.terms,
        zh_chunks = k.zh_chunks + sign * totals.zh, en_chunks = k.en_chunks + sign * totals.en,
        other_chunks = k.other_chunks + sign * totals.other, updated_at = now()
    from (
        select count(*) as n, coalesce(sum(c.term_count), 0) as terms,
            count(*) filter (where c.lang = 'zh') as zh, count(*) filter (where c.lang = 'en') as en,
            count(*) filter (where c.lang = 'other') as other
        from (
            select c.term_count, kb_internal.text_language(c.content) as lang
            from kb.chunks as c where c.id = any(chunk_ids)
        ) as c
    ) as totals
    where k.id = target_kb;
end
$$;

-- Internal: the canonical form of a document key, or an invalid_parameter_value error. Keys are
-- NFC-normalised (so 'café.md' typed composed or decomposed names one document), must show something
-- (not only white space or invisible characters) and are at most 1000 characters and 2000 bytes
-- (UTF-8; btree index entries are limited to about 2.7 kB).
create or replace function kb_internal.canonical_doc_key(doc_key text)
returns text
language plpgsql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    canonical text := normalize(doc_key, nfc);
begin
    if canonical is null or kb_internal.is_blank(canonical) then
        raise exception 'doc_key must be a non-empty string (not only white space or invisible characters)'
            using errcode = 'invalid_parameter_value';
    end if;
    if length(canonical) > 1000 or octet_length(canonical) > 2000 then
        raise exception 'doc_key must be a non-empty string of at most 1000 characters and 2000 bytes, '
            'got % characters and % bytes', length(canonical), octet_length(canonical)
            using errcode = 'invalid_parameter_value';
    end if;
    return canonical;
end
$$;

-- Internal: check a chunks array before kb.replace_document writes anything. Raises on the first
-- malformed chunk (by position) or one whose content exceeds 100000 characters (the chunker's are at most
-- max_chars, 800 by default), a duplicate ordinal, an empty or oversized array, and embeddings that
-- do not fit model (NULL: no chunk may carry one): wrong dimension, non-numbers, values beyond float4,
-- zero or degenerate norm (kb_internal.storable_embedding). Linear: one scan of the array, then a hash aggregate
-- over the ordinals. Returns the number of chunks.
create or replace function kb_internal.check_chunks(chunks jsonb, model kb.embedding_models)
returns integer
language plpgsql stable
set search_path = pg_catalog, public, pg_temp
as $$
declare
    n integer;
    problem text[];
    duplicate integer;
begin
    if chunks is null or jsonb_typeof(chunks) <> 'array' then
        raise exception 'chunks must be a JSON array of objects, got %', coalesce(jsonb_typeof(chunks), 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
    n := jsonb_array_length(chunks);
    if n = 0 then
        raise exception 'chunks must not be empty: a document has at least one chunk '
            '(kb.delete_document removes a document)' using errcode = 'invalid_parameter_value';
    end if;
    if n > 100000 then
        raise exception 'too many chunks (%): at most 100000 per document', n
            using errcode = 'program_limit_exceeded';
    end if;

    -- each check runs only when the ones before it passed (CASE order), so every cast is safe
    select checked.problem into problem
    from (
        select e.i, case
            when jsonb_typeof(e.item) <> 'object' then array[
                '22023', format('chunk %s must be a JSON object, got %s', e.i, jsonb_typeof(e.item))]
            when jsonb_typeof(e.item -> 'content') is distinct from 'string' or kb_internal.is_blank(e.item ->> 'content')
                then array['22023', format('chunk %s needs a non-empty "content" string (white space, '
                    'zero-width and control characters alone do not count)', e.i)]
            when length(e.item ->> 'content') > 100000 then array['54000', format(
                'chunk %s: content is %s characters long; at most 100000 per chunk', e.i,
                length(e.item ->> 'content'))]
            when e.item ? 'ordinal' and (jsonb_typeof(e.item -> 'ordinal') <> 'number'
                or (e.item ->> 'ordinal') !~ '^[0-9]{1,9}$') then array[
                '22023', format('chunk %s: "ordinal" must be a non-negative integer', e.i)]
            when e.item ? 'heading_path' and (jsonb_typeof(e.item -> 'heading_path') <> 'array'
                or jsonb_path_exists(e.item -> 'heading_path', '$[*] ? (@.type() != "string")')) then array[
                '22023', format('chunk %s: "heading_path" must be an array of strings', e.i)]
            when coalesce(e.item ->> 'chunk_type', 'text') not in (
                'text', 'table', 'code', 'faq', 'image', 'image_caption'
            ) then array['22023', format(
                    'chunk %s: unknown chunk_type "%s" (text, table, code, faq, image, image_caption)',
                    e.i, left(e.item ->> 'chunk_type', 50))]
            when e.item ? 'metadata' and jsonb_typeof(e.item -> 'metadata') <> 'object' then array[
                '22023', format('chunk %s: "metadata" must be an object', e.i)]
            when not e.item ? 'embedding' then null
            when jsonb_typeof(e.item -> 'embedding') <> 'array'
                or jsonb_path_exists(e.item -> 'embedding', '$[*] ? (@.type() != "number")') then array[
                '22023', format('chunk %s: "embedding" must be an array of numbers', e.i)]
            when model.id is null or jsonb_array_length(e.item -> 'embedding') <> model.dimension then array[
                '22000', format('chunk %s: embedding dimension does not match model "%s" (%s dimensions, got %s)',
                    e.i, model.name, model.dimension, jsonb_array_length(e.item -> 'embedding'))]
            when jsonb_path_exists(e.item -> 'embedding', '$[*] ? (@ > 3.4e38 || @ < -3.4e38)')
                or not kb_internal.storable_embedding((e.item -> 'embedding')::text::vector, model.storage) then array[
                '22000', format('chunk %s: "embedding" has a zero or degenerate norm (or values beyond float4, or '
                    'beyond half precision for a halfvec model); cosine distance to it is undefined', e.i)]
        end as problem
        from jsonb_array_elements(chunks) with ordinality as x (item, pos),
            lateral (select x.item, (x.pos - 1)::integer as i) as e
    ) as checked
    where checked.problem is not null
    order by checked.i
    limit 1;
    if problem is not null then
        raise exception '%', problem[2] using errcode = problem[1];
    end if;

    select o.ordinal into duplicate
    from (
        select coalesce((x.item ->> 'ordinal')::integer, (x.pos - 1)::integer) as ordinal
        from jsonb_array_elements(chunks) with ordinality as x (item, pos)
    ) as o
    group by o.ordinal
    having count(*) > 1
    order by o.ordinal
    limit 1;
    if duplicate is not null then
        raise exception 'duplicate chunk ordinal %', duplicate using errcode = 'unique_violation';
    end if;
    return n;
end
$$;

-- Internal: whether failure_key records a failed image of document doc_key: doc_key + '#img/' + path (an
-- image a Markdown document references) or doc_key + '#page-' (an image inside a PDF page). Such records
-- go when the document is replaced or deleted; the ingest path records them again if still failing.
create or replace function kb_internal.is_image_failure_of(failure_key text, doc_key text)
returns boolean
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select starts_with(failure_key, doc_key || '#img/') or starts_with(failure_key, doc_key || '#page-')
$$;

-- Replace a document's chunks in one transaction: readers see the old or the new version, never a mix.
-- Creates the knowledge base (private, owned by the caller) if missing and the caller may. Unchanged
-- content_hash -> no-op (changed = false). Chunks without an "embedding" are queued for every model.
-- doc_key is NFC-normalised (kb_internal.canonical_doc_key); chunks must be a non-empty array (kb_internal.check_chunks).
-- A write clears the recorded failures of the document and of its images (kb_internal.is_image_failure_of).
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
    canonical_key text := kb_internal.canonical_doc_key(replace_document.doc_key);
    target_kb integer;
    doc kb.documents;
    new_hash text;
    old_chunk_ids bigint[];
    new_chunk_ids bigint[];
    target_model kb.embedding_models;
    n_queued integer := 0;
begin
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
    if model is not null or jsonb_path_exists(chunks, '$[*].embedding') then
        target_model := kb.resolve_model(model);
    end if;
    perform kb_internal.check_chunks(chunks, target_model);
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
    -- a name taken by a knowledge base the caller cannot see: the same answer create_knowledge_base gives
    -- (whoever may write to a knowledge base may read it)
    if not target_kb = any(kb.visible_kb_ids()) then
        raise exception 'knowledge base name "%" is not available', replace_document.kb
            using errcode = 'unique_violation',
                hint = 'knowledge base names are unique across pgkb; choose another name';
    end if;
    perform kb_internal.writable_kb(replace_document.kb);

    -- unchanged document: report without taking any lock
    select * into doc from kb.documents as d
    where d.kb_id = target_kb and d.doc_key = canonical_key and d.content_hash = new_hash;
    if doc.id is not null then
        return query select doc.id, doc.chunk_count, false, 0;
        return;
    end if;
    -- writers of one knowledge base serialise on its row (BM25 statistics), then lock the document row
    perform from kb.knowledge_bases as k where k.id = target_kb for no key update;
    insert into kb.documents as d (kb_id, doc_key, content_hash)
    values (target_kb, canonical_key, '')
    on conflict on constraint documents_kb_id_doc_key_key do nothing;
    select * into doc from kb.documents as d
    where d.kb_id = target_kb and d.doc_key = canonical_key
    for update;
    if doc.content_hash = new_hash then
        return query select doc.id, doc.chunk_count, false, 0;
        return;
    end if;

    select coalesce(array_agg(c.id), '{}') into old_chunk_ids from kb.chunks as c where c.document_id = doc.id;
    perform kb_internal.adjust_term_stats(target_kb, old_chunk_ids, -1);
    -- old chunks go with their embeddings and queue entries (ON DELETE CASCADE)
    delete from kb.chunks as c where c.id = any(old_chunk_ids);
    -- the new chunks' terms (kb.chunk_terms, in their statistics below) read the new title
    update kb.documents as d set title = coalesce(replace_document.title, '') where d.id = doc.id;

    -- one pass over the (checked) array: chunks, their lengths in terms and given embeddings
    with parsed as materialized (
        select coalesce((x.item ->> 'ordinal')::integer, (x.pos - 1)::integer) as ordinal,
            x.item ->> 'content' as content,
            array(select jsonb_array_elements_text(x.item -> 'heading_path')) as heading_path,
            coalesce(x.item ->> 'chunk_type', 'text') as chunk_type,
            coalesce(x.item -> 'metadata', '{}') as metadata,
            x.item -> 'embedding' as embedding
        from jsonb_array_elements(chunks) with ordinality as x (item, pos)
    ),
    inserted as (
        insert into kb.chunks as c (
            document_id, kb_id, ordinal, content, heading_path, chunk_type, char_count, metadata,
            term_count, heading_script
        )
        select doc.id, target_kb, p.ordinal, p.content, p.heading_path, p.chunk_type, length(p.content),
            p.metadata, cardinality(kb.lexical_terms(kb.indexed_text(title, p.heading_path, p.content))),
            kb_internal.heading_script(title, p.heading_path)
        from parsed as p
        returning c.id, c.ordinal
    ),
    embedded as (
        insert into kb.embeddings (chunk_id, model_id, kb_id, embedding, half)
        select i.id, target_model.id, target_kb,
            case when target_model.storage = 'vector' then p.embedding::text::vector end,
            case when target_model.storage = 'halfvec' then p.embedding::text::halfvec end
        from inserted as i
        inner join parsed as p on i.ordinal = p.ordinal
        where p.embedding is not null
    )
    select coalesce(array_agg(inserted.id), '{}') into new_chunk_ids from inserted;

    perform kb_internal.adjust_term_stats(target_kb, new_chunk_ids, 1);

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
    set source_url = replace_document.source_url,
        source_type = replace_document.source_type, content_hash = new_hash,
        metadata = replace_document.metadata, chunk_count = cardinality(new_chunk_ids),
        status = case when n_queued > 0 then 'embedding' else 'ready' end, updated_at = now()
    where d.id = doc.id;
    delete from kb.ingest_failures as f
    where f.kb_id = target_kb and (f.doc_key = canonical_key or kb_internal.is_image_failure_of(f.doc_key, canonical_key));
    return query select doc.id, cardinality(new_chunk_ids), true, n_queued;
end
$$;

-- Delete a document and everything derived from it (its failure records and its images' too). Returns
-- true if it existed. doc_key is NFC-normalised like in kb.replace_document.
create or replace function kb.delete_document(kb text, doc_key text)
returns boolean
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    canonical_key text := kb_internal.canonical_doc_key(delete_document.doc_key);
    target_kb integer := kb_internal.writable_kb(delete_document.kb);
    doc_id bigint;
    old_chunk_ids bigint[];
begin
    perform from kb.knowledge_bases as k where k.id = target_kb for no key update;
    select d.id into doc_id from kb.documents as d
    where d.kb_id = target_kb and d.doc_key = canonical_key
    for update;
    if doc_id is null then
        return false;
    end if;
    select coalesce(array_agg(c.id), '{}') into old_chunk_ids from kb.chunks as c where c.document_id = doc_id;
    perform kb_internal.adjust_term_stats(target_kb, old_chunk_ids, -1);
    delete from kb.documents as d where d.id = doc_id;
    delete from kb.ingest_failures as f
    where f.kb_id = target_kb and (f.doc_key = canonical_key or kb_internal.is_image_failure_of(f.doc_key, canonical_key));
    return true;
end
$$;

-- Store embeddings computed outside the database (ingestion, worker) for one model: checks the
-- dimension and norm (kb_internal.storable_embedding) of every vector, removes the chunks' queue entries and marks
-- documents ready once none of their entries is left. Chunk ids that do not exist (any more) or that the
-- caller may not write are skipped alike, so the answer tells nothing about other users' chunks.
-- Writers of one document serialise on its row (locked in id order, before anything else), so the last
-- of two workers finishing one document always sees the other's queue entries gone.
-- Returns the number of embeddings stored.
create or replace function kb.store_embeddings(model text, chunk_ids bigint[], embeddings vector[])
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
declare
    target kb.embedding_models := kb.resolve_model(model);
    admin boolean := kb.current_is_admin();
    writable_kbs integer[];
    bad bigint;
    writable bigint[];
    doc_ids bigint[];
    stored integer;
begin
    if chunk_ids is null or embeddings is null or cardinality(chunk_ids) <> cardinality(embeddings) then
        raise exception 'chunk_ids and embeddings must be arrays of the same length'
            using errcode = 'invalid_parameter_value';
    end if;
    if cardinality(chunk_ids) > 100000 then
        raise exception 'at most 100000 embeddings per call, got %', cardinality(chunk_ids)
            using errcode = 'program_limit_exceeded';
    end if;
    if array_position(chunk_ids, null) is not null
        or (select count(distinct x) from unnest(chunk_ids) as x) <> cardinality(chunk_ids) then
        raise exception 'chunk_ids must be distinct and not NULL' using errcode = 'invalid_parameter_value';
    end if;
    select x.n into bad from unnest(embeddings) with ordinality as x (e, n)
    where x.e is null or vector_dims(x.e) <> target.dimension
    order by x.n limit 1;
    if bad is not null then
        raise exception 'embedding dimension does not match model "%" (% dimensions): embeddings[%]',
            target.name, target.dimension, bad using errcode = 'data_exception';
    end if;
    select x.n into bad from unnest(embeddings) with ordinality as x (e, n)
    where not kb_internal.storable_embedding(x.e, target.storage)
    order by x.n limit 1;
    if bad is not null then
        raise exception 'embeddings[%] has a zero or degenerate norm (or values beyond half precision for a halfvec '
            'model); cosine distance to it is undefined', bad
            using errcode = 'data_exception';
    end if;

    if not admin then
        writable_kbs := array(select k.id from kb.knowledge_bases as k where kb.can_write_kb(k.id));
    end if;
    -- lock the documents first, in id order (no deadlocks between workers), then re-read which chunks
    -- are still there: under READ COMMITTED every statement below sees what earlier lock holders committed
    -- a user's chunk ids are looked up among the knowledge bases they may write only (chunks_kb_chunk_idx;
    -- id + 0: never by primary key, which would fetch another user's chunk row before skipping it)
    select coalesce(array_agg(d.id), '{}') into doc_ids
    from (
        select d.id from kb.documents as d
        where d.id in (
            select c.document_id from kb.chunks as c
            where admin and c.id = any(chunk_ids)
            union all
            select c.document_id from kb.chunks as c
            where not admin and c.kb_id = any(writable_kbs) and c.id + 0 = any(chunk_ids)
        )
        order by d.id
        for no key update of d
    ) as d;
    select coalesce(array_agg(c.id), '{}') into writable
    from (
        select c.id, c.document_id from kb.chunks as c
        where admin and c.id = any(chunk_ids)
        union all
        select c.id, c.document_id from kb.chunks as c
        where not admin and c.kb_id = any(writable_kbs) and c.id + 0 = any(chunk_ids)
    ) as c
    where c.document_id = any(doc_ids);

    insert into kb.embeddings as e (chunk_id, model_id, kb_id, embedding, half)
    select c.id, target.id, c.kb_id, case when target.storage = 'vector' then x.embedding end,
        case when target.storage = 'halfvec' then x.embedding::halfvec end
    from unnest(chunk_ids, embeddings) as x (chunk_id, embedding)
    inner join kb.chunks as c on x.chunk_id = c.id
    where c.id = any(writable)
    on conflict (chunk_id, model_id) do update
    set embedding = excluded.embedding, half = excluded.half, created_at = now();
    get diagnostics stored = row_count;
    delete from kb.embedding_queue as q
    where q.model_id = target.id and q.chunk_id in (
        select l.chunk_id from kb.embedding_queue as l     -- in chunk id order, like kb.fail_embedding_batch
        where l.model_id = target.id and l.chunk_id = any(writable)
        order by l.chunk_id
        for update
    );
    -- a locking read: under REPEATABLE READ an entry deleted by a worker that committed after this
    -- transaction began raises a serialization failure (retry) instead of leaving the document 'embedding'
    update kb.documents as d set status = 'ready'
    where d.id = any(doc_ids) and d.status = 'embedding'
        and not exists (
            select from kb.embedding_queue as q inner join kb.chunks as c on q.chunk_id = c.id
            where c.document_id = d.id
            for key share of q
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
    target_kb integer := kb_internal.writable_kb(record_ingest_failure.kb);
begin
    insert into kb.ingest_failures as f (kb_id, doc_key, error)
    values (target_kb, kb_internal.canonical_doc_key(doc_key), left(coalesce(error, 'unknown error'), 2000))
    on conflict on constraint ingest_failures_pkey do update set error = excluded.error, failed_at = now();
end
$$;

-- The chunks' stored heading scripts (kb.chunks.heading_script, written by kb.replace_document) against what
-- kb_internal.heading_script gives for their document's title and headings now: one row per document, heading
-- trail and stored script, with its chunk count. The rule is evaluated once per row, not per chunk. Read by the
-- doctor (kb_internal.doctor_chunks) and kb_admin.refill_heading_scripts.
create or replace function kb_internal.heading_scripts_held()
returns table (document_id bigint, heading_path text[], stored text, wanted text, chunks bigint)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select g.document_id, g.heading_path, g.heading_script, kb_internal.heading_script(d.title, g.heading_path), g.n
    from (
        select c.document_id, c.heading_path, c.heading_script, count(*) as n
        from kb.chunks as c
        group by c.document_id, c.heading_path, c.heading_script
    ) as g
    join kb.documents as d on d.id = g.document_id
$$;

-- Admin: store again every chunk's heading script that is not what kb_internal.heading_script gives for its
-- title and headings now (after a change to kb_internal.text_scripts; `pgkb db doctor` counts them), in one
-- statement. Returns the number of chunks changed.
create or replace function kb_admin.refill_heading_scripts()
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    n bigint;
begin
    perform kb.require_admin('refill heading scripts');
    update kb.chunks as c set heading_script = h.wanted
    from kb_internal.heading_scripts_held() as h
    where h.stored is distinct from h.wanted
        and c.document_id = h.document_id and c.heading_path = h.heading_path
        and c.heading_script is not distinct from h.stored;
    get diagnostics n = row_count;
    return n;
end
$$;
