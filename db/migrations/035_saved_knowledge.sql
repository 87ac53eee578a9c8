-- 035 knowledge saved by agents (issue 34): kb.save_knowledge writes a document through kb.replace_document
-- and records each save here, so that a user's saves per minute are bounded however many servers they
-- call. Rows go with their user and knowledge base; nobody but administrators reads them directly.

create table kb.knowledge_saves (
    id bigint generated always as identity primary key,
    user_id bigint not null references kb.users (id) on delete cascade,
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    doc_key text not null,
    saved_at timestamptz not null default now()
);
create index knowledge_saves_user_idx on kb.knowledge_saves (user_id, saved_at);
create index knowledge_saves_kb_idx on kb.knowledge_saves (kb_id);
alter table kb.knowledge_saves enable row level security;

insert into kb.settings (key, value, description) values
(
    'save_max_chars', '20000',
    'the longest body kb.save_knowledge accepts, in characters (title and tags apart)'
),
(
    'saves_per_minute', '10',
    'how many documents one user may save with kb.save_knowledge per minute (0: none)'
)
on conflict (key) do nothing;
