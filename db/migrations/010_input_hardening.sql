-- 010 input hardening: brings stored data in line with the stricter checks of db/functions (issue 9).
-- - kb.check_chunks (linear) replaces kb.parse_chunks.
-- - Word terms are cut to 64 characters (kb.lexical_terms): chunks stored with longer terms get them cut
--   the same way, with their BM25 document frequencies moved along.
-- - Document keys are NFC-normalised (kb.canonical_doc_key). Where two stored keys differ only in their
--   normalisation, the one already in NFC (else the latest) stays and the other document is removed, as
--   every later write and delete addresses the NFC key. Keys must be NFC and at most 2000 bytes.
-- - Term statistics with a document frequency of 0 are dropped (kb.adjust_term_stats now does it).
-- - Embeddings with a zero or degenerate norm (NaN cosine distances) are removed and queued again.

drop function if exists kb.parse_chunks(jsonb);

-- long terms -------------------------------------------------------------------------------------------

create temporary table pgkb_010_long on commit drop as
select c.id
from kb.chunks as c
where exists (
    select from unnest(c.terms) as t (term)
    where length(t.term) > 64
);

update kb.term_stats as s
set df = s.df - o.n
from (
    select
        c.kb_id,
        t.term,
        count(*) as n
    from kb.chunks as c
    inner join pgkb_010_long as l on c.id = l.id
    cross join unnest(c.terms) as t (term)
    group by c.kb_id, t.term
) as o
where s.kb_id = o.kb_id and s.term = o.term;

update kb.chunks as c
set
    term_freqs = (
        select jsonb_object_agg(f.term, f.n)
        from (
            select
                left(e.key, 64) as term,
                sum(e.value::integer) as n
            from jsonb_each_text(c.term_freqs) as e
            group by left(e.key, 64)
        ) as f
    )
where c.id in (select l.id from pgkb_010_long as l);

insert into kb.term_stats as s (kb_id, term, df)
select
    c.kb_id,
    t.term,
    count(*) as df
from kb.chunks as c
inner join pgkb_010_long as l on c.id = l.id
cross join unnest(c.terms) as t (term)
group by c.kb_id, t.term
on conflict (kb_id, term) do update set df = s.df + excluded.df;

-- document keys ----------------------------------------------------------------------------------------
-- (noqa RF02/RF03: the linter takes the normal form nfc in normalize(text, nfc) for a column.)

create temporary table pgkb_010_duplicates on commit drop as
select ranked.id
from (
    select
        d.id,
        row_number() over (
            partition by d.kb_id, normalize(d.doc_key, nfc)  -- noqa: RF02,RF03
            order by d.doc_key is nfc normalized desc, d.updated_at desc, d.id desc
        ) as position
    from kb.documents as d
    where normalize(d.doc_key, nfc) in (  -- noqa: RF02,RF03
        select normalize(x.doc_key, nfc) from kb.documents as x  -- noqa: RF02,RF03
        where x.doc_key is not nfc normalized
    )
) as ranked
where ranked.position > 1;

update kb.term_stats as s
set df = s.df - o.n
from (
    select
        c.kb_id,
        t.term,
        count(*) as n
    from kb.chunks as c
    inner join pgkb_010_duplicates as u on c.document_id = u.id
    cross join unnest(c.terms) as t (term)
    group by c.kb_id, t.term
) as o
where s.kb_id = o.kb_id and s.term = o.term;

update kb.knowledge_bases as k
set chunk_count = k.chunk_count - o.n, term_total = k.term_total - o.terms
from (
    select
        c.kb_id,
        count(*) as n,
        sum(c.term_count) as terms
    from kb.chunks as c
    inner join pgkb_010_duplicates as u on c.document_id = u.id
    group by c.kb_id
) as o
where k.id = o.kb_id;

delete from kb.documents as d
using pgkb_010_duplicates as u
where d.id = u.id;

update kb.documents
set doc_key = normalize(doc_key, nfc)  -- noqa: RF02,RF03
where doc_key is not nfc normalized;

delete from kb.ingest_failures as f
using (
    select
        x.kb_id,
        x.doc_key,
        row_number() over (
            partition by x.kb_id, normalize(x.doc_key, nfc)  -- noqa: RF02,RF03
            order by x.doc_key is nfc normalized desc, x.failed_at desc, x.doc_key asc
        ) as position
    from kb.ingest_failures as x
) as ranked
where
    f.kb_id = ranked.kb_id and f.doc_key = ranked.doc_key and ranked.position > 1;

update kb.ingest_failures
set doc_key = normalize(doc_key, nfc)  -- noqa: RF02,RF03
where doc_key is not nfc normalized;

alter table kb.documents add constraint documents_doc_key_nfc check (doc_key is nfc normalized);
alter table kb.ingest_failures add constraint ingest_failures_doc_key_nfc check (doc_key is nfc normalized);

-- The byte limit becomes a constraint only where no stored key exceeds it: a constraint that old rows
-- violate would make every later update of those rows (status, embeddings) fail.
do $bytes$
begin
    if exists (select from kb.documents as d where octet_length(d.doc_key) > 2000) then
        raise notice 'pgkb: some document keys are longer than 2000 bytes; new keys are limited, old ones stay';
    else
        alter table kb.documents add constraint documents_doc_key_bytes check (octet_length(doc_key) <= 2000);
    end if;
    if exists (select from kb.ingest_failures as f where octet_length(f.doc_key) > 2000) then
        raise notice 'pgkb: some ingest failures have keys longer than 2000 bytes; new keys are limited';
    else
        alter table kb.ingest_failures add constraint ingest_failures_doc_key_bytes
        check (octet_length(doc_key) <= 2000);
    end if;
end
$bytes$;

-- term statistics --------------------------------------------------------------------------------------

delete from kb.term_stats
where df <= 0;

-- degenerate embeddings --------------------------------------------------------------------------------

with removed as (
    delete from kb.embeddings as e
    where vector_norm(e.embedding) not between 1e-15 and 1e15
    returning e.chunk_id, e.model_id, e.kb_id
),

queued as (
    insert into kb.embedding_queue (chunk_id, model_id, kb_id)
    select
        r.chunk_id,
        r.model_id,
        r.kb_id
    from removed as r
    on conflict do nothing
    returning chunk_id
)

update kb.documents as d
set status = 'embedding'
where d.id in (select c.document_id from kb.chunks as c inner join queued as q on c.id = q.chunk_id);
