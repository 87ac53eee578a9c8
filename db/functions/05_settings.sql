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

-- The value of an integer setting; raises when the key is missing or its value is not an integer.
create or replace function kb_internal.setting_int(key text)
returns integer
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    raw text := kb_internal.setting(key);
begin
    if raw !~ '^\s*-?\d{1,9}\s*$' then
        raise exception 'setting "%" must be an integer, not "%"', key, left(raw, 50)
            using errcode = 'invalid_parameter_value';
    end if;
    return raw::integer;
end
$$;

-- The value of a numeric setting; raises when the key is missing or its value is not a finite number.
create or replace function kb_internal.setting_number(key text)
returns double precision
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    raw text := kb_internal.setting(key);
begin
    if raw !~ '^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d{1,3})?\s*$' then
        raise exception 'setting "%" must be a number, not "%"', key, left(raw, 50)
            using errcode = 'invalid_parameter_value';
    end if;
    return raw::double precision;
end
$$;
