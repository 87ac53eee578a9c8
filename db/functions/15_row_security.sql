-- Row-level security: the policies on kb's tables (the visibility they apply is 10_identity.sql's).

-- Row-level security on every table, as a second line: end-user roles hold no privilege on these tables
-- (they read through 55_reads.sql), but a role granted SELECT by hand still sees only visible rows.
alter table kb.users enable row level security;
alter table kb.teams enable row level security;
alter table kb.memberships enable row level security;
alter table kb.knowledge_bases enable row level security;
alter table kb.documents enable row level security;
alter table kb.chunks enable row level security;
alter table kb.term_stats enable row level security;
alter table kb.embeddings enable row level security;
alter table kb.embedding_queue enable row level security;
alter table kb.embedding_models enable row level security;
alter table kb.ingest_failures enable row level security;

drop policy if exists users_visible on kb.users;
create policy users_visible on kb.users for select
using (id = (select kb.current_user_id()) or (select kb.current_is_admin()));

drop policy if exists teams_visible on kb.teams;
create policy teams_visible on kb.teams for select
using ((select kb.current_is_admin()) or exists (
    select from kb.memberships as m
    where m.team_id = teams.id and m.user_id = (select kb.current_user_id())
));

drop policy if exists memberships_visible on kb.memberships;
create policy memberships_visible on kb.memberships for select
using (user_id = (select kb.current_user_id()) or (select kb.current_is_admin()));

drop policy if exists knowledge_bases_visible on kb.knowledge_bases;
create policy knowledge_bases_visible on kb.knowledge_bases for select
using (id = any((select kb.visible_kb_ids())::integer[]));

-- Everything that belongs to a knowledge base: visible with it.
do $kb_rows$
declare
    tbl text;
begin
    foreach tbl in array array[
        'documents', 'chunks', 'term_stats', 'term_blocks', 'postings', 'embeddings', 'embedding_queue', 'ingest_failures',
        'image_captions', 'glossary', 'knowledge_saves'
    ] loop
        continue when to_regclass('kb.' || tbl) is null;    -- a schema before migration 014 / 016 / 032 / 049
        execute format('drop policy if exists %1$I on kb.%2$I', tbl || '_visible', tbl);
        execute format(
            'create policy %1$I on kb.%2$I for select'
            ' using (kb_id = any((select kb.visible_kb_ids())::integer[]))',
            tbl || '_visible', tbl
        );
    end loop;
end
$kb_rows$;

drop policy if exists embedding_models_visible on kb.embedding_models;
create policy embedding_models_visible on kb.embedding_models for select using (true);

-- Row-level security (enabled by migration 024) as a second line: end-user roles hold no privilege on
-- kb.api_keys at all, but a role granted SELECT by hand still sees only its own keys.
do $api_keys$
begin
    if to_regclass('kb.api_keys') is not null then  -- NULL: a schema before migration 024
        drop policy if exists api_keys_visible on kb.api_keys;
        create policy api_keys_visible on kb.api_keys for select
        using (user_id = (select kb.current_user_id()) or (select kb.current_is_admin()));
    end if;
end
$api_keys$;

-- The question log (migration 036) as a second line: end users hold no privilege on it (they read through
-- 39_question_log.sql), but a role granted SELECT by hand sees only its own questions and ratings and, as an
-- owner, its knowledge bases' parts of questions.
do $question_log$
begin
    if to_regclass('kb.questions') is not null then  -- NULL: a schema before migration 036
        drop policy if exists questions_visible on kb.questions;
        create policy questions_visible on kb.questions for select
        using (user_id = (select kb.current_user_id()) or (select kb.current_is_admin()));
        drop policy if exists question_kbs_visible on kb.question_kbs;
        create policy question_kbs_visible on kb.question_kbs for select
        using ((select kb.current_is_admin()) or kb_id in (
            select k.id from kb.knowledge_bases as k where k.owner_id = (select kb.current_user_id())
        ));
        drop policy if exists answer_ratings_visible on kb.answer_ratings;
        create policy answer_ratings_visible on kb.answer_ratings for select
        using (user_id = (select kb.current_user_id()) or (select kb.current_is_admin()));
    end if;
end
$question_log$;
