-- 018 posting payload: a posting block's chunk ids, term frequencies and chunk lengths move from three
-- SQL arrays (16 bytes a posting) into one compact bytea payload (3-4 bytes a posting), which the
-- BM25 leg decodes with numpy inside the server (plpython3u) or, without it, in SQL. The format is
-- kb.encode_postings / kb.decode_postings (db/functions/31_postings.sql); blocks hold up to 256 postings.
-- The blocks are rebuilt from the chunks by db/functions/31_postings.sql (every knowledge base whose
-- postings_format is below the current one), in the same `pgkb db migrate` transaction.

-- migration 016's maintenance functions wrote the arrays: db/functions/31_postings.sql has their successors
-- (kb.build_postings, kb.build_postings_batch, kb.clear_postings)
drop function kb.rebuild_postings(integer);
drop function kb.append_postings(integer, bigint);
drop function kb.reset_postings(integer);

truncate kb.postings;
alter table kb.postings
drop column chunk_ids,
drop column tfs,
drop column dls,
add column n smallint not null check (n between 1 and 256),
add column payload bytea not null;

-- the payload is already compact and read byte by byte by the SQL leg (get_byte decompresses a compressed
-- value again on every call): never compressed nor moved out of line (at most 256 x 16 bytes, a row fits
-- a page)
alter table kb.postings alter column payload set storage plain;

-- the posting format a knowledge base's blocks are in: new ones start in the current one (1); existing
-- ones are rebuilt (their old blocks are gone)
alter table kb.knowledge_bases add column postings_format smallint not null default 1;
update kb.knowledge_bases set postings_format = 0;

-- the BM25 leg: 'auto' (the new default, for the old default 'blocks') takes numpy where the server has
-- plpython3u and numpy, else blocks
update kb.settings set value = 'auto'
where key = 'lexical_leg' and value = 'blocks';
update kb.settings set
    description = 'BM25 leg: auto (numpy where the server has plpython3u and numpy, else blocks), numpy '
    '(posting blocks scored by numpy in the server), blocks (posting blocks in SQL) or scan (GIN term index, '
    'within lexical_probe_budget)'
where key = 'lexical_leg';
