-- 024 API keys (issue 22): bearer keys for `pgkb serve` and `pgkb mcp --transport http` kept in the
-- database, so they can expire, be revoked without a restart and be made by their users
-- (db/functions/12_api_keys.sql). A key is "pgkb_<key_id>_<secret>": only the SHA-256 of the secret is
-- stored. No end-user role has any privilege on this table (90_grants.sql).

create table kb.api_keys (
    key_id text primary key check (key_id ~ '^[0-9a-f]{16}$'),   -- public: shown by kb.list_api_keys
    user_id bigint not null references kb.users (id) on delete cascade,
    name text not null check (char_length(name) between 1 and 100),
    secret_hash bytea not null check (octet_length(secret_hash) = 32),  -- sha256 of the secret's hex text
    created_at timestamptz not null default now(),
    expires_at timestamptz not null check (isfinite(expires_at)),
    last_used_at timestamptz,           -- recorded at most once a minute (kb.verify_api_key)
    revoked_at timestamptz
);
alter table kb.api_keys enable row level security;  -- the policy: db/functions/12_api_keys.sql
