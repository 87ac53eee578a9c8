-- 042 one copy of each chunk's terms (issue 33): kb.chunks held its terms twice, term_freqs ({term: frequency},
-- what writes undo, the posting build and the BM25 legs read) and the array generated from it (migration 009)
-- with a GIN index over it, which the 'scan' engine probed and kb.retrieve read. Both read term_freqs now;
-- the array, its index and the function that made it go. The table is rewritten once, in id order, so the
-- space comes back at the upgrade (a dropped column stays in every row until the row is written again).

drop index if exists kb.chunks_terms_idx;
alter table kb.chunks drop column terms;
drop function if exists kb_internal.term_keys(jsonb);
cluster kb.chunks using chunks_pkey;
alter table kb.chunks set without cluster;
