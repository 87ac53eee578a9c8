-- Knowledge saved by its users and their agents (issue 34): one call that writes a Markdown note as a
-- document through kb.replace_document, bounded in size and rate, with where it came from in its metadata.

-- The doc_key a note saved without one gets: 'saved/' and the title's letters, digits and CJK characters,
-- lower case, runs of anything else as one '-' (at most 100 characters), so saving a title again replaces
-- its note. 'saved/note' when nothing is left of the title.
create or replace function kb_internal.saved_doc_key(title text)
returns text
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select 'saved/' || coalesce(nullif(left(trim(both '-' from regexp_replace(
        lower(normalize(title, nfkc)), '[^a-z0-9\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+', '-', 'g'
    )), 100), ''), 'note')
$$;

-- Save a note into knowledge base kb, which the caller may write (an unknown or invisible one gives the
-- error every read gives): its title, its Markdown body, and the chunks the caller's client cut from the body
-- and a line on where it came from (kb.replace_document's chunks, with or without embeddings), under doc_key
-- (default kb_internal.saved_doc_key(title)); the same doc_key again replaces the note. The metadata records
-- saved_by, saved_at, origin ('sql', 'mcp', 'cli', 'http') and tags. Bounded: the body at most save_max_chars
-- characters, at most 16 tags of 50, at most saves_per_minute saves per user and minute
-- (program_limit_exceeded). Bad input changes nothing. Returns the doc_key (note_key) and what
-- kb.replace_document returns.
create or replace function kb.save_knowledge(
    kb text,
    title text,
    body text,
    chunks jsonb,
    doc_key text default null,
    tags text[] default '{}',
    origin text default 'sql',
    model text default null
)
returns table (note_key text, document_id bigint, chunk_count integer, changed boolean, queued integer)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    max_chars constant integer := kb_internal.setting_int('save_max_chars');
    per_minute constant integer := kb_internal.setting_int('saves_per_minute');
    saver constant bigint := kb.current_user_id();
    key text;
    target_kb integer;
    recent integer;
begin
    if title is null or kb_internal.is_blank(title) then
        raise exception 'a note needs a title' using errcode = 'invalid_parameter_value';
    end if;
    if char_length(title) > 200 then
        raise exception 'the title is % characters long; at most 200 are accepted', char_length(title)
            using errcode = 'invalid_parameter_value';
    end if;
    if body is null or kb_internal.is_blank(body) then
        raise exception 'a note needs a body' using errcode = 'invalid_parameter_value';
    end if;
    if char_length(body) > max_chars then
        raise exception 'the body is % characters long; at most % are accepted', char_length(body), max_chars
            using errcode = 'program_limit_exceeded';
    end if;
    if tags is null or cardinality(tags) > 16
        or exists (select from unnest(tags) as t where t is null or kb_internal.is_blank(t) or char_length(t) > 50) then
        raise exception 'tags: at most 16, each a non-blank text of at most 50 characters'
            using errcode = 'invalid_parameter_value';
    end if;
    if origin is null or origin not in ('sql', 'mcp', 'cli', 'http') then
        raise exception 'origin must be one of sql, mcp, cli, http' using errcode = 'invalid_parameter_value';
    end if;
    if saver is null then
        raise exception 'saving a note needs a pgkb user (kb.create_user)' using errcode = 'insufficient_privilege';
    end if;
    key := kb_internal.canonical_doc_key(
        coalesce(nullif(btrim(save_knowledge.doc_key), ''), kb_internal.saved_doc_key(title))
    );
    target_kb := kb_internal.writable_kb(save_knowledge.kb);  -- unknown and invisible: the readers' error
    -- one user's saves, one at a time: the count below is then exact however many servers call
    perform pg_advisory_xact_lock(hashtext('pgkb.save_knowledge'), saver::integer);
    select count(*) into recent from kb.knowledge_saves as s
    where s.user_id = saver and s.saved_at > clock_timestamp() - interval '1 minute';
    if recent >= per_minute then
        raise exception 'too many saves: at most % per minute; try again in a minute', per_minute
            using errcode = 'program_limit_exceeded';
    end if;
    return query
    select key, r.document_id, r.chunk_count, r.changed, r.queued
    from kb.replace_document(
        save_knowledge.kb, key, title, chunks,
        metadata => jsonb_build_object(
            'saved_by', (select u.name from kb.users as u where u.id = saver),
            'saved_at', to_jsonb(date_trunc('second', now())),
            'origin', origin,
            'tags', to_jsonb(array(select distinct btrim(t) from unnest(tags) as t order by 1))
        ),
        model => save_knowledge.model
    ) as r;
    insert into kb.knowledge_saves (user_id, kb_id, doc_key) values (saver, target_kb, key);
    delete from kb.knowledge_saves as s where s.user_id = saver and s.saved_at < now() - interval '1 day';
end
$$;
