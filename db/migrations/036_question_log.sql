-- 036 the question log (issue 34), off by default per knowledge base: kb.knowledge_bases.question_log_days
-- (NULL: off; N: on, rows kept N days). A search or an ask that searched a knowledge base with the log on
-- writes one kb.questions row (the redacted question, as its asker and administrators see it) and one
-- kb.question_kbs row per such knowledge base (that knowledge base's part: as its owner sees it, without
-- who asked). kb.answer_ratings holds 👍/👎 on answers: against a logged question, or alone.

alter table kb.knowledge_bases add column question_log_days integer
constraint question_log_days_range check (question_log_days between 1 and 3650);

create table kb.questions (
    id bigint generated always as identity primary key,
    user_id bigint references kb.users (id) on delete cascade,
    asked_at timestamptz not null default now(),
    question text not null,             -- kb.redact(question)
    phrasings integer not null default 1,
    mode text not null,                 -- search, vector, lexical, fuzzy, retrieve, ask
    entry_point text not null,          -- sql, mcp, page, dify, cli
    found boolean not null,
    top_score double precision,         -- kb.answer_score of the hits (the answer gate's)
    latency_ms double precision not null,
    documents bigint[] not null default '{}'   -- cited (ask) or found (search) documents, best first
);
create index questions_user_idx on kb.questions (user_id, asked_at);

create table kb.question_kbs (
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    question_id bigint not null references kb.questions (id) on delete cascade,
    asked_at timestamptz not null,
    found boolean not null,             -- this knowledge base's hits pass the answer gate
    top_score double precision,         -- kb.answer_score of this knowledge base's hits
    documents bigint[] not null default '{}',  -- this knowledge base's cited or found documents
    primary key (kb_id, question_id)
);
create index question_kbs_question_idx on kb.question_kbs (question_id);
create index question_kbs_kb_time_idx on kb.question_kbs (kb_id, asked_at);

create table kb.answer_ratings (
    id bigint generated always as identity primary key,
    user_id bigint references kb.users (id) on delete cascade,
    rated_at timestamptz not null default now(),
    question_id bigint references kb.questions (id) on delete cascade,
    kb_id integer references kb.knowledge_bases (id) on delete cascade,
    question text,                      -- kb.redact(question), for a rating kept alone
    helpful boolean not null,
    note text
);
create unique index answer_ratings_question_idx on kb.answer_ratings (question_id) where question_id is not null;
create index answer_ratings_user_idx on kb.answer_ratings (user_id, rated_at);
create index answer_ratings_kb_idx on kb.answer_ratings (kb_id, rated_at);

alter table kb.questions enable row level security;
alter table kb.question_kbs enable row level security;
alter table kb.answer_ratings enable row level security;

insert into kb.settings (key, value, description) values
(
    'gap_similarity', '0.9',
    'kb.knowledge_gaps: the cosine similarity at or above which two questions are one topic'
),
(
    'gap_questions', '1000',
    'kb.knowledge_gaps: how many of the newest unanswered questions are grouped into topics'
),
(
    'ratings_per_minute', '30',
    'kb.rate_answer: at most this many ratings per user and minute (0: none)'
)
on conflict (key) do nothing;
