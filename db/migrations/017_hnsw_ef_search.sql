-- 017 hnsw ef_search: the vector leg's HNSW search breadth becomes a setting (it was fixed at 100 in
-- kb.vector_leg's SET clause, recall@10 0.891 on anchored vectors at 100k chunks; docs/benchmarks.md).

insert into kb.settings (key, value, description) values
(
    'hnsw_ef_search', '300',
    'hnsw.ef_search of the vector leg (kb.vector_leg): higher finds more true neighbours, costs more time'
)
on conflict (key) do nothing;
