-- 002 knowledge: who (users, teams, memberships), where (knowledge bases) and what (documents, chunks),
-- plus the BM25 corpus statistics that kb.replace_document keeps current.

create table kb.users (
    id bigint generated always as identity primary key,
    name text not null unique check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$'),
    db_role name unique,            -- the login role that acts as this user (NULL: only via pgkb_service)
    is_admin boolean not null default false,
    created_at timestamptz not null default now()
);

create table kb.teams (
    id bigint generated always as identity primary key,
    name text not null unique check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$'),
    created_at timestamptz not null default now()
);

create table kb.memberships (
    team_id bigint not null references kb.teams (id) on delete cascade,
    user_id bigint not null references kb.users (id) on delete cascade,
    primary key (team_id, user_id)
);
create index memberships_user_idx on kb.memberships (user_id);

create table kb.knowledge_bases (
    id integer generated always as identity primary key,
    name text not null unique check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'),
    visibility text not null default 'private' check (visibility in ('private', 'team', 'public')),
    owner_id bigint references kb.users (id) on delete set null,
    team_id bigint references kb.teams (id) on delete set null,
    description text not null default '',
    chunk_count bigint not null default 0,      -- BM25: N
    term_total bigint not null default 0,       -- BM25: sum of chunk lengths in terms (avgdl = term_total / N)
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    check (visibility <> 'team' or team_id is not null)
);

create table kb.documents (
    id bigint generated always as identity primary key,
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    doc_key text not null check (doc_key <> '' and length(doc_key) <= 1000),
    title text not null default '',
    source_url text,
    source_type text not null default 'markdown',
    content_hash text not null,
    metadata jsonb not null default '{}' check (jsonb_typeof(metadata) = 'object'),
    status text not null default 'ready' check (status in ('ready', 'embedding')),
    chunk_count integer not null default 0,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    unique (kb_id, doc_key)
);

create table kb.chunks (
    id bigint generated always as identity primary key,
    document_id bigint not null references kb.documents (id) on delete cascade,
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,  -- denormalised for filters
    ordinal integer not null check (ordinal >= 0),
    content text not null check (content <> ''),
    heading_path text[] not null default '{}',
    chunk_type text not null default 'text'
    check (chunk_type in ('text', 'table', 'code', 'faq', 'image_caption')),
    char_count integer not null,
    metadata jsonb not null default '{}' check (jsonb_typeof(metadata) = 'object'),
    term_freqs jsonb not null,       -- {term: frequency} over title + heading path + content (kb.term_freqs)
    term_count integer not null,     -- BM25 chunk length
    unique (document_id, ordinal)
);
create index chunks_kb_idx on kb.chunks (kb_id);
-- lexical leg: inverted index over CJK bigrams + word tokens (keys of term_freqs, operator ?|)
create index chunks_terms_idx on kb.chunks using gin (term_freqs);
-- fuzzy leg: trigrams (needs LC_CTYPE C.UTF-8 or another UTF-8 locale for CJK)
create index chunks_trgm_idx on kb.chunks using gin (content gin_trgm_ops);

-- BM25 document frequency per knowledge base and term.
create table kb.term_stats (
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    term text not null,
    df integer not null,
    primary key (kb_id, term)
);

-- The role that installs pgkb is its first administrator (and the owner of knowledge bases it creates).
insert into kb.users (name, db_role, is_admin)
select
    current_user as name,
    current_user as db_role,
    true as is_admin
where current_user ~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$';
