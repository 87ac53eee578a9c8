-- 001 foundation: extensions, the kb schema, pgkb's group roles and the settings table.
-- Roles are cluster-wide, so they are created only when missing.

create extension if not exists vector;
create extension if not exists pg_trgm;

create schema if not exists kb;

do $roles$
begin
    -- pgkb_user: every login role that maps to a pgkb user is granted this (read + write via the API).
    if not exists (select from pg_catalog.pg_roles where rolname = 'pgkb_user') then
        create role pgkb_user nologin;
    end if;
    -- pgkb_service: may act for a named pgkb user (MCP server); never sees more than that user.
    if not exists (select from pg_catalog.pg_roles where rolname = 'pgkb_service') then
        create role pgkb_service nologin in role pgkb_user;
    end if;
    -- pgkb_admin: sees and manages everything, like the database owner.
    if not exists (select from pg_catalog.pg_roles where rolname = 'pgkb_admin') then
        create role pgkb_admin nologin;
    end if;
end
$roles$;

-- Nobody but its owner may create objects in public, where SECURITY DEFINER functions resolve the
-- vector and pg_trgm operators (PostgreSQL 15 already defaults to this; older clusters may not).
do $public$
begin
    if pg_catalog.pg_has_role(
        (select nspowner from pg_catalog.pg_namespace where nspname = 'public'), 'MEMBER'
    ) then
        revoke create on schema public from public;
    end if;
end
$public$;

create table kb.settings (
    key text primary key check (key ~ '^[a-z][a-z0-9_]*$'),
    value text not null,
    description text not null default ''
);

insert into kb.settings (key, value, description) values
(
    'embedding_url', 'http://127.0.0.1:8765/v1/embeddings',
    'OpenAI-compatible /v1/embeddings endpoint used by kb.hybrid_search to embed queries (plpython3u)'
),
('embedding_api_key', '', 'Bearer token for embedding_url; empty for none'),
('embedding_timeout_ms', '3000', 'Timeout of one query-embedding HTTP call'),
('hnsw_m', '16', 'HNSW m for indexes created by kb.register_embedding_model'),
('hnsw_ef_construction', '64', 'HNSW ef_construction for indexes created by kb.register_embedding_model');
