-- 003 embeddings: the model registry, embeddings keyed by (chunk, model) in an untyped vector column
-- (one partial HNSW expression index per model, created by kb.register_embedding_model), and the queue
-- of chunks still waiting for an embedding.

create table kb.embedding_models (
    id integer generated always as identity primary key,
    name text not null unique check (name <> '' and length(name) <= 200),
    dimension integer not null check (dimension between 1 and 2000),
    query_prefix text not null default '',     -- e.g. 'query: ' (e5) or a bge query instruction
    passage_prefix text not null default '',   -- e.g. 'passage: ' (e5)
    is_default boolean not null default false,
    created_at timestamptz not null default now()
);
create unique index embedding_models_one_default on kb.embedding_models (is_default) where is_default;

create table kb.embeddings (
    chunk_id bigint not null references kb.chunks (id) on delete cascade,
    model_id integer not null references kb.embedding_models (id) on delete cascade,
    kb_id integer not null,     -- denormalised so filtered HNSW scans need no join
    embedding vector not null,
    created_at timestamptz not null default now(),
    primary key (chunk_id, model_id)
);

create table kb.embedding_queue (
    chunk_id bigint not null references kb.chunks (id) on delete cascade,
    model_id integer not null references kb.embedding_models (id) on delete cascade,
    kb_id integer not null,
    enqueued_at timestamptz not null default now(),
    attempts integer not null default 0,
    next_attempt_at timestamptz not null default now(),
    last_error text,
    parked boolean not null default false,     -- gave up after repeated failures; see last_error
    primary key (chunk_id, model_id)
);
create index embedding_queue_ready_idx on kb.embedding_queue (model_id, next_attempt_at) where not parked;
