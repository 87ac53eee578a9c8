-- The one reader of kb.settings for every function. Migrations seed every key with its default, so the
-- table is the single place a default lives; a missing or malformed value is a configuration error, not a
-- silent fallback to a literal written somewhere else.

-- The value of a setting; raises when the key is missing.
create or replace function kb_internal.setting(key text)
returns text
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    val text;
begin
    select s.value into val from kb.settings as s where s.key = setting.key;
    if not found then
        raise exception 'setting "%" is missing from kb.settings', key using errcode = 'undefined_object',
            hint = 'run pgkb db migrate, or insert the key with its value';
    end if;
    return val;
end
$$;

-- The values of several settings, in the order of keys (one read of kb.settings for a caller that needs
-- many, e.g. kb.search_defaults); raises when a key is missing.
create or replace function kb_internal.settings_of(keys text[])
returns text[]
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    vals text[];
    missing text;
begin
    select array_agg(s.value order by k.n), min(k.key) filter (where s.key is null) into vals, missing
    from unnest(keys) with ordinality as k (key, n)
    left join kb.settings as s on s.key = k.key;
    if missing is not null then
        perform kb_internal.setting(missing);  -- raises: its error, the one for a missing key
    end if;
    return vals;
end
$$;

-- The integer value raw of setting key; raises when it is not an integer.
create or replace function kb_internal.as_int(key text, raw text)
returns integer
language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if raw !~ '^\s*-?\d{1,9}\s*$' then
        raise exception 'setting "%" must be an integer, not "%"', key, left(raw, 50)
            using errcode = 'invalid_parameter_value';
    end if;
    return raw::integer;
end
$$;

-- The numeric value raw of setting key; raises when it is not a finite number.
create or replace function kb_internal.as_number(key text, raw text)
returns double precision
language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if raw !~ '^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d{1,3})?\s*$' then
        raise exception 'setting "%" must be a number, not "%"', key, left(raw, 50)
            using errcode = 'invalid_parameter_value';
    end if;
    return raw::double precision;
end
$$;

-- The value of an integer setting; raises when the key is missing or its value is not an integer.
create or replace function kb_internal.setting_int(key text)
returns integer
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    return kb_internal.as_int(key, kb_internal.setting(key));
end
$$;

-- The value of a numeric setting; raises when the key is missing or its value is not a finite number.
create or replace function kb_internal.setting_number(key text)
returns double precision
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    return kb_internal.as_number(key, kb_internal.setting(key));
end
$$;
