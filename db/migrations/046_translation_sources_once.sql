-- 046 kb_internal.query_translations takes the question's translation sources when its caller has them
-- (kb_internal.translated_question computed them twice per question: for the translations and for the count
-- of the question's dictionary words). The two-argument function is dropped; db/functions defines the new one,
-- whose third argument defaults to NULL (computed there), so every other caller is unchanged.

drop function if exists kb_internal.query_translations(text, integer[]);
