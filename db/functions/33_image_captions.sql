-- The image caption cache (kb.image_captions) of the ingest path: captions a vision model wrote, keyed by
-- knowledge base, image SHA-256, model and language. Only writers of a knowledge base read or write its
-- entries, so a caption never reaches a user of another knowledge base (not even whether an image with a
-- given hash was seen there). All run as the owner (SECURITY DEFINER) after a write-permission check.

-- The cached captions, among image_sha256s, of knowledge base kb for one vision model and language.
-- Needs write access to kb (the ingest path); at most 10000 hashes per call. Hashes without a caption
-- are simply absent from the result.
create or replace function kb.cached_image_captions(kb text, model text, language text, image_sha256s text[])
returns table (image_sha256 text, caption text)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer := kb_internal.writable_kb(cached_image_captions.kb);
begin
    if cardinality(image_sha256s) > 10000 then
        raise exception 'at most 10000 image hashes per call, got %', cardinality(image_sha256s)
            using errcode = 'program_limit_exceeded';
    end if;
    return query
    select c.image_sha256, c.caption
    from kb.image_captions as c
    where c.kb_id = target_kb and c.model = cached_image_captions.model
        and c.language = cached_image_captions.language
        and c.image_sha256 = any(image_sha256s)
    order by c.image_sha256;
end
$$;

-- Cache caption as what model says, in language, about the image with content hash image_sha256 in
-- knowledge base kb (replacing an older caption). Needs write access; image_sha256 is 64 lowercase hex
-- digits, model a non-empty name of at most 200 characters, language 2-8 lowercase letters ('zh', 'en'),
-- caption non-empty and at most 20000 characters. Bad input raises and stores nothing.
create or replace function kb.store_image_caption(
    kb text, image_sha256 text, model text, language text, caption text
)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer := kb_internal.writable_kb(store_image_caption.kb);
begin
    if image_sha256 is null or image_sha256 !~ '^[0-9a-f]{64}$' then
        raise exception 'image_sha256 must be 64 lowercase hex digits (a SHA-256), got "%"', left(image_sha256, 80)
            using errcode = 'invalid_parameter_value';
    end if;
    if model is null or kb_internal.is_blank(model) or length(model) > 200 then
        raise exception 'model must be a non-empty name of at most 200 characters'
            using errcode = 'invalid_parameter_value';
    end if;
    if language is null or language !~ '^[a-z]{2,8}$' then
        raise exception 'language must be 2-8 lowercase letters (e.g. zh, en), got "%"', left(language, 20)
            using errcode = 'invalid_parameter_value';
    end if;
    if caption is null or kb_internal.is_blank(caption) or length(caption) > 20000 then
        raise exception 'caption must be non-empty text of at most 20000 characters'
            using errcode = 'invalid_parameter_value';
    end if;
    insert into kb.image_captions as c (kb_id, image_sha256, model, language, caption)
    values (target_kb, image_sha256, model, language, caption)
    on conflict on constraint image_captions_pkey
    do update set caption = excluded.caption, created_at = now();
end
$$;

-- Forget the cached captions of knowledge base kb whose image no image chunk of kb shows any more
-- (metadata image_sha256), so the cache follows the folder. Needs write access. Returns how many went.
create or replace function kb.prune_image_captions(kb text)
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer := kb_internal.writable_kb(prune_image_captions.kb);
    pruned integer;
begin
    delete from kb.image_captions as c
    where c.kb_id = target_kb
        and not exists (
            select from kb.chunks as x
            where x.kb_id = target_kb and x.chunk_type = 'image' and x.metadata ->> 'image_sha256' = c.image_sha256
        );
    get diagnostics pruned = row_count;
    return pruned;
end
$$;
