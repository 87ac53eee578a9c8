-- The question log (issue 34, migration 036), off by default per knowledge base: what was asked, found or not,
-- and how readers rated the answers. Who sees what: a user their own questions (kb.my_questions); an owner
-- their knowledge base's part of each question, without who asked (kb.question_log); administrators all.
-- Nothing of a knowledge base with the log off is written. The tables are read through these functions only.

-- The entry point a search or an ask was called from: pgkb's clients set pgkb.entry_point to 'mcp', 'page',
-- 'dify' or 'cli' for their transaction (set_config(..., true)), and `pgkb eval` / `pgkb sweep` to 'eval' (a
-- replay: never logged); anything else, or nothing, is 'sql'.
create or replace function kb_internal.entry_point()
returns text
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    e constant text := coalesce(current_setting('pgkb.entry_point', true), '');
begin
    return case when e in ('mcp', 'page', 'dify', 'cli', 'eval') then e else 'sql' end;
end
$$;

-- Turn the question log of knowledge base kb on, rows kept `days` days (1..3650), or off (days NULL or 0):
-- its owner or an administrator. Turning it off stops the writing and keeps what was logged until it ages
-- out or kb.purge_question_log deletes it. Returns the days now in force (NULL: off).
create or replace function kb.set_question_log(kb text, days integer)
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb constant integer := kb_internal.managed_kb(set_question_log.kb, 'change its question log');
begin
    if days is not null and days not between 0 and 3650 then
        raise exception 'days must be between 1 and 3650 (0 or NULL: off), got %', days
            using errcode = 'invalid_parameter_value';
    end if;
    update kb.knowledge_bases as k set question_log_days = nullif(days, 0) where k.id = target_kb;
    return nullif(days, 0);
end
$$;

-- How many days knowledge base kb keeps its question log (NULL: off): its owner or an administrator.
create or replace function kb.question_log_days(kb text)
returns integer
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select k.question_log_days from kb.knowledge_bases as k
    where k.id = kb_internal.managed_kb(question_log_days.kb, 'read its question log setting')
$$;

-- Delete knowledge base kb's part of its logged questions, all of them or those asked before `before`, and
-- the questions (with their ratings) that no knowledge base's log holds any more: its owner or an
-- administrator. Returns how many of kb's rows were deleted.
create or replace function kb.purge_question_log(kb text, before timestamptz default null)
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    target_kb constant integer := kb_internal.managed_kb(purge_question_log.kb, 'purge its question log');
    deleted bigint;
begin
    with gone as (
        delete from kb.question_kbs as q
        where q.kb_id = target_kb and (before is null or q.asked_at < before)
        returning q.question_id
    ),
    orphans as (
        delete from kb.questions as q
        where q.id in (select g.question_id from gone as g)
            and not exists (select from kb.question_kbs as o where o.question_id = q.id and o.kb_id <> target_kb)
    )
    select count(*) into deleted from gone;
    delete from kb.answer_ratings as r
    where r.kb_id = target_kb and r.question_id is null and (before is null or r.rated_at < before);
    return deleted;
end
$$;

-- The documents (ids, best first, at most 10, no repeats) that hits name. (PL/pgSQL: its statement is
-- planned once per session; a SQL function with SET is planned at every call, on the search path here.)
create or replace function kb_internal.hit_documents(hits kb.search_result[])
returns bigint[]
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    return (
        select coalesce(array_agg(x.id order by x.first), '{}')
        from (
            select c.document_id as id, min(h.ordinality) as first
            from unnest(hits) with ordinality as h
            join kb.chunks as c on c.id = h.chunk_id
            group by c.document_id
            order by min(h.ordinality)
            limit 10
        ) as x
    );
end
$$;

-- Log one search or ask of question (and its also phrasings) over knowledge base kb_name (NULL: every one the
-- caller can see), if any of them has its question log on; otherwise write nothing and return NULL. hits: what
-- it returned; answered, cited and evidence: an ask's verdict, the documents its answer cites and its
-- kb.answer_evidence (NULL for a search). Only the logged knowledge bases' hits and documents count (an
-- answer from others alone is logged as not found). Each logged knowledge base gets its own part. The
-- documents found or cited are stored now; what the answer gate says of a search's hits, and of each part's,
-- is judged later, when the log is first read (kb_internal.settle_questions, settle_question_kbs): the search
-- pays for an insert per row, not for the gate, and the row keeps its hits (ids and leg scores, no content)
-- until then. Rows older than a knowledge base's retention go, but for rows a reader holds (skipped, for a
-- later call). The latency is the statement's so far. Not on a standby, in a read-only transaction, from
-- entry point 'eval', or when the transaction set pgkb.question_log to 'off' (a call that accompanies a
-- logged one: the page's search beside its ask). Returns the question's id, also kept in pgkb.question_id for
-- kb.last_question_id().
create or replace function kb_internal.log_question(
    question text, also text[], kb_name text, mode text, hits kb.search_result[], answered boolean, cited bigint[],
    evidence jsonb default null
)
returns bigint
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    asked constant boolean := mode = 'ask';
    searched integer[];
    logged record;
    logged_ids integer[];
    logged_names text[];   -- the searched knowledge bases that keep a question log
    kept kb.search_result[];
    part kb.search_result[];
    documents bigint[];    -- found (a search) or cited (an ask), of the logged knowledge bases
    question_id bigint;
    latency constant double precision := extract(epoch from clock_timestamp() - statement_timestamp()) * 1000;
begin
    perform set_config('pgkb.question_id', '', false);
    -- (the cheapest test first: a companion call and the benchmarks' loops turn the log off)
    if current_setting('pgkb.question_log', true) = 'off' or current_setting('transaction_read_only') = 'on'
        or kb_internal.entry_point() = 'eval' then
        return null;    -- a standby, a read-only transaction, a replay (pgkb eval, pgkb sweep), or a companion call
    end if;
    searched := case when kb_name is null then kb.visible_kb_ids() else array[kb.resolve_kb(kb_name)] end;
    select coalesce(array_agg(k.id order by k.id), '{}'), coalesce(array_agg(k.name order by k.id), '{}')
    into logged_ids, logged_names
    from kb.knowledge_bases as k where k.id = any(searched) and k.question_log_days is not null;
    if cardinality(logged_ids) = 0 then
        return null;
    end if;
    -- nothing of a knowledge base with the log off; of the others, what the gate reads: ids and leg scores
    kept := array(
        select row(
            h.chunk_id, h.kb, null, null, null, null, null, null, null, null, h.score, h.vector_rank, h.lexical_rank,
            h.fuzzy_rank, h.vector_score, h.lexical_score, h.fuzzy_score, h.vector_used, null
        )::kb.search_result
        from unnest(hits) with ordinality as h where h.kb = any(logged_names) order by h.ordinality
    );
    if asked then
        cited := array(
            select c.id from unnest(cited) with ordinality as c (id, n)
            join kb.documents as d on d.id = c.id and d.kb_id = any(logged_ids)
            order by c.n
        );
        answered := coalesce(answered, false) and cardinality(cited) > 0;  -- else: from unlogged ones alone
    end if;
    documents := case when asked then cited else kb_internal.hit_documents(kept) end;
    insert into kb.questions (
        user_id, question, phrasings, also, mode, entry_point, found, top_score, latency_ms, documents, hits
    ) values (
        kb.current_user_id(), kb.redact(question), 1 + coalesce(cardinality(also), 0),
        array(select kb.redact(a) from unnest(also) as a), log_question.mode, kb_internal.entry_point(),
        case when asked then answered when cardinality(kept) = 0 then false end,  -- NULL: judged later
        case when asked and jsonb_typeof(evidence -> 'coverage') = 'number' and cardinality(kept) > 0
            then kb.answer_score(evidence) end,
        latency, documents, case when not asked and cardinality(kept) > 0 then kept end
    )
    returning id into question_id;
    for logged in
        select k.id, k.name, k.question_log_days from kb.knowledge_bases as k where k.id = any(logged_ids)
    loop
        part := array(select h from unnest(kept) as h where h.kb = logged.name);
        insert into kb.question_kbs (kb_id, question_id, asked_at, found, documents, hits)
        values (
            logged.id, question_id, now(), case when cardinality(part) = 0 then false end,
            case
                when cardinality(logged_ids) = 1 then documents  -- the one logged knowledge base: the question's
                when asked then array(
                    select c.id from unnest(cited) with ordinality as c (id, n)
                    join kb.documents as d on d.id = c.id and d.kb_id = logged.id order by c.n
                )
                else kb_internal.hit_documents(part)
            end,
            nullif(part, '{}')
        );
        -- retention: the rows past it that no reader holds (a held one goes with a later search); an index
        -- probe first, the delete only when there is something to delete
        continue when not exists (
            select from kb.question_kbs as q
            where q.kb_id = logged.id and q.asked_at < now() - make_interval(days => logged.question_log_days)
        );
        with old as (
            select q.question_id from kb.question_kbs as q
            where q.kb_id = logged.id and q.asked_at < now() - make_interval(days => logged.question_log_days)
            for update skip locked
        ),
        gone as (
            delete from kb.question_kbs as q using old
            where q.kb_id = logged.id and q.question_id = old.question_id
            returning q.question_id
        ),
        orphans as (
            select q.id from kb.questions as q
            where q.id in (select g.question_id from gone as g)
                and not exists (select from kb.question_kbs as o where o.question_id = q.id and o.kb_id <> logged.id)
            for update skip locked
        )
        delete from kb.questions as q using orphans where q.id = orphans.id;
    end loop;
    perform set_config('pgkb.question_id', question_id::text, false);
    return question_id;
end
$$;

-- Judge the caller's logged searches among ids that wait for it: found (the answer gate on the hits the
-- search kept) and top_score (kb.answer_score), read over the knowledge bases that logged it and the caller
-- can still see, with the question as logged (redacted) and today's statistics. A search none of whose hits
-- exists any more (their documents were rewritten) cannot be judged: found stays NULL. Read-write
-- transactions only; rows another transaction holds are left to it. At most 200 a call (about a second, and
-- 0.6 ms more for each hit the gate tokenises): the rest wait for the next read. Called by the asker's reading (kb.my_questions).
create or replace function kb_internal.settle_questions(ids bigint[])
returns void
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    visible constant integer[] := kb.visible_kb_ids();
    q record;
    evidence jsonb;
begin
    if current_setting('transaction_read_only') = 'on' then
        return;
    end if;
    for q in
        select x.id, x.question, x.also, x.hits from kb.questions as x
        where x.id = any(ids) and x.hits is not null
        order by x.asked_at desc
        limit 200
        for no key update skip locked
    loop
        evidence := kb_internal.hits_evidence(q.question, q.hits, q.also, array(
            select p.kb_id from kb.question_kbs as p where p.question_id = q.id and p.kb_id = any(visible)
        ));
        update kb.questions as x
        set found = case when (evidence ->> 'visible_hits')::integer > 0 then kb.answer_gate(evidence) end,
            top_score = case when (evidence ->> 'visible_hits')::integer > 0 then kb.answer_score(evidence) end,
            hits = null
        where x.id = q.id;
    end loop;
end
$$;

-- Judge the parts of knowledge bases kb_ids asked since `since` that wait for it (only those rated helpful
-- when rated_only), the `most` newest and at most 200 a call (about a second, and 0.6 ms more for each hit the
-- gate tokenises; the rest wait for the next read): whether that knowledge base's hits pass the answer gate, and their score, read over that knowledge
-- base alone, with the question as logged (redacted) and today's statistics. A part none of whose hits exists
-- any more cannot be judged: found stays NULL. Read-write transactions only; parts another transaction holds
-- are left to it. Called by the owner's and administrators' reading (kb.question_log, kb.knowledge_gaps,
-- kb.rated_questions).
create or replace function kb_internal.settle_question_kbs(
    kb_ids integer[], since interval, most integer, rated_only boolean default false
)
returns void
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    p record;
    evidence jsonb;
begin
    if current_setting('transaction_read_only') = 'on' then
        return;
    end if;
    for p in
        select x.kb_id, x.question_id, x.hits, q.question, q.also
        from kb.question_kbs as x
        -- lateral: each part's question by its id, never a scan of everyone's
        cross join lateral (select y.question, y.also from kb.questions as y where y.id = x.question_id) as q
        -- (an index condition whatever the plan: "kb IS NULL OR kb_id = kb" in a generic plan is not one, and
        -- would read every knowledge base's waiting parts)
        where x.hits is not null and x.kb_id = any(kb_ids) and x.asked_at >= now() - since
            and (not rated_only or exists (
                select from kb.answer_ratings as a where a.question_id = x.question_id and a.helpful
            ))
        order by x.asked_at desc
        limit least(most, 200)
        for no key update of x skip locked
    loop
        evidence := kb_internal.hits_evidence(p.question, p.hits, p.also, array[p.kb_id]);
        update kb.question_kbs as x
        set found = case when (evidence ->> 'visible_hits')::integer > 0 then kb.answer_gate(evidence) end,
            top_score = case when (evidence ->> 'visible_hits')::integer > 0 then kb.answer_score(evidence) end,
            hits = null
        where x.kb_id = p.kb_id and x.question_id = p.question_id;
    end loop;
end
$$;

-- hits, after kb_internal.log_question logged them as a search of mode: the search API's functions return
-- kb_internal.search's hits through it.
create or replace function kb_internal.logged_hits(
    mode text, question text, also text[], kb_name text, hits kb.search_result[]
)
returns setof kb.search_result
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
begin
    perform kb_internal.log_question(question, also, kb_name, mode, hits, null, null);
    return query select * from unnest(hits);
end
$$;

-- The id of the question this session's last search or ask logged (NULL: it was not logged), for
-- kb.rate_answer. Only the asker can rate it, so a value set by hand gains nothing.
create or replace function kb.last_question_id()
returns bigint
language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select nullif(current_setting('pgkb.question_id', true), '')::bigint
$$;

-- The caller's own logged questions of the last `since` (newest first, at most max_rows of 1..1000): the
-- knowledge bases each searched that logged it and that the caller can still see, the documents found or
-- cited that the caller can still see, and the caller's rating. Searches not judged yet are judged first
-- (kb_internal.settle_questions; in a read-only transaction they show found NULL).
create or replace function kb.my_questions(since interval default '7 days', max_rows integer default 100)
returns table (
    question_id bigint, asked_at timestamptz, question text, mode text, entry_point text, found boolean,
    top_score double precision, latency_ms double precision, knowledge_bases text[], documents text[],
    helpful boolean, note text
)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off    -- by index: no other user's row is read, not even to be filtered out
as $$
declare
    me constant bigint := kb.current_user_id();
    visible constant integer[] := kb.visible_kb_ids();
begin
    if since is null or max_rows is null or max_rows not between 1 and 1000 then
        raise exception 'since must be an interval and max_rows between 1 and 1000'
            using errcode = 'invalid_parameter_value';
    end if;
    perform kb_internal.settle_questions(array(
        select q.id from kb.questions as q
        where q.user_id = me and q.asked_at >= now() - since and q.hits is not null
        order by q.asked_at desc limit max_rows
    ));
    return query
    select q.id, q.asked_at, q.question, q.mode, q.entry_point, q.found, q.top_score, q.latency_ms,
        array(
            select k.name from kb.question_kbs as x join kb.knowledge_bases as k on k.id = x.kb_id
            where x.question_id = q.id and k.id = any(visible) order by k.name
        ),
        array(
            select k.name || '/' || d.doc_key
            from unnest(q.documents) with ordinality as u (id, n)
            join kb.documents as d on d.id = u.id
            join kb.knowledge_bases as k on k.id = d.kb_id
            where d.kb_id = any(visible) order by u.n
        ),
        r.helpful, r.note
    from kb.questions as q
    -- lateral: each row's rating looked up by its question id, never a scan of everyone's ratings
    left join lateral (
        select a.helpful, a.note from kb.answer_ratings as a where a.question_id = q.id
    ) as r on true
    where q.user_id = me and q.asked_at >= now() - since
    order by q.asked_at desc, q.id desc
    limit max_rows;
end
$$;

-- Knowledge base kb's part of its logged questions of the last `since` (newest first, at most max_rows of
-- 1..1000): for its owner without who asked; for an administrator with the asker's name (kb NULL: every
-- knowledge base's). found, top_score and documents are this knowledge base's alone; nothing says which other
-- knowledge bases a question searched. An unknown or invisible kb gives the readers' error. Parts not judged
-- yet are judged first (kb_internal.settle_question_kbs).
create or replace function kb.question_log(kb text, since interval default '7 days', max_rows integer default 100)
returns table (
    question_id bigint, knowledge_base text, asked_at timestamptz, question text, mode text, entry_point text,
    found boolean, top_score double precision, latency_ms double precision, documents text[],
    helpful boolean, note text, asked_by text
)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off    -- by index: no other user's row is read, not even to be filtered out
as $$
declare
    admin constant boolean := kb.current_is_admin();
    targets integer[];
begin
    if since is null or max_rows is null or max_rows not between 1 and 1000 then
        raise exception 'since must be an interval and max_rows between 1 and 1000'
            using errcode = 'invalid_parameter_value';
    end if;
    if question_log.kb is null then
        perform kb.require_admin('read every knowledge base''s question log');
        targets := array(select k.id from kb.knowledge_bases as k);
    else
        targets := array[kb_internal.managed_kb(question_log.kb, 'read its question log')];
    end if;
    perform kb_internal.settle_question_kbs(targets, since, max_rows);
    return query
    select q.id, k.name, x.asked_at, q.question, q.mode, q.entry_point, x.found, x.top_score, q.latency_ms,
        array(
            select d.doc_key from unnest(x.documents) with ordinality as u (id, n)
            join kb.documents as d on d.id = u.id and d.kb_id = x.kb_id order by u.n
        ),
        r.helpful, r.note,
        case when admin then (select u.name from kb.users as u where u.id = q.user_id) end
    from kb.question_kbs as x
    -- lateral: each part's question and rating looked up by its question id, never a scan of everyone's
    cross join lateral (
        select y.id, y.question, y.mode, y.entry_point, y.latency_ms, y.user_id from kb.questions as y
        where y.id = x.question_id
    ) as q
    join kb.knowledge_bases as k on k.id = x.kb_id
    left join lateral (
        select a.helpful, a.note from kb.answer_ratings as a where a.question_id = x.question_id
    ) as r on true
    where x.kb_id = any(targets) and x.asked_at >= now() - since
    order by x.asked_at desc, q.id desc
    limit max_rows;
end
$$;

-- Rate an answer helpful or not, with an optional note (at most 2000 characters): the caller's own logged
-- question (question_id, e.g. kb.last_question_id(); rating it again replaces the rating), or, when the log
-- was off, the question's text with the knowledge base it was asked of (kb, optional; kept alone, redacted).
-- Another user's question id gives the error a missing one gives; at most ratings_per_minute ratings per user
-- and minute. Returns the rating's id.
create or replace function kb.rate_answer(
    helpful boolean,
    question_id bigint default null,
    note text default null,
    question text default null,
    kb text default null
)
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    me constant bigint := kb.current_user_id();
    target_kb integer;
    rating bigint;
begin
    if helpful is null then
        raise exception 'helpful must be true or false' using errcode = 'invalid_parameter_value';
    end if;
    if me is null then
        raise exception 'rating an answer needs a pgkb user (kb.create_user)' using errcode = 'insufficient_privilege';
    end if;
    if char_length(note) > 2000 then
        raise exception 'the note is % characters long; at most 2000 are accepted', char_length(note)
            using errcode = 'program_limit_exceeded';
    end if;
    note := nullif(btrim(note), '');
    -- one user's ratings, one at a time: the count is then exact however many servers call
    perform pg_advisory_xact_lock(hashtext('pgkb.rate_answer'), me::integer);
    if (
        select count(*) from kb.answer_ratings as r
        where r.user_id = me and r.rated_at > clock_timestamp() - interval '1 minute'
    ) >= kb_internal.setting_int('ratings_per_minute') then
        raise exception 'too many ratings: at most % per minute; try again in a minute',
            kb_internal.setting_int('ratings_per_minute') using errcode = 'program_limit_exceeded';
    end if;
    if (rate_answer.question_id is null) = (question is null) then
        raise exception 'give either question_id (a logged question) or question (with kb, when the log was off)'
            using errcode = 'invalid_parameter_value';
    end if;
    if rate_answer.question_id is not null then
        if rate_answer.kb is not null then
            raise exception 'kb goes with question, not with question_id' using errcode = 'invalid_parameter_value';
        end if;
        if not exists (select from kb.questions as q where q.id = rate_answer.question_id and q.user_id = me) then
            raise exception 'unknown question %: only your own logged questions can be rated by id',
                rate_answer.question_id using errcode = 'no_data_found',
                    hint = 'SELECT question_id FROM kb.my_questions() lists them';
        end if;
        insert into kb.answer_ratings as r (user_id, question_id, helpful, note)
        values (me, rate_answer.question_id, rate_answer.helpful, rate_answer.note)
        on conflict (question_id) where question_id is not null
        do update set helpful = excluded.helpful, note = excluded.note, rated_at = now()
        returning r.id into rating;
        return rating;
    end if;
    if kb_internal.is_blank(question) or char_length(question) > kb_internal.api_limit('query_chars') then
        raise exception 'question must not be blank, and at most % characters long',
            kb_internal.api_limit('query_chars') using errcode = 'invalid_parameter_value';
    end if;
    if rate_answer.kb is not null then
        target_kb := kb.resolve_kb(rate_answer.kb);
    end if;
    insert into kb.answer_ratings as r (user_id, kb_id, question, helpful, note)
    values (me, target_kb, kb.redact(question), rate_answer.helpful, rate_answer.note)
    returning r.id into rating;
    return rating;
end
$$;

-- Knowledge base kb's logged questions whose answers were rated helpful (its owner or an administrator; an
-- unknown or invisible kb gives the readers' error), asked in the last `since`, for `pgkb eval --from-log`:
-- each distinct question (its newest asking) with the mode it was asked in and kb's documents it cited (an
-- ask) or found (a search), best first, as doc keys of documents that still exist. At most max_rows
-- (1..10000), newest first; questions with no such document are left out. Parts not judged yet are judged
-- first (kb_internal.settle_question_kbs).
create or replace function kb.rated_questions(kb text, since interval default '90 days', max_rows integer default 1000)
returns table (question_id bigint, asked_at timestamptz, question text, mode text, documents text[])
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off    -- by index: no row of another knowledge base's log is read
as $$
declare
    target_kb constant integer := kb_internal.managed_kb(rated_questions.kb, 'read its rated questions');
begin
    if since is null or max_rows is null or max_rows not between 1 and 10000 then
        raise exception 'since must be an interval and max_rows between 1 and 10000'
            using errcode = 'invalid_parameter_value';
    end if;
    perform kb_internal.settle_question_kbs(array[target_kb], since, max_rows, rated_only => true);
    return query
    select t.id, t.asked_at, t.question, t.mode, t.keys
    from (
        select distinct on (q.question) q.id, x.asked_at, q.question, q.mode, docs.keys
        from kb.question_kbs as x
        -- lateral: each part's question and rating looked up by its question id, never a scan of everyone's
        cross join lateral (
            select y.id, y.question, y.mode from kb.questions as y where y.id = x.question_id
        ) as q
        cross join lateral (
            select a.helpful from kb.answer_ratings as a where a.question_id = x.question_id and a.helpful
        ) as r
        cross join lateral (
            select array(
                select d.doc_key from unnest(x.documents) with ordinality as u (id, n)
                join kb.documents as d on d.id = u.id and d.kb_id = x.kb_id order by u.n
            ) as keys
        ) as docs
        where x.kb_id = target_kb and x.asked_at >= now() - since and cardinality(docs.keys) > 0
        order by q.question, x.asked_at desc, q.id desc
    ) as t
    order by t.asked_at desc, t.id desc
    limit max_rows;
end
$$;
