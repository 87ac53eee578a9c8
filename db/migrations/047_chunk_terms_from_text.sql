-- 047 one stored copy of each chunk's terms (issue 33): kb.chunks kept its terms as term_freqs ({term:
-- frequency}, 1.6 times its text on the 100k bench) beside the posting lists. The few readers that need one
-- chunk's terms (the statistics' undo on replace and delete, the posting build, the SQL legs' lookups, the
-- answer gate, kb.retrieve) compute them from the chunk's text with kb.chunk_terms (db/functions), so the column
-- and kb.term_freqs go. Since writes now undo a chunk's statistics from its text, each knowledge base records
-- the term model it was counted with (terms_version, kb_internal.terms_version(); a later change to the model
-- raises both it and this column's default). A knowledge base with a chunk whose stored terms are not what its
-- text gives with the installed tokenizer (or, on a release without kb.indexed_text, any with chunks) is marked
-- 0 and counted again by `pgkb db migrate` (kb_internal.recount_old_terms); the others keep their statistics and
-- postings. The comparison tokenises every chunk once (about 0.5 ms a chunk). The table is rewritten once, as
-- in migration 042, so the space comes back at the upgrade.

alter table kb.knowledge_bases add column terms_version smallint not null default 1;
do $compare$
begin
    if to_regprocedure('kb.indexed_text(text, text[], text)') is not null
        and to_regprocedure('kb.term_freqs(text[])') is not null then
        update kb.knowledge_bases as k set terms_version = 0
        where exists (
            select from kb.chunks as c
            inner join kb.documents as d on c.document_id = d.id
            where c.kb_id = k.id
                and c.term_freqs is distinct from kb.term_freqs(
                    kb.lexical_terms(kb.indexed_text(d.title, c.heading_path, c.content))
                )
        );
    else
        update kb.knowledge_bases as k set terms_version = 0
        where exists (select from kb.chunks as c where c.kb_id = k.id);
    end if;
end
$compare$;

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
