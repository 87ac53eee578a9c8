-- 049 the term dictionary in blocks (issue 33, "one copy of each chunk's terms" and the storage goal): a row
-- per term in kb.term_stats cost about 160 bytes and its primary key 30 more, ten times the text of the shared
-- sets (most terms occur once). A knowledge base's dictionary is now kept mostly in kb.term_blocks: its terms in
-- byte order, up to kb_internal.term_block_size() a row, with their document frequency, tiers, blocked_to and
-- recent postings as aligned arrays, compressed (kind 0); and its Chinese bigrams again, keyed by their last
-- character (kind 1: key = the bigram reversed), for the fuzzy leg. kb.term_stats holds the entries
-- changed since the last compaction (a writer copies a term's block entry there first), and a row there,
-- of df 0 too, overrides the term's block entry. db/functions/29_term_dictionary.sql reads and compacts it;
-- `pgkb db migrate` compacts the knowledge bases (kb_internal.compact_due_terms).

create table kb.term_blocks (
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    kind smallint not null check (kind in (0, 1)),
    first_term text collate "C" not null,
    n integer not null check (n > 0),
    terms text[] collate "C" not null,
    dfs integer[] not null,
    tiers bigint[] not null,
    blocked_to bigint[] not null,
    recent_counts integer[] not null,
    recent_ids bigint[] not null,
    recent_tfs integer[] not null,
    recent_dls integer[] not null,
    primary key (kb_id, kind, first_term)
);
alter table kb.term_blocks enable row level security;
-- every array compressed and kept inline where it fits (a block of many recent postings may still go to TOAST)
alter table kb.term_blocks
alter column terms set storage main,
alter column dfs set storage main,
alter column tiers set storage main,
alter column blocked_to set storage main,
alter column recent_counts set storage main,
alter column recent_ids set storage main,
alter column recent_tfs set storage main,
alter column recent_dls set storage main,
alter column terms set compression pglz,
alter column dfs set compression pglz,
alter column tiers set compression pglz,
alter column blocked_to set compression pglz,
alter column recent_counts set compression pglz,
alter column recent_ids set compression pglz,
alter column recent_tfs set compression pglz,
alter column recent_dls set compression pglz;
alter table kb.term_blocks set (toast_tuple_target = 128);

-- what decides when a knowledge base's dictionary is compacted (kb_internal.compact_terms_if_due): its rows in
-- kb.term_stats, counted from above between counts, and its entries in blocks at the last compaction
alter table kb.knowledge_bases
add column term_rows integer not null default 0,
add column block_terms integer not null default 0;
update kb.knowledge_bases as k
set term_rows = s.n
from (
    select
        s.kb_id,
        count(*) as n
    from kb.term_stats as s
    group by s.kb_id
) as s
where s.kb_id = k.id;
