-- How a source is shown to readers, one rule for every client (psql, the CLI, MCP, the page, Dify): the
-- headings after its title (kb_internal.heading_trail) and the address of the document (kb_internal.openable_source).
-- kb_internal.search and kb.get_document apply both, kb.list_documents the second.

-- The headings to show after a document's title: heading_path without blank headings and without a heading
-- equal (white space around it aside) to the part shown before it, the title counting as the part before
-- the first heading. A Markdown file whose first heading repeats its title is then shown as
-- "title > section", never "title > title > section". Never NULL.
create or replace function kb_internal.heading_trail(title text, heading_path text[])
returns text[]
language plpgsql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    trail text[] := '{}';
    before text := btrim(title);    -- the part shown before the next heading (blank: none)
    part text;
begin
    -- a loop over the array, no query: search shows a trail for each of its top_k hits
    foreach part in array coalesce(heading_path, '{}') loop
        if btrim(part) <> '' then
            if before is null or before = '' or btrim(part) <> before then
                trail := trail || part;
            end if;
            before := btrim(part);
        end if;
    end loop;
    return trail;
end
$$;

-- The address of a document that whoever it is shown to can open: its source_url when that is an http(s)
-- address with a host (no white space or control character anywhere), else NULL -- clients then show
-- kb://<kb>/<doc_key>. A path on the server (what `pgkb ingest` records without --base-url) never leaves the
-- database through a read, nor does a script address (javascript://%0A..., data:, vbscript:) a link would run.
-- (A standard SQL body, bound when created like kb.document_uri below, so inlined into the query that calls it:
-- NULL in, NULL out without STRICT, which would keep it from being inlined.)
create or replace function kb_internal.openable_source(source_url text)
returns text
language sql immutable parallel safe
return case when source_url ~* '^https?://[a-z0-9\[]' and source_url !~ '[[:space:][:cntrl:]]' then source_url end;

-- The kb:// URI a reader is shown for a document, kb://<kb>/<doc_key>: the one place it is built (search
-- results' also_in, citations, and the clients, which select it; the MCP server serves it as a resource).
-- (A standard SQL body of immutable operators: bound when created, so no search_path is needed, and inlined
-- into the query that calls it: search builds one per candidate. format() is only stable: no inlining.)
create or replace function kb.document_uri(kb text, doc_key text)
returns text
language sql immutable parallel safe
return 'kb://' || coalesce(kb, '') || '/' || coalesce(doc_key, '');
