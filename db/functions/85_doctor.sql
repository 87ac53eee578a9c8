-- `pgkb db doctor`, the database's half: what a healthy pgkb database looks like, checked from the catalogs
-- and kb's tables. kb_admin.doctor() runs every area below and returns one row per problem, with the command or
-- statement that fixes it, and 'ok' rows for what is fine ('skipped': cannot be checked here). The client
-- adds what only it can see (db/ on disk, the embedder it is configured with). Administrators only: it
-- names roles, grants and the embedding endpoint.

-- The real members of a role, directly or through other roles (pg_has_role would also count every
-- superuser as a member of everything); none for an unknown role.
create or replace function kb_internal.role_members(group_name name)
returns setof oid
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with recursive members (oid) as (
        select m.member from pg_auth_members as m join pg_roles as g on g.oid = m.roleid
        where g.rolname = group_name
        union
        select m.member from pg_auth_members as m join members on m.roleid = members.oid
    )
    select members.oid from members
$$;

-- Every key of kb.settings and the values the functions reading it accept: kind integer or number in
-- low..high, fraction (a decimal in [0, 1) as kb.retrieve reads it), choice (one of arg), url (empty or
-- http(s)), duration (a value of the server parameter arg), env (an environment variable name or empty),
-- text or secret (anything; a secret is never shown). wanted says it in words, for messages.
create or replace function kb_internal.setting_rules()
returns table (key text, kind text, low numeric, high numeric, arg text, wanted text)
language sql immutable
set search_path = pg_catalog, pg_temp
as $$
    select r.key, r.kind, r.low, r.high, r.arg,
        case r.kind
            when 'integer' then format('an integer in %s..%s', r.low, r.high)
            when 'number' then format('a number in [%s, %s]', r.low, r.high)
            when 'fraction' then 'a decimal number in [0, 1) such as 0.76'
            when 'choice' then 'one of ' || replace(r.arg, ',', ', ')
            when 'url' then 'an http(s) URL, or empty for none'
            when 'duration' then format('a value %s accepts, such as 30s', r.arg)
            when 'env' then 'an environment variable name, or empty'
            else 'any text'
        end
    from (values
        ('answer_min_coverage', 'number', 0, 1, null),
        ('answer_min_score', 'number', 0, 1, null),
        ('answer_vector_ceiling', 'number', -1, 1, null),
        ('answer_vector_floor', 'number', -1, 1, null),
        ('answer_vector_weight', 'number', 0, 1, null),
        ('chat_api_key', 'secret', null, null, null),
        ('chat_api_key_env', 'env', null, null, null),
        ('chat_max_tokens', 'integer', 1, 1000000, null),
        ('chat_model', 'text', null, null, null),
        ('chat_temperature', 'number', 0, 2, null),
        ('chat_timeout_ms', 'integer', 1, 600000, null),
        ('chat_url', 'url', null, null, null),
        ('embedding_api_key', 'secret', null, null, null),
        ('embedding_timeout_ms', 'integer', 1, 600000, null),
        ('embedding_url', 'url', null, null, null),
        ('fuzzy_max_terms', 'integer', 0, 1000, null),
        ('fuzzy_term_expansions', 'integer', 0, 1000, null),
        ('gap_questions', 'integer', 1, 10000, null),
        ('gap_similarity', 'number', 0, 1, null),
        ('glossary_weight', 'number', 0, 1000000, null),
        ('hnsw_ef_construction', 'integer', 4, 1000, null),
        ('hnsw_ef_search', 'integer', 1, 1000, null),
        ('hnsw_m', 'integer', 2, 100, null),
        ('lexical_leg', 'choice', null, null, 'auto,numpy,blocks,scan'),
        ('lexical_max_query_terms', 'integer', 1, 100000, null),
        ('lexical_numpy_heap_mb', 'integer', 0, 2047, null),
        ('lexical_numpy_posting_budget', 'integer', 1, 999999999, null),
        ('lexical_posting_budget', 'integer', 1, 999999999, null),
        ('lexical_probe_budget', 'integer', 1, 999999999, null),
        ('lexicon_max_sources', 'integer', 0, 64, null),
        ('lexicon_max_translations', 'integer', 0, 64, null),
        ('lexicon_weight', 'number', 0, 1000000, null),
        ('relevance_cosine_floor', 'fraction', null, null, null),
        ('save_max_chars', 'integer', 1, 1000000, null),
        ('ratings_per_minute', 'integer', 0, 100000, null),
        ('saves_per_minute', 'integer', 0, 100000, null),
        ('search_bm25_b', 'number', 0, 1, null),
        ('search_bm25_k1', 'number', 0, 1000000, null),
        ('search_candidates', 'integer', 1, 1000, null),
        ('search_fusion', 'choice', null, null, 'dbsf,rrf'),
        ('search_fuzzy_weight', 'number', 0, 1000000, null),
        ('search_lexical_weight', 'number', 0, 1000000, null),
        ('search_rrf_k', 'number', 0.000001, 1000000, null),
        ('search_vector_weight', 'number', 0, 1000000, null),
        ('translation_min_share', 'number', 0, 1, null),
        ('user_client_connection_check_interval', 'duration', null, null, 'client_connection_check_interval'),
        ('user_lock_timeout', 'duration', null, null, 'lock_timeout'),
        ('user_statement_timeout', 'duration', null, null, 'statement_timeout'),
        ('vector_exact_chunks', 'integer', 0, 1000000000, null)
    ) as r (key, kind, low, high, arg)
$$;

-- What is wrong with value as the setting key (NULL: nothing): outside its rule (kb_internal.setting_rules), or
-- at odds with another setting (hnsw_ef_construction below twice hnsw_m, answer_vector_floor not below
-- answer_vector_ceiling, lexical_leg 'numpy' on a server without numpy). Changes nothing.
create or replace function kb_internal.setting_problem(key text, value text)
returns text
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    rule record;
    num numeric;
    other text;
begin
    select * into rule from kb_internal.setting_rules() as r where r.key = setting_problem.key;
    if not found then
        return 'not a pgkb setting: nothing reads it';
    end if;
    if rule.kind = 'integer' and value !~ '^\s*-?\d{1,9}\s*$'
        or rule.kind = 'number' and value !~ '^\s*-?(\d+\.?\d*|\.\d+)([eE][-+]?\d{1,3})?\s*$'
        or rule.kind = 'fraction' and value !~ '^\s*0?\.\d+\s*$'
        or rule.kind = 'choice' and value <> all(string_to_array(rule.arg, ','))
        or rule.kind = 'url' and btrim(value) <> '' and btrim(value) !~* '^https?://'
        or rule.kind = 'env' and value !~ '^\s*([A-Za-z_][A-Za-z0-9_]*)?\s*$' then
        return 'must be ' || rule.wanted;
    end if;
    if rule.kind in ('integer', 'number') then
        num := value::numeric;
        if num not between rule.low and rule.high then
            return 'must be ' || rule.wanted;
        end if;
    end if;
    if rule.kind = 'duration' then
        begin
            perform set_config(rule.arg, value, true);
            raise exception using errcode = 'PD000';    -- undoes the set_config: nothing changes
        exception
            when sqlstate 'PD000' then null;
            when others then return format('must be %s (%s)', rule.wanted, sqlerrm);
        end;
    end if;
    if key = 'hnsw_ef_construction' then
        select s.value into other from kb.settings as s where s.key = 'hnsw_m';
        if other ~ '^\s*\d{1,9}\s*$' and value::integer < 2 * other::integer then
            return format('must be at least twice hnsw_m (%s), or kb.register_embedding_model refuses', btrim(other));
        end if;
    elsif key = 'answer_vector_floor' then
        select s.value into other from kb.settings as s where s.key = 'answer_vector_ceiling';
        if kb_internal.setting_problem('answer_vector_ceiling', other) is null and value::numeric >= other::numeric then
            return format('must be below answer_vector_ceiling (%s), or kb.ask ignores the vector score', btrim(other));
        end if;
    elsif key = 'lexical_leg' and value = 'numpy' then
        begin
            perform kb_admin.lexical_engine_choice();
        exception when others then
            return sqlerrm;
        end;
    end if;
    return null;
end
$$;

-- Extensions and languages, one row each: vector (0.8 or newer) and pg_trgm, and the language plpython3u
-- (in-database query embedding, chat answers, the numpy BM25 leg), with how to get each back.
create or replace function kb_internal.doctor_extensions()
returns table ("check" text, status text, detail text, fix text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with wanted (name, what, install) as (
        values
        (
            'vector', 'pgvector (0.8 or newer: the embeddings and the vector leg)',
            'install pgvector 0.8 or newer for this server (make setup), then: alter extension vector update'
        ),
        ('pg_trgm', 'pg_trgm', 'create extension if not exists pg_trgm'),
        (
            'plpython3u',
            'the language plpython3u (in-database query embedding: psql searches without query_embedding run '
            || 'lexical-only; chat answers of kb.ask; the numpy BM25 leg)',
            case when exists (select from pg_available_extensions as a where a.name = 'plpython3u')
                then 'pgkb db migrate (as a superuser: it creates the extension and the functions that use it)'
                else format(
                    'install postgresql-plpython3-%s for this server (make setup), then pgkb db migrate',
                    current_setting('server_version_num')::integer / 10000
                )
            end
        )
    ),
    found as (
        select w.*, e.extversion,
            e.extversion is not null and (w.name <> 'vector'
                or string_to_array(split_part(e.extversion, '-', 1), '.')::integer [] >= '{0,8}') as fine
        from wanted as w
        left join pg_extension as e on e.extname = w.name
    )
    select 'extensions',
        case when f.fine then 'ok' else 'problem' end,
        case when f.extversion is null then f.what || ' is not installed'
            else format('%s %s is installed%s', f.name, f.extversion, case when f.fine then '' else ': too old' end)
        end,
        case when not f.fine then f.install end
    from found as f
$$;

-- numpy for the server's Python: without it the BM25 leg runs in SQL, several times slower
-- (kb_internal.numpy_available, cached per session). Skipped without plpython3u.
create or replace function kb_internal.doctor_numpy()
returns table ("check" text, status text, detail text, fix text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    available boolean;
begin
    "check" := 'numpy';
    if not exists (select from pg_extension as e where e.extname = 'plpython3u') then
        status := 'skipped';
        detail := 'needs plpython3u (see extensions)';
    elsif to_regprocedure('kb_internal.numpy_available()') is null then
        status := 'problem';
        detail := 'kb_internal.numpy_available() is missing: db/functions are not fully applied';
        fix := 'pgkb db migrate';
    else
        execute 'select kb_internal.numpy_available()' into available;
        if available then
            status := 'ok';
            detail := 'the server''s Python imports numpy: the BM25 leg runs on numpy';
        else
            status := 'problem';
            detail := 'the server''s Python cannot import numpy: the BM25 leg runs in SQL, several times slower';
            fix := 'install numpy for the Python plpython3u runs (Debian/Ubuntu: apt-get install python3-numpy, '
                'as make setup does); sessions opened afterwards use it';
        end if;
    end if;
    return next;
end
$$;

-- The indexes pgkb expects (kb_internal.expected_indexes: the migrations' and one HNSW index per model and
-- knowledge base of at least vector_exact_chunks chunks), each present and valid (without them searches scan
-- sequentially), no per-knowledge-base HNSW index that is not expected, and no other kb index invalid (a primary key's after a failed
-- REINDEX, or the leftover such a failure leaves).
create or replace function kb_internal.doctor_indexes()
returns table ("check" text, status text, detail text, fix text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with problems as (
        select case p.problem
            when 'stale' then format(
                'kb.%s is no longer expected: its knowledge base or model is gone, or the knowledge base is small',
                p.index_name
            )
            else format('kb.%s is %s: searches that need it scan sequentially', p.index_name, p.problem)
        end as detail,
            'pgkb db migrate' as fix
        from kb_admin.index_problems() as p
        union all
        select format('kb.%s is invalid', c.relname),
            format('reindex index kb.%I (or drop it, if it is the leftover of a failed REINDEX CONCURRENTLY)',
                c.relname)
        from pg_index as i
        join pg_class as c on c.oid = i.indexrelid
        where c.relnamespace = 'kb'::regnamespace and not (i.indisvalid and i.indisready)
            and c.relname not in (select e.index_name from kb_internal.expected_indexes() as e)
    )
    select 'indexes', 'problem', p.detail, p.fix from problems as p
    union all
    select 'indexes', 'ok',
        format('all %s indexes pgkb expects are present and valid', (select count(*) from kb_internal.expected_indexes())),
        null
    where not exists (select from problems)
$$;

-- Row-level security, the second line behind the grants: enabled on every kb table but kb.settings and
-- kb.schema_migrations (which hold no knowledge-base rows), and forced on none (pgkb's functions run as
-- the tables' owner and write past the SELECT-only policies).
create or replace function kb_internal.doctor_row_security()
returns table ("check" text, status text, detail text, fix text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with tables as (
        select c.relname, c.relrowsecurity, c.relforcerowsecurity,
            c.relname not in ('settings', 'schema_migrations') as needs_rls
        from pg_class as c
        where c.relnamespace = 'kb'::regnamespace and c.relkind in ('r', 'p')
    ),
    problems as (
        select format('row-level security is off on kb.%s', t.relname) as detail,
            format('alter table kb.%I enable row level security', t.relname) as fix
        from tables as t where t.needs_rls and not t.relrowsecurity
        union all
        select format('row-level security is forced on kb.%s: pgkb''s functions cannot write it', t.relname),
            format('alter table kb.%I no force row level security', t.relname)
        from tables as t where t.relforcerowsecurity
    )
    select 'row security', 'problem', p.detail, p.fix from problems as p
    union all
    select 'row security', 'ok',
        format('enabled on all %s kb tables that hold knowledge-base rows', count(*) filter (where t.needs_rls)),
        null
    from tables as t
    having not exists (select from problems)
$$;

-- Privileges: end users (pgkb_user, pgkb_service and the roles in them that administer nothing, see
-- kb_internal.role_problem) reach no kb table, view or sequence but SELECT on kb.embedding_models and
-- kb.schema_migrations, through any grant they hold or may SET ROLE to; no kb function is executable by
-- PUBLIC; kb_service and kb_admin (their schema and functions) are granted to whom 90_grants.sql grants
-- them and nobody else, kb_internal to nobody but its owner.
create or replace function kb_internal.doctor_privileges()
returns table ("check" text, status text, detail text, fix text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with end_users as (
        select r.oid from pg_roles as r
        where (r.rolname in ('pgkb_user', 'pgkb_service') or r.oid in (select kb_internal.role_members('pgkb_user')))
            and coalesce((kb_internal.role_problem(r.rolname)).reason, 'bypassrls') = 'bypassrls'
    ),
    grants as (
        select c.relname, null::name as attname, a.grantee, a.privilege_type
        from pg_class as c, aclexplode(c.relacl) as a
        where c.relnamespace = 'kb'::regnamespace
        union all
        select c.relname, att.attname, a.grantee, a.privilege_type
        from pg_class as c
        join pg_attribute as att on att.attrelid = c.oid, aclexplode(att.attacl) as a
        where c.relnamespace = 'kb'::regnamespace
    ),
    leaks as (
        select g.relname, g.attname, coalesce(r.rolname, 'public') as grantee,
            string_agg(g.privilege_type, ', ' order by g.privilege_type) as privileges
        from grants as g
        left join pg_roles as r on r.oid = g.grantee
        where (g.grantee = 0 or exists (select from end_users as e where pg_has_role(e.oid, g.grantee, 'MEMBER')))
            and not (g.privilege_type = 'SELECT' and g.relname in ('embedding_models', 'schema_migrations'))
        group by g.relname, g.attname, r.rolname
    ),
    -- the schemas whose use 90_grants.sql grants to a few roles, and to which
    callable (nspname, grantees, rule) as (
        values
        ('kb_service', array['pgkb_service', 'pgkb_admin'], 'kb_service is for pgkb_service and pgkb_admin'),
        ('kb_admin', array['pgkb_admin'], 'kb_admin is for pgkb_admin'),
        ('kb_internal', array[]::text [], 'kb_internal is its owner''s alone')
    ),
    stray_callers as (
        select o.privilege, o.object, coalesce(quote_ident(r.rolname), 'public') as grantee_name, c.rule
        from (
            select n.nspname, 'EXECUTE' as privilege, format('function %s', p.oid::regprocedure) as object,
                a.grantee, p.proowner as owner
            from pg_proc as p join pg_namespace as n on n.oid = p.pronamespace,
                aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) as a
            union all
            select n.nspname, a.privilege_type, format('schema %I', n.nspname), a.grantee, n.nspowner
            from pg_namespace as n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) as a
        ) as o
        join callable as c on c.nspname = o.nspname
        left join pg_roles as r on r.oid = o.grantee
        where o.grantee <> o.owner and (r.rolname is null or r.rolname <> all(c.grantees))
    ),
    problems as (
        select format(
            '%s on kb.%s%s is granted to %s, so end users have it (they must reach kb tables only through '
            'pgkb''s functions)',
            l.privileges, l.relname, case when l.attname is not null then format(' (%s)', l.attname) end, l.grantee
        ) as detail,
        format(
            'revoke %s%s on kb.%I from %s', lower(l.privileges),
            case when l.attname is not null then format(' (%I)', l.attname) end, l.relname,
            case when l.grantee = 'public' then 'public' else quote_ident(l.grantee) end
        ) as fix
        from leaks as l
        union all
        select format('%s is executable by every role (PUBLIC)', p.oid::regprocedure),
            format('revoke execute on function %s from public', p.oid::regprocedure)
        from pg_proc as p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) as a
        where p.pronamespace = 'kb'::regnamespace and a.grantee = 0
        union all
        select format('%s on %s is granted to %s, but %s', s.privilege, s.object, s.grantee_name, s.rule),
            format('revoke %s on %s from %s', lower(s.privilege), s.object, s.grantee_name)
        from stray_callers as s
    )
    select 'privileges', 'problem', p.detail, p.fix from problems as p
    union all
    select 'privileges', 'ok',
        'end users hold no privilege on kb tables (but SELECT on embedding_models, schema_migrations), PUBLIC '
        || 'none on kb functions, and only the roles 90_grants.sql names use kb_service and kb_admin, nobody '
        || 'kb_internal',
        null
    where not exists (select from problems)
$$;

-- Service roles: every member of pgkb_service (the roles pgkb mcp and pgkb serve log in as) is no
-- superuser, has no BYPASSRLS, administers nothing (kb_internal.role_problem).
create or replace function kb_internal.doctor_service_roles()
returns table ("check" text, status text, detail text, fix text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with members as (
        select r.rolname, p.problem, p.fix
        from pg_roles as r, kb_internal.role_problem(r.rolname) as p
        where r.oid in (select kb_internal.role_members('pgkb_service'))
    )
    select 'service roles', 'problem',
        format('%s, and it is in pgkb_service: a server logging in as it sees more than the users it acts for',
            m.problem),
        m.fix
    from members as m where m.problem is not null
    union all
    select 'service roles', 'ok',
        coalesce(
            'members of pgkb_service, none privileged: ' || string_agg(m.rolname, ', ' order by m.rolname),
            'no role is a member of pgkb_service'
        ),
        null
    from members as m
    having count(*) filter (where m.problem is not null) = 0
$$;

-- Settings: every key of kb.settings known and in range (kb_internal.setting_problem), none missing. Values of
-- secrets are never shown.
create or replace function kb_internal.doctor_settings()
returns table ("check" text, status text, detail text, fix text)
language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    with settings as (
        select coalesce(s.key, r.key) as key, s.value, r.kind, r.wanted,
            case when s.key is null then 'missing' else kb_internal.setting_problem(s.key, s.value) end as problem
        from kb.settings as s
        full join kb_internal.setting_rules() as r on r.key = s.key
    ),
    problems as (
        select
            case when s.problem = 'missing'
                then format('%s is missing from kb.settings: the functions that read it raise', s.key)
                else format('%s = %s: %s', s.key,
                    case when s.kind = 'secret' then '(hidden)' else quote_literal(left(s.value, 60)) end, s.problem)
            end as detail,
            case
                when s.problem = 'missing'
                    then format('insert into kb.settings (key, value) values (%L, ''<%s>'')', s.key, s.wanted)
                when s.kind is null then format('delete from kb.settings where key = %L', s.key)
                else format('update kb.settings set value = ''<%s>'' where key = %L', s.wanted, s.key)
            end as fix
        from settings as s
        where s.problem is not null
    )
    select 'settings', 'problem', p.detail, p.fix from problems as p
    union all
    select 'settings', 'ok', format('all %s settings are in range', (select count(*) from kb.settings)), null
    where not exists (select from problems)
$$;

-- The database's own query embedding (kb_internal.query_embeddings): kb.settings embedding_url answers the default
-- model's query with a vector of its dimension. Skipped without plpython3u; 'ok' with no URL configured.
create or replace function kb_internal.doctor_query_embedding()
returns table ("check" text, status text, detail text, fix text)
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    url text := btrim(kb_internal.setting('embedding_url'));
    api_key text := kb_internal.setting('embedding_api_key');
    timeout_ms integer := kb_internal.setting_int('embedding_timeout_ms');
    model kb.embedding_models;
    result real [];
begin
    "check" := 'query embedding';
    select * into model from kb.embedding_models as m where m.is_default;
    if url = '' then
        status := 'ok';
        detail := 'embedding_url is empty: searches that pass no query_embedding use the lexical legs only';
    elsif to_regprocedure('kb_internal.http_embeddings(text,text,text[],text,integer)') is null then
        status := 'skipped';
        detail := 'needs plpython3u (see extensions)';
    elsif model.id is null then
        status := 'skipped';
        detail := 'no default embedding model (see embeddings)';
    else
        begin
            execute 'select kb_internal.http_embeddings($1, $2, $3, $4, $5)' into result
            using url, model.name, array[model.query_prefix || 'pgkb doctor'], api_key, timeout_ms;
            if coalesce(array_length(result, 2), 0) is distinct from model.dimension then
                detail := format('%s returned %s dimensions; model %s has %s', kb_internal.shown_url(url),
                    coalesce(array_length(result, 2), 0), model.name, model.dimension);
            end if;
        exception when others then
            detail := regexp_replace(kb_internal.redact(sqlerrm, url, array[api_key]), '^plpy\.Error: ', '');
        end;
        if detail is null then
            status := 'ok';
            detail := format('%s answers %s with %s-d vectors', kb_internal.shown_url(url), model.name, model.dimension);
        else
            status := 'problem';
            detail := 'searches from SQL that pass no query_embedding run lexical-only: ' || detail;
            fix := format('start the embedding service there (pgkb embed-server, or make run), or point the setting '
                'at one serving %s: update kb.settings set value = ''<url>'' where key = ''embedding_url''',
                model.name);
        end if;
    end if;
    return next;
end
$$;

-- Embeddings per registered model: a default model exists, and every chunk has an embedding of each
-- model, else the chunks waiting in the queue, parked after failures, or in neither (never embedded).
create or replace function kb_internal.doctor_embeddings()
returns table ("check" text, status text, detail text, fix text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with counts as (
        select m.id, m.name, m.is_default,
            format('%s%s', m.name, case when m.is_default then ' (default)' else '' end) as shown,
            case when m.is_default then 'pgkb worker --once'
                else format('pgkb worker --once --model %s (with PGKB_EMBED_* set for it)', m.name) end as worker,
            x.total, x.missing, x.queued, x.parked, x.missing - x.queued - x.parked as lost
        from kb.embedding_models as m
        cross join lateral (
            select count(*) as total,
                count(*) filter (where e.chunk_id is null) as missing,
                count(*) filter (where e.chunk_id is null and not q.parked) as queued,
                count(*) filter (where e.chunk_id is null and q.parked) as parked
            from kb.chunks as c
            left join kb.embeddings as e on e.chunk_id = c.id and e.model_id = m.id
            left join kb.embedding_queue as q on q.chunk_id = c.id and q.model_id = m.id
        ) as x
    )
    select 'embeddings', 'problem', 'no default embedding model: searches and ingestion have none to use',
        'select kb.use_embedding_model(''<name>'') (see select name from kb.embedding_models)'
    where not exists (select from kb.embedding_models as m where m.is_default)
    union all
    select 'embeddings', 'problem',
        format('%s: %s of %s chunks wait in the embedding queue', c.shown, c.queued, c.total), c.worker
    from counts as c where c.queued > 0
    union all
    select 'embeddings', 'problem',
        format('%s: %s of %s chunks are parked after repeated failures (kb.parked_embeddings says why)',
            c.shown, c.parked, c.total),
        format('select kb_admin.retry_parked_embeddings(%L); then %s', c.name, c.worker)
    from counts as c where c.parked > 0
    union all
    select 'embeddings', 'problem',
        format('%s: %s of %s chunks have no embedding and are not queued for one', c.shown, c.lost, c.total),
        format('insert into kb.embedding_queue (chunk_id, model_id, kb_id) select c.id, %s, c.kb_id from kb.chunks '
            'as c where not exists (select from kb.embeddings as e where e.chunk_id = c.id and e.model_id = %s) '
            'on conflict do nothing; then %s', c.id, c.id, c.worker)
    from counts as c where c.lost > 0
    union all
    select 'embeddings', 'ok', format('%s: all %s chunks embedded', c.shown, c.total), null
    from counts as c where c.missing = 0
$$;

-- Chunks: every chunk's stored heading script (kb.chunks.heading_script, which fusion's cross-script rule
-- reads) is what kb_internal.heading_script gives for its document's title and its headings now
-- (kb_internal.heading_scripts_held). A change to that rule (kb_internal.text_scripts) leaves them stale until
-- kb_admin.refill_heading_scripts() runs; until then this says how many differ.
create or replace function kb_internal.doctor_chunks()
returns table ("check" text, status text, detail text, fix text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with held as (
        select coalesce(sum(h.chunks), 0) as total,
            coalesce(sum(h.chunks) filter (where h.stored is distinct from h.wanted), 0) as differ
        from kb_internal.heading_scripts_held() as h
    )
    select 'chunks', 'problem',
        format('%s of %s chunks store a heading script that kb_internal.heading_script no longer gives for their '
            'title and headings: the cross-script rule of fusion reads them', h.differ, h.total),
        'select kb_admin.refill_heading_scripts()'
    from held as h where h.differ > 0
    union all
    select 'chunks', 'ok', format('all %s chunks store the heading script of their title and headings', h.total), null
    from held as h where h.differ = 0
$$;

-- Terms: every knowledge base was counted with today's term model (kb_internal.terms_version; `pgkb db migrate`
-- counts an older one again), and a sample, the 200 newest chunks, still gives the terms it was counted with: its
-- length in terms as stored and each of its terms in its knowledge base's statistics. Writes undo a chunk's
-- statistics from its text, so a difference (a PostgreSQL upgrade that changed Unicode normalisation or case
-- folding, a hand edit of a title or a chunk) would make them drift; kb_admin.recount_terms counts one again.
create or replace function kb_internal.doctor_terms()
returns table ("check" text, status text, detail text, fix text)
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    with old as (
        select string_agg(k.name, ', ' order by k.name) as names, count(*) as n
        from kb.knowledge_bases as k where k.terms_version < kb_internal.terms_version()
    ),
    sample as (
        select c.id, c.kb_id, c.term_count, d.title, c.heading_path, c.content
        from kb.chunks as c
        cross join lateral (select d.title from kb.documents as d where d.id = c.document_id offset 0) as d
        order by c.id desc
        limit 200
    ),
    differ as (
        select s.kb_id
        from sample as s
        where s.term_count <> cardinality(kb.lexical_terms(kb.indexed_text(s.title, s.heading_path, s.content)))
            or exists (
                select from kb.chunk_terms(s.title, s.heading_path, s.content) as t
                where not exists (select from kb_internal.term_counts(array[s.kb_id], array[t.term]))
            )
    ),
    drifted as (
        select count(*) as n, (select count(*) from sample) as sampled,
            string_agg(distinct k.name, ', ') as names, min(k.name) as first_name
        from differ as x inner join kb.knowledge_bases as k on k.id = x.kb_id
    )
    select 'terms', 'problem', format('%s knowledge bases were counted with an older term model: %s', o.n, o.names),
        'pgkb db migrate (it counts them again)'
    from old as o where o.n > 0
    union all
    select 'terms', 'problem',
        format('%s of the %s newest chunks give other terms than they were counted with (in %s): deletes and '
            'replaces would leave their statistics wrong', d.n, d.sampled, d.names),
        format('select kb_admin.recount_terms(%L)', d.first_name) || ' (for each knowledge base named)'
    from drifted as d where d.n > 0
    union all
    select 'terms', 'ok', format('every knowledge base counted with term model %s; the %s newest chunks give the '
        'terms they were counted with', kb_internal.terms_version(), d.sampled), null
    from old as o, drifted as d where o.n = 0 and d.n = 0
$$;

-- Admin: the database's health, area by area (the functions above, in this order); an area that cannot
-- be checked at all (say, a function it needs is gone) is a problem row with the error. Reads only, but
-- for one query embedding through kb.settings embedding_url. Runs as the owner: its areas are kb_internal's.
create or replace function kb_admin.doctor()
returns table ("check" text, status text, detail text, fix text)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    area text;
begin
    foreach area in array array[
        'extensions', 'numpy', 'indexes', 'row_security', 'privileges', 'service_roles', 'settings',
        'query_embedding', 'embeddings', 'chunks', 'terms'
    ] loop
        begin
            return query execute format('select * from kb_internal.doctor_%s()', area);
        exception when others then
            return query select replace(area, '_', ' '), 'problem', 'could not be checked: ' || sqlerrm,
                'fix what the error names (the other problems may say how; pgkb db migrate restores functions)';
        end;
    end loop;
end
$$;
