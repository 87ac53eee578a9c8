-- Identity and visibility: who the caller is, which knowledge bases they may read or write (the
-- row-level-security policies built on it: 15_row_security.sql), and the admin API for users, teams and
-- knowledge bases.
-- Identity comes from session_user (the login role; SET ROLE cannot change it). Only members of
-- pgkb_service may act for another user, by setting pgkb.acting_user.

-- The pgkb user the current session acts as, or NULL for an unmapped role (sees public KBs only).
-- Raises if pgkb.acting_user is set by a role that is not pgkb_service or names an unknown user.
create or replace function kb.current_user_id()
returns bigint
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    acting text := nullif(current_setting('pgkb.acting_user', true), '');
    uid bigint;
begin
    if acting is not null then
        if not pg_has_role(session_user, 'pgkb_service', 'MEMBER') then
            raise exception 'pgkb.acting_user may only be set by members of pgkb_service (session user %)',
                session_user using errcode = 'insufficient_privilege';
        end if;
        select u.id into uid from kb.users as u where u.name = acting;
        if uid is null then
            raise exception 'unknown pgkb user "%" in pgkb.acting_user', acting
                using errcode = 'invalid_parameter_value';
        end if;
        return uid;
    end if;
    select u.id into uid from kb.users as u where u.db_role = session_user;
    return uid;
end
$$;

-- True when the caller administers pgkb: a superuser, a member of pgkb_admin, the owner of schema kb, or
-- a pgkb user flagged is_admin. A service acting for a user is exactly as privileged as that user.
create or replace function kb.current_is_admin()
returns boolean
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    return (
        select case
            when nullif(current_setting('pgkb.acting_user', true), '') is not null
                then coalesce((select u.is_admin from kb.users as u where u.id = kb.current_user_id()), false)
            else (select r.rolsuper from pg_roles as r where r.rolname = session_user)
                or pg_has_role(session_user, 'pgkb_admin', 'MEMBER')
                or pg_has_role(session_user, (select n.nspowner from pg_namespace as n where n.nspname = 'kb'),
                    'MEMBER')
                or coalesce((select u.is_admin from kb.users as u where u.id = kb.current_user_id()), false)
        end
    );
end
$$;

-- Ids of the knowledge bases the caller may read: public ones, their own, and team ones of their teams
-- (admins: all). Used by every RLS policy and by the search functions.
create or replace function kb.visible_kb_ids()
returns integer[]
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    return (
        with me as (select kb.current_user_id() as uid, kb.current_is_admin() as admin)
        select coalesce(array_agg(k.id order by k.id), '{}')
        from kb.knowledge_bases as k, me
        where me.admin
            or k.visibility = 'public'
            or k.owner_id = me.uid
            or (k.visibility = 'team' and exists (
                select from kb.memberships as m where m.team_id = k.team_id and m.user_id = me.uid
            ))
    );
end
$$;

-- True when the caller may replace or delete documents in the knowledge base: admins, its owner, and
-- members of its team when it is team-visible.
create or replace function kb.can_write_kb(kb_id integer)
returns boolean
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select kb.current_is_admin() or exists (
        select from kb.knowledge_bases as k
        where k.id = can_write_kb.kb_id
            and (k.owner_id = kb.current_user_id()
                or (k.visibility = 'team' and exists (
                    select from kb.memberships as m
                    where m.team_id = k.team_id and m.user_id = kb.current_user_id()
                )))
    )
$$;

-- Resolve a knowledge-base name the caller may read to its id. Unknown and invisible names raise the
-- same error and read the same rows (the name is looked for among the visible knowledge bases, each read
-- by its id: an index lookup by name would fetch another user's row, visible in pg_stat_* counters), so
-- names of other users' knowledge bases do not leak.
create or replace function kb.resolve_kb(kb_name text)
returns integer
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    visible constant integer [] := kb.visible_kb_ids();  -- once, whatever the name (not once per row)
    found integer;
begin
    select k.id into found
    from unnest(visible) as v (id)
    cross join lateral (select k.id, k.name from kb.knowledge_bases as k where k.id = v.id offset 0) as k
    where k.name = kb_name;
    if found is null then
        raise exception 'unknown knowledge base "%"', left(kb_name, 200)
            using errcode = 'no_data_found',
                hint = 'SELECT name FROM kb.list_knowledge_bases() lists the ones you can see';
    end if;
    return found;
end
$$;

-- Internal: the id of knowledge base kb if the caller may write to it; else the error kb.resolve_kb gives
-- (unknown or invisible: no_data_found), or insufficient_privilege (readable only). The one write check of
-- every function that writes into a named knowledge base.
create or replace function kb_internal.writable_kb(kb text)
returns integer
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer := kb.resolve_kb(writable_kb.kb);
begin
    if not kb.can_write_kb(target_kb) then
        raise exception 'you may not write to knowledge base "%"', writable_kb.kb
            using errcode = 'insufficient_privilege';
    end if;
    return target_kb;
end
$$;

-- Internal: true when the caller may decide what knowledge base kb_id is and who reads it (visibility,
-- team, owner, name, deletion): its owner and administrators. Members of its team may write documents
-- (kb.can_write_kb) but not this. The one such rule: kb.create_knowledge_base and 14_lifecycle.sql use it.
create or replace function kb_internal.can_manage_kb(kb_id integer)
returns boolean
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select kb.current_is_admin() or exists (
        select from kb.knowledge_bases as k
        where k.id = can_manage_kb.kb_id and k.owner_id = kb.current_user_id()
    )
$$;

-- Internal: the id of knowledge base kb if the caller may manage it (kb_internal.can_manage_kb); else the
-- error kb.resolve_kb gives (unknown or invisible: no_data_found, the same rows read), or
-- insufficient_privilege naming the action (visible, but not the caller's).
create or replace function kb_internal.managed_kb(kb text, action text)
returns integer
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer := kb.resolve_kb(managed_kb.kb);
begin
    if not kb_internal.can_manage_kb(target_kb) then
        raise exception 'only the owner of knowledge base "%" or an administrator may %', managed_kb.kb, action
            using errcode = 'insufficient_privilege';
    end if;
    return target_kb;
end
$$;

-- Internal: raise invalid_parameter_value unless name can name a `what` ('knowledge base', 'pgkb user' or
-- 'team'): 1-100 letters, digits, "_", "." or "-" (users and teams also "@"), beginning with a letter or digit
-- (the tables' checks, said in words). The one name rule of kb.create_* and kb.rename_knowledge_base.
create or replace function kb_internal.check_name(name text, what text)
returns void
language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    kb_name constant boolean := what = 'knowledge base';
    allowed constant text := case when kb_name then '_.-' else '_.@-' end;
begin
    if name is null or name !~ ('^[A-Za-z0-9][A-Za-z0-9' || allowed || ']{0,99}$') then
        raise exception 'invalid % name "%": use 1-100 letters, digits, "_", "."% or "-"', what,
            left(coalesce(name, 'NULL'), 200), case when kb_name then '' else ', "@"' end
            using errcode = 'invalid_parameter_value';
    end if;
end
$$;

-- Internal: the id of a team the caller may name (NULL for NULL): to share a knowledge base with, or to leave. An
-- administrator may name any team (unknown: no_data_found); anyone else only one of their own, looked for
-- among their memberships (t.name || '': never the teams' name index), so a team they are not in and one
-- that does not exist read the same rows and give the same error.
create or replace function kb_internal.callers_team(team text)
returns bigint
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    found bigint;
begin
    if team is null then
        return null;
    end if;
    if kb.current_is_admin() then
        found := (select t.id from kb.teams as t where t.name = team);
        if found is null then
            raise exception 'unknown team "%"', left(team, 200) using errcode = 'no_data_found';
        end if;
        return found;
    end if;
    found := (
        select t.id from kb.teams as t
        where t.id = any(array(select m.team_id from kb.memberships as m where m.user_id = kb.current_user_id()))
            and t.name || '' = team
    );
    if found is null then
        raise exception 'you are not a member of a team "%"', left(team, 200) using errcode = 'insufficient_privilege';
    end if;
    return found;
end
$$;

-- Raise unless the caller administers pgkb.
create or replace function kb.require_admin(action text)
returns void
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if not kb.current_is_admin() then
        raise exception 'only pgkb administrators may %', action using errcode = 'insufficient_privilege';
    end if;
end
$$;

-- Admin: create (or update) a pgkb user, optionally mapped to a login role, which is then granted
-- pgkb_user and bounded by the default timeouts (kb_internal.bound_sessions). Returns the user id.
create or replace function kb.create_user(name text, db_role name default null, is_admin boolean default false)
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    uid bigint;
begin
    perform kb.require_admin('create users');
    perform kb_internal.check_name(name, 'pgkb user');
    if db_role is not null and not exists (select from pg_roles as r where r.rolname = create_user.db_role) then
        raise exception 'database role "%" does not exist', db_role using errcode = 'undefined_object';
    end if;
    insert into kb.users as u (name, db_role, is_admin)
    values (create_user.name, create_user.db_role, create_user.is_admin)
    on conflict on constraint users_name_key
    do update set db_role = excluded.db_role, is_admin = excluded.is_admin
    returning u.id into uid;
    if db_role is not null then
        execute format('grant pgkb_user to %I', db_role);
        perform kb_internal.bound_sessions(db_role);
    end if;
    return uid;
end
$$;

-- Internal: give a login role's sessions in this database the defaults of kb.settings for
-- statement_timeout, lock_timeout (user_statement_timeout, user_lock_timeout) and
-- client_connection_check_interval (user_client_connection_check_interval), so a psql user's read waits
-- behind a stuck lock or runs for at most that long, and stops soon after its client is gone. A user may
-- still SET them in a session; the search functions also bound their own work (top_k, candidates, query
-- terms, conditions). Superusers and settings a role was already given are left alone.
create or replace function kb_internal.bound_sessions(login_role name)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    given text [] := coalesce((
        select s.setconfig from pg_db_role_setting as s
        join pg_roles as r on r.oid = s.setrole
        join pg_database as db on db.oid = s.setdatabase
        where r.rolname = login_role and db.datname = current_database()
    ), '{}');
    parameter text;
    setting_key text;
begin
    if coalesce((select r.rolsuper from pg_roles as r where r.rolname = login_role), true) then
        return;
    end if;
    for parameter, setting_key in values
        ('statement_timeout', 'user_statement_timeout'),
        ('lock_timeout', 'user_lock_timeout'),
        ('client_connection_check_interval', 'user_client_connection_check_interval')
    loop
        if not exists (select from unnest(given) as g where starts_with(g, parameter || '=')) then
            execute format('alter role %I in database %I set %I = %L', login_role, current_database(), parameter,
                kb_internal.setting(setting_key));
        end if;
    end loop;
exception when insufficient_privilege then
    -- a managed server whose pgkb owner may not alter roles: say so, never fail the caller for it
    raise notice 'pgkb: cannot set default timeouts for role % (the owner of schema kb lacks CREATEROLE); '
        'set them yourself: ALTER ROLE % IN DATABASE % SET statement_timeout = ...', login_role, login_role,
        current_database();
end
$$;

-- Admin: create a team if missing; returns its id.
create or replace function kb.create_team(name text)
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    tid bigint;
begin
    perform kb.require_admin('create teams');
    perform kb_internal.check_name(name, 'team');
    insert into kb.teams as t (name) values (create_team.name)
    on conflict on constraint teams_name_key do update set name = excluded.name
    returning t.id into tid;
    return tid;
end
$$;

-- Admin: add a user to a team (idempotent).
create or replace function kb.add_team_member(team text, username text)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    tid bigint := (select t.id from kb.teams as t where t.name = team);
    uid bigint := (select u.id from kb.users as u where u.name = username);
begin
    perform kb.require_admin('change team membership');
    if tid is null then
        raise exception 'unknown team "%"', team using errcode = 'no_data_found';
    end if;
    if uid is null then
        raise exception 'unknown pgkb user "%"', username using errcode = 'no_data_found';
    end if;
    insert into kb.memberships (team_id, user_id) values (tid, uid) on conflict do nothing;
end
$$;

-- Create a knowledge base owned by the caller (admins may name another owner), with its HNSW index per
-- model (kb_internal.create_vector_indexes), or update the visibility/team/description of one the caller
-- owns (admins: any). Returns its id.
create or replace function kb.create_knowledge_base(
    name text,
    visibility text default 'private',
    team text default null,
    owner text default null,
    description text default null
)
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    owner_uid bigint := kb.current_user_id();
    team_uid bigint;
    existing integer := (select k.id from kb.knowledge_bases as k where k.name = create_knowledge_base.name);
    kid integer;
begin
    perform kb_internal.check_name(name, 'knowledge base');
    if visibility is null or visibility not in ('private', 'team', 'public') then
        raise exception 'invalid visibility "%": expected private, team or public', visibility
            using errcode = 'invalid_parameter_value';
    end if;
    if owner is not null then
        perform kb.require_admin('create knowledge bases for another user');
        owner_uid := (select u.id from kb.users as u where u.name = owner);
        if owner_uid is null then
            raise exception 'unknown pgkb user "%"', owner using errcode = 'no_data_found';
        end if;
    end if;
    if owner_uid is null and not kb.current_is_admin() then
        raise exception 'session user % is not a pgkb user and may not create knowledge bases', session_user
            using errcode = 'insufficient_privilege';
    end if;
    -- a non-administrator's own teams only (owner_uid is theirs: naming another owner needs an administrator)
    team_uid := kb_internal.callers_team(team);
    if visibility = 'team' and team_uid is null then
        raise exception 'a team-visible knowledge base needs a team' using errcode = 'invalid_parameter_value';
    end if;
    if existing is not null then
        if not kb.can_write_kb(existing) then
            -- names are one namespace: say only that the name is taken, never whose or what it holds
            raise exception 'knowledge base name "%" is not available', name using errcode = 'unique_violation',
                hint = 'knowledge base names are unique across pgkb; choose another name';
        end if;
        -- writing documents into a team knowledge base does not include deciding who may read it
        if not kb_internal.can_manage_kb(existing) then
            raise exception 'only the owner of knowledge base "%" may change its visibility or team', name
                using errcode = 'insufficient_privilege';
        end if;
        update kb.knowledge_bases as k
        set visibility = create_knowledge_base.visibility, team_id = team_uid,
            description = coalesce(create_knowledge_base.description, k.description), updated_at = now()
        where k.id = existing;
        return existing;
    end if;
    insert into kb.knowledge_bases as k (name, visibility, owner_id, team_id, description)
    values (name, visibility, owner_uid, team_uid, coalesce(description, ''))
    returning k.id into kid;
    perform kb_internal.create_vector_indexes(kb_id => kid);
    return kid;
end
$$;

-- Why a role must not serve end users, with the statement that fixes it; all NULL when it is fit to. reason:
-- 'superuser', 'admin' (in pgkb_admin), 'owner' (of schema kb), 'mapped' (to a pgkb administrator) -- the
-- roles that administer pgkb -- or 'bypassrls'; each sees more than the users it acts for.
-- kb.service_role_problem asks it for the session's login role, kb_admin.doctor for every member of pgkb_service.
create or replace function kb_internal.role_problem(role_name name, out reason text, out problem text, out fix text)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select k.reason, format(x.problem, r.rolname), format(x.fix, r.rolname)
    from pg_roles as r
    cross join lateral (
        select case
            when r.rolsuper then 'superuser'
            when pg_has_role(r.rolname, 'pgkb_admin', 'MEMBER') then 'admin'
            when pg_has_role(r.rolname, (select n.nspowner from pg_namespace as n where n.nspname = 'kb'), 'MEMBER')
                then 'owner'
            when exists (select from kb.users as u where u.db_role = r.rolname and u.is_admin) then 'mapped'
            when r.rolbypassrls then 'bypassrls'
        end as reason
    ) as k
    left join (values
        ('superuser', 'role %I is a superuser', 'alter role %I nosuperuser'),
        ('admin', 'role %I is a member of pgkb_admin', 'revoke pgkb_admin from %I (or from the role it has it through)'),
        (
            'owner', 'role %I owns schema kb',
            'revoke pgkb_service from %I, and let the service log in as a role of its own '
            || '(create role pgkb_mcp login; grant pgkb_service to pgkb_mcp)'
        ),
        (
            'mapped', 'role %I maps to a pgkb administrator',
            'update kb.users set is_admin = false where db_role = %L'
        ),
        ('bypassrls', 'role %I has BYPASSRLS', 'alter role %I nobypassrls')
    ) as x (reason, problem, fix) on x.reason = k.reason
    where r.rolname = role_name
$$;

-- Why the session's login role must not serve end users, or NULL when it is fit to (kb_internal.role_problem).
-- Evaluated on session_user, whatever pgkb.acting_user says. pgkb mcp refuses to start on a non-NULL answer.
create or replace function kb.service_role_problem()
returns text
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select (kb_internal.role_problem(session_user)).problem
$$;
