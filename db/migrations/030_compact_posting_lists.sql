-- 030 compact posting lists: a posting build writes each (term, tier) list once, cut into full blocks from
-- its start (postings_format 2, kb_internal.postings_format()); the numpy build used to cut every list at each
-- 100,000 chunks, which left 6.6 million blocks of 47 postings on average at a million chunks (1.8 million
-- when cut once). Every knowledge base (format 1) is rebuilt by db/functions/54_postings_rebuild.sql in the
-- same `pgkb db migrate`: the blocks go here at once (TRUNCATE, so the table is not left with the old
-- blocks' dead rows), kb_internal.build_postings resets the rest.

truncate kb.postings;

alter table kb.knowledge_bases alter column postings_format set default 2;

-- the numpy builder builds a whole knowledge base in one call; kb_internal.build_postings_batch takes the number of
-- chunks per step (tests build lists over several steps)
drop function if exists kb_internal.build_postings_numpy(integer, bigint, bigint);
drop function if exists kb_internal.build_postings_batch(integer, bigint);

insert into kb.settings (key, value, description) values
(
    'lexical_numpy_heap_mb', '64',
    'BM25 leg (numpy): memory (MB) a backend keeps after a search instead of returning it to the operating '
    'system (glibc malloc''s trim threshold, set at its first numpy search), so that the next search does not '
    'fault its arrays in again; 0 leaves malloc as it is'
)
on conflict (key) do nothing;
