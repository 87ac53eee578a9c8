-- 005 ingest failures: files that could not be ingested, with the reason, until a later run succeeds.

create table kb.ingest_failures (
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    doc_key text not null,
    error text not null,
    failed_at timestamptz not null default now(),
    primary key (kb_id, doc_key)
);
