-- The lifecycle after creation (10_identity.sql creates): changing a knowledge base's visibility, team, owner
-- and name, deleting it with everything in it, removing team members and users, and listing users and teams.
-- Who may do what is 10_identity.sql's: kb_internal.can_manage_kb (owner or administrator) for a knowledge
-- base, kb.require_admin for users and teams. Names are looked up among what the caller may see first
-- (kb.resolve_kb, kb_internal.callers_team), so an invisible object and a missing one give the same error and
-- read the same rows. Bad input is refused before anything is read or changed.

-- Internal: raise invalid_parameter_value for a name that cannot name anything: NULL, blank (white space,
-- zero-width and control characters alone: kb_internal.is_blank) or over 100 characters. what: 'knowledge
-- base', 'team' or 'pgkb user', for the message.
create or replace function kb_internal.check_given_name(given text, what text)
returns void
language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if given is null or kb_internal.is_blank(given) then
        raise exception 'a % name is needed, got %', what, case when given is null then 'NULL' else 'a blank one' end
            using errcode = 'invalid_parameter_value';
    end if;
    if char_length(given) > 100 then
        raise exception 'the % name is % characters long; at most 100 are accepted', what, char_length(given)
            using errcode = 'invalid_parameter_value';
    end if;
end
$$;

-- Delete knowledge base `name` and everything in it: documents, chunks, embeddings, the embedding queue, BM25
-- postings and term statistics, ingest failures, image captions, glossary (ON DELETE CASCADE, each). Its owner
-- or an administrator. Returns what it held. Its HNSW indexes are left (empty, never scanned: no search names
-- a knowledge base that is gone) for `pgkb db migrate` or `pgkb kb delete` to drop CONCURRENTLY: dropping one
-- here would hold kb.embeddings' ACCESS EXCLUSIVE lock, and stall every search, to the end of the caller's
-- transaction.
create or replace function kb.delete_knowledge_base(name text)
returns table (documents bigint, chunks bigint)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer;
    n_documents bigint;
    n_chunks bigint;
begin
    perform kb_internal.check_given_name(name, 'knowledge base');
    target_kb := kb_internal.managed_kb(delete_knowledge_base.name, 'delete it');
    select k.chunk_count into n_chunks from kb.knowledge_bases as k where k.id = target_kb for update;
    if not found then  -- deleted while this call waited: as if it had never been there
        raise exception 'unknown knowledge base "%"', left(name, 200) using errcode = 'no_data_found';
    end if;
    n_documents := (select count(*) from kb.documents as d where d.kb_id = target_kb);
    delete from kb.knowledge_bases as k where k.id = target_kb;
    return query select n_documents, n_chunks;
end
$$;

-- Set knowledge base `name`'s visibility ('private', 'team' or 'public') and, when `team` is given, its team
-- (NULL keeps the one it has; 'team' needs one). Its owner or an administrator; the owner names one of their
-- own teams (kb_internal.callers_team), an administrator any. Its team's members may not.
create or replace function kb.set_knowledge_base_visibility(name text, visibility text, team text default null)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer;
    new_team bigint;
begin
    perform kb_internal.check_given_name(name, 'knowledge base');
    if visibility is null or visibility not in ('private', 'team', 'public') then
        raise exception 'invalid visibility "%": expected private, team or public', left(coalesce(visibility, 'NULL'), 200)
            using errcode = 'invalid_parameter_value';
    end if;
    if team is not null then
        perform kb_internal.check_given_name(team, 'team');
    end if;
    target_kb := kb_internal.managed_kb(set_knowledge_base_visibility.name, 'change its visibility or team');
    new_team := coalesce(
        kb_internal.callers_team(team),
        (select k.team_id from kb.knowledge_bases as k where k.id = target_kb)
    );
    if visibility = 'team' and new_team is null then
        raise exception 'a team-visible knowledge base needs a team: knowledge base "%" has none, name one', name
            using errcode = 'invalid_parameter_value';
    end if;
    update kb.knowledge_bases as k
    set visibility = set_knowledge_base_visibility.visibility, team_id = new_team, updated_at = now()
    where k.id = target_kb;
end
$$;

-- Hand knowledge base `name` to pgkb user `owner`. An administrator, to anyone; its owner, to themselves or a
-- member of one of their teams (looked for among those members: any other user and one that does not exist
-- give the same error and read the same rows). Its team's members may not.
create or replace function kb.set_knowledge_base_owner(name text, owner text)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer;
    me bigint := kb.current_user_id();
    new_owner bigint;
begin
    perform kb_internal.check_given_name(name, 'knowledge base');
    perform kb_internal.check_given_name(owner, 'pgkb user');
    target_kb := kb_internal.managed_kb(set_knowledge_base_owner.name, 'hand it to another user');
    if kb.current_is_admin() then
        new_owner := (select u.id from kb.users as u where u.name = owner);
        if new_owner is null then
            raise exception 'unknown pgkb user "%"', left(owner, 200) using errcode = 'no_data_found';
        end if;
    else
        -- the caller and their teams' members, each read by id (u.name || '': never the users' name index)
        new_owner := (
            select u.id from kb.users as u
            where u.id = any(array(
                select me
                union
                select m.user_id from kb.memberships as m
                where m.team_id = any(array(select mine.team_id from kb.memberships as mine where mine.user_id = me))
            ))
                and u.name || '' = owner
        );
        if new_owner is null then
            raise exception 'no member of your teams is called "%"', left(owner, 200) using errcode = 'no_data_found',
                hint = 'an owner may hand a knowledge base to a member of one of their teams; an administrator to anyone';
        end if;
    end if;
    update kb.knowledge_bases as k set owner_id = new_owner, updated_at = now() where k.id = target_kb;
end
$$;

-- Rename knowledge base `name` to `new_name` (the rules of kb.create_knowledge_base: 1-100 letters, digits,
-- "_", "." or "-"; one namespace, so a name taken by any knowledge base is "not available"). Its owner or an
-- administrator. Its id, and so its indexes, documents and statistics, stay; its documents' URIs change.
create or replace function kb.rename_knowledge_base(name text, new_name text)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb integer;
begin
    perform kb_internal.check_given_name(name, 'knowledge base');
    perform kb_internal.check_name(new_name, 'knowledge base');
    target_kb := kb_internal.managed_kb(rename_knowledge_base.name, 'rename it');
    if new_name = name then
        return;
    end if;
    update kb.knowledge_bases as k set name = new_name, updated_at = now() where k.id = target_kb;
exception when unique_violation then
    raise exception 'knowledge base name "%" is not available', new_name using errcode = 'unique_violation',
        hint = 'knowledge base names are unique across pgkb; choose another name';
end
$$;

-- Take pgkb user `username` out of team `team`; true if they were in it. An administrator, anyone; a user,
-- only themselves (leaving a team of their own: another team and a missing one give the same error). They
-- keep the knowledge bases they own, and stop seeing the team's other ones.
create or replace function kb.remove_team_member(team text, username text)
returns boolean
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    me bigint := kb.current_user_id();
    tid bigint;
    uid bigint;
begin
    perform kb_internal.check_given_name(team, 'team');
    perform kb_internal.check_given_name(username, 'pgkb user');
    if kb.current_is_admin() then
        tid := (select t.id from kb.teams as t where t.name = team);
        if tid is null then
            raise exception 'unknown team "%"', left(team, 200) using errcode = 'no_data_found';
        end if;
        uid := (select u.id from kb.users as u where u.name = username);
        if uid is null then
            raise exception 'unknown pgkb user "%"', left(username, 200) using errcode = 'no_data_found';
        end if;
    elsif me is not null and username = (select u.name from kb.users as u where u.id = me) then
        tid := kb_internal.callers_team(team);
        uid := me;
    else
        -- before any name is looked up: nobody else learns which users or teams exist
        perform kb.require_admin('remove other users from teams');
    end if;
    delete from kb.memberships as m where m.team_id = tid and m.user_id = uid;
    return found;
end
$$;

-- Administrators: remove pgkb user `name`; their API keys and team memberships go with them, and their login
-- role loses pgkb_user (the role itself stays). Refused while they own knowledge bases, unless transfer_to
-- names the user who gets them all. Not the user the caller acts as. Returns how many were handed over.
create or replace function kb.remove_user(name text, transfer_to text default null)
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    uid bigint;
    login name;
    heir bigint;
    owned text [];
begin
    perform kb.require_admin('remove users');
    perform kb_internal.check_given_name(name, 'pgkb user');
    if transfer_to is not null then
        perform kb_internal.check_given_name(transfer_to, 'pgkb user');
    end if;
    select u.id, u.db_role into uid, login from kb.users as u where u.name = remove_user.name for update;
    if uid is null then
        raise exception 'unknown pgkb user "%"', left(name, 200) using errcode = 'no_data_found';
    end if;
    if uid = kb.current_user_id() then
        raise exception 'pgkb user "%" is the one this session acts as: remove it from another administrator''s session',
            name using errcode = 'object_in_use';
    end if;
    if transfer_to is not null then
        heir := (select u.id from kb.users as u where u.name = transfer_to);
        if heir is null then
            raise exception 'unknown pgkb user "%" (transfer_to)', left(transfer_to, 200) using errcode = 'no_data_found';
        end if;
        if heir = uid then
            raise exception 'transfer_to names the user being removed' using errcode = 'invalid_parameter_value';
        end if;
    end if;
    owned := array(select k.name from kb.knowledge_bases as k where k.owner_id = uid order by k.name for update);
    if cardinality(owned) > 0 and heir is null then
        raise exception 'pgkb user "%" owns % knowledge base(s): %', name, cardinality(owned),
            array_to_string(owned[1:10], ', ') || case when cardinality(owned) > 10 then ', ...' else '' end
            using errcode = 'dependent_objects_still_exist',
                hint = 'hand them over with transfer_to => ''<user>'', or delete them first (kb.delete_knowledge_base)';
    end if;
    update kb.knowledge_bases as k set owner_id = heir, updated_at = now() where k.owner_id = uid;
    delete from kb.users as u where u.id = uid;  -- memberships and API keys: ON DELETE CASCADE
    if login is not null and exists (select from pg_roles as r where r.rolname = login) then
        begin
            execute format('revoke pgkb_user from %I', login);
        exception when insufficient_privilege then
            raise notice 'pgkb: cannot revoke pgkb_user from role % (the owner of schema kb lacks the right); '
                'revoke it yourself: REVOKE pgkb_user FROM %', login, login;
        end;
    end if;
    return cardinality(owned);
end
$$;

-- The pgkb users the caller may see: everyone for administrators, else themselves only (an unmapped role:
-- none), with their login role, teams and the knowledge bases they own.
create or replace function kb.list_users()
returns table (
    name text, db_role name, is_admin boolean, teams text[], knowledge_bases text[], created_at timestamptz
)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    shown bigint [] := case
        when kb.current_is_admin() then array(select u.id from kb.users as u)
        else array_remove(array[kb.current_user_id()], null)
    end;
begin
    return query
    select u.name, u.db_role, u.is_admin,
        coalesce(array(
            select t.name from kb.memberships as m join kb.teams as t on t.id = m.team_id
            where m.user_id = u.id order by t.name
        ), '{}'),
        coalesce(array(select k.name from kb.knowledge_bases as k where k.owner_id = u.id order by k.name), '{}'),
        u.created_at
    from unnest(shown) as s (id)
    join kb.users as u on u.id = s.id
    order by u.name;
end
$$;

-- The teams the caller may see: every team for administrators, with its members; else the caller's own teams,
-- members NULL (who else is in a team is the administrators' to see, as with kb.memberships).
create or replace function kb.list_teams()
returns table (name text, members text[], created_at timestamptz)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if kb.current_is_admin() then
        return query
        select t.name,
            coalesce(array(
                select u.name from kb.memberships as m join kb.users as u on u.id = m.user_id
                where m.team_id = t.id order by u.name
            ), '{}'),
            t.created_at
        from kb.teams as t
        order by t.name;
        return;
    end if;
    return query
    select t.name, null::text [], t.created_at
    from kb.memberships as m join kb.teams as t on t.id = m.team_id
    where m.user_id = kb.current_user_id()
    order by t.name;
end
$$;
