-- Redaction of HTTP endpoint secrets: every message about an embedding or chat endpoint (errors, notices,
-- a model's answer and its streamed deltas) passes through kb_internal.redact before a caller can see it, so an
-- endpoint's key, user info or query string never reaches a search or an answer.

-- An endpoint URL as a message may show it: scheme, host, port and path, without user info, query string
-- or fragment (any of which may hold a secret). A URL without "scheme://" is shown as "(the configured URL)".
create or replace function kb_internal.shown_url(url text)
returns text
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(array_to_string(regexp_match(url, '^([A-Za-z][A-Za-z0-9+.-]*://)(?:[^@/?#]*@)?([^/?#]*)([^?#]*)'),
        ''), '(the configured URL)')
$$;

-- What kb_internal.redact hides, longest first (a secret inside another is then never left half visible): each of
-- secrets (API keys; also trimmed) and url's user info, password, query string, fragment and query values
-- of 4 or more characters. Streams use it to hold back a delta's end that may begin a secret.
create or replace function kb_internal.endpoint_secrets(url text, secrets text[] default '{}')
returns text[]
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    with u as (
        select regexp_match(coalesce(url, ''), '^[^:/?#]*://(?:([^@/?#]*)@)?[^?#]*(?:\?([^#]*))?(?:#(.*))?$') as parts
    ),
    hidden as (
        select unnest(coalesce(secrets, '{}')) as x
        union all select btrim(unnest(coalesce(secrets, '{}')), E' \t\r\n')
        union all select p.x from u cross join unnest(u.parts) as p (x) where length(p.x) >= 4
        union all select substr(u.parts[1], strpos(u.parts[1], ':') + 1) from u where strpos(u.parts[1], ':') > 0
        union all select substr(q.x, strpos(q.x, '=') + 1)
        from u cross join unnest(string_to_array(u.parts[2], '&')) as q (x)
        where length(q.x) - strpos(q.x, '=') >= 4
    )
    select coalesce(array_agg(s.x order by length(s.x) desc, s.x), '{}')
    from (select distinct h.x from hidden as h where coalesce(h.x, '') <> '') as s
$$;

-- message as any caller may see it: url shown as kb_internal.shown_url, then every kb_internal.endpoint_secrets of url and
-- secrets replaced by ***. NULL stays NULL. Every message about an endpoint passes through it.
create or replace function kb_internal.redact(message text, url text, secrets text[] default '{}')
returns text
language plpgsql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    secret text;
begin
    if coalesce(url, '') <> '' then
        message := replace(message, url, kb_internal.shown_url(url));
    end if;
    foreach secret in array kb_internal.endpoint_secrets(url, secrets) loop
        message := replace(message, secret, '***');
    end loop;
    return message;
end
$$;

-- How many characters at the end of message may be the start of one of secrets (0: none): the end a cut or a
-- stream must hold back, since the rest of the secret may follow. Each secret's own full length is not counted
-- (kb_internal.redact replaces a whole secret).
create or replace function kb_internal.secret_start_length(message text, secrets text[])
returns integer
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(max(n.n), 0)
    from unnest(coalesce(secrets, '{}')) as s (secret)
    cross join lateral generate_series(least(length(s.secret) - 1, length(message)), 1, -1) as n (n)
    where right(message, n.n) = left(s.secret, n.n)
$$;

-- message as kb_internal.redact shows it, at most max_chars characters: redacted first, then cut, and where it
-- is cut (or already_cut says the text was cut before it came here, an endpoint's body read up to a bound) the
-- end that may begin a secret is dropped, so no part of a secret is ever shown. A cut ends in '…'.
create or replace function kb_internal.redacted_excerpt(
    message text, url text, secrets text[], max_chars integer, already_cut boolean default false
)
returns text
language plpgsql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    hidden constant text[] := kb_internal.endpoint_secrets(url, secrets);
    shown text := message;
begin
    if already_cut then
        shown := left(shown, length(shown) - kb_internal.secret_start_length(shown, hidden));
    end if;
    shown := kb_internal.redact(shown, url, secrets);
    if length(shown) > max_chars then
        shown := left(shown, max_chars);
        shown := left(shown, length(shown) - kb_internal.secret_start_length(shown, hidden)) || '…';
    elsif already_cut then
        shown := shown || '…';
    end if;
    return shown;
end
$$;

-- A question as the question log keeps it (kb.questions, kb.answer_ratings): secrets and personal data
-- masked -- a value after password/token/secret/api key/密码/令牌/密钥 and the like, JWTs, prefixed API keys
-- (sk-, ghp_, AKIA…), long hexadecimal or base64 strings, e-mail addresses, Chinese identity card and mobile
-- numbers, other phone numbers in international form -- each replaced by a bracketed word. NULL stays NULL.
-- (Matched in collation "C": case-insensitive matching in C.UTF-8 was seen to change unmatched letters' case.)
create or replace function kb.redact(question text)
returns text
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        regexp_replace(regexp_replace(regexp_replace(question collate "C",
        '((?:password|passwd|pwd|passcode|token|secret|api[_ -]?key|access[_ -]?key|密码|口令|令牌|密钥|秘钥)\s*(?:is\s+|[:=：]\s*|是\s*))[^\s,;，；。]+',
            '\1[secret]', 'gi'),
        'eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*', '[secret]', 'g'),
        '(?:\m|(?<=_))(?:sk|pk|rk|ghp|gho|ghs|glpat|xox[abprs]|AKIA|ASIA)[-_]?[A-Za-z0-9_-]{12,}', '[secret]', 'g'),
        '[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}', '[email]', 'g'),
        '(?<![0-9A-Za-z])[1-9][0-9]{5}(?:19|20)[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])[0-9]{3}[0-9Xx](?![0-9A-Za-z])',
            '[id]', 'g'),
        '(?<![0-9])(?:\+?86[ -]?)?1[3-9][0-9][ -]?[0-9]{4}[ -]?[0-9]{4}(?![0-9])', '[phone]', 'g'),
        '(?<![0-9A-Za-z])\+[1-9][0-9]{0,2}[ -]?[0-9][0-9 -]{6,14}[0-9](?![0-9])', '[phone]', 'g'),
        '(?<![0-9A-Za-z])[0-9A-Fa-f]{32,}(?![0-9A-Za-z])', '[secret]', 'g'),
        '(?<![0-9A-Za-z+/_-])(?=[A-Za-z0-9+/_-]*[0-9])(?=[A-Za-z0-9+/_-]*[A-Za-z])[A-Za-z0-9+/_-]{40,}={0,2}',
            '[secret]', 'g')
$$;
