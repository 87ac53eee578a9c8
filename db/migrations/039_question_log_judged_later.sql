-- 039 the question log judges later (issue 34: logging must not slow search). A search logs its question,
-- its documents and, per logged knowledge base, its hits (ids and leg scores, no content), with found and
-- top_score NULL; the answer gate judges them when the log is first read (kb_internal.settle_questions and
-- settle_question_kbs), and the hits are dropped then (found stays NULL for hits that no longer exist). An
-- ask is judged as it answers.

alter table kb.questions alter column found drop not null;
alter table kb.questions add column also text[];                   -- the other phrasings, redacted
alter table kb.questions add column hits kb.search_result[];       -- a search's, until it is judged
alter table kb.question_kbs alter column found drop not null;
alter table kb.question_kbs add column hits kb.search_result[];    -- this knowledge base's, until judged
create index question_kbs_unjudged_idx on kb.question_kbs (kb_id, asked_at) where hits is not null;
create index questions_unjudged_idx on kb.questions (user_id, asked_at) where hits is not null;

-- log_question gained the ask's evidence
drop function if exists kb_internal.log_question(text, text[], text, text, kb.search_result[], boolean, bigint[]);
drop function if exists kb_internal.ask_logged(text, text[], text, kb.search_result[], boolean, jsonb);
