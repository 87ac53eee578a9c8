-- The embedding queue's worker API (pgkb worker): claim a batch of due entries under a lease, report a
-- failed batch (exponential backoff, parked after max_attempts), list and retry parked entries. Results
-- are stored with kb.store_embeddings, which also removes the entries from the queue.
--
-- Design: a claim is a short transaction that leases the entries (next_attempt_at := now() + lease) and
-- commits before any embedding is computed; the worker does NOT hold row locks while it embeds. Holding
-- FOR UPDATE locks across a model / HTTP call (seconds to minutes) would keep a transaction open that
-- long (pins the xmin horizon: no vacuum of the busy queue), tie up a connection, and block
-- kb.replace_document, whose chunk delete cascades into the locked queue rows, behind a slow embedder.
-- With a lease, FOR UPDATE SKIP LOCKED only serialises the claims themselves; a crashed worker's entries
-- become due again when the lease runs out. A worker slower than its lease may see its entries claimed
-- a second time; that costs work but no harm (kb.store_embeddings upserts).
-- attempts counts claims, so entries whose workers keep dying (say, a chunk that crashes the model) are
-- parked too rather than retried forever.
--
-- The queue has RLS with a SELECT policy only: writes must run as the owner (SECURITY DEFINER), and
-- each function checks the caller's permission itself.

-- Claim up to batch_size due, unparked queue entries of one model (NULL: the default) for one worker and
-- lease them until now() + lease; returns the chunks to embed (oldest due first). Non-admins only get
-- entries of knowledge bases they may write. Due entries already claimed max_attempts times (their
-- workers never reported back) are parked instead of being handed out again.
create or replace function kb.claim_embedding_batch(
    model text,
    batch_size integer,
    lease interval default '5 minutes',
    max_attempts integer default 5
)
returns table (chunk_id bigint, document_id bigint, title text, heading_path text[], content text)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target kb.embedding_models;
    admin boolean := kb.current_is_admin();
    writable integer [];
    claimed bigint [];
    n_lost bigint;
begin
    if batch_size is null or batch_size not between 1 and 1000 then
        raise exception 'batch_size must be between 1 and 1000, got %', coalesce(batch_size::text, 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
    if lease is null or lease < interval '1 second' or lease > interval '1 day' then
        raise exception 'lease must be between 1 second and 1 day, got %', coalesce(lease::text, 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
    if max_attempts is null or max_attempts not between 1 and 100 then
        raise exception 'max_attempts must be between 1 and 100, got %', coalesce(max_attempts::text, 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
    target := kb.resolve_model(model);
    if not admin then
        select coalesce(array_agg(k.id), '{}') into writable
        from kb.knowledge_bases as k where kb.can_write_kb(k.id);
    end if;

    -- Claim in one statement. Picked entries already claimed max_attempts times are parked instead; if
    -- that leaves nothing, pick again, so an empty result always means nothing is due.
    loop
        with picked as (
            select q.chunk_id, q.attempts >= max_attempts as lost
            from kb.embedding_queue as q
            where q.model_id = target.id and not q.parked and q.next_attempt_at <= now()
                and (admin or q.kb_id = any(writable))
            order by q.next_attempt_at, q.chunk_id
            limit batch_size
            for update skip locked
        ),
        changed as (
            update kb.embedding_queue as q
            set attempts = q.attempts + (not picked.lost)::integer,
                next_attempt_at = case when picked.lost then q.next_attempt_at else now() + lease end,
                parked = picked.lost,
                last_error = case when picked.lost then left(format(
                    'claimed %s times without a result (did the worker crash?); last error: %s',
                    q.attempts, coalesce(q.last_error, 'none')), 2000) else q.last_error end
            from picked
            where q.model_id = target.id and q.chunk_id = picked.chunk_id
            returning q.chunk_id, q.parked
        )
        select coalesce(array_agg(changed.chunk_id) filter (where not changed.parked), '{}'),
            count(*) filter (where changed.parked)
        into claimed, n_lost
        from changed;
        exit when cardinality(claimed) > 0 or n_lost = 0;
    end loop;

    return query
    select c.id, c.document_id, d.title, c.heading_path, c.content
    from kb.chunks as c
    join kb.documents as d on d.id = c.document_id
    where c.id = any(claimed)
    order by c.id;
end
$$;

-- Report that embedding these claimed chunks for one model (NULL: the default) failed: records the
-- error and retries after 30 s x 2^(attempts - 1), capped at 1 hour; entries claimed max_attempts times
-- are parked (see kb.parked_embeddings, kb_admin.retry_parked_embeddings). Unknown, already embedded or parked
-- chunk ids, and those of knowledge bases the caller may not write, are ignored alike (the answer tells
-- nothing about other users' chunks). Entries are locked in chunk id order, like kb.store_embeddings
-- does, so a late report racing a store of the same entries cannot deadlock with it.
-- Returns how many entries will be retried and how many were parked.
create or replace function kb.fail_embedding_batch(
    model text,
    chunk_ids bigint[],
    error text,
    max_attempts integer default 5
)
returns table (retrying integer, parked integer)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target kb.embedding_models;
    admin boolean := kb.current_is_admin();
begin
    if chunk_ids is null or cardinality(chunk_ids) > 100000 then
        raise exception 'chunk_ids must be an array of at most 100000 chunk ids'
            using errcode = 'invalid_parameter_value';
    end if;
    if error is null or btrim(error) = '' then
        raise exception 'error must be a non-empty message' using errcode = 'invalid_parameter_value';
    end if;
    if max_attempts is null or max_attempts not between 1 and 100 then
        raise exception 'max_attempts must be between 1 and 100, got %', coalesce(max_attempts::text, 'NULL')
            using errcode = 'invalid_parameter_value';
    end if;
    target := kb.resolve_model(model);
    return query
    with locked as (
        select l.chunk_id from kb.embedding_queue as l
        where l.model_id = target.id and l.chunk_id = any(chunk_ids) and not l.parked
            and (admin or kb.can_write_kb(l.kb_id))
        order by l.chunk_id
        for update
    ),
    failed as (
        update kb.embedding_queue as q
        set last_error = left(error, 2000),
            parked = q.attempts >= max_attempts,
            next_attempt_at = now() + least(
                interval '30 seconds' * power(2, least(greatest(q.attempts - 1, 0), 10)), interval '1 hour'
            )
        from locked
        where q.model_id = target.id and q.chunk_id = locked.chunk_id
        returning q.parked
    )
    select (count(*) filter (where not f.parked))::integer, (count(*) filter (where f.parked))::integer
    from failed as f;
end
$$;

-- Admin: parked queue entries (embedding gave up after repeated failures) with where they come from.
-- security_invoker: the queue's RLS and the caller's own table privileges apply (pgkb_admin may read the
-- tables, pgkb_user is not granted the view); the current_is_admin() filter keeps it empty for anyone
-- else even if it is granted by mistake.
create or replace view kb.parked_embeddings with (security_invoker = true) as
select
    k.name as kb,
    d.doc_key,
    c.ordinal,
    m.name as model,
    q.attempts,
    q.last_error,
    q.enqueued_at,
    q.chunk_id
from kb.embedding_queue as q
inner join kb.chunks as c on q.chunk_id = c.id
inner join kb.documents as d on c.document_id = d.id
inner join kb.knowledge_bases as k on q.kb_id = k.id
inner join kb.embedding_models as m on q.model_id = m.id
where q.parked and (select kb.current_is_admin());

-- Admin: unpark the parked entries of one model (NULL: all models) so workers try them again from
-- attempt 0, at once; last_error is kept until the next failure. Wakes waiting workers. Returns the
-- number of entries unparked.
create or replace function kb_admin.retry_parked_embeddings(model text default null)
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_id integer;
    n integer;
begin
    perform kb.require_admin('retry parked embeddings');
    if model is not null then
        target_id := (kb.resolve_model(model)).id;
    end if;
    update kb.embedding_queue as q
    set parked = false, attempts = 0, next_attempt_at = now()
    where q.parked and (target_id is null or q.model_id = target_id);
    get diagnostics n = row_count;
    if n > 0 then
        perform pg_notify('pgkb_embedding_queue', 'retry');
    end if;
    return n;
end
$$;
