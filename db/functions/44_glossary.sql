-- A knowledge base's glossary: sets of terms that mean the same there (发版 = 上线 = release, service names,
-- internal abbreviations), which kb_internal.query_translations (46_translations.sql) expands a query with, both
-- ways. Written with the knowledge base's write rules (kb_internal.writable_kb), read by whoever may read it;
-- an unknown and an invisible knowledge base raise the same error.

-- Internal: the terms of a glossary entry as stored (trimmed, NFC, in the given order, duplicates by
-- kb.fold_text dropped), or invalid_parameter_value: NULL, fewer than 2 distinct terms or more than
-- kb.limits() glossary_terms, a blank term, one longer than glossary_term_chars.
create or replace function kb_internal.glossary_terms(terms text[])
returns text[]
language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    max_terms constant integer := kb_internal.api_limit('glossary_terms');
    max_chars constant integer := kb_internal.api_limit('glossary_term_chars');
    cleaned text[];
begin
    if terms is null or cardinality(terms) = 0 or array_ndims(terms) <> 1 then
        raise exception 'terms must be an array of 2 to % terms', max_terms using errcode = 'invalid_parameter_value';
    end if;
    if cardinality(terms) > max_terms then
        raise exception 'a glossary entry holds at most % terms, got %', max_terms, cardinality(terms)
            using errcode = 'program_limit_exceeded';
    end if;
    if exists (select from unnest(terms) as t where t is null or kb_internal.is_blank(t)) then
        raise exception 'glossary terms must not be empty (white space and invisible characters alone do not count)'
            using errcode = 'invalid_parameter_value';
    end if;
    if exists (select from unnest(terms) as t where length(btrim(t)) > max_chars) then
        raise exception 'a glossary term is at most % characters long', max_chars
            using errcode = 'program_limit_exceeded';
    end if;
    cleaned := array(
        select x.t from (
            select distinct on (kb.fold_text(normalize(btrim(t.t), nfc))) normalize(btrim(t.t), nfc) as t, t.n
            from unnest(terms) with ordinality as t (t, n)
            order by kb.fold_text(normalize(btrim(t.t), nfc)), t.n
        ) as x order by x.n
    );
    if cardinality(cleaned) < 2 then
        raise exception 'a glossary entry needs at least 2 different terms, got %', cardinality(cleaned)
            using errcode = 'invalid_parameter_value';
    end if;
    return cleaned;
end
$$;

-- Add an entry to knowledge base kb's glossary: terms that mean the same (2..kb.limits() glossary_terms, each
-- at most glossary_term_chars characters); returns its id. Needs write access to kb; at most
-- glossary_entries entries per knowledge base; an entry equal to one there (the same terms) is not added
-- twice: its id is returned.
create or replace function kb.glossary_add(kb text, terms text[])
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb constant integer := kb_internal.writable_kb(glossary_add.kb);
    cleaned constant text[] := kb_internal.glossary_terms(glossary_add.terms);
    max_entries constant integer := kb_internal.api_limit('glossary_entries');
    entry_id bigint;
begin
    -- one writer of a knowledge base's glossary at a time, so the bound holds
    perform from kb.knowledge_bases as k where k.id = target_kb for update;
    select g.id into entry_id from kb.glossary as g
    where g.kb_id = target_kb
        and (select array_agg(kb.fold_text(t) order by kb.fold_text(t)) from unnest(g.terms) as t)
        = (select array_agg(kb.fold_text(t) order by kb.fold_text(t)) from unnest(cleaned) as t);
    if entry_id is not null then
        return entry_id;
    end if;
    if (select count(*) from kb.glossary as g where g.kb_id = target_kb) >= max_entries then
        raise exception 'the glossary of knowledge base "%" holds % entries, the most it may', glossary_add.kb,
            max_entries using errcode = 'program_limit_exceeded', hint = 'remove entries with kb.glossary_remove';
    end if;
    insert into kb.glossary (kb_id, terms, created_by) values (target_kb, cleaned, kb.current_user_id())
    returning id into entry_id;
    return entry_id;
end
$$;

-- The glossary entries of knowledge base kb (NULL: of every knowledge base the caller may read), by
-- knowledge base and id. An unknown or invisible kb raises kb.resolve_kb's error.
create or replace function kb.glossary(kb text default null)
returns table (id bigint, knowledge_base text, terms text[], created_at timestamptz)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    kb_ids constant integer[] := case when glossary.kb is null then kb.visible_kb_ids()
        else array[kb.resolve_kb(glossary.kb)] end;
begin
    return query
    select g.id, k.name, g.terms, g.created_at
    from unnest(kb_ids) as v (id)
    cross join lateral (select k.id, k.name from kb.knowledge_bases as k where k.id = v.id offset 0) as k
    cross join lateral (select g.* from kb.glossary as g where g.kb_id = k.id offset 0) as g
    order by k.name, g.id;
end
$$;

-- Remove entry entry_id from knowledge base kb's glossary. Needs write access to kb; an id that is not an
-- entry of kb raises no_data_found (whether or not it is another knowledge base's).
create or replace function kb.glossary_remove(kb text, entry_id bigint)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb constant integer := kb_internal.writable_kb(glossary_remove.kb);
begin
    -- read through the knowledge base's own rows (id + 0: not the primary key), so another one's entry is never read
    delete from kb.glossary as g where g.kb_id = target_kb and g.id + 0 = entry_id;
    if not found then
        raise exception 'knowledge base "%" has no glossary entry %', glossary_remove.kb, coalesce(entry_id::text, 'NULL')
            using errcode = 'no_data_found';
    end if;
end
$$;
