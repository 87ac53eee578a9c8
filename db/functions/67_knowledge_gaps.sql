-- What was asked and not found (issue 34): a knowledge base's logged questions that its knowledge did not
-- answer, or answered unhelpfully, grouped into topics by the similarity of their embeddings, for its owner.

-- Knowledge base kb's gaps since `since` (its owner or an administrator; an unknown or invisible kb gives the
-- readers' error): its part of each logged question that it did not answer (its hits failed the answer gate) or
-- whose answer was rated unhelpful, and the unhelpful ratings kept alone for it -- at most the gap_questions
-- newest -- grouped greedily, newest first, into topics: a question joins the first topic whose first question
-- has cosine similarity >= gap_similarity with it (embedded in batches by the default model; without an
-- embedding, the first topic with the same query terms). Each topic: how many questions, how many rated
-- unhelpful, up to three examples (the newest, distinct), the documents of kb that came closest (most often
-- among its questions' hits, at most three) and when it was last asked. Largest topics first.
create or replace function kb.knowledge_gaps(kb text, since interval default '7 days')
returns table (
    topic integer, questions integer, unhelpful integer, examples text[], closest_documents text[],
    last_asked timestamptz
)
language plpgsql volatile security definer
set search_path = pg_catalog, public, pg_temp
set enable_seqscan = off    -- by index: no row of another knowledge base's log is read
as $$
declare
    target_kb constant integer := kb_internal.managed_kb(knowledge_gaps.kb, 'read its knowledge gaps');
    threshold constant double precision := kb_internal.setting_number('gap_similarity');
    most constant integer := kb_internal.setting_int('gap_questions');
    model kb.embedding_models;
    texts text[];          -- the gaps' questions, newest first
    asked timestamptz[];
    rated_unhelpful boolean[];
    documents jsonb;        -- per question, the ids of kb's documents its hits named
    embedded vector[];
    batch vector[];
    leaders vector[];      -- per topic, its first question's embedding (NULL: it has none)
    leader_terms text[];   -- per topic, its first question's sorted distinct terms
    assigned integer[];    -- per question, its topic
    terms text;
    chosen integer;
    i integer;
    j integer;
begin
    if since is null then
        raise exception 'since must be an interval' using errcode = 'invalid_parameter_value';
    end if;
    perform kb_internal.settle_question_kbs(array[target_kb], since, most);  -- the parts not judged yet
    select coalesce(array_agg(g.question order by g.at desc), '{}'), array_agg(g.at order by g.at desc),
        array_agg(g.bad order by g.at desc), jsonb_agg(to_jsonb(g.documents) order by g.at desc)
    into texts, asked, rated_unhelpful, documents
    from (
        select q.question, x.asked_at as at, coalesce(not r.helpful, false) as bad, x.documents
        from kb.question_kbs as x
        -- lateral: each part's question and rating looked up by its question id, never a scan of everyone's
        cross join lateral (select y.question from kb.questions as y where y.id = x.question_id) as q
        left join lateral (
            select a.helpful from kb.answer_ratings as a where a.question_id = x.question_id
        ) as r on true
        where x.kb_id = target_kb and x.asked_at >= now() - since and (not x.found or r.helpful = false)
        union all
        select r.question, r.rated_at, true, '{}'
        from kb.answer_ratings as r
        where r.kb_id = target_kb and r.question_id is null and not r.helpful and r.rated_at >= now() - since
        order by 2 desc
        limit most
    ) as g;
    if cardinality(texts) = 0 then
        return;
    end if;

    begin
        model := kb.resolve_model(null);
    exception when others then
        model := null;  -- no default model: grouped by terms
    end;
    if model.id is not null then
        for i in 0 .. (cardinality(texts) - 1) / 64 loop
            select e.embeddings into batch from kb_internal.query_embeddings(texts[i * 64 + 1 : i * 64 + 64], model) as e;
            embedded := embedded || coalesce(batch, array_fill(null::vector, array[least(64, cardinality(texts) - i * 64)]));
        end loop;
    end if;

    for i in 1 .. cardinality(texts) loop
        chosen := null;
        terms := array_to_string(array(
            select distinct t.term from unnest(kb_internal.query_terms(texts[i])) as t (term) order by 1
        ), ' ');
        for j in 1 .. coalesce(cardinality(leader_terms), 0) loop
            if (embedded[i] is not null and leaders[j] is not null and 1 - (embedded[i] <=> leaders[j]) >= threshold)
                or ((embedded[i] is null or leaders[j] is null) and leader_terms[j] = terms) then
                chosen := j;
                exit;
            end if;
        end loop;
        if chosen is null then
            leaders := leaders || embedded[i];
            leader_terms := leader_terms || terms;
            chosen := cardinality(leader_terms);
        end if;
        assigned := assigned || chosen;
    end loop;

    return query
    with member as (
        select g.question, g.at as asked_at, g.bad as rated_unhelpful, a.topic,
            array(select jsonb_array_elements_text(documents -> (g.n::integer - 1))::bigint) as documents
        from unnest(texts, asked, rated_unhelpful, assigned) with ordinality as g (question, at, bad, topic, n)
        cross join lateral (select g.topic) as a
    ),
    sized as (
        select m.topic, count(*)::integer as questions, (count(*) filter (where m.rated_unhelpful))::integer as bad,
            max(m.asked_at) as last_asked
        from member as m group by m.topic
    )
    select row_number() over (order by s.questions desc, s.last_asked desc)::integer, s.questions, s.bad,
        array(
            select e.question from (
                select m.question, max(m.asked_at) as latest from member as m where m.topic = s.topic
                group by m.question order by 2 desc limit 3
            ) as e order by e.latest desc
        ),
        array(
            select d.doc_key from (
                select u.id, count(*) as times, min(u.k) as best
                from member as m cross join lateral unnest(m.documents) with ordinality as u (id, k)
                where m.topic = s.topic group by u.id
            ) as c
            join kb.documents as d on d.id = c.id and d.kb_id = target_kb
            order by c.times desc, c.best, d.doc_key limit 3
        ),
        s.last_asked
    from sized as s
    order by 1;
end
$$;
