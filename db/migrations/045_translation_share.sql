-- 045 the question's offline translation for the vector leg (kb_internal.translated_question) is made when a
-- tenth of the searched knowledge is in the other language, not only when that language is the knowledge's
-- main one (or none is): a Chinese question over Chinese runbooks with English API pages is translated too.
-- The language profile it reads now counts a chunk's prose only (kb_internal.text_language leaves code and
-- addresses out: a Chinese page's playground links and code blocks made it "English"; code alone has no
-- language and counts in no share), so every knowledge base's chunks are counted again when db/functions is
-- applied (34_language_profile.sql counts those not marked counted): one pass over the chunks' content inside
-- migrate's table locks, so searches wait for it (about 4 s per 100,000 chunks on the 2-core VM, 2026-12-07).

insert into kb.settings (key, value, description) values
(
    'translation_min_share', '0.1',
    'Search: a question is translated offline for the vector leg when at least this share of the searched '
    || 'chunks is in the other language (Chinese / English prose; kb.language_profile); 0 to 1'
)
on conflict (key) do nothing;

update kb.knowledge_bases set languages_counted = false;
