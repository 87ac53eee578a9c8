-- API keys (kb.api_keys, migration 024): bearer keys for `pgkb serve` and `pgkb mcp --transport http`. A key
-- is "pgkb_<key_id>_<secret>": key_id is 16 hex digits, public (it names the key in lists and revocations);
-- secret is 64 hex digits (256 random bits), returned once by kb.create_api_key and stored only as its
-- SHA-256. Users make, list and revoke their own keys, administrators anyone's; only the service role
-- (pgkb_service, the servers) may check a key (kb_service.verify_api_key). No end-user role may read the table.

-- Internal: the id of the pgkb user whose keys a call manages: the caller's own for NULL or their own
-- name; another user's only for administrators (checked before the name is looked up, so nobody else
-- learns which users exist). Raises for a caller that is no pgkb user and for an unknown user.
create or replace function kb_internal.api_key_user_id(username text, action text)
returns bigint
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    me bigint := kb.current_user_id();
    uid bigint;
begin
    if username is null or username = (select u.name from kb.users as u where u.id = me) then
        if me is null then
            raise exception 'session user % is not a pgkb user: name the pgkb user to % for', session_user, action
                using errcode = 'insufficient_privilege';
        end if;
        return me;
    end if;
    perform kb.require_admin(action || ' for another user');
    uid := (select u.id from kb.users as u where u.name = username);
    if uid is null then
        raise exception 'unknown pgkb user "%"', left(username, 200) using errcode = 'no_data_found';
    end if;
    return uid;
end
$$;

-- Make an API key for a pgkb user (NULL: the caller) named `name` (1-100 characters, no control
-- characters) that stops working at expires_at (finite, in the future). Returns the key once: only its
-- hash is kept. Users make their own keys, administrators anyone's; not through a service acting for a user.
create or replace function kb.create_api_key(username text, name text, expires_at timestamptz)
returns table (key_id text, api_key text)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    -- gen_random_uuid draws from the server's strong random source; hashing 3 x 122 random bits
    -- gives 256 uniform bits (pgcrypto is not needed)
    secret text := encode(sha256(
        uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())
    ), 'hex');
    new_id text := encode(substr(sha256(uuid_send(gen_random_uuid())), 1, 8), 'hex');
    key_name text := regexp_replace(create_api_key.name, '^[[:space:]]+|[[:space:]]+$', '', 'g');
    owner_id bigint;
begin
    if nullif(current_setting('pgkb.acting_user', true), '') is not null then
        raise exception 'API keys are made by the user''s own login or an administrator, not through pgkb.acting_user'
            using errcode = 'insufficient_privilege';
    end if;
    if key_name is null or kb_internal.is_blank(key_name) then
        raise exception 'an API key needs a name (what it is for, e.g. laptop or dify)'
            using errcode = 'invalid_parameter_value';
    end if;
    if char_length(key_name) > 100 then
        raise exception 'the API key name is % characters long; at most 100 are accepted', char_length(key_name)
            using errcode = 'invalid_parameter_value';
    end if;
    if key_name ~ '[[:cntrl:]]' then
        raise exception 'the API key name contains a control character' using errcode = 'invalid_parameter_value';
    end if;
    if expires_at is null or not isfinite(expires_at) or expires_at <= now() then
        raise exception 'expires_at must be a finite time in the future, got %', coalesce(expires_at::text, 'NULL')
            using errcode = 'invalid_parameter_value', hint = 'e.g. now() + interval ''90 days''';
    end if;
    owner_id := kb_internal.api_key_user_id(username, 'create API keys');
    insert into kb.api_keys (key_id, user_id, name, secret_hash, expires_at)
    values (new_id, owner_id, key_name, sha256(convert_to(secret, 'UTF8')), create_api_key.expires_at);
    return query select new_id, 'pgkb_' || new_id || '_' || secret;
end
$$;

-- The API keys the caller may see, never their secrets: for username NULL a user's own keys (an
-- administrator: everyone's), else that user's (administrators only, unless it is the caller).
-- status is active, expired or revoked.
create or replace function kb.list_api_keys(username text default null)
returns table (
    key_id text, owner text, name text, created_at timestamptz, expires_at timestamptz,
    last_used_at timestamptz, revoked_at timestamptz, status text
)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    owner_id bigint;
begin
    if username is not null then
        owner_id := kb_internal.api_key_user_id(username, 'list API keys');
    elsif not kb.current_is_admin() then
        owner_id := kb.current_user_id();
        if owner_id is null then
            return;
        end if;
    end if;
    return query
    select k.key_id, u.name, k.name, k.created_at, k.expires_at, k.last_used_at, k.revoked_at,
        case when k.revoked_at is not null then 'revoked' when k.expires_at <= now() then 'expired'
            else 'active' end
    from kb.api_keys as k join kb.users as u on u.id = k.user_id
    where owner_id is null or k.user_id = owner_id
    order by u.name, k.created_at, k.key_id;
end
$$;

-- Revoke an API key by its key_id (16 hex digits, as kb.list_api_keys shows it): the caller's own, or
-- any for administrators. Another user's key and an unknown one give the same error and read the same rows.
-- Revoking twice keeps the first time. Returns when the key was
-- revoked; servers refuse it from then on. A whole key is refused without being echoed (see below for the log).
create or replace function kb.revoke_api_key(key_id text)
returns timestamptz
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    me bigint;
    found_id text;
    revoked timestamptz;
begin
    if key_id ~ 'pgkb_[0-9a-f]{16}_' then
        raise exception 'that is a whole API key, not its id: pass only the 16 hexadecimal digits after "pgkb_"'
            using errcode = 'invalid_parameter_value';
    end if;
    if key_id is null or key_id !~ '^[0-9a-f]{16}$' then
        -- never echoed: it may be a whole key pasted by mistake
        raise exception 'an API key id is 16 lower-case hexadecimal digits (key_id of kb.list_api_keys)'
            using errcode = 'invalid_parameter_value';
    end if;
    me := kb.current_user_id();  -- read once, whatever the id (in the query, only when a row's id matched)
    if coalesce(kb.current_is_admin(), false) then
        select k.key_id into found_id from kb.api_keys as k where k.key_id = revoke_api_key.key_id for update;
    else
        -- by owner (key_id || '' keeps the primary key out of it): another user's key is never fetched alone
        select k.key_id into found_id from kb.api_keys as k
        where k.user_id = me and k.key_id || '' = revoke_api_key.key_id for update;
    end if;
    if found_id is null then
        raise exception 'unknown API key %', key_id using errcode = 'no_data_found',
            hint = 'SELECT key_id, name FROM kb.list_api_keys() lists yours';
    end if;
    update kb.api_keys as k set revoked_at = coalesce(k.revoked_at, now())
    where k.key_id = revoke_api_key.key_id
    returning k.revoked_at into revoked;
    return revoked;
end
$$;

-- Service role only: the pgkb user of the API key whose key_id and secret's SHA-256 are given, or NULL
-- for a malformed, unknown, wrong, revoked or expired one (one answer for all). The digests are compared
-- blinded by a random nonce, so timing tells nothing of the stored hash. Records last use at most once a
-- minute per key (never on a standby or in a read-only transaction, and never waiting for a row lock).
create or replace function kb_service.verify_api_key(key_id text, secret_sha256 bytea)
returns text
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    nonce bytea := uuid_send(gen_random_uuid());
    stored bytea;
    owner_id bigint;
    revoked timestamptz;
    expires timestamptz;
begin
    if key_id is null or key_id !~ '^[0-9a-f]{16}$' or octet_length(secret_sha256) is distinct from 32 then
        return null;
    end if;
    select k.secret_hash, k.user_id, k.revoked_at, k.expires_at into stored, owner_id, revoked, expires
    from kb.api_keys as k where k.key_id = verify_api_key.key_id;
    if sha256(coalesce(stored, '\x00'::bytea) || nonce) <> sha256(secret_sha256 || nonce)
        or revoked is not null or expires <= now() then
        return null;
    end if;
    if not pg_is_in_recovery() and current_setting('transaction_read_only') = 'off' then
        perform from kb.api_keys as k
        where k.key_id = verify_api_key.key_id and (k.last_used_at is null or k.last_used_at < now() - interval '1 minute')
        for update skip locked;
        if found then
            update kb.api_keys as k set last_used_at = now() where k.key_id = verify_api_key.key_id;
        end if;
    end if;
    return (select u.name from kb.users as u where u.id = owner_id);
end
$$;

-- A whole key passed to kb.revoke_api_key by mistake would reach the server log as the failed statement's text
-- (log_min_error_statement): the function logs no statement. Only a superuser may set this; a migration by
-- another role leaves it, and the README says what log_statement does to secrets.
do $$
begin
    if (select r.rolsuper from pg_catalog.pg_roles as r where r.rolname = current_user) then
        alter function kb.revoke_api_key(text) set log_min_error_statement = panic;
    end if;
end
$$;
