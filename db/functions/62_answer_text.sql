-- Answer text: the chat prompt, citation checking and the offline extractive answer, shared by every
-- client (psql, CLI, MCP). Pure functions of their arguments: they read no table, so what a hits array
-- holds is all they can tell; kb.ask hands them hits from kb_internal.search, which RLS has filtered.
-- Sources are numbered by their position in hits: [1] is hits[1].

-- True when the text holds a CJK ideograph, kana or hangul: answers and refusals are then Chinese.
create or replace function kb_internal.has_cjk(input text)
returns boolean
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select input ~ '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]'
$$;

-- The "not found" answer in the question's language: Chinese for a question with CJK characters,
-- English otherwise.
create or replace function kb.not_found_text(question text)
returns text
language sql immutable parallel safe security definer
set search_path = pg_catalog, pg_temp
as $$
    select case when kb_internal.has_cjk(coalesce(question, '')) then '知识库中未找到相关信息'
        else 'Not found in the knowledge base.' end
$$;

-- The line that opens a 'closest' answer (closest passages, not an answer) in the question's language.
create or replace function kb.closest_text(question text)
returns text
language sql immutable parallel safe security definer
set search_path = pg_catalog, pg_temp
as $$
    select case when kb_internal.has_cjk(coalesce(question, '')) then '没有确切答案；以下是最接近的段落：'
        else 'No exact answer; these are the closest passages:' end
$$;

-- The part of a hit's content that answers read: its first 2000 characters (the chat model sees no more
-- of a source, kb.answer_prompt), so the work of an answer is bounded whatever a chunk's length.
create or replace function kb_internal.answer_source(content text)
returns text
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select left(coalesce(content, ''), 2000)
$$;

-- The sentences of a text, in order: split at line ends, after 。！？； ! ? ; and after a period that
-- white space follows; trimmed of Markdown list / heading / table / quote markers. heading: the line was
-- a Markdown heading. line: 1-based line number (sentences of one line share it). Blank pieces and
-- pieces without a letter or digit (table rules, lone punctuation) are left out. Linear in the text: each
-- sentence end is marked with a line break in one left-to-right pass (no look-behind), then split there.
create or replace function kb_internal.answer_sentences(input text)
returns table (ord integer, line integer, heading boolean, sentence text)
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select (row_number() over (order by l.n, s.n))::integer, l.n::integer, l.heading, s.piece
    from (
        select x.n, x.raw ~ '^\s{0,3}#{1,6}\s' as heading,
            regexp_replace(x.raw, '^\s*(?:#{1,6}\s+|>\s*|[-*+]\s+|\d{1,3}[.)]\s+|\|)\s*', '') as body
        from string_to_table(input, E'\n') with ordinality as x (raw, n)
    ) as l
    cross join lateral (
        select btrim(regexp_replace(p.piece, '\s*\|\s*', ' | ', 'g'), E' \t\r|') as piece, p.n
        from string_to_table(regexp_replace(l.body, '([。！？；!?;])|(\.)\s+', '\1\2' || E'\n', 'g'), E'\n')
            with ordinality as p (piece, n)
    ) as s
    where s.piece ~ '[[:alnum:]]'
$$;

-- Raises unless question is a valid query (kb.check_search_input) and hits holds at most 100 sources: the
-- bound of every function that reads the sources of an answer.
create or replace function kb_internal.check_answer_input(question text, hits kb.search_result[])
returns void
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    perform kb.check_search_input(question, 1);
    if coalesce(cardinality(hits), 0) > 100 then
        raise exception 'hits holds % rows; at most 100 sources are accepted', cardinality(hits)
            using errcode = 'program_limit_exceeded';
    end if;
end
$$;

-- Weighted overlap of a text with query terms: the sum of the weights of the distinct terms of
-- kb.lexical_terms(input) present in weights ({term: weight}). 0 when none is.
create or replace function kb_internal.term_overlap(input text, weights jsonb)
returns double precision
language sql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(sum((weights ->> t.term)::double precision), 0)
    from (select distinct u.term from unnest(kb.lexical_terms(input)) as u (term)) as t
    where weights ? t.term
$$;

-- Term weights for matching a question against the sentences of the hits: {term: idf} for the distinct
-- kb.lexical_terms of question, idf = ln(1 + S / (1 + s)) over the S sentences of the hits' contents
-- (s of them hold the term), so common words of these sources weigh little. Reads only its arguments.
-- Linear: sentence terms are counted in one hash aggregate, not once per question term.
create or replace function kb_internal.answer_term_weights(question text, hits kb.search_result[])
returns jsonb
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    with sentences as (
        select distinct on (s.sentence) s.sentence, kb.lexical_terms(s.sentence) as terms
        from unnest(hits) as h
        cross join lateral kb_internal.answer_sentences(kb_internal.answer_source(h.content)) as s
    ),
    total as (select count(*)::double precision as n from sentences),
    query_terms as (select distinct t.term from unnest(kb_internal.query_terms(question)) as t (term)),
    holding as (
        select t.term, count(distinct s.sentence) as s
        from sentences as s cross join unnest(s.terms) as t (term)
        where t.term in (select q.term from query_terms as q)
        group by t.term
    )
    select coalesce(jsonb_object_agg(q.term, ln(1 + total.n / (1 + coalesce(h.s, 0)))), '{}')
    from query_terms as q cross join total left join holding as h on h.term = q.term
$$;

-- The chat messages for answering question from hits, as a jsonb array [{role, content}]: a system
-- message with the rules (only the numbered sources, [n] after every statement, the not-found sentence,
-- the question's language) and a user message with each source as "[n] title > headings (page p)" and
-- its text, then the question. Each source is cut by kb_internal.answer_source and the sources to 12000 in all.
create or replace function kb.answer_prompt(question text, hits kb.search_result[])
returns jsonb
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    budget constant integer := 12000;
    sources text := '';
    block text;
    hit kb.search_result;
    n integer := 0;
    used integer := 0;
    page text;
begin
    perform kb_internal.check_answer_input(question, hits);
    foreach hit in array coalesce(hits, '{}') loop
        n := n + 1;
        exit when used >= budget;
        page := hit.metadata ->> 'page';
        block := format('[%s] %s', n, concat_ws(' > ', nullif(hit.title, ''), nullif(array_to_string(
            hit.heading_path, ' > '), ''))
        ) || case when page is not null then format(' (page %s)', left(page, 20)) else '' end
        || E'\n' || left(kb_internal.answer_source(hit.content), budget - used);
        used := used + length(block);
        sources := sources || block || E'\n\n';
    end loop;
    return jsonb_build_array(
        jsonb_build_object('role', 'system', 'content',
            'You answer questions from a private knowledge base. Use only the numbered sources the user '
            || 'gives; never use other knowledge and never guess. After every statement put the number of '
            || 'the source it comes from in square brackets, e.g. [1] or [1][2]; cite only numbers that are '
            || 'given. If the sources do not answer the question, reply exactly "' || kb.not_found_text(question)
            || '" and nothing else. Answer in the language of the question, briefly.'),
        jsonb_build_object('role', 'user', 'content',
            case when n = 0 then E'Sources: none.\n\n' else E'Sources:\n\n' || sources end
            || 'Question: ' || question)
    );
end
$$;

-- The Markdown blocks of a text, in order: a fenced code block (``` or ~~~ through its closing fence, or
-- to the end) is one block; otherwise a run of non-blank lines is one (a paragraph, a list, a table).
-- kind: 'code', 'table' (every line starts with |) or 'text'. Linear: one pass over the lines.
create or replace function kb_internal.markdown_blocks(input text)
returns table (ord integer, kind text, block text)
language plpgsql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    line text;
    fence text;             -- the open fence's marker while inside a code block
    lines text [] := '{}';
begin
    ord := 0;
    foreach line in array string_to_array(input, E'\n') loop
        if fence is not null then
            lines := lines || line;
            if btrim(line) ~ ('^' || fence || '[`~]*$') then
                ord := ord + 1; kind := 'code'; block := array_to_string(lines, E'\n');
                return next;
                lines := '{}'; fence := null;
            end if;
        elsif line ~ '^\s{0,3}(```|~~~)' then
            if cardinality(lines) > 0 then
                ord := ord + 1; block := array_to_string(lines, E'\n');
                kind := case when block ~ '^\s*\|' and block !~ E'\n\\s*[^|\\s]' then 'table' else 'text' end;
                return next;
            end if;
            fence := substring(line from '^\s{0,3}(```|~~~)');
            lines := array[line];
        elsif btrim(line) = '' then
            if cardinality(lines) > 0 then
                ord := ord + 1; block := array_to_string(lines, E'\n');
                kind := case when block ~ '^\s*\|' and block !~ E'\n\\s*[^|\\s]' then 'table' else 'text' end;
                return next;
            end if;
            lines := '{}';
        else
            lines := lines || line;
        end if;
    end loop;
    if cardinality(lines) > 0 then
        ord := ord + 1; block := array_to_string(lines, E'\n');
        kind := case when fence is not null then 'code'
            when block ~ '^\s*\|' and block !~ E'\n\\s*[^|\\s]' then 'table' else 'text' end;
        return next;
    end if;
end
$$;

-- The offline answer: hits shown as passages, verbatim Markdown. Consecutive hits of one document make
-- one passage, under its title and deepest common heading in bold, and each hit's deeper
-- headings in bold; each hit's text is followed by its [n]. At most 1800 characters in all, cut at a block
-- boundary with "…" (a block too long by itself is cut at a line, never mid-row, and a code block closed;
-- one line too long at its last sentence end).
-- kb.answer_sources chooses which chunks to give it. Empty hits give the not-found sentence.
create or replace function kb.extractive_answer(question text, hits kb.search_result[])
returns text
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    budget constant integer := 1800;
    out text [] := '{}';        -- the answer's blocks
    used integer := 0;
    hit kb.search_result;
    prev kb.search_result;
    n integer := 0;
    common text [];
    i integer;
    b record;
    taken integer;
    piece text;
    line text;
    cut boolean := false;
begin
    perform kb_internal.check_answer_input(question, hits);
    if coalesce(cardinality(hits), 0) = 0 then
        return kb.not_found_text(question);
    end if;
    foreach hit in array hits loop
        n := n + 1;
        if prev.chunk_id is null or (prev.kb, prev.doc_key) is distinct from (hit.kb, hit.doc_key) then
            -- a new passage: its heading is the deepest heading its consecutive hits share
            common := coalesce(hit.heading_path, '{}');
            for i in n + 1 .. cardinality(hits) loop
                exit when (hits[i].kb, hits[i].doc_key) is distinct from (hit.kb, hit.doc_key);
                while cardinality(common) > 0
                    and common is distinct from (coalesce(hits[i].heading_path, '{}'))[1:cardinality(common)] loop
                    common := common[1:cardinality(common) - 1];
                end loop;
            end loop;
            -- the document's title, then the passage's heading (kb_internal.search shows no title twice)
            piece := '**' || concat_ws(' › ', coalesce(nullif(hit.title, ''), hit.doc_key), common[cardinality(common)])
                || '**';
            if used + length(piece) + 200 > budget then
                cut := true;
                exit;
            end if;
            out := out || piece;
            used := used + length(piece);
            prev := null;
        end if;
        -- the hit's headings below the passage's (those the previous hit of the passage did not show)
        for i in cardinality(common) + 1 .. coalesce(cardinality(hit.heading_path), 0) loop
            continue when prev.chunk_id is not null
                and prev.heading_path[1:i] is not distinct from hit.heading_path[1:i];
            piece := '**' || hit.heading_path[i] || '**';
            used := used + length(piece);
            out := out || piece;
        end loop;
        taken := 0;
        for b in select * from kb_internal.markdown_blocks(kb_internal.answer_source(hit.content)) as x order by x.ord loop
            if used + length(b.block) + 2 <= budget then
                out := out || b.block;
                used := used + length(b.block) + 2;
                taken := taken + 1;
                continue;
            end if;
            cut := true;
            if taken = 0 and budget - used >= 200 then
                -- the first block alone is too long: as many whole lines as fit
                piece := null;
                foreach line in array string_to_array(b.block, E'\n') loop
                    if used + coalesce(length(piece), 0) + length(line) + 8 > budget then
                        if piece is null and line !~ '^\s*\|' then
                            -- one long line of prose: up to its last sentence end that fits
                            line := left(line, budget - used - 8);
                            piece := coalesce(substring(line from '^(.{100,}[。！？；.!?;])'), line);
                        end if;
                        exit;
                    end if;
                    piece := coalesce(piece || E'\n', '') || line;
                end loop;
                if piece is not null then
                    if b.kind = 'code' then
                        piece := piece || E'\n' || substring(btrim(piece) from '^\s{0,3}(```|~~~)');
                    end if;
                    out := out || piece;
                    used := used + length(piece);
                    taken := 1;
                end if;
            end if;
            exit;
        end loop;
        if taken > 0 then
            -- the citation ends the hit's last prose line; after a table or code block it stands alone
            if out[cardinality(out)] ~ E'(^|\n)\\s*(\\||```|~~~)[^\n]*$' then
                out := out || format('[%s]', n);
            else
                out[cardinality(out)] := out[cardinality(out)] || format(' [%s]', n);
            end if;
        end if;
        exit when cut;
        prev := hit;
    end loop;
    if cut then
        out := out || '…'::text;
    end if;
    return coalesce(nullif(array_to_string(out, E'\n\n'), ''), kb.not_found_text(question));
end
$$;

-- text with the square brackets inside Markdown code -- fenced blocks and `inline` spans -- replaced by
-- U+E010 / U+E011, so that kb_internal.check_citations reads items[0] or [1, 2] in code as code, not as citation
-- markers; translate(x, E'\ue010\ue011', '[]') restores them. Linear in the lines.
create or replace function kb_internal.mask_code_brackets(input text)
returns text
language plpgsql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    line text;
    span text;
    fence text;
    lines text [] := '{}';
begin
    if input !~ '[`~]' then
        return input;
    end if;
    foreach line in array string_to_array(input, E'\n') loop
        if fence is not null then
            if btrim(line) ~ ('^' || fence || '[`~]*$') then
                fence := null;
            end if;
            line := translate(line, '[]', E'\ue010\ue011');
        elsif line ~ '^\s{0,3}(```|~~~)' then
            fence := substring(line from '^\s{0,3}(```|~~~)');
        else
            for span in select m[1] from regexp_matches(line, '(`[^`]+`)', 'g') as m loop
                line := replace(line, span, translate(span, '[]', E'\ue010\ue011'));
            end loop;
        end if;
        lines := lines || line;
    end loop;
    return array_to_string(lines, E'\n');
end
$$;

-- The body of kb.cite (its parameter renamed: kb.cite's output column "answer" shadows its parameter).
-- Internal; the contract is kb.cite's, below.
create or replace function kb_internal.check_citations(reply text, hits kb.search_result[])
returns table (answer text, citations jsonb, dropped integer, uncited boolean)
language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    marker constant text := '(?:\[|【)\s*\d{1,6}(?:\s*[,，、–~-]\s*\d{1,6})*\s*(?:\]|】)';
    n_sources integer := coalesce(cardinality(hits), 0);
    rest text := kb_internal.mask_code_brackets(reply);     -- [n] in code is code, not a citation
    out text := '';
    statement_start integer := 1;
    m text [];
    pos integer;
    nums integer [];
    valid integer [];
    lo integer;
    hi integer;
    part text;
    cited jsonb := '{}';   -- {n: statement text so far}
    stmt text;
    result_citations jsonb;
begin
    if reply is null then
        raise exception 'answer must not be NULL' using errcode = 'invalid_parameter_value';
    end if;
    if length(reply) > 100000 then
        raise exception 'answer is % characters long; at most 100000 are accepted', length(reply)
            using errcode = 'program_limit_exceeded';
    end if;
    if n_sources > 100 then
        raise exception 'hits holds % rows; at most 100 sources are accepted', n_sources
            using errcode = 'program_limit_exceeded';
    end if;
    dropped := 0;
    loop
        m := regexp_match(rest, marker);
        exit when m is null;
        pos := strpos(rest, m[1]);
        -- the text before the marker belongs to the statement it cites
        out := out || left(rest, pos - 1);
        stmt := substr(out, statement_start);
        nums := '{}';
        foreach part in array regexp_split_to_array(regexp_replace(m[1], '\[|\]|【|】|\s', '', 'g'), '[,，、]')
        loop
            if part ~ '^\d+[–~-]\d+$' then
                lo := substring(part from '^(\d+)')::integer;
                hi := substring(part from '(\d+)$')::integer;
                if hi >= lo and hi - lo < 20 then
                    nums := nums || array(select generate_series(lo, hi));
                else
                    nums := nums || lo || hi;
                end if;
            else
                nums := nums || part::integer;
            end if;
        end loop;
        valid := array(select distinct x from unnest(nums) as x where x between 1 and n_sources order by x);
        dropped := dropped + (select count(*) from unnest(nums) as x where x not between 1 and n_sources);
        if cardinality(valid) = 0 then
            out := rtrim(out, ' ');     -- a removed marker takes the space before it along
        else
            out := out || (select string_agg(format('[%s]', x), '' order by x) from unnest(valid) as x);
            select cited || jsonb_object_agg(x::text, coalesce(cited ->> x::text, '') || ' ' || stmt)
            into cited from unnest(valid) as x;
        end if;
        rest := substr(rest, pos + length(m[1]));
        -- the next statement starts after this marker unless more markers follow directly
        if rest !~ ('^\s*' || marker) then
            statement_start := length(out) + 1;
        end if;
    end loop;
    out := out || rest;

    select coalesce(jsonb_agg(jsonb_build_object(
        'n', c.n,
        'chunk_id', h.chunk_id,
        'chunk_index', h.chunk_index,
        'kb', h.kb,
        'doc_key', h.doc_key,
        'title', h.title,
        'heading_path', to_jsonb(coalesce(h.heading_path, '{}')),
        'page', h.metadata -> 'page',
        'source_url', h.source_url,
        'uri', kb.document_uri(h.kb, h.doc_key),
        'also_in', to_jsonb(coalesce(h.also_in, '{}')),
        'quote', (
            select s.sentence
            from kb_internal.answer_sentences(kb_internal.answer_source(h.content)) as s
            cross join lateral (select kb_internal.term_overlap(s.sentence, (
                select coalesce(jsonb_object_agg(t.term, 1), '{}')
                from (select distinct u.term from unnest(kb.lexical_terms(c.statements)) as u (term)) as t
            )) as score) as sc
            where sc.score > 0
            order by sc.score desc, s.heading, s.ord limit 1
        )
    ) order by c.n), '[]')
    into result_citations
    from (select e.key::integer as n, e.value as statements from jsonb_each_text(cited) as e) as c
    join lateral (select (hits[c.n]).*) as h on true;

    answer := translate(out, E'\ue010\ue011', '[]');
    citations := result_citations;
    uncited := cited = '{}' and btrim(out) <> '' and btrim(out) not in (
        '知识库中未找到相关信息', '知识库中未找到相关信息。', 'Not found in the knowledge base.',
        'Not found in the knowledge base'
    ) and exists (select from kb_internal.answer_sentences(out));
    return next;
end
$$;

-- Check the citations of an answer against hits (source n = hits[n]). Recognises [1], [1,2], [1, 2],
-- [1][2], [1-3] and the full-width 【1】 forms; numbers naming no given source are removed and counted
-- (dropped); the rest are rewritten as [n][m]. citations: one object per cited source, ordered by n,
-- {n, chunk_id, chunk_index, kb, doc_key, title, heading_path, page, source_url, uri, also_in, quote};
-- also_in: the hit's (other documents holding the same text); quote is the sentence of the chunk's
-- kb_internal.answer_source sharing most terms with the statements citing it (NULL when none shares any).
-- uncited: the answer states something (not just the not-found sentence) but cites no valid source.
create or replace function kb.cite(answer text, hits kb.search_result[])
returns table (answer text, citations jsonb, dropped integer, uncited boolean)
language sql immutable security definer
set search_path = pg_catalog, pg_temp
as $$
    select * from kb_internal.check_citations($1, $2)
$$;
