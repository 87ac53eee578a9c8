-- 048 kb_internal.query_translations gives each translation term's posting tiers beside its df, and takes the
-- question's terms when its caller has them: kb_internal.lexical_query_terms read both again for every
-- translation term, and computed the question's terms twice. The three-argument function is dropped;
-- db/functions defines the new one (its fourth argument defaults to NULL, so other callers are unchanged).

drop function if exists kb_internal.query_translations(text, integer[], jsonb);
