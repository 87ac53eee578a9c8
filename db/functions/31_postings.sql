-- Posting blocks (kb.postings, migrations 016 and 018): the BM25 leg's inverted lists. A term's postings
-- in a knowledge base are its newest ones in its kb.term_stats row (recent_ids / recent_tfs / recent_dls,
-- fewer than kb_internal.recent_postings_limit()) and the older ones in blocks per (knowledge base, term, impact
-- tier, first chunk id) of up to kb_internal.posting_block_size() postings, in id order. Builds and appends keep a
-- (term, tier) list cut into full blocks from its start, only its last block with room (since
-- postings_format 2, migration 030); a delete leaves the blocks it touched smaller.
--
-- Block payload (format 3): n postings of one tier, sorted by chunk id, in three runs:
--   chunk id gap             n x id_bytes: each id minus the one before it (0 for the first, which is
--                            first_chunk); id_bytes 1 when every gap is below 256, 2 below 65536, 4 below
--                            2^32, else 8 (formats 1 and 2 stored each id minus first_chunk: gaps are narrower)
--   term frequency           n x tf_bytes (0 for tf classes 1 and 2: the tier says it; 1 for 3..16; 4 for 17+)
--   chunk length - floor     n x dl_bytes (1 for length classes 0-8: none is 256 wide; 4 for 724+)
-- all unsigned big-endian; id_bytes = octet_length(payload) / n - tf_bytes - dl_bytes. kb_internal.encode_postings
-- writes it; kb_internal.decode_postings (SQL) and kb_internal.lexical_leg_numpy (numpy) read it, and tests hold them equal.

-- The impact tier of a posting: tf class (1, 2, 3-4, 5-8, 9-16, 17+) * 10 + length class (floors 0, 45,
-- 64, 91, 128, 181, 256, 362, 512, 724 terms). Immutable: changing the classes needs a new migration
-- that rebuilds kb.postings and kb.term_stats.tiers. Neither STRICT nor a SET clause, so that the planner
-- inlines it (it runs once per posting written: as a function call it cost ~7 us each, a quarter of a
-- document's write); it names no object, only integer comparisons, so the caller's search_path cannot
-- change what it does (pg_catalog is searched first).
create or replace function kb_internal.posting_tier(tf integer, dl integer)
returns smallint
language sql immutable parallel safe
as $$
    select ((case when tf <= 1 then 0 when tf = 2 then 1 when tf <= 4 then 2 when tf <= 8 then 3
        when tf <= 16 then 4 else 5 end) * 10
        + (case when dl < 45 then 0 when dl < 64 then 1 when dl < 91 then 2 when dl < 128 then 3
            when dl < 181 then 4 when dl < 256 then 5 when dl < 362 then 6 when dl < 512 then 7
            when dl < 724 then 8 else 9 end))::smallint
$$;

-- The limits of a tier (kb_internal.posting_tier): the highest tf (NULL: unbounded) and the lowest chunk length of
-- its postings. BM25's tf part grows with tf and falls with length, so these bound it.
create or replace function kb_internal.posting_tier_limits(tier integer, out tf_max integer, out dl_min integer)
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select (array[1, 2, 4, 8, 16, null]::integer[])[tier / 10 + 1],
        (array[0, 45, 64, 91, 128, 181, 256, 362, 512, 724])[tier % 10 + 1]
$$;

-- How many recent postings a term keeps in its kb.term_stats row before they move to kb.postings. Small
-- enough that the row stays well below PostgreSQL's 2 kB TOAST threshold; large enough that most terms
-- (rare ones) never need a block and a common term's move happens once per ~64 of its postings.
create or replace function kb_internal.recent_postings_limit()
returns integer
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$ select 64 $$;

-- The format of a knowledge base's posting lists that kb_internal.build_postings writes and the searches expect
-- (kb.knowledge_bases.postings_format; 54_postings_rebuild.sql rebuilds the lists of older ones): 3, ids
-- stored as gaps (migration 031); 2, a list cut into full blocks from its start (migration 030); 1, blocks
-- cut at every 100,000 chunks built.
create or replace function kb_internal.postings_format()
returns smallint
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$ select 3::smallint $$;

-- The most postings a block holds: a flush of recent postings rewrites at most a list's last block, a
-- delete the blocks that held the removed postings.
create or replace function kb_internal.posting_block_size()
returns integer
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$ select 256 $$;

-- The payload field widths of a tier's blocks (see the format above) and what they are relative to: the
-- tf a tier implies (tf_bytes = 0) and the tier's length floor. No SET clause (it names no object), so
-- that the decoder that calls it stays inlinable.
create or replace function kb_internal.posting_fields(
    tier integer, out tf_bytes integer, out dl_bytes integer, out tf_fixed integer, out dl_min integer
)
language sql immutable parallel safe
as $$
    select case when tier / 10 <= 1 then 0 when tier / 10 <= 4 then 1 else 4 end,
        case when tier % 10 <= 8 then 1 else 4 end,
        tier / 10 + 1,
        (array[0, 45, 64, 91, 128, 181, 256, 362, 512, 724])[tier % 10 + 1]
$$;

-- The unsigned big-endian integer of width bytes (0, 1, 2, 4 or 8) at offset o of p (0 for width 0; an
-- 8-byte one is below 2^63: chunk ids are bigint).
-- Inlined (no SET clause, names no object).
create or replace function kb_internal.payload_uint(p bytea, o integer, width integer)
returns bigint
language sql immutable parallel safe
as $$
    select case width
        when 0 then 0::bigint
        when 1 then get_byte(p, o)::bigint
        when 2 then (get_byte(p, o) << 8 | get_byte(p, o + 1))::bigint
        -- << and | bind alike, left to right: every shift in its own parentheses
        when 4 then (get_byte(p, o)::bigint << 24) | (get_byte(p, o + 1) << 16) | (get_byte(p, o + 2) << 8)
            | get_byte(p, o + 3)
        else (get_byte(p, o)::bigint << 56) | (get_byte(p, o + 1)::bigint << 48) | (get_byte(p, o + 2)::bigint << 40)
            | (get_byte(p, o + 3)::bigint << 32) | (get_byte(p, o + 4)::bigint << 24) | (get_byte(p, o + 5) << 16)
            | (get_byte(p, o + 6) << 8) | get_byte(p, o + 7)
    end
$$;

-- The payload of one block: postings of the given tier, ids ascending (ids[1] is its first_chunk), tfs and
-- lengths inside the tier's classes (kb_internal.posting_tier).
create or replace function kb_internal.encode_postings(tier integer, ids bigint[], tfs integer[], dls integer[])
returns bytea
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select string_agg(substring(int8send(x.gap) from 9 - w.id_bytes), ''::bytea order by x.o)
        || coalesce(string_agg(substring(int8send(x.tf::bigint) from 9 - f.tf_bytes), ''::bytea order by x.o)
            filter (where f.tf_bytes > 0), '')
        || string_agg(substring(int8send((x.dl - f.dl_min)::bigint) from 9 - f.dl_bytes), ''::bytea order by x.o)
    from kb_internal.posting_fields(tier) as f
    cross join (
        select case when g.widest < 256 then 1 when g.widest < 65536 then 2 when g.widest < 4294967296 then 4
            else 8 end as id_bytes
        from (select coalesce(max(ids[i + 1] - ids[i]), 0) as widest
            from generate_series(1, cardinality(ids) - 1) as i) as g
    ) as w
    cross join (
        select u.o, u.tf, u.dl, u.id - coalesce(lag(u.id) over (order by u.o), u.id) as gap
        from unnest(ids, tfs, dls) with ordinality as u (id, tf, dl, o)
    ) as x
$$;

-- The postings of one block (kb.postings row), in id order. Inlined into the SQL leg's reads (no SET
-- clause; it names only kb functions, schema-qualified).
create or replace function kb_internal.decode_postings(tier integer, first_chunk bigint, n integer, payload bytea)
returns table (chunk_id bigint, tf integer, dl integer)
language sql immutable parallel safe
as $$
    select first_chunk + sum(kb_internal.payload_uint(payload, i * w.id_bytes, w.id_bytes)) over (order by i)::bigint,
        case when f.tf_bytes = 0 then f.tf_fixed
            else kb_internal.payload_uint(payload, n * w.id_bytes + i * f.tf_bytes, f.tf_bytes)::integer end,
        f.dl_min + kb_internal.payload_uint(payload, n * (w.id_bytes + f.tf_bytes) + i * f.dl_bytes, f.dl_bytes)::integer
    from kb_internal.posting_fields(tier) as f
    cross join lateral (select octet_length(payload) / n - f.tf_bytes - f.dl_bytes as id_bytes) as w
    cross join generate_series(0, n - 1) as i
    order by i
$$;

-- Internal: the postings of the last block of each given list (terms[i], tiers[i]) of target_kb that has
-- room (fewer than kb_internal.posting_block_size() postings): what an append to those lists refills, so that a
-- list stays cut into full blocks from its start (kb_internal.flush_recent_postings, kb_internal.build_postings_batch).
-- PL/pgSQL, like every function here that names a table (see kb_internal.clear_postings).
create or replace function kb_internal.refillable_postings(target_kb integer, terms text[], tiers integer[])
returns table (term text, tier integer, chunk_id bigint, tf integer, dl integer)
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    return query
    select g.term, g.tier, d.chunk_id, d.tf, d.dl
    from unnest(terms, tiers) as g (term, tier)
    cross join lateral (
        select q.first_chunk, q.n, q.payload from kb.postings as q
        where q.kb_id = target_kb and q.term = g.term and q.tier = g.tier
        order by q.first_chunk desc
        limit 1
    ) as t
    cross join lateral kb_internal.decode_postings(g.tier, t.first_chunk, t.n, t.payload) as d
    where t.n < kb_internal.posting_block_size();
end
$$;

-- Internal: move the recent postings of the given terms (kb.term_stats.recent_*) to the ends of their
-- tiers' lists, refilling a list's last block up to kb_internal.posting_block_size() (kb_internal.refillable_postings:
-- decoded and written again in place), else starting new ones; their rows keep none and remember the
-- highest id moved (blocked_to). Called by kb_internal.adjust_term_stats under the knowledge base's row lock (so
-- moved ids are above every id in the lists).
create or replace function kb_internal.flush_recent_postings(target_kb integer, terms text[])
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    block_size constant integer := kb_internal.posting_block_size();
begin
    with moving as materialized (
        select s.term, s.recent_ids, s.recent_tfs, s.recent_dls
        from kb.term_stats as s
        where s.kb_id = target_kb and s.term = any(terms) and cardinality(s.recent_ids) > 0
    ),
    cleared as (
        update kb.term_stats as s
        set recent_ids = '{}', recent_tfs = '{}', recent_dls = '{}',
            blocked_to = (select max(x.id) from unnest(m.recent_ids) as x (id))
        from moving as m
        where s.kb_id = target_kb and s.term = m.term
    ),
    moved as materialized (
        select m.term, kb_internal.posting_tier(x.tf, x.dl)::integer as tier, x.id, x.tf, x.dl
        from moving as m, unnest(m.recent_ids, m.recent_tfs, m.recent_dls) as x (id, tf, dl)
    ),
    merged as (
        select r.term, r.tier, r.chunk_id as id, r.tf, r.dl
        from (select array_agg(g.term) as terms, array_agg(g.tier) as tiers
            from (select distinct m.term, m.tier from moved as m) as g) as g
        cross join lateral kb_internal.refillable_postings(target_kb, g.terms, g.tiers) as r
        union all
        select m.term, m.tier, m.id, m.tf, m.dl from moved as m
    ),
    blocks as (
        select x.term, x.tier, array_agg(x.id order by x.id) as ids, array_agg(x.tf order by x.id) as tfs,
            array_agg(x.dl order by x.id) as dls
        from (
            select m.*, (row_number() over (partition by m.term, m.tier order by m.id) - 1) / block_size as block
            from merged as m
        ) as x
        group by x.term, x.tier, x.block
    )
    insert into kb.postings (kb_id, term, tier, first_chunk, n, payload)
    select target_kb, b.term, b.tier, b.ids[1], cardinality(b.ids), kb_internal.encode_postings(b.tier, b.ids, b.tfs, b.dls)
    from blocks as b
    order by b.term, b.tier, b.ids[1]
    -- a refilled last block keeps its first chunk id: it is written again in place
    on conflict (kb_id, term, tier, first_chunk) do update set n = excluded.n, payload = excluded.payload;
end
$$;

-- Internal: remove the given postings (chunk id, term, tf, chunk length; aligned arrays) of the given terms
-- from the blocks that hold them (blocks left empty go; the others are written again). Per (term, tier) only
-- the blocks that can hold a removed id are read: from the last one starting at or before the lowest id to
-- the last one starting at or before the highest. Called by kb_internal.adjust_term_stats under the knowledge base's row lock.
create or replace function kb_internal.remove_block_postings(
    target_kb integer, chunk_ids bigint[], chunk_terms text[], tfs integer[], dls integer[], terms text[]
)
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    with removed as materialized (
        select x.term, kb_internal.posting_tier(x.tf, x.dl) as tier, array_agg(x.id) as ids,
            min(x.id) as lo, max(x.id) as hi
        from unnest(chunk_ids, chunk_terms, tfs, dls) as x (id, term, tf, dl)
        inner join (select distinct w.term from unnest(terms) as w (term)) as w on x.term = w.term
        group by 1, 2
    ),
    touched as materialized (
        select p.term, p.tier, p.first_chunk, k.ids, k.id_list, k.tf_list, k.dl_list
        from removed as g
        inner join kb.postings as p
            on p.kb_id = target_kb and p.term = g.term and p.tier = g.tier and p.first_chunk <= g.hi
            and p.first_chunk >= coalesce((
                select max(q.first_chunk) from kb.postings as q
                where q.kb_id = target_kb and q.term = g.term and q.tier = g.tier and q.first_chunk <= g.lo
            ), g.lo)
        cross join lateral (
            select g.ids, array_agg(d.chunk_id order by d.chunk_id) filter (where d.chunk_id <> all(g.ids)) as id_list,
                array_agg(d.tf order by d.chunk_id) filter (where d.chunk_id <> all(g.ids)) as tf_list,
                array_agg(d.dl order by d.chunk_id) filter (where d.chunk_id <> all(g.ids)) as dl_list,
                bool_or(d.chunk_id = any(g.ids)) as hit
            from kb_internal.decode_postings(p.tier, p.first_chunk, p.n, p.payload) as d
        ) as k
        where k.hit
    ),
    dropped as (
        delete from kb.postings as p
        using touched as t
        where t.id_list is null and p.kb_id = target_kb and p.term = t.term and p.tier = t.tier
            and p.first_chunk = t.first_chunk
    )
    -- a block's new first chunk id stays below the next block's, so the key stays unique
    update kb.postings as p
    set first_chunk = t.id_list[1], n = cardinality(t.id_list),
        payload = kb_internal.encode_postings(t.tier, t.id_list, t.tf_list, t.dl_list)
    from touched as t
    where t.id_list is not null and p.kb_id = target_kb and p.term = t.term and p.tier = t.tier
        and p.first_chunk = t.first_chunk;
end
$$;

-- Add the postings of the next `chunks` chunks of one knowledge base above chunk id after_id (in id order)
-- to its lists, from their terms (kb.chunk_terms) and the final document frequencies in kb.term_stats: terms
-- with fewer than kb_internal.recent_postings_limit() postings keep them in their row, the others are appended
-- to their tiers' lists, refilling each list's last block (kb_internal.refillable_postings) and then in blocks
-- of kb_internal.posting_block_size(). The chunks must lie above every id already in the lists. Returns the highest
-- chunk id added (NULL: none left). kb_internal.build_postings's steps where the server has no numpy (a refilled
-- block is written again, so the table holds dead rows until VACUUM); bounded work per call.
create or replace function kb_internal.build_postings_batch(target_kb integer, after_id bigint, chunks integer default 100000)
returns bigint
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    lo constant bigint := after_id;
    block_size constant integer := kb_internal.posting_block_size();
    hi bigint;
begin
    select max(c.id) into hi
    from (select c.id from kb.chunks as c where c.kb_id = target_kb and c.id > lo order by c.id limit chunks) as c;
    if hi is null then
        return null;
    end if;
    with posting as materialized (
        select t.term, c.id, t.tf, c.term_count as dl,
            kb_internal.posting_tier(t.tf, c.term_count)::integer as tier,
            s.df >= kb_internal.recent_postings_limit() as blocked
        from kb.chunks as c
        inner join kb.documents as d on c.document_id = d.id
        cross join lateral kb.chunk_terms(d.title, c.heading_path, c.content) as t
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
    ),
    merged as (
        select r.term, r.tier, r.chunk_id as id, r.tf, r.dl
        from (select array_agg(g.term) as terms, array_agg(g.tier) as tiers
            from (select distinct p.term, p.tier from posting as p where p.blocked) as g) as g
        cross join lateral kb_internal.refillable_postings(target_kb, g.terms, g.tiers) as r
        union all
        select p.term, p.tier, p.id, p.tf, p.dl from posting as p where p.blocked
    )
    insert into kb.postings (kb_id, term, tier, first_chunk, n, payload)
    select target_kb, x.term, x.tier, min(x.id), count(*),
        kb_internal.encode_postings(x.tier, array_agg(x.id order by x.id), array_agg(x.tf order by x.id),
            array_agg(x.dl order by x.id))
    from (
        select m.term, m.tier, m.id, m.tf, m.dl,
            (row_number() over (partition by m.term, m.tier order by m.id) - 1) / block_size as block
        from merged as m
    ) as x
    group by x.term, x.tier, x.block
    -- a refilled last block keeps its first chunk id: it is written again in place
    on conflict (kb_id, term, tier, first_chunk) do update set n = excluded.n, payload = excluded.payload;
    return hi;
end
$$;

-- Empty one knowledge base's postings (blocks, recent postings, tiers) before kb_internal.build_postings_batch, its
-- dictionary entries out of their blocks (kb_internal.expand_terms).
-- PL/pgSQL (its statements are checked when run, not when created), like every function here that names
-- a table, so that today's functions apply to a schema before migration 016 (upgrade tests).
create or replace function kb_internal.clear_postings(target_kb integer)
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    delete from kb.postings as p where p.kb_id = target_kb;
    if to_regclass('kb.term_blocks') is not null then    -- NULL: a schema before migration 049
        perform kb_internal.expand_terms(target_kb);     -- every entry is rewritten: a row each meanwhile
    end if;
    update kb.term_stats as s set tiers = 0, recent_ids = '{}', recent_tfs = '{}', recent_dls = '{}', blocked_to = null
    where s.kb_id = target_kb;
end
$$;

-- Rebuild the postings and term tiers of one knowledge base from its chunks: with kb_internal.build_postings_numpy
-- where the server has numpy (one pass over the chunks, each list written once), else reset and then
-- kb_internal.build_postings_batch until no chunk is left (SQL, several times slower); memory and temporary space
-- stay bounded on any size. Records the format built. Idempotent; the caller holds the knowledge base's
-- row lock or is alone. Both paths take the dictionary's entries out of their blocks; it is compacted at the end.
create or replace function kb_internal.build_postings(target_kb integer)
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    done_to bigint := 0;
    with_numpy boolean := false;
    -- false on a schema older than migration 049: the dictionary is kb.term_stats alone
    with_blocks constant boolean := to_regclass('kb.term_blocks') is not null;
begin
    -- 53_postings_build_numpy.sql, where plpython3u is; separate IFs, so the calls are planned only where
    -- they exist
    if to_regprocedure('kb_internal.build_postings_numpy(integer, integer)') is not null then
        with_numpy := kb_internal.numpy_available();
    end if;
    if with_numpy then
        perform kb_internal.build_postings_numpy(target_kb);     -- resets what it replaces itself
    else
        perform kb_internal.clear_postings(target_kb);
        loop
            done_to := kb_internal.build_postings_batch(target_kb, done_to);
            exit when done_to is null;
        end loop;
    end if;
    update kb.knowledge_bases set postings_format = kb_internal.postings_format() where id = target_kb;
    if with_blocks then
        perform kb_internal.compact_terms(target_kb);
    end if;
end
$$;

-- Count one knowledge base's terms again from its chunks' text (kb.chunk_terms with today's term model): each
-- chunk's length in terms, the document frequencies in kb.term_stats, N and the total length, then its postings
-- (kb_internal.build_postings); records kb_internal.terms_version(). What `pgkb db migrate` runs for a knowledge
-- base counted with an older term model (kb_internal.recount_old_terms). The caller holds the row lock or is alone.
create or replace function kb_internal.recount_terms(target_kb integer)
returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    update kb.chunks as c set term_count = x.n
    from (
        select c.id, cardinality(kb.lexical_terms(kb.indexed_text(d.title, c.heading_path, c.content))) as n
        from kb.chunks as c inner join kb.documents as d on c.document_id = d.id
        where c.kb_id = target_kb
    ) as x
    where c.id = x.id and c.term_count is distinct from x.n;
    delete from kb.postings as p where p.kb_id = target_kb;
    delete from kb.term_stats as s where s.kb_id = target_kb;
    if to_regclass('kb.term_blocks') is not null then
        delete from kb.term_blocks as b where b.kb_id = target_kb;
    end if;
    insert into kb.term_stats (kb_id, term, df)
    select target_kb, t.term, count(*)
    from kb.chunks as c
    inner join kb.documents as d on c.document_id = d.id
    cross join lateral kb.chunk_terms(d.title, c.heading_path, c.content) as t
    where c.kb_id = target_kb
    group by t.term;
    update kb.knowledge_bases as k
    set chunk_count = x.n, term_total = x.terms, terms_version = kb_internal.terms_version()
    from (
        select count(*) as n, coalesce(sum(c.term_count), 0) as terms from kb.chunks as c where c.kb_id = target_kb
    ) as x
    where k.id = target_kb;
    perform kb_internal.build_postings(target_kb);
end
$$;

-- Admin: count a knowledge base's terms again (kb_internal.recount_terms), for one whose statistics no longer
-- match its text (`pgkb db doctor` samples them: a PostgreSQL upgrade that changed Unicode normalisation, a
-- hand edit of a title or a chunk). Writers of it wait meanwhile. An unknown name: kb.resolve_kb's error.
create or replace function kb_admin.recount_terms(kb text)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer;
begin
    perform kb.require_admin('count terms again');
    target_kb := kb.resolve_kb(recount_terms.kb);
    perform from kb.knowledge_bases as k where k.id = target_kb for no key update;
    perform kb_internal.recount_terms(target_kb);
end
$$;

-- Count again (kb_internal.recount_terms) every knowledge base counted with an older term model (terms_version
-- below kb_internal.terms_version(); migration 047 marks those whose stored terms differed from their text's),
-- each under its row lock; returns their names. `pgkb db migrate` runs it after the functions, every time.
create or replace function kb_internal.recount_old_terms()
returns table (name text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    target kb.knowledge_bases;
begin
    for target in
        select * from kb.knowledge_bases as k where k.terms_version < kb_internal.terms_version() order by k.id
        for no key update
    loop
        perform kb_internal.recount_terms(target.id);
        name := target.name;
        return next;
    end loop;
end
$$;
