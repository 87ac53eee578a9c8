-- 008 score fusion: kb.search and kb.hybrid_search gain a trailing `fusion` parameter ('dbsf' or
-- 'rrf'). CREATE OR REPLACE cannot add a parameter, so the old signatures are dropped here and
-- db/functions creates (and grants) the new ones in the same transaction.

drop function if exists kb.hybrid_search(
    text, integer, text, vector, text, double precision, double precision, double precision,
    double precision, integer, jsonb, double precision, double precision
);
drop function if exists kb.search(
    text, integer, text, vector, text, double precision, double precision, double precision,
    double precision, integer, jsonb, double precision, double precision
);
