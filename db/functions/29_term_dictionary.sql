-- The term dictionary of a knowledge base (migration 049): each term's document frequency, posting tiers,
-- blocked_to and recent postings (31_postings.sql). Most entries live compressed in kb.term_blocks (kind 0:
-- terms in byte order, up to kb_internal.term_block_size() a block, a block's recent postings in three flat
-- arrays, recent_counts of them per term in term order; kind 1: the Chinese bigrams again, reversed, with their df only);
-- the entries written since the last compaction live in kb.term_stats, one row a term, and a row there (of
-- df 0 too: a term removed) overrides the term's block entry. Writers copy the entries they change to
-- kb.term_stats first (kb_internal.checkout_terms); kb_internal.compact_terms folds the rows back into blocks.
-- Every reader goes through the four readers below, one per shape of lookup.

-- The most terms a block holds: a lookup decompresses one block's arrays (about 12 us more a term found
-- than a row of its own, docs/benchmarks.md), a block's compressed size falls with more terms a block.
create or replace function kb_internal.term_block_size()
returns integer
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$ select 128 $$;

-- The document frequency and posting tiers of the given terms in the knowledge bases kb_ids (each id and term
-- once): a row per knowledge base that holds the term at df > 0. kb_internal.term_entries without the recent
-- postings, which it does not decompress: what the legs' term lists, the translations, the fuzzy leg's checks
-- and the answer gate read. Inlinable (not where its arguments hold a subquery, as in the translations').
create or replace function kb_internal.term_counts(kb_ids integer[], terms text[])
returns table (kb_id integer, term text, df integer, tiers bigint)
language sql stable parallel safe
as $$
    select k.id, t.term, e.df, e.tiers
    from (select distinct x.term from unnest(terms) as x (term)) as t
    cross join (select distinct x.id from unnest(kb_ids) as x (id)) as k
    cross join lateral (
        select s.df, s.tiers
        from kb.term_stats as s
        where s.kb_id = k.id and s.term = t.term
        union all
        select b.dfs[p.i], b.tiers[p.i]
        from (
            select b.terms, b.dfs, b.tiers from kb.term_blocks as b
            where b.kb_id = k.id and b.kind = 0 and b.first_term <= t.term collate "C"
            order by b.first_term desc
            limit 1
        ) as b
        -- OFFSET 0: the position is computed once, not in every expression that reads it
        cross join lateral (select array_position(b.terms, t.term collate "C") as i offset 0) as p
        where p.i is not null
        limit 1
    ) as e
    where e.df > 0
$$;

-- The entries of the given terms in the knowledge bases kb_ids (each id and term once, whatever the
-- arrays repeat): a row per knowledge base that holds the term at df > 0. Per (knowledge base, term), one
-- index lookup of its row in kb.term_stats and, only where it has none (LIMIT 1 over UNION ALL), one of the
-- last kind-0 block starting at or before it, whatever the tables' statistics. Inlined into its callers (no
-- SET clause; it names kb objects only, schema-qualified).
create or replace function kb_internal.term_entries(kb_ids integer[], terms text[])
returns table (
    kb_id integer, term text, df integer, tiers bigint, blocked_to bigint, recent_ids bigint[],
    recent_tfs integer[], recent_dls integer[]
)
language sql stable parallel safe
as $$
    select k.id, t.term, e.df, e.tiers, e.blocked_to, e.recent_ids, e.recent_tfs, e.recent_dls
    from (select distinct x.term from unnest(terms) as x (term)) as t
    cross join (select distinct x.id from unnest(kb_ids) as x (id)) as k
    cross join lateral (
        select s.df, s.tiers, s.blocked_to, s.recent_ids, s.recent_tfs, s.recent_dls
        from kb.term_stats as s
        where s.kb_id = k.id and s.term = t.term
        union all
        select b.dfs[p.i], b.tiers[p.i], b.blocked_to[p.i], b.recent_ids[r.lo + 1:r.lo + r.n],
            b.recent_tfs[r.lo + 1:r.lo + r.n], b.recent_dls[r.lo + 1:r.lo + r.n]
        from (
            select b.* from kb.term_blocks as b
            where b.kb_id = k.id and b.kind = 0 and b.first_term <= t.term collate "C"
            order by b.first_term desc
            limit 1
        ) as b
        -- OFFSET 0 and an aggregate: the position and the term's postings' place in the block's arrays are
        -- computed once, not in every expression that reads them
        cross join lateral (select array_position(b.terms, t.term collate "C") as i offset 0) as p
        cross join lateral (
            select (coalesce(sum(c.n) filter (where c.o < p.i), 0))::integer as lo,
                max(c.n) filter (where c.o = p.i) as n
            from unnest(b.recent_counts) with ordinality as c (n, o)
        ) as r
        where p.i is not null
        limit 1
    ) as e
    where e.df > 0
$$;

-- The terms of the knowledge bases kb_ids strictly between lo and hi (byte order) at df > 0, a row per
-- knowledge base, in no set order: live rows, then the entries without one of the kind-0 blocks that can hold
-- such terms. Callers bound what they read with LIMIT (the rows come as they are read): past that bound, which
-- terms are read depends on what was written since the last compaction, as it depended on index order with
-- rows alone. Inlined into its callers.
create or replace function kb_internal.term_range(kb_ids integer[], lo text, hi text)
returns table (kb_id integer, term text, df integer)
language sql stable parallel safe
as $$
    select s.kb_id, s.term, s.df
    from kb.term_stats as s
    where s.kb_id = any(kb_ids) and s.term > lo and s.term < hi and s.df > 0
    union all
    select b.kb_id, u.term, u.df
    from (select distinct x.id from unnest(kb_ids) as x (id)) as k
    cross join lateral (
        select b.kb_id, b.terms, b.dfs from kb.term_blocks as b
        where b.kb_id = k.id and b.kind = 0 and b.first_term < hi collate "C"
            and b.first_term >= coalesce((
                select max(c.first_term) from kb.term_blocks as c
                where c.kb_id = k.id and c.kind = 0 and c.first_term <= lo collate "C"
            ), '')
        order by b.first_term
    ) as b
    cross join lateral unnest(b.terms, b.dfs) as u (term, df)
    where u.term > lo collate "C" and u.term < hi collate "C" and u.df > 0
        -- a scalar subquery (never planned as a join over every row): one index lookup an entry, compared in
        -- the column's collation (in "C", the block's, the index could not take the term)
        and (select true from kb.term_stats as s where s.kb_id = b.kb_id and s.term = (u.term collate "default")) is null
$$;

-- The Chinese bigrams (two characters, not ASCII) of the knowledge bases kb_ids that end in the character
-- last, at df > 0, a row per knowledge base, in no set order: live rows (term_stats_bigram_end_idx), then
-- the kind-1 blocks of the bigrams reversed that begin with it. Callers bound what they read with LIMIT.
-- Inlined into its callers.
create or replace function kb_internal.bigrams_ending(kb_ids integer[], last text)
returns table (kb_id integer, term text, df integer)
language sql stable parallel safe
as $$
    select s.kb_id, s.term, s.df
    from kb.term_stats as s
    where s.kb_id = any(kb_ids) and right(s.term, 1) = last and length(s.term) = 2 and octet_length(s.term) > 2
        and s.df > 0
    union all
    select b.kb_id, reverse(u.key), u.df
    from (select distinct x.id from unnest(kb_ids) as x (id)) as k
    cross join lateral (
        select b.kb_id, b.terms, b.dfs from kb.term_blocks as b
        where b.kb_id = k.id and b.kind = 1 and b.first_term < last || chr(1114111) collate "C"
            and b.first_term >= coalesce((
                select max(c.first_term) from kb.term_blocks as c
                where c.kb_id = k.id and c.kind = 1 and c.first_term <= last collate "C"
            ), '')
        order by b.first_term
    ) as b
    cross join lateral unnest(b.terms, b.dfs) as u (key, df)
    where left(u.key, 1) = last and u.df > 0
        and (
            select true from kb.term_stats as s where s.kb_id = b.kb_id and s.term = (reverse(u.key) collate "default")
        ) is null
$$;

-- Internal: whether a kind-0 block of target_kb holds term (at any df, overridden or not). Inlined (no SET
-- clause; names kb objects only).
create or replace function kb_internal.block_holds(target_kb integer, term text)
returns boolean
language sql stable parallel safe
as $$
    select exists (
        select from (
            select b.terms from kb.term_blocks as b
            where b.kb_id = target_kb and b.kind = 0 and b.first_term <= term collate "C"
            order by b.first_term desc
            limit 1
        ) as b
        where term collate "C" = any(b.terms)
    )
$$;

-- Internal: every kind-0 block entry of one knowledge base (df 0 included, overridden or not), with its
-- recent postings: what kb_internal.expand_terms and kb_internal.compact_terms read. Each block's arrays are
-- read once (the postings are assigned to their terms by position, not sliced per term).
create or replace function kb_internal.block_entries(target_kb integer)
returns table (
    term text, df integer, tiers bigint, blocked_to bigint, recent_ids bigint[], recent_tfs integer[],
    recent_dls integer[]
)
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    return query
    with blocks as materialized (
        select b.first_term, b.terms, b.dfs, b.tiers, b.blocked_to, b.recent_counts, b.recent_ids, b.recent_tfs,
            b.recent_dls
        from kb.term_blocks as b
        where b.kb_id = target_kb and b.kind = 0
    ),
    entries as materialized (
        select b.first_term, u.i, u.term, u.df, u.tiers, u.blocked_to, u.n,
            sum(u.n) over (partition by b.first_term order by u.i) as e
        from blocks as b
        cross join lateral unnest(b.terms, b.dfs, b.tiers, b.blocked_to, b.recent_counts)
            with ordinality as u (term, df, tiers, blocked_to, n, i)
    ),
    posts as (
        select o.first_term, o.i, array_agg(r.id order by r.j) as ids, array_agg(r.tf order by r.j) as tfs,
            array_agg(r.dl order by r.j) as dls
        from (
            select e.first_term, e.i, g.j from entries as e cross join generate_series(e.e - e.n + 1, e.e) as g (j)
        ) as o
        inner join (
            select b.first_term, r.id, r.tf, r.dl, r.j
            from blocks as b
            cross join lateral unnest(b.recent_ids, b.recent_tfs, b.recent_dls) with ordinality as r (id, tf, dl, j)
        ) as r on r.first_term = o.first_term and r.j = o.j
        group by o.first_term, o.i
    )
    select e.term::text, e.df, e.tiers, e.blocked_to, coalesce(p.ids, '{}'), coalesce(p.tfs, '{}'),
        coalesce(p.dls, '{}')
    from entries as e
    left join posts as p on p.first_term = e.first_term and p.i = e.i;
end
$$;

-- The whole dictionary of one knowledge base: every term at df > 0 with its entry (a live row of kb.term_stats,
-- else its block entry), in no set order. What compaction writes and the tests read.
create or replace function kb_internal.term_dictionary(target_kb integer)
returns table (
    term text, df integer, tiers bigint, blocked_to bigint, recent_ids bigint[], recent_tfs integer[],
    recent_dls integer[]
)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select e.term, e.df, e.tiers, e.blocked_to, e.recent_ids, e.recent_tfs, e.recent_dls
    from kb_internal.block_entries(target_kb) as e
    where e.df > 0 and not exists (select from kb.term_stats as s where s.kb_id = target_kb and s.term = e.term)
    union all
    select s.term, s.df, s.tiers, s.blocked_to, s.recent_ids, s.recent_tfs, s.recent_dls
    from kb.term_stats as s
    where s.kb_id = target_kb and s.df > 0
$$;

-- Internal: copy the block entries of the given terms of target_kb that have no row in kb.term_stats there
-- (what a writer changes next), in term order. The caller holds the knowledge base's row lock.
create or replace function kb_internal.checkout_terms(target_kb integer, terms text[])
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into kb.term_stats as s (kb_id, term, df, tiers, blocked_to, recent_ids, recent_tfs, recent_dls)
    select target_kb, e.term, e.df, e.tiers, e.blocked_to, e.recent_ids, e.recent_tfs, e.recent_dls
    from kb_internal.term_entries(array[target_kb], terms) as e
    order by e.term
    on conflict (kb_id, term) do nothing;
end
$$;

-- Internal: move every block entry of target_kb to kb.term_stats (a row there wins) and drop its blocks:
-- before a rebuild that rewrites every entry (kb_internal.build_postings, kb_internal.recount_terms). The caller
-- holds the knowledge base's row lock or is alone.
create or replace function kb_internal.expand_terms(target_kb integer)
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into kb.term_stats as s (kb_id, term, df, tiers, blocked_to, recent_ids, recent_tfs, recent_dls)
    select target_kb, e.term, e.df, e.tiers, e.blocked_to, e.recent_ids, e.recent_tfs, e.recent_dls
    from kb_internal.block_entries(target_kb) as e
    where e.df > 0
    order by e.term
    on conflict (kb_id, term) do nothing;
    delete from kb.term_stats as s where s.kb_id = target_kb and s.df <= 0;
    delete from kb.term_blocks as b where b.kb_id = target_kb;
end
$$;

-- Internal: fold target_kb's rows of kb.term_stats into new blocks with its block entries (a row wins; df 0
-- drops the term) and empty them: kind-0 blocks of kb_internal.term_block_size() terms, kind-1 blocks of its
-- Chinese bigrams reversed. Rewrites every block of the knowledge base. The caller holds its row lock or is
-- alone; searches meanwhile read the old blocks and rows (one snapshot).
create or replace function kb_internal.compact_terms(target_kb integer)
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    block_size constant integer := kb_internal.term_block_size();
begin
    if to_regclass('pg_temp.pgkb_term_entries') is not null then   -- left by a call whose error was caught
        drop table pg_temp.pgkb_term_entries;
    end if;
    create temporary table pgkb_term_entries on commit drop as
    select e.term collate "C" as term, e.df, e.tiers, e.blocked_to, e.recent_ids, e.recent_tfs, e.recent_dls
    from kb_internal.term_dictionary(target_kb) as e;

    delete from kb.term_blocks as b where b.kb_id = target_kb;
    delete from kb.term_stats as s where s.kb_id = target_kb;

    insert into kb.term_blocks (
        kb_id, kind, first_term, n, terms, dfs, tiers, blocked_to, recent_counts, recent_ids, recent_tfs, recent_dls
    )
    with numbered as materialized (
        select e.*, (row_number() over (order by e.term) - 1) / block_size as block from pgkb_term_entries as e
    ),
    posts as (
        select e.block, array_agg(r.id order by e.term, r.j) as ids, array_agg(r.tf order by e.term, r.j) as tfs,
            array_agg(r.dl order by e.term, r.j) as dls
        from numbered as e
        cross join lateral unnest(e.recent_ids, e.recent_tfs, e.recent_dls) with ordinality as r (id, tf, dl, j)
        group by e.block
    )
    select target_kb, 0, g.first_term, g.n, g.terms, g.dfs, g.tiers, g.blocked_to, g.recent_counts,
        coalesce(p.ids, '{}'), coalesce(p.tfs, '{}'), coalesce(p.dls, '{}')
    from (
        select e.block, min(e.term) as first_term, count(*)::integer as n, array_agg(e.term order by e.term) as terms,
            array_agg(e.df order by e.term) as dfs, array_agg(e.tiers order by e.term) as tiers,
            array_agg(e.blocked_to order by e.term) as blocked_to,
            array_agg(cardinality(e.recent_ids) order by e.term) as recent_counts
        from numbered as e
        group by e.block
    ) as g
    left join posts as p on p.block = g.block
    order by g.first_term;

    insert into kb.term_blocks (
        kb_id, kind, first_term, n, terms, dfs, tiers, blocked_to, recent_counts, recent_ids, recent_tfs, recent_dls
    )
    select target_kb, 1, min(x.key), count(*)::integer, array_agg(x.key order by x.key), array_agg(x.df order by x.key),
        '{}', '{}', '{}', '{}', '{}', '{}'
    from (
        select x.key, x.df, (row_number() over (order by x.key) - 1) / block_size as block
        from (
            select reverse(e.term) collate "C" as key, e.df from pgkb_term_entries as e
            where length(e.term) = 2 and octet_length(e.term) > 2
        ) as x
    ) as x
    group by x.block
    order by 3;

    update kb.knowledge_bases as k
    set term_rows = 0, block_terms = (select count(*) from pg_temp.pgkb_term_entries)
    where k.id = target_kb;
    drop table pg_temp.pgkb_term_entries;
end
$$;

-- The rows in kb.term_stats at which a knowledge base of block_terms entries in blocks is compacted: 1024, or
-- an eighth of its entries, so that the rows never grow past a share of the dictionary and a compaction's
-- work (every block rewritten) is paid once per that many rows. Inlined (no SET clause, names no object).
create or replace function kb_internal.term_rows_bound(block_terms integer)
returns integer
language sql immutable parallel safe
as $$ select greatest(1024, block_terms / 8) $$;

-- Internal: whether target_kb's dictionary is due for compaction (kb_internal.term_rows_bound). Counts its rows
-- in kb.term_stats (up to the bound) and records the count as knowledge_bases.term_rows.
create or replace function kb_internal.terms_due(target_kb integer)
returns boolean
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    bound constant integer := (
        select kb_internal.term_rows_bound(k.block_terms) from kb.knowledge_bases as k where k.id = target_kb
    );
    counted constant integer := (
        select count(*) from (select from kb.term_stats as s where s.kb_id = target_kb limit bound) as s
    );
begin
    update kb.knowledge_bases as k set term_rows = counted where k.id = target_kb;
    return counted >= bound;
end
$$;

-- The most entries a knowledge base's dictionary may hold in blocks for a write to compact it itself: its
-- compaction then takes a few seconds at most (4 s for 148,187 terms and 1.5 million recent postings,
-- docs/benchmarks.md), well inside the servers' 10 s statement timeout; a larger one is compacted by `pgkb db
-- migrate` (kb_internal.compact_due_terms), so that no write of it can be cancelled by its compaction.
create or replace function kb_internal.inline_compaction_terms()
returns integer
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$ select 131072 $$;

-- Internal: after a write that gave up to `added` terms of target_kb a row in kb.term_stats, compact its
-- dictionary (kb_internal.compact_terms) if that is due and the knowledge base small enough
-- (kb_internal.inline_compaction_terms). knowledge_bases.term_rows counts the rows from above (each write adds
-- its terms, rows or not), so the rows are counted (kb_internal.terms_due) only when it passes the bound.
-- Returns whether it compacted. The caller holds the knowledge base's row lock.
create or replace function kb_internal.compact_terms_if_due(target_kb integer, added integer)
returns boolean
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    update kb.knowledge_bases as k set term_rows = k.term_rows + added where k.id = target_kb;
    if not exists (
        select from kb.knowledge_bases as k
        where k.id = target_kb and k.term_rows >= kb_internal.term_rows_bound(k.block_terms)
            and k.block_terms <= kb_internal.inline_compaction_terms()
    ) or not kb_internal.terms_due(target_kb) then
        return false;
    end if;
    perform kb_internal.compact_terms(target_kb);
    return true;
end
$$;

-- Compact the dictionary of every knowledge base whose compaction is due (kb_internal.terms_due), each under
-- its row lock, whatever its size; returns their names. `pgkb db migrate` runs it after the functions, every
-- time (an upgrade from before migration 049 compacts every knowledge base of 1024 terms or more here; the
-- knowledge bases too large for their writes to compact them, kb_internal.inline_compaction_terms, are
-- compacted here).
create or replace function kb_internal.compact_due_terms()
returns table (name text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    target kb.knowledge_bases;
begin
    -- term_rows counts from above: only those past their bound are counted and locked
    for target in
        select * from kb.knowledge_bases as k where k.term_rows >= kb_internal.term_rows_bound(k.block_terms) order by k.id
        for no key update
    loop
        if kb_internal.terms_due(target.id) then
            perform kb_internal.compact_terms(target.id);
            name := target.name;
            return next;
        end if;
    end loop;
end
$$;
