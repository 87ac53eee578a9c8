-- 033 one HNSW index per model and knowledge base (issue 32, finding 3): an HNSW scan over one index for
-- every knowledge base fetched the heap rows of invisible knowledge bases near the query and dropped them,
-- so the caller's counters and buffers told how much private text lay near any vector. Each (model,
-- knowledge base) now has its own partial index, for knowledge bases of at least vector_exact_chunks chunks
-- (below, the vector leg searches exactly; kb_internal.expected_indexes: `pgkb db migrate` builds them right
-- after this migration and whenever a knowledge base has grown past that size, kb.register_embedding_model
-- for a new model), and the vector leg scans only the indexes of the knowledge bases it searches.

-- The HNSW parameters a model's indexes are built with (NULL: kb.settings hnsw_m / hnsw_ef_construction at
-- build time); kept from the model's former index where it had its own.
alter table kb.embedding_models add column hnsw_m integer check (hnsw_m between 2 and 100);
alter table kb.embedding_models add column hnsw_ef_construction integer
check (hnsw_ef_construction between 4 and 1000 and hnsw_ef_construction >= 2 * hnsw_m);

update kb.embedding_models as m
set hnsw_m = nullif(o.m, s.m), hnsw_ef_construction = nullif(o.efc, s.efc)
from (
    select
        substring(c.relname from '^embeddings_hnsw_model_(\d+)$')::integer as model_id,
        (
            select substring(r.opt from '^m=(\d+)$')::integer
            from unnest(c.reloptions) as r (opt)
            where r.opt like 'm=%'
        ) as m,
        (
            select substring(r.opt from '^ef_construction=(\d+)$')::integer
            from unnest(c.reloptions) as r (opt)
            where r.opt like 'ef\_construction=%'
        ) as efc
    from pg_class as c
    where c.relnamespace = 'kb'::regnamespace and c.relkind = 'i' and c.relname ~ '^embeddings_hnsw_model_\d+$'
) as o,
    (
        select
            (
                select case when v.value ~ '^\s*\d+\s*$' then btrim(v.value)::integer end
                from kb.settings as v
                where v.key = 'hnsw_m'
            ) as m,
            (
                select case when v.value ~ '^\s*\d+\s*$' then btrim(v.value)::integer end
                from kb.settings as v
                where v.key = 'hnsw_ef_construction'
            ) as efc
    ) as s
where m.id = o.model_id;

-- The one-model indexes go; `pgkb db migrate` creates the per-knowledge-base ones in its next step.
do $$
declare
    i record;
begin
    for i in
        select c.relname from pg_class as c
        where c.relnamespace = 'kb'::regnamespace and c.relkind = 'i' and c.relname ~ '^embeddings_hnsw_model_\d+$'
    loop
        execute format('drop index kb.%I', i.relname);
    end loop;
end
$$;

drop function if exists kb.hnsw_index_name(integer);
drop function if exists kb_internal.hnsw_index_definition(integer, integer, integer, integer);

-- Below this many chunks a knowledge base is searched exactly, with the other small ones in one scan of the
-- slice btree, instead of through its own HNSW index: a graph that small is read almost whole at the vector
-- leg's ef_search anyway, and one scan per knowledge base would add up when many are searched.
insert into kb.settings (key, value, description) values
(
    'vector_exact_chunks', '10000',
    'knowledge bases with fewer chunks are searched exactly by the vector leg (kb_internal.vector_leg), '
    || 'together, instead of one HNSW scan each'
)
on conflict (key) do nothing;
