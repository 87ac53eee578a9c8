-- 047 one stored copy of each chunk's terms (issue 33): kb.chunks kept its terms as term_freqs ({term:
-- frequency}, 1.6 times its text on the 100k bench) beside the posting lists. The few readers that need one
-- chunk's terms (the statistics' undo on replace and delete, the posting build, the SQL legs' lookups, the
-- answer gate, kb.retrieve) compute them from the chunk's text with kb.chunk_terms (db/functions), so the column
-- and kb.term_freqs go. The posting lists and statistics are unchanged: nothing is rebuilt. The table is
-- rewritten once, as in migration 042, so the space comes back at the upgrade.

alter table kb.chunks drop column term_freqs;
drop function if exists kb.term_freqs(text[]);
drop function if exists kb_internal.remove_block_postings(integer, bigint[], text[]);
do $rewrite$
begin
    if exists (select from pg_index where indexrelid = 'kb.chunks_pkey'::regclass and indisvalid) then
        cluster kb.chunks using chunks_pkey;
        alter table kb.chunks set without cluster;
    end if;
end
$rewrite$;

update kb.settings set
    description = 'BM25 leg: auto (numpy where the server has plpython3u and numpy, else blocks), numpy '
    '(posting blocks scored by numpy in the server), blocks (posting blocks in SQL) or scan (every chunk of the '
    'searched knowledge bases read and tokenised, about 0.5 ms a chunk: a reference for checking, not for serving)'
where key = 'lexical_leg';
