-- Query embedding for the vector leg when the caller passes none: the model's query prefix, then
-- kb.http_embedding (plpython3u) against kb.settings.embedding_url. Never raises for an unavailable
-- endpoint: returns NULL with a NOTICE so search degrades to the lexical legs.

-- Embed a query with a registered model; NULL (and a NOTICE saying why, through kb.redact: no key, user
-- info or query string of the endpoint) if no embedding can be had.
create or replace function kb.embed_query(query text, model kb.embedding_models)
returns vector
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    url text := kb.setting('embedding_url');
    api_key text := kb.setting('embedding_api_key');
    timeout_ms integer := kb.setting_int('embedding_timeout_ms');
    result real [];
begin
    if coalesce(url, '') = '' then
        raise notice 'pgkb: no embedding_url configured; searching with the lexical legs only';
        return null;
    end if;
    if to_regprocedure('kb.http_embedding(text,text,text,text,integer)') is null then
        raise notice 'pgkb: plpython3u is not installed, so the database cannot embed queries; '
            'pass query_embedding => ... (searching with the lexical legs only)';
        return null;
    end if;
    begin
        execute 'select kb.http_embedding($1, $2, $3, $4, $5)'
        into result
        using url, model.name, model.query_prefix || query, api_key, timeout_ms;
    exception when others then
        raise notice 'pgkb: query embedding failed (%); searching with the lexical legs only',
            kb.redact(sqlerrm, url, array[api_key]);
        return null;
    end;
    if cardinality(result) is distinct from model.dimension then
        raise notice 'pgkb: embedding endpoint returned % dimensions, model "%" has %; lexical legs only',
            cardinality(result), model.name, model.dimension;
        return null;
    end if;
    return result::vector;
end
$$;
