-- The embedding queue's backlog for operators: what the servers' /metrics report, so an alert can say the
-- worker falls behind or chunks are parked. Totals over every knowledge base; callable by pgkb_service (the
-- servers' role, which may act for any user, so totals tell it nothing new) and pgkb_admin, not by users.

-- Per registered model: chunks waiting for an embedding (queued, including those backing off after a
-- failure), chunks given up on (parked, see kb.parked_embeddings) and the age in seconds of the oldest
-- queued entry (NULL when none is queued). Counts only: no chunk, document or knowledge base is named.
create or replace function kb_service.embedding_backlog()
returns table (model text, queued bigint, parked bigint, oldest_queued_seconds double precision)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select m.name,
        count(q.chunk_id) filter (where not q.parked),
        count(q.chunk_id) filter (where q.parked),
        extract(epoch from clock_timestamp() - min(q.enqueued_at) filter (where not q.parked))::float8
    from kb.embedding_models as m
    left join kb.embedding_queue as q on q.model_id = m.id
    group by m.id, m.name
    order by m.id
$$;
