-- Knowledge bases whose posting blocks are in an older format (postings_format below
-- kb_internal.postings_format(); migrations 018, 030 and 031) are rebuilt here, inside `pgkb db migrate`: after
-- 53_postings_build_numpy.sql, so that the build takes numpy where the server has it. Skipped on a schema
-- older than migration 018 (tests that apply today's functions to an old schema).
do $$
begin
    if exists (
        select from pg_attribute
        where attrelid = 'kb.knowledge_bases'::regclass and attname = 'postings_format' and not attisdropped
    ) then
        perform kb_internal.build_postings(k.id) from kb.knowledge_bases as k where k.postings_format < kb_internal.postings_format()
            order by k.id;
    end if;
end
$$;
