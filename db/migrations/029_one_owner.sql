-- 029 one owner for each rule (issue 23, items 1 and 2). kb.ask takes the caller's query embedding (and
-- model, vector weight) as kb.hybrid_search does, and kb.retrieve a vector weight, so a client whose own
-- embedding failed turns the vector leg off instead of having the database try again: new signatures,
-- re-created by db/functions (66_ask.sql, 58_retrieve.sql) in this same `pgkb db migrate`.

drop function if exists kb.ask(text, integer, text, jsonb, text, boolean);
drop function if exists kb_internal.ask_answer(text, integer, text, jsonb, text, boolean);
drop function if exists kb.retrieve(text, integer, text, vector, text, jsonb, double precision);
