-- 023 fuzzy leg signatures: a database migrated to 022 with the first functions of the fuzzy leg (commit
-- 1f5602f) holds kb.lexical_query_terms and kb.lexical_hits with other result columns; drop them so that
-- db/functions can create today's (a fresh database has neither: nothing to do).

drop function if exists kb.lexical_query_terms(text, integer[], jsonb);
drop function if exists kb.lexical_hits(
    text, integer[], integer, jsonb, double precision, double precision, jsonb
);
