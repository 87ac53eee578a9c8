-- 016 posting blocks: the BM25 leg reads compact posting lists instead of decompressing every candidate's
-- term_freqs (docs/benchmarks.md, "Lexical leg design"). A term's postings (chunk id, term frequency,
-- chunk length) in a knowledge base live in one of two places:
-- - its newest ones in its own kb.term_stats row (recent_ids / recent_tfs / recent_dls, aligned, fewer
--   than kb.recent_postings_limit()), which every write already rewrites: a rare term never costs more;
-- - the older ones in kb.postings, per impact tier, in blocks of about 128 postings keyed by their first
--   chunk id (ids only grow, so a list's blocks are disjoint and in id order). When a term's recent
--   postings reach the limit they move to the ends of its tiers' lists (kb.flush_recent_postings).
-- A tier is a class of (tf, chunk length): every posting of a tier has tf <= its tf ceiling and length >=
-- its length floor, so the tier bounds the BM25 tf part of its postings for any k1, b and average length.
-- kb.term_stats.tiers is the set of tiers a term has postings in (bit i = tier i), a superset after
-- deletes; blocked_to the highest chunk id ever moved to its blocks (NULL: none), so a delete probes the
-- blocks only for terms that can have some there.

-- the scan leg's kb.lexical_leg becomes kb.lexical_leg_scan (db/functions/50_search.sql); the new
-- kb.lexical_leg has a parameter of the same type in the same place under another name
drop function if exists kb.lexical_leg(text, integer[], integer, jsonb, double precision, double precision, integer);

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

alter table kb.term_stats
add column tiers bigint not null default 0,
add column recent_ids bigint[] not null default '{}',
add column recent_tfs integer[] not null default '{}',
add column recent_dls integer[] not null default '{}',
add column blocked_to bigint;

-- The impact tier of a posting: tf class (1, 2, 3-4, 5-8, 9-16, 17+) * 10 + length class (floors 0, 45,
-- 64, 91, 128, 181, 256, 362, 512, 724 terms). Immutable: changing the classes needs a new migration
-- that rebuilds kb.postings and kb.term_stats.tiers. Neither STRICT nor a SET clause, so that the planner
-- inlines it (it runs once per posting written: as a function call it cost ~7 us each, a quarter of a
-- document's write); it names no object, only integer comparisons, so the caller's search_path cannot
-- change what it does (pg_catalog is searched first).
create function kb.posting_tier(tf integer, dl integer)
returns smallint
language sql immutable parallel safe
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
    select (array[1, 2, 4, 8, 16, null]::integer[])[tier / 10 + 1],
        (array[0, 45, 64, 91, 128, 181, 256, 362, 512, 724])[tier % 10 + 1]
$$;

-- How many recent postings a term keeps in its kb.term_stats row before they move to kb.postings. Small
-- enough that the row stays well below PostgreSQL's 2 kB TOAST threshold; large enough that most terms
-- (rare ones) never need a block and a common term's move happens once per ~64 of its postings.
create function kb.recent_postings_limit()
returns integer
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$ select 64 $$;

-- Add the postings of the next 100,000 chunks of one knowledge base above chunk id after_id (in id order)
-- to its lists, from their term_freqs and the final document frequencies in kb.term_stats: terms with fewer
-- than kb.recent_postings_limit() postings keep them in their row, the others get blocks of up to 128.
-- The chunks must lie above every id already in the lists. Returns the highest chunk id added (NULL: none
-- left). For kb.rebuild_postings and bulk loads; each call is one transaction's worth of bounded work.
create function kb.append_postings(target_kb integer, after_id bigint)
returns bigint
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    lo constant bigint := after_id;
    hi bigint;
begin
    select max(c.id) into hi
    from (select c.id from kb.chunks as c where c.kb_id = target_kb and c.id > lo order by c.id limit 100000) as c;
    if hi is null then
        return null;
    end if;
    with posting as materialized (
        select t.term, c.id, t.tf::integer as tf, c.term_count as dl,
            kb.posting_tier(t.tf::integer, c.term_count) as tier,
            s.df >= kb.recent_postings_limit() as blocked
        from kb.chunks as c
        cross join lateral jsonb_each_text(c.term_freqs) as t (term, tf)
        inner join kb.term_stats as s on s.kb_id = target_kb and s.term = t.term
        where c.kb_id = target_kb and c.id > lo and c.id <= hi
    ),
    per_term as (
        update kb.term_stats as s
        set tiers = s.tiers | m.tiers, recent_ids = s.recent_ids || coalesce(m.ids, '{}'),
            recent_tfs = s.recent_tfs || coalesce(m.tfs, '{}'), recent_dls = s.recent_dls || coalesce(m.dls, '{}'),
            blocked_to = greatest(s.blocked_to, m.blocked_to)
        from (
            select p.term, bit_or(1::bigint << p.tier) as tiers,
                array_agg(p.id) filter (where not p.blocked) as ids,
                array_agg(p.tf) filter (where not p.blocked) as tfs,
                array_agg(p.dl) filter (where not p.blocked) as dls,
                max(p.id) filter (where p.blocked) as blocked_to
            from posting as p group by p.term
        ) as m
        where s.kb_id = target_kb and s.term = m.term
    )
    insert into kb.postings (kb_id, term, tier, first_chunk, chunk_ids, tfs, dls)
    select target_kb, x.term, x.tier, min(x.id), array_agg(x.id order by x.id), array_agg(x.tf order by x.id),
        array_agg(x.dl order by x.id)
    from (
        select p.term, p.tier, p.id, p.tf, p.dl,
            (row_number() over (partition by p.term, p.tier order by p.id) - 1) / 128 as block
        from posting as p where p.blocked
    ) as x
    group by x.term, x.tier, x.block;
    return hi;
end
$$;

-- Empty one knowledge base's postings (blocks, recent postings, tiers) before kb.append_postings.
create function kb.reset_postings(target_kb integer)
returns void
language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    delete from kb.postings as p where p.kb_id = target_kb;
    update kb.term_stats as s set tiers = 0, recent_ids = '{}', recent_tfs = '{}', recent_dls = '{}', blocked_to = null
    where s.kb_id = target_kb;
$$;

-- Rebuild the postings and term tiers of one knowledge base from its chunks (this migration): reset, then
-- kb.append_postings until no chunk is left, so memory and temporary space stay bounded on any size (a
-- batch ends a list's last block early). Idempotent; the caller holds the knowledge base's row lock or is
-- alone.
create function kb.rebuild_postings(target_kb integer)
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    done_to bigint := 0;
begin
    perform kb.reset_postings(target_kb);
    loop
        done_to := kb.append_postings(target_kb, done_to);
        exit when done_to is null;
    end loop;
end
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

insert into kb.settings (key, value, description) values
(
    'lexical_posting_budget', '40000',
    'BM25 leg (blocks): postings read at most per query (then the best candidates so far are scored); '
    'exact top n whenever the bounds settle it within the budget'
)
on conflict (key) do nothing;
