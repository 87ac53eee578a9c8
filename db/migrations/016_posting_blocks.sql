-- 016 posting blocks: the BM25 leg reads compact posting lists instead of decompressing every candidate's
-- term_freqs (docs/benchmarks.md, "Lexical leg design"). Per knowledge base, term and impact tier, the
-- chunks holding the term, with their term frequency and length, in blocks of about 128 postings keyed by
-- their first chunk id (ids only grow, so a list's blocks are disjoint and in id order). A tier is a
-- class of (tf, chunk length): every posting of a tier has tf <= its tf ceiling and length >= its length
-- floor, so the tier bounds the BM25 tf part of its postings for any k1, b and average length.
-- kb.term_stats.tiers is the set of tiers a term has postings in (bit i = tier i), a superset after deletes.

create table kb.postings (
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    term text not null,
    tier smallint not null check (tier between 0 and 59),
    first_chunk bigint not null,
    chunk_ids bigint[] not null,
    tfs integer[] not null,
    dls integer[] not null,
    primary key (kb_id, term, tier, first_chunk)
);
alter table kb.postings enable row level security;

alter table kb.term_stats add column tiers bigint not null default 0;

-- The impact tier of a posting: tf class (1, 2, 3-4, 5-8, 9-16, 17+) * 10 + length class (floors 0, 45,
-- 64, 91, 128, 181, 256, 362, 512, 724 terms). Immutable: changing the classes needs a new migration
-- that rebuilds kb.postings and kb.term_stats.tiers.
create function kb.posting_tier(tf integer, dl integer)
returns smallint
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select ((case when tf <= 1 then 0 when tf = 2 then 1 when tf <= 4 then 2 when tf <= 8 then 3
        when tf <= 16 then 4 else 5 end) * 10
        + (case when dl < 45 then 0 when dl < 64 then 1 when dl < 91 then 2 when dl < 128 then 3
            when dl < 181 then 4 when dl < 256 then 5 when dl < 362 then 6 when dl < 512 then 7
            when dl < 724 then 8 else 9 end))::smallint
$$;

-- The limits of a tier (kb.posting_tier): the highest tf (NULL: unbounded) and the lowest chunk length of
-- its postings. BM25's tf part grows with tf and falls with length, so these bound it.
create function kb.posting_tier_limits(tier integer, out tf_max integer, out dl_min integer)
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select (array[1, 2, 4, 8, 16, null]::integer [])[tier / 10 + 1],
        (array[0, 45, 64, 91, 128, 181, 256, 362, 512, 724])[tier % 10 + 1]
$$;

-- Rebuild the posting blocks and term tiers of one knowledge base from its chunks' term_freqs (this
-- migration, and bulk loads that write chunks directly). Idempotent; the caller holds the knowledge
-- base's row lock or is alone.
create function kb.rebuild_postings(target_kb integer)
returns void
language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    delete from kb.postings as p where p.kb_id = target_kb;

    insert into kb.postings (kb_id, term, tier, first_chunk, chunk_ids, tfs, dls)
    select target_kb, x.term, x.tier, min(x.id), array_agg(x.id order by x.id), array_agg(x.tf order by x.id),
        array_agg(x.dl order by x.id)
    from (
        select y.term, y.tier, y.id, y.tf, y.dl,
            (row_number() over (partition by y.term, y.tier order by y.id) - 1) / 128 as block
        from (
            select t.term, kb.posting_tier(t.tf::integer, c.term_count) as tier, c.id, t.tf::integer as tf,
                c.term_count as dl
            from kb.chunks as c, jsonb_each_text(c.term_freqs) as t (term, tf)
            where c.kb_id = target_kb
        ) as y
    ) as x
    group by x.term, x.tier, x.block;

    update kb.term_stats as s set tiers = m.tiers
    from (
        select p.term, bit_or(1::bigint << p.tier) as tiers
        from kb.postings as p where p.kb_id = target_kb group by p.term
    ) as m
    where s.kb_id = target_kb and s.term = m.term;
$$;

select kb.rebuild_postings(k.id)
from kb.knowledge_bases as k
order by k.id;

insert into kb.settings (key, value, description) values
(
    'lexical_leg', 'blocks',
    'BM25 leg: blocks (exact top n from kb.postings) or scan (GIN term index, within lexical_probe_budget)'
)
on conflict (key) do nothing;
