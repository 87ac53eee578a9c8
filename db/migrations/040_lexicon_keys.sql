-- 040 the lexicon's lookup keys (issue 31: the cost of translating queries). Each source of
-- kb_internal.lexicon once, with its terms (kb_internal.content_terms, computed at load): the Chinese words
-- of a query are looked up here, and their terms read from here rather than tokenised again per query.
-- Collation "C": keys are compared byte by byte, as they are looked up (exact match only). Filled by the
-- lexicon's loader (pgkb.lexicon, parse version 4, so `pgkb db migrate` reloads the lexicon once); read by
-- kb_internal.translation_sources only; holds no user data.
create table kb_internal.lexicon_keys (
    lang text not null check (lang in ('zh', 'en')),
    source text collate "C" not null,
    terms text[] not null,
    primary key (lang, source)
);

-- A database that holds a lexicon already gets its keys here, so searches keep their translations until the
-- loader's reload (a fresh database has neither a lexicon nor, yet, kb_internal.content_terms).
do $$
begin
    if to_regprocedure('kb_internal.content_terms(text)') is not null then
        insert into kb_internal.lexicon_keys (lang, source, terms)
        select k.lang, k.source, kb_internal.content_terms(k.source)
        from (select distinct l.lang, l.source from kb_internal.lexicon as l) as k;
    end if;
end
$$;
