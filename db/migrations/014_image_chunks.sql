-- 014 image chunks: images (Markdown references, image files, images inside PDF pages) become chunks of
-- type 'image' (a vision model's caption plus alt text, figure caption and file name); 'image_caption'
-- stays valid for rows written before. kb.image_captions caches captions per knowledge base, image
-- content hash (SHA-256), vision model and caption language, so re-ingesting an unchanged image calls no
-- vision endpoint. It holds knowledge (what an image shows): pgkb users reach it only through the
-- write-checked functions of db/functions/33_image_captions.sql, never directly.

alter table kb.chunks drop constraint chunks_chunk_type_check;
alter table kb.chunks add constraint chunks_chunk_type_check
check (chunk_type in ('text', 'table', 'code', 'faq', 'image_caption', 'image'));

create table kb.image_captions (
    kb_id integer not null references kb.knowledge_bases (id) on delete cascade,
    image_sha256 text not null check (image_sha256 ~ '^[0-9a-f]{64}$'),
    model text not null check (model <> '' and length(model) <= 200),
    language text not null check (language ~ '^[a-z]{2,8}$'),
    caption text not null check (caption <> '' and length(caption) <= 20000),
    created_at timestamptz not null default now(),
    primary key (kb_id, image_sha256, model, language)
);
