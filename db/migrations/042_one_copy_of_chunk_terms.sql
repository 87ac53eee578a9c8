-- 042 one copy of each chunk's terms (issue 33): kb.chunks held its terms twice, term_freqs ({term: frequency},
-- what writes undo, the posting build and the BM25 legs read) and the array generated from it (migration 009)
-- with a GIN index over it, which the 'scan' engine probed and kb.retrieve read. Both read term_freqs now;
-- the array, its index and the function that made it go. The table is rewritten once, in id order, so the
-- space comes back at the upgrade (a dropped column stays in every row until the row is written again);
-- with its primary key invalid (a failed reindex) CLUSTER cannot run, and the space comes back as rows are
-- written again instead.

drop index if exists kb.chunks_terms_idx;
alter table kb.chunks drop column terms;
drop function if exists kb_internal.term_keys(jsonb);
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
    'searched knowledge bases read, a reference for checking, not for serving)'
where key = 'lexical_leg';
