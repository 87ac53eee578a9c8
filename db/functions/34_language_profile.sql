-- The language profile of a knowledge base: its chunks by language (kb_internal.text_language), counted by
-- kb_internal.adjust_term_stats on every write. Shown by kb.list_knowledge_bases, `pgkb db status`, the MCP
-- server (which tells agents which language to ask in) and the page.

-- The shares of a knowledge base's chunks by language, {"zh": .., "en": .., "other": .., "main": ..}: main is
-- the language of at least 60 % of the chunks, 'mixed' when none is, NULL for an empty knowledge base.
create or replace function kb.language_profile(zh_chunks bigint, en_chunks bigint, other_chunks bigint)
returns jsonb
language sql immutable
set search_path = pg_catalog, pg_temp
as $$
    select case when t.total = 0 then jsonb_build_object('zh', 0, 'en', 0, 'other', 0, 'main', null)
        else jsonb_build_object(
            'zh', round(zh_chunks / t.total, 3), 'en', round(en_chunks / t.total, 3),
            'other', round(other_chunks / t.total, 3),
            'main', case
                when zh_chunks >= 0.6 * t.total then 'zh'
                when en_chunks >= 0.6 * t.total then 'en'
                when other_chunks >= 0.6 * t.total then 'other'
                else 'mixed'
            end
        ) end
    from (select greatest(zh_chunks, 0) + greatest(en_chunks, 0) + greatest(other_chunks, 0)::numeric as total) as t
$$;

-- The language profile of all the knowledge the caller may read (kb.language_profile of the visible knowledge
-- bases' chunks together): what the MCP server tells an agent about the language to ask in.
create or replace function kb.knowledge_languages()
returns jsonb
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select kb.language_profile(
        coalesce(sum(k.zh_chunks), 0)::bigint, coalesce(sum(k.en_chunks), 0)::bigint,
        coalesce(sum(k.other_chunks), 0)::bigint
    )
    from unnest(kb.visible_kb_ids()) as v (id)
    cross join lateral (select k.* from kb.knowledge_bases as k where k.id = v.id offset 0) as k
$$;

-- Knowledge bases written before migration 032 are counted here, inside `pgkb db migrate` (once: they are
-- marked counted). Skipped on a schema older than migration 032.
do $$
begin
    if to_regclass('kb.glossary') is not null then
        update kb.knowledge_bases as k
        set zh_chunks = coalesce(c.zh, 0), en_chunks = coalesce(c.en, 0), other_chunks = coalesce(c.other, 0),
            languages_counted = true
        from (
            select k.id, x.zh, x.en, x.other
            from kb.knowledge_bases as k
            left join lateral (
                select count(*) filter (where l.lang = 'zh') as zh, count(*) filter (where l.lang = 'en') as en,
                    count(*) filter (where l.lang = 'other') as other
                from (select kb_internal.text_language(c.content) as lang from kb.chunks as c where c.kb_id = k.id) as l
            ) as x on true
            where not k.languages_counted
        ) as c
        where k.id = c.id;
    end if;
end
$$;
