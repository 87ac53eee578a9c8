-- kb.ask: retrieve (kb_internal.search, so row-level visibility decides what can be cited), weigh the evidence
-- (kb.answer_evidence, kb.answer_gate), then answer with numbered citations -- from the chat endpoint
-- (kb_internal.chat_completion) when one is configured, else extractively -- and verify them (kb.cite).

-- Log an ask (kb_internal.log_question, mode 'ask') with its verdict, the documents its citations name and its
-- evidence (the score); {"question_id": id} for the answer's evidence when it was logged, else {}.
create or replace function kb_internal.ask_logged(
    q text, also text[], kb_name text, hits kb.search_result[], answered boolean, citations jsonb, evidence jsonb
)
returns jsonb
language sql volatile
set search_path = pg_catalog, public, pg_temp
as $$
    select jsonb_strip_nulls(jsonb_build_object('question_id', kb_internal.log_question(
        q, also, kb_name, 'ask', hits, answered, array(
            select c.document_id
            from jsonb_array_elements(citations) with ordinality as x (citation, n)
            join kb.chunks as c on c.id = (x.citation ->> 'chunk_id')::bigint
            where answered
            group by c.document_id
            order by min(x.n)
        ), evidence
    )))
$$;

-- The body of kb.ask (parameters renamed: kb.ask's output column "mode" shadows its parameter; found is
-- answered here, FOUND being PL/pgSQL's own).
-- Internal: pgkb users call kb.ask. On a failing chat endpoint the answer is the extractive one with
-- evidence.llm_error saying why; a chat answer that is the not-found sentence gives found = false.
-- evidence adds score, min_score (the gate) and sources (hits retrieved) to kb.answer_evidence, and
-- lexical_only ("lexical only: <why>", kb_internal.query_embedding's reason) when the database could not
-- embed the question, so the vector leg did not run. The database embeds only when given no embedding and
-- no vector weight of 0. An extractive answer that kb.answer_is_closest judges to rest on meaning alone is
-- mode 'closest', found false.
create or replace function kb_internal.ask_answer(
    q text, k integer, kb_name text, doc_filter jsonb, wanted text, streaming boolean,
    given_embedding vector, model_name text, v_weight double precision, also text[], also_embeddings vector[]
)
returns table (
    answer text, answered boolean, citations jsonb, mode text, model text, evidence jsonb,
    dropped_citations integer, uncited boolean,
    retrieve_ms double precision, generate_ms double precision, total_ms double precision
)
language plpgsql volatile
set search_path = pg_catalog, public, pg_temp
as $$
declare
    started timestamptz := clock_timestamp();
    retrieved timestamptz;
    chat_url text := btrim(kb_internal.setting('chat_url'));
    can_chat boolean := to_regprocedure(
        'kb_internal.chat_completion(text,text,jsonb,integer,integer,double precision,boolean)'
    ) is not null;
    hits kb.search_result[];
    embedding vector := given_embedding;
    phrasing_embeddings vector[] := also_embeddings;
    embedded vector[];
    translated text;        -- the question's offline translation (kb.query_translation), blended into its embedding
    embedding_failure text;
    reply jsonb;
    checked record;
    llm_error text;
begin
    perform kb.check_search_input(q, k, also);
    wanted := lower(btrim(coalesce(wanted, 'auto')));
    if wanted not in ('auto', 'llm', 'extractive') then
        raise exception 'mode must be ''auto'', ''llm'' or ''extractive'' (or NULL for auto), got %', left(wanted, 50)
            using errcode = 'invalid_parameter_value';
    end if;
    if streaming is null then
        raise exception 'stream must be true or false, not NULL' using errcode = 'invalid_parameter_value';
    end if;
    if wanted = 'llm' and chat_url = '' then
        raise exception 'mode ''llm'' needs a chat endpoint, and none is configured'
            using errcode = 'feature_not_supported',
                hint = 'an administrator sets the chat_url setting (docs/answers.md, "Configuring a chat endpoint"); mode => ''extractive'' works offline';
    end if;
    if wanted = 'llm' and not can_chat then
        raise exception 'mode ''llm'' needs plpython3u, which this database does not have'
            using errcode = 'feature_not_supported', hint = 'mode => ''extractive'' works without it';
    end if;
    if wanted = 'auto' then
        wanted := case when chat_url <> '' and can_chat then 'llm' else 'extractive' end;
    end if;

    if kb_name is not null then
        perform kb.resolve_kb(kb_name);     -- an unknown knowledge base fails before the embedding is awaited
    end if;
    -- embedded here, not by kb_internal.search, to learn why it failed; vector weight 0 then (the same legs run)
    -- every phrasing and the question's offline translation in one request (blended into the question's embedding)
    if embedding is null and v_weight is distinct from 0 then
        translated := kb.query_translation(q, kb_name, also);
        select e.embeddings, e.failure into embedded, embedding_failure
        from kb_internal.query_embeddings(
            array[q] || coalesce(also, '{}') || array_remove(array[translated], null), kb.resolve_model(model_name)
        ) as e;
        embedding := kb.blend_query_embeddings(embedded[1], embedded[coalesce(cardinality(also), 0) + 2]);
        if also is not null and phrasing_embeddings is null then
            phrasing_embeddings := embedded[2:cardinality(also) + 1];
        end if;
        v_weight := case when embedding is null then 0 else v_weight end;
    end if;
    hits := array(
        select h from kb_internal.search(
            q, k, kb_name, embedding, model_name, v_weight,
            null, null, null, null, doc_filter, null, null, null, null, also,
            case when v_weight is distinct from 0 then phrasing_embeddings end
        ) as h
    );
    retrieved := clock_timestamp();
    evidence := kb.answer_evidence(q, hits, also);
    evidence := evidence || jsonb_build_object(
        'score', kb.answer_score(evidence),
        'min_score', kb_internal.setting('answer_min_score')::double precision,
        'sources', cardinality(hits)
    ) || case when embedding_failure is not null
        then jsonb_build_object('lexical_only', 'lexical only: ' || embedding_failure) else '{}' end;
    retrieve_ms := extract(epoch from retrieved - started) * 1000;
    dropped_citations := 0;
    uncited := false;

    if not kb.answer_gate(evidence) then
        answer := kb.not_found_text(q);
        answered := false;
        citations := '[]';
        mode := 'not_found';
        generate_ms := 0;
        total_ms := extract(epoch from clock_timestamp() - started) * 1000;
        evidence := evidence || kb_internal.ask_logged(q, also, kb_name, hits, false, citations, evidence);
        return next;
        return;
    end if;

    if wanted = 'llm' then
        begin
            execute 'select kb_internal.chat_completion($1, $2, $3, $4, $5, $6, $7)'
            into reply
            using chat_url, kb_internal.setting('chat_model'), kb.answer_prompt(q, hits),
                kb_internal.setting_int('chat_timeout_ms'), kb_internal.setting_int('chat_max_tokens'),
                kb_internal.setting('chat_temperature')::double precision, streaming;
        exception when others then
            llm_error := sqlerrm;
        end;
    end if;

    if reply is not null then
        select * into checked from kb.cite(reply ->> 'content', hits);
        mode := 'llm';
        model := reply ->> 'model';
        if btrim(regexp_replace(checked.answer, '[。.\s]+$', '')) in (
            '知识库中未找到相关信息', 'Not found in the knowledge base'
        ) then
            -- the model read the sources and found no answer in them
            answer := kb.not_found_text(q);
            answered := false;
            citations := '[]';
            mode := 'not_found';
            evidence := evidence || '{"refused_by": "llm"}';
        else
            answer := checked.answer;
            answered := true;
            citations := checked.citations;
            dropped_citations := checked.dropped;
            uncited := checked.uncited;
        end if;
    else
        select * into checked from kb.extractive_reply(q, hits);
        answer := checked.answer;
        answered := true;
        citations := checked.citations;
        mode := 'extractive';
        if kb.answer_is_closest(evidence) then
            -- the first source holds few of the question's words: shown as the closest passages
            answer := kb.closest_text(q) || E'\n\n' || checked.answer;
            answered := false;
            mode := 'closest';
        end if;
        dropped_citations := checked.dropped;
        uncited := checked.uncited;
        if llm_error is not null then
            evidence := evidence || jsonb_build_object('llm_error', llm_error);
        end if;
    end if;
    generate_ms := extract(epoch from clock_timestamp() - retrieved) * 1000;
    total_ms := extract(epoch from clock_timestamp() - started) * 1000;
    evidence := evidence || kb_internal.ask_logged(q, also, kb_name, hits, answered, citations, evidence);
    return next;
end
$$;

-- Answer a question from the knowledge bases the caller can read (kb: only that one; filter: document
-- metadata @> filter). mode NULL / 'auto': 'llm' when kb.settings chat_url is set, else 'extractive';
-- 'llm' without an endpoint raises. Returns one row; mode 'not_found' (the chat endpoint never called)
-- when kb.answer_gate refuses the evidence, 'closest' (found false: the passages nearest the question,
-- introduced as such) when an extractive answer's first source holds few of its words. stream: chat
-- deltas arrive as NOTICEs 'pgkb-delta:<text>'. query_embedding, model and vector_weight are
-- kb.hybrid_search's: without an embedding the database embeds the question itself (blended with its
-- offline translation's, kb.query_translation, when no also is given), unless vector_weight
-- is 0 (a caller whose own embedding failed: lexical legs only, no second try here). also / also_embeddings:
-- other phrasings of the question, as kb.hybrid_search takes them; the gate reads the best phrasing's evidence.
create or replace function kb.ask(
    question text,
    top_k integer default 5,
    kb text default null,
    filter jsonb default null,
    mode text default null,
    stream boolean default false,
    query_embedding vector default null,
    model text default null,
    vector_weight double precision default null,
    also text[] default null,
    also_embeddings vector[] default null
)
returns table (
    answer text, found boolean, citations jsonb, mode text, model text, evidence jsonb,
    dropped_citations integer, uncited boolean,
    retrieve_ms double precision, generate_ms double precision, total_ms double precision
)
language sql volatile security definer
set search_path = pg_catalog, public, pg_temp
as $$
    select * from kb_internal.ask_answer($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
$$;
