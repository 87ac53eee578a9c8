-- 015 metadata conditions: kb.search and kb.hybrid_search gain a trailing `metadata_condition` parameter
-- (Dify-style conditions on document metadata, see db/functions/48_metadata_filter.sql), and kb.retrieve
-- scores hits on an absolute 0..1 scale. CREATE OR REPLACE cannot add a parameter, so the old signatures
-- are dropped here and db/functions creates (and grants) the new ones in the same transaction.

drop function if exists kb.hybrid_search(
    text, integer, text, vector, text, double precision, double precision, double precision,
    double precision, integer, jsonb, double precision, double precision, text
);
drop function if exists kb.search(
    text, integer, text, vector, text, double precision, double precision, double precision,
    double precision, integer, jsonb, double precision, double precision, text
);

insert into kb.settings (key, value, description) values
(
    'relevance_cosine_floor', '0.76',
    'kb.retrieve: the cosine similarity that maps to relevance 0 (1 maps to 1); measured for '
    || 'multilingual-e5-small, whose unrelated passages score up to ~0.86 and relevant ones from ~0.89'
)
on conflict (key) do nothing;
