-- Query embedding for the vector leg when the caller passes none: the model's query prefix, then
-- kb_internal.http_embeddings (plpython3u) against kb.settings.embedding_url, every phrasing of a question in one
-- request. Never raises for an unavailable endpoint: no embedding, and why, so search degrades to the lexical
-- legs and can say so.

-- The embeddings of queries (the phrasings of one question) by a registered model, in one request, or NULL and
-- failure: why none can be had, a sentence for people ("the embedding service is not reachable (...)"; endpoint
-- messages through kb_internal.redact: no key, user info or query string). Unreachable (connection refused,
-- timed out): kb_internal.http_embeddings's SQLSTATE 08000. A vector of the wrong dimension or a zero /
-- degenerate norm counts as no embedding for all of them.
create or replace function kb_internal.query_embeddings(
    queries text[], model kb.embedding_models, out embeddings vector[], out failure text
)
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    url text := kb_internal.setting('embedding_url');
    api_key text := kb_internal.setting('embedding_api_key');
    timeout_ms integer := kb_internal.setting_int('embedding_timeout_ms');
    result real [];
    why text;
begin
    if coalesce(url, '') = '' then
        failure := 'no embedding service is configured (the embedding_url setting is empty)';
        return;
    end if;
    if to_regprocedure('kb_internal.http_embeddings(text,text,text[],text,integer)') is null then
        failure := 'plpython3u is not installed, so the database cannot embed queries; '
            'pass query_embedding => ...';
        return;
    end if;
    begin
        execute 'select kb_internal.http_embeddings($1, $2, $3, $4, $5)'
        into result
        using url, model.name, array(select model.query_prefix || q from unnest(queries) with ordinality as x (q, n)
            order by x.n), api_key, timeout_ms;
    exception when others then
        why := kb_internal.redact(regexp_replace(sqlerrm, '^plpy\.Error: ', ''), url, array[api_key]);
        failure := format(
            case when sqlstate = '08000' then 'the embedding service is not reachable (%s)'
                else 'the embedding service failed (%s)' end, why
        );
        return;
    end;
    if coalesce(array_length(result, 2), 0) is distinct from model.dimension then
        failure := format('the embedding service returned %s dimensions, model "%s" has %s',
            coalesce(array_length(result, 2), 0), model.name, model.dimension);
        return;
    end if;
    embeddings := array(
        select array(select unnest(result[i:i][:]))::vector from generate_subscripts(result, 1) as i order by i
    );
    if exists (select from unnest(embeddings) as e where not kb_internal.storable_embedding(e, model.storage)) then
        embeddings := null;
        failure := 'the embedding service returned a zero or degenerate vector';
    end if;
end
$$;

-- A query's embedding (kb_internal.query_embeddings of the query alone) or NULL and why not.
create or replace function kb_internal.query_embedding(
    query text, model kb.embedding_models, out embedding vector, out failure text
)
language sql volatile
set search_path = pg_catalog, public, pg_temp
as $$
    select e.embeddings[1], e.failure from kb_internal.query_embeddings(array[query], model) as e
$$;

-- Embed the phrasings of a query with a registered model (kb_internal.query_embeddings, one request); NULL, and a
-- NOTICE "pgkb: query embedding failed: <why>; searching with the lexical legs only", if no embedding can be had.
create or replace function kb_internal.embed_queries(queries text[], model kb.embedding_models)
returns vector[]
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    attempt record;
begin
    select * into attempt from kb_internal.query_embeddings(queries, model);
    if attempt.failure is not null then
        raise notice 'pgkb: query embedding failed: %; searching with the lexical legs only', attempt.failure;
    end if;
    return attempt.embeddings;
end
$$;
