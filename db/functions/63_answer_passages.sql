-- Passages for the offline answer: which chunks kb.extractive_answer shows. The evidence is a heading
-- section, not a sentence: the chunks of the best hits' sections, read from the tables (only chunks of
-- knowledge bases the caller may read: hits are re-checked against kb.visible_kb_ids(), so a hand-made
-- hits array learns nothing), and the steps section when the question asks how to do something.

-- The chunks to answer question from, in answer order, as kb.search_result rows: the section (the run of
-- chunks with its heading path, at most 8 each side) of the first visible hit -- for a how-to question
-- (怎么办, 如何, how do I) its document's first steps section (步骤, 处理, steps …) with subsections, at most
-- 12 chunks -- and of one more hit as relevant by kb_internal.term_overlap from another section (another document
-- for a how-to question) with other text. Raises on a bad question or more than 100 hits.
create or replace function kb.answer_sources(question text, hits kb.search_result[])
returns kb.search_result[]
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    visible integer [] := kb.visible_kb_ids();
    how_to boolean;
    weights jsonb;
    anchor record;
    steps text [];
    chosen kb.search_result [] := '{}';
    section kb.search_result [];
    anchors integer := 0;
    first_section text;
begin
    perform kb_internal.check_answer_input(question, hits);
    how_to := question ~* ('(怎么办|怎么处理|怎么解决|怎么做|怎么弄|怎么排查|如何|怎样|步骤|排查|处理方法|解决方法'
        || '|\mhow (do|to|can|should|would)\M|\mwhat (should|do) (i|we)\M|\msteps?\M|\mprocedure\M|\mtroubleshoot)');
    weights := kb_internal.answer_term_weights(question, hits);

    for anchor in
        with candidates as (
            select h.ord, c.id as chunk_id, c.document_id, c.heading_path, c.ordinal, c.content, hits[h.ord] as hit,
                kb_internal.term_overlap(kb_internal.answer_source(c.content), weights) as overlap
            from generate_subscripts(hits, 1) as h (ord)
            join kb.chunks as c on c.id = hits[h.ord].chunk_id and c.kb_id = any(visible)
        )
        select a.* from candidates as a
        -- the first: the best hit, whatever its words (the vector leg may have found it across languages)
        where a.ord = (select min(b.ord) from candidates as b)
            or a.overlap >= 0.5 * (select max(b.overlap) from candidates as b)
        order by a.ord
    loop
        exit when anchors = 2;
        -- a second passage comes from another section and says something else
        continue when anchor.content = any(array(select (x).content from unnest(chosen) as x))
            or first_section = anchor.document_id || ':' || array_to_string(anchor.heading_path, E'\x1f')
            -- a how-to answer's steps already speak for their document
            or how_to and split_part(first_section, ':', 1) = anchor.document_id::text;
        steps := null;
        if how_to and anchors = 0 then
            -- the first heading of the document that names steps, below a title heading all chunks share
            select c.heading_path[1:i.i] into steps
            from kb.chunks as c
            cross join lateral generate_subscripts(c.heading_path, 1) as i (i)
            where c.document_id = anchor.document_id
                and c.heading_path[i.i] ~* ('(步骤|处理|解决|排查|操作|措施|办法|方法|流程|\msteps?\M|procedure|how to'
                    || '|troubleshoot|resolution|\mfix|mitigation|remediation)')
                and (i.i > 1 or (
                    select count(distinct d.heading_path[1]) from kb.chunks as d
                    where d.document_id = anchor.document_id and cardinality(d.heading_path) > 0
                ) > 1)
            order by c.ordinal, i.i
            limit 1;
        end if;
        section := array(
            -- shown as kb_internal.search shows a hit (kb_internal.heading_trail, kb_internal.openable_source); also_in: the anchor's
            select row(c.id, k.name, d.doc_key, d.title, kb_internal.heading_trail(d.title, c.heading_path), c.ordinal,
                c.content, kb_internal.openable_source(d.source_url), c.chunk_type, c.metadata, (anchor.hit).score,
                null, null, null, null, null, null, (anchor.hit).vector_used,
                case when c.id = anchor.chunk_id then (anchor.hit).also_in end)::kb.search_result
            from kb.chunks as c
            join kb.documents as d on d.id = c.document_id
            join kb.knowledge_bases as k on k.id = c.kb_id
            where c.document_id = anchor.document_id
                and c.id <> all(array(select (x).chunk_id from unnest(chosen) as x))
                and case when steps is not null
                    then c.heading_path[1:cardinality(steps)] = steps
                    else c.heading_path = anchor.heading_path
                        and c.ordinal between anchor.ordinal - 8 and anchor.ordinal + 8
                        -- the run around the anchor: no other heading between
                        and not exists (
                            select from kb.chunks as o
                            where o.document_id = anchor.document_id and o.heading_path <> anchor.heading_path
                                and o.ordinal between least(c.ordinal, anchor.ordinal)
                                and greatest(c.ordinal, anchor.ordinal)
                        )
                end
            order by c.ordinal
            limit 12
        );
        continue when cardinality(section) = 0;
        chosen := chosen || section;
        anchors := anchors + 1;
        first_section := coalesce(first_section,
            anchor.document_id || ':' || array_to_string(anchor.heading_path, E'\x1f'));
    end loop;
    return chosen;
end
$$;

-- The offline answer of kb.ask, cited: kb.cite(kb.extractive_answer(question, sources), sources) with
-- sources = kb.answer_sources(question, hits), so [n] names sources[n] (returned too).
create or replace function kb.extractive_reply(question text, hits kb.search_result[])
returns table (answer text, citations jsonb, dropped integer, uncited boolean, sources kb.search_result[])
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    sources := kb.answer_sources(question, hits);
    select c.answer, c.citations, c.dropped, c.uncited into answer, citations, dropped, uncited
    from kb.cite(kb.extractive_answer(question, sources), sources) as c;
    return next;
end
$$;
