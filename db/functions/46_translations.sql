-- Offline translation of a query's words for the term legs and the answer gate: a knowledge base's glossary
-- (kb.glossary, 44_glossary.sql) and the Chinese–English lexicon (kb_internal.lexicon: CC-CEDICT, CC BY-SA 4.0,
-- both ways, ECDICT, MIT, English to Chinese and read backwards, and pgkb's own software terms; loaded by
-- `pgkb db migrate`, pgkb.lexicon).
-- kb_internal.lexical_query_terms (50_search_legs.sql) adds the translations to the query's terms, weighted
-- below them; kb.answer_evidence counts a query term as covered by a chunk that holds one of its translations.
-- Every read is keyed by the searched kb_ids.

-- What kb_internal.lexicon.sense adds to an English word's translation that only one of the two dictionaries
-- gives, when the word has one both give, and to a Chinese word's that only ECDICT (read backwards) gives
-- (pgkb.lexicon loads it so; its own senses stay below): the one definition of the two tiers, read by the
-- loader and by kb_internal.query_translations (stored senses hold it: changing it needs a reload,
-- pgkb.lexicon.PARSE_VERSION).
create or replace function kb_internal.lexicon_single_source()
returns smallint
language sql immutable parallel safe
return 64;

-- The sources of translation in a query, in order, at most lexicon_max_sources: terms of the glossaries of
-- kb_ids that occur in it (a Chinese term as a substring of the folded query, an English one as a run of its
-- words), then the words the lexicon knows (kb_internal.lexicon_keys; Chinese words only when the knowledge
-- bases of kb_ids hold English prose, English words only when they hold Chinese) -- each run of Chinese characters split
-- by longest match (words of 2 to 8 characters, the first 200 characters of the query), the English words by
-- longest match of up to three words (the last one also as its singular or stem: tokens, expired, rotating,
-- payment; two words also as one: time out, but not after a function word or an article: for a, do i),
-- function words not on their own. Each source as {source, lang, keys (the lexicon's forms of it), kind
-- ('glossary' | 'lexicon'), targets (a glossary term's aliases), its terms as kb_internal.content_terms gives
-- them (a Chinese word's stored at load, an English phrase's its words)}. Bounded: at most 64 words and 200
-- Chinese characters are looked up.
create or replace function kb_internal.translation_sources(query text, kb_ids integer[])
returns jsonb
language plpgsql stable
set search_path = pg_catalog, pg_temp
-- one plan per statement for the session: planning them for every query cost more than running them
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
declare
    raw constant text[] := kb_internal.settings_of(array['lexicon_weight', 'glossary_weight', 'lexicon_max_sources']);
    use_lexicon constant boolean := kb_internal.as_number('lexicon_weight', raw[1]) > 0;
    use_glossary constant boolean := kb_internal.as_number('glossary_weight', raw[2]) > 0;
    max_sources constant integer := kb_internal.as_int('lexicon_max_sources', raw[3]);
    -- the lexicon translates into a language the searched knowledge has prose in (its language profile,
    -- kb.knowledge_bases.zh_chunks / en_chunks: a one-language knowledge base's questions in its own language
    -- are not looked up at all). A chunk counts in one language: English quoted inside Chinese chunks, or
    -- code, does not make a knowledge base English
    into_english boolean;
    into_chinese boolean;
    function_words constant text[] := kb_internal.english_function_words();
    folded constant text := kb.fold_text(query);
    words constant text[] := array(
        select m[1] from regexp_matches(lower(normalize(query, nfkc)), '[a-z0-9]+', 'g') as m limit 64
    );
    spaced constant text := ' ' || array_to_string(words, ' ') || ' ';
    runs constant text[] := array(
        select left(m[1], 200) from regexp_matches(
            left(folded, 2000), '([\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]{2,})', 'g'
        ) as m
    );
    sources jsonb := '[]';
    taken text[] := '{}';   -- the sources so far (a glossary term is not looked up in the lexicon again)
    found jsonb;        -- "run:position" -> [length, terms] of the longest Chinese word starting there
    word jsonb;
    k integer;
    run text;
    pos integer;
    len integer;
    english jsonb;      -- "position:length" -> the lexicon's forms of that English phrase
    window_start integer;
    window_end integer;
    phrase text;
    entry record;
begin
    if max_sources < 1 or not (use_lexicon or use_glossary) then
        return sources;
    end if;
    select coalesce(bool_or(k.en_chunks > 0), false), coalesce(bool_or(k.zh_chunks > 0), false)
    into into_english, into_chinese
    from kb.knowledge_bases as k where k.id = any(kb_ids);
    if use_glossary then
        for entry in
            select m.term, array(select t from unnest(g.terms) as t where t <> m.term) as others
            from kb.glossary as g
            cross join lateral unnest(g.terms) as m (term)
            where g.kb_id = any(kb_ids)
                and case when m.term ~ '[^\x01-\x7f]'
                    then strpos(folded, kb.fold_text(m.term)) > 0
                    else strpos(spaced, ' ' || array_to_string(array(
                        select x[1] from regexp_matches(lower(m.term), '[a-z0-9]+', 'g') as x
                    ), ' ') || ' ') > 0 and m.term ~ '[A-Za-z0-9]'
                end
            order by g.id, m.term
        loop
            if not kb.fold_text(entry.term) = any(taken) then
                sources := sources || jsonb_build_object('source', entry.term, 'lang', '', 'keys', '[]'::jsonb,
                    'kind', 'glossary', 'targets', to_jsonb(entry.others));
                taken := taken || kb.fold_text(entry.term);
            end if;
        end loop;
    end if;
    if use_lexicon and into_english then
        -- Chinese: every substring of 2..8 characters of each run looked up at once, giving for each run k and
        -- position i the longest word the lexicon knows there ("k:i" -> [its length, its terms]); then the
        -- longest match from the left
        found := (
            select coalesce(jsonb_object_agg(w.k || ':' || w.i, jsonb_build_array(w.len, w.terms)), '{}')
            from (
                with spans as materialized (
                    select r.k, p.i, n.len, substr(r.run, p.i, n.len) as span
                    from unnest(runs) with ordinality as r (run, k)
                    cross join generate_series(1, length(r.run) - 1) as p (i)
                    cross join generate_series(2, 8) as n (len)
                    where p.i + n.len - 1 <= length(r.run)
                ),
                -- one index scan for every span
                words as materialized (
                    select l.source, l.terms from kb_internal.lexicon_keys as l
                    where l.lang = 'zh' and l.source = any(array(select s.span from spans as s))
                )
                select distinct on (s.k, s.i) s.k, s.i, s.len, w.terms
                from spans as s join words as w on w.source = s.span
                order by s.k, s.i, s.len desc
            ) as w
        );
        for k in 1 .. coalesce(cardinality(runs), 0) loop
            run := runs[k];
            pos := 1;
            while pos < length(run) loop
                word := found -> (k || ':' || pos);
                if word is null then
                    pos := pos + 1;
                    continue;
                end if;
                len := (word ->> 0)::integer;
                if not substr(run, pos, len) = any(taken) then
                    sources := sources || jsonb_build_object('source', substr(run, pos, len), 'lang', 'zh',
                        'keys', jsonb_build_array(substr(run, pos, len)), 'kind', 'lexicon', 'targets', '[]'::jsonb,
                        'terms', word -> 1);
                    taken := taken || substr(run, pos, len);
                end if;
                pos := pos + len;
            end loop;
        end loop;
    end if;
    if use_lexicon and into_chinese then
        -- English: phrases of 1..3 words (the last word also as a singular or stem), looked up at once for the
        -- start positions of a window of words: the lexicon's form of each (position, length) that it knows, the
        -- plainest form first; then longest match. Windows of 16 words until max_sources are found: a long
        -- query's later words cannot be sources (only the first max_sources are kept)
        window_start := 1;
        while window_start <= cardinality(words) and jsonb_array_length(sources) < max_sources loop
            window_end := least(window_start + 15, cardinality(words));
            english := (
                with forms as materialized (  -- each word's forms once (a phrase started in the window may end 2 beyond)
                    select p.i, v.form from generate_series(window_start, least(window_end + 2, cardinality(words))) as p (i)
                    cross join lateral unnest(kb_internal.english_variants(words[p.i])) as v (form)
                ),
                -- the phrase of n.len words that ends at word f.i, its last word in form f.form
                keys as (
                    select f.i - n.len + 1 as i, n.len, k.key
                    from forms as f
                    cross join generate_series(1, 3) as n (len)
                    cross join lateral (
                        select array_to_string(words[f.i - n.len + 1:f.i - 1], ' ')
                            || case when n.len > 1 then ' ' else '' end || f.form as key
                        union all
                        -- two words written as one: time out -> timeout, log in -> login, e mail -> email; not
                        -- after a function word or an article (for a -> fora, do i -> doi)
                        select words[f.i - 1] || f.form where n.len = 2
                            and not (words[f.i - 1] = any(function_words) or words[f.i - 1] in ('a', 'i'))
                    ) as k
                    where f.i - n.len + 1 between window_start and window_end
                        and (n.len > 1 or not (words[f.i] = any(function_words) or length(words[f.i]) < 2))
                ),
                -- one index scan for every key
                known as (
                    select array(
                        select l.source::text from kb_internal.lexicon_keys as l
                        where l.lang = 'en' and l.source = any(array(select distinct k.key from keys as k))
                    ) as sources
                )
                select coalesce(jsonb_object_agg(m.at, m.keys), '{}') from (
                    select k.i || ':' || k.len as at, jsonb_agg(distinct k.key) as keys
                    from keys as k cross join known
                    where k.key = any(known.sources)
                    group by k.i, k.len
                ) as m
            );
            pos := window_start;
            while pos <= window_end loop
                len := least(3, cardinality(words) - pos + 1);
                while len >= 1 and not english ? (pos || ':' || len) loop
                    len := len - 1;
                end loop;
                if len >= 1 then
                    phrase := array_to_string(words[pos:pos + len - 1], ' ');
                    if not phrase = any(taken) then
                        sources := sources || jsonb_build_object('source', phrase, 'lang', 'en',
                            'keys', english -> (pos || ':' || len), 'kind', 'lexicon', 'targets', '[]'::jsonb,
                            'terms', to_jsonb(kb_internal.content_terms(phrase)));
                        taken := taken || phrase;
                    end if;
                    pos := pos + len;
                else
                    pos := pos + 1;
                end if;
            end loop;
            window_start := pos;
        end loop;
    end if;
    return (select coalesce(jsonb_agg(s.v order by s.n), '[]') from jsonb_array_elements(sources)
        with ordinality as s (v, n) where s.n <= max_sources);
end
$$;

-- The forms an English word is looked up under in the lexicon, sorted: the word itself; plurals and third
-- persons (tokens, policies, pushes), past forms (expired, rotated, stopped), -ing forms (rotating, running)
-- and derived nouns (payment, rotation, production, deletion, permission, extension, availability) give
-- their stems too: a word the lexicon knows is looked up under its stem as well (production -> 产制 alone,
-- produce -> 生产). A form that is no word finds nothing.
-- Words of digits or of 2 letters or fewer are looked up as they are. String tests, not regular
-- expressions: it runs for every word of every query.
create or replace function kb_internal.english_variants(word text)
returns text[]
language plpgsql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    n constant integer := length(word);
    vowels constant text := 'aeiou';
    forms text[] := array[word];
begin
    if n < 3 or word !~ '^[a-z]+$' then
        return forms;
    end if;
    if right(word, 3) = 'ies' and n >= 4 and strpos(vowels, substr(word, n - 3, 1)) = 0 then
        forms := forms || (left(word, -3) || 'y');
    end if;
    if right(word, 4) in ('sses', 'shes', 'ches') or right(word, 3) in ('xes', 'zes') then
        forms := forms || left(word, -2);
    end if;
    if right(word, 1) = 's' and substr(word, n - 1, 1) not in ('s', 'u') then
        forms := forms || left(word, -1);
    end if;
    if right(word, 3) = 'ied' then
        forms := forms || (left(word, -3) || 'y');
    end if;
    if right(word, 2) = 'ed' then
        forms := forms || left(word, -1) || left(word, -2);
        if n >= 4 and substr(word, n - 3, 1) = substr(word, n - 2, 1) and strpos(vowels, substr(word, n - 2, 1)) = 0 then
            forms := forms || left(word, -3);  -- stopped -> stop
        end if;
    end if;
    if right(word, 3) = 'ing' then
        forms := forms || left(word, -3) || (left(word, -3) || 'e');
        if n >= 5 and substr(word, n - 4, 1) = substr(word, n - 3, 1) and strpos(vowels, substr(word, n - 3, 1)) = 0 then
            forms := forms || left(word, -4);  -- running -> run
        end if;
    end if;
    -- derived nouns: payment -> pay, rotation -> rotate, expiration -> expire
    if right(word, 4) = 'ment' and n >= 7 then
        forms := forms || left(word, -4);
    elsif right(word, 5) = 'ments' and n >= 8 then
        forms := forms || left(word, -5);
    end if;
    if right(word, 5) = 'ation' and n >= 8 then
        forms := forms || (left(word, -5) || 'ate') || (left(word, -5) || 'e');
    elsif right(word, 6) = 'ations' and n >= 9 then
        forms := forms || (left(word, -6) || 'ate') || (left(word, -6) || 'e');
    elsif right(word, 6) = 'uction' and n >= 9 then
        forms := forms || (left(word, -6) || 'uce');          -- production -> produce
    elsif right(word, 5) = 'etion' and n >= 8 then
        forms := forms || (left(word, -3) || 'e');            -- deletion -> delete
    elsif right(word, 7) = 'mission' and n >= 9 and word <> 'commission' then
        forms := forms || (left(word, -5) || 't');            -- permission -> permit
    elsif right(word, 5) = 'nsion' and n >= 8 then
        forms := forms || (left(word, -4) || 'd');            -- extension -> extend
    end if;
    -- availability -> available, visibility -> visible. No other -ity, -ction or -ly rule: they make real
    -- words of another sense (community -> commune, gravity -> grave, direction -> direct, affection ->
    -- affect, closely -> close, generally -> general), and a stem's translations rank with the word's own
    if right(word, 7) in ('ability', 'ibility') and n >= 9 then
        forms := forms || (left(word, -5) || 'le');
    end if;
    return array(select distinct f from unnest(forms) as f where length(f) >= 2 or f = word order by f);
end
$$;

-- The regular inflections of an English word, the word first: the forms a text writes a dictionary's base
-- form in (expire: expires, expired, expiring; policy: policies, policied, policying; box: boxes; stop:
-- stops, stopped, stopping; commit: committed, and the undoubled commited). What the answer gate
-- (kb_internal.hits_evidence) accepts for a translation, which the lexicon gives as its base form while English
-- text is not stemmed. Forms that are other real words are not made: -es only after s, x, z, ch, sh (rat is no
-- rates), no -d after a three-letter word's ee (see is no seed), a word of one vowel group ending
-- consonant-vowel-consonant only doubled (rat: ratted, not rated or rating). A form that is no word occurs in
-- no text. Words that are not of 3 or more ASCII letters: themselves alone.
create or replace function kb_internal.english_inflections(word text)
returns text[]
language plpgsql immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    n constant integer := length(word);
    vowels constant text := 'aeiou';
    -- qu counts as a consonant (quiz, quit); y after a consonant as a vowel (copy)
    groups constant integer := (
        select count(*) from regexp_matches(replace(word, 'qu', 'q'), '[aeiou]+', 'g')
    );
    last constant text := right(word, 1);
    before constant text := substr(word, n - 1, 1);
    forms text[] := array[word, word || 's'];
    cvc boolean;
begin
    if n < 3 or word !~ '^[a-z]+$' then
        return array[word];
    end if;
    cvc := strpos(vowels, last) = 0 and last not in ('w', 'x', 'y')
        and strpos(vowels, before) > 0 and strpos(vowels, substr(word, n - 2, 1)) = 0
        and not (before = 'u' and substr(word, n - 2, 1) = 'q') or word ~ '^qu[aeio][^aeiouwxy]$';
    if right(word, 1) in ('s', 'x', 'z') or right(word, 2) in ('ch', 'sh') then
        forms := array[word, word || 'es'];
    end if;
    if last = 'e' and before = 'e' then
        -- agree -> agreed, agreeing; not see -> seed
        forms := forms || (word || 'ing') || case when n > 3 then array[word || 'd'] else '{}' end;
    elsif last = 'e' then
        forms := forms || (word || 'd') || (left(word, -1) || 'ing');
    elsif last = 'y' and strpos(vowels, before) = 0 then
        forms := array[word, left(word, -1) || 'ies', left(word, -1) || 'ied', word || 'ing'];
    elsif cvc and groups = 1 then
        -- stop -> stopped, quiz -> quizzes: only doubled (rat -> ratted, not rated / rating)
        forms := array[word, word || 's', word || last || 'ed', word || last || 'ing']
            || case when last = 'z' then array[word || 'zes'] else '{}' end;
    elsif cvc then
        -- commit -> committed, edit -> edited: the stress decides, so both
        forms := forms || (word || 'ed') || (word || 'ing') || (word || last || 'ed') || (word || last || 'ing');
    else
        forms := forms || (word || 'ed') || (word || 'ing');
    end if;
    return forms;
end
$$;

-- The translations of query's words that the term legs score and the answer gate reads: for each source of
-- kb_internal.translation_sources, its glossary aliases and lexicon translations whose terms (kb.lexical_terms
-- without function words) all occur in the vocabulary of kb_ids, not all of them query terms already, at most
-- lexicon_max_translations (a glossary's aliases in their order; the lexicon's: of an English word those
-- both dictionaries or the software terms give before those one alone gives, of a Chinese word CC-CEDICT's
-- before those only ECDICT or the software terms give (kb_internal.lexicon_single_source), within each the
-- commonest in the knowledge first, then by sense: the dictionaries' order of senses is a general one,
-- "component" 成分 before 组件, the knowledge's use tells its domain). One row per translation term:
-- weight = the kind's weight (glossary_weight; lexicon_weight x the square of the concept's share of the df of
-- concept and source together: a word the knowledge already uses as often as its translations needs them
-- little, and a chunk holding both, a glossary page, gains little) / the translation's terms x idf(concept) /
-- idf(term), at most 1 (a common term of a phrase, 使用 of 再使用, keeps its own idf): BM25 scores the term
-- with the one idf of its source's concept, whose df is the sum over its translations of their rarest term's
-- df, at most N (Pirkola's structured query: ten translations of a common word weigh as one common word).
-- A source's terms are those translation_sources gives (a Chinese word's, stored at load), else
-- kb_internal.content_terms of it. given_sources: kb_internal.translation_sources(query, kb_ids), given_terms:
-- kb_internal.query_terms(query), when the caller has them already (NULL: computed here).
-- covers: the query terms the source spans; concept_df: that df (kb.answer_evidence reads both); df and
-- tiers: the term's in kb_ids, as kb_internal.lexical_query_terms reads them (it scores the rows as they are).
create or replace function kb_internal.query_translations(
    query text, kb_ids integer[], given_sources jsonb default null, given_terms text[] default null
)
returns table (
    source text, covers text[], translation text, term text, df bigint, tiers bigint, concept_df double precision,
    weight double precision, kind text
)
language plpgsql stable
set search_path = pg_catalog, pg_temp
-- one plan per statement for the session: planning them for every query cost more than running them
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
declare
    sources constant jsonb := coalesce(given_sources, kb_internal.translation_sources(query, kb_ids));
    raw constant text[] := kb_internal.settings_of(
        array['lexicon_max_translations', 'glossary_weight', 'lexicon_weight']
    );
    max_translations constant integer := kb_internal.as_int('lexicon_max_translations', raw[1]);
    glossary_weight constant double precision := kb_internal.as_number('glossary_weight', raw[2]);
    lexicon_weight constant double precision := kb_internal.as_number('lexicon_weight', raw[3]);
    query_terms constant text[] := coalesce(given_terms, kb_internal.query_terms(query));
    n_chunks double precision;
begin
    if jsonb_array_length(sources) = 0 or max_translations < 1 then
        return;
    end if;
    select greatest(coalesce(sum(k.chunk_count), 0), 1) into n_chunks
    from kb.knowledge_bases as k where k.id = any(kb_ids);
    return query
    with src as materialized (
        select s.n, s.v ->> 'source' as source, s.v ->> 'lang' as lang,
            array(select jsonb_array_elements_text(s.v -> 'keys')) as keys, s.v ->> 'kind' as kind,
            s.v -> 'targets' as targets, case when s.v ? 'terms'
                then array(select jsonb_array_elements_text(s.v -> 'terms'))
                else kb_internal.content_terms(s.v ->> 'source')
            end as terms
        from jsonb_array_elements(sources) with ordinality as s (v, n)
    ),
    candidates as materialized (
        select row_number() over () as id, c.* from (
        select src.n, src.source, src.kind, t.target, t.sense::integer as sense,
            kb_internal.content_terms(t.target) as terms
        from src cross join lateral jsonb_array_elements_text(src.targets) with ordinality as t (target, sense)
        where src.kind = 'glossary'
        union all
        select src.n, src.source, src.kind, l.target, l.sense::integer, l.terms
        from src cross join lateral (
            select l.target, l.sense, l.terms from (
                -- each translation once, at its best sense over the source's forms (naming, name: 命名)
                select distinct on (l.target) l.target, l.sense, l.terms
                from kb_internal.lexicon as l
                where l.lang = src.lang and l.source = any(src.keys)
                order by l.target, l.sense
            ) as l
            -- the first senses, the shortest (commonest) words first: a common English word has up to ~150
            order by l.sense, length(l.target), l.target limit 8 * max_translations
        ) as l
        where src.kind = 'lexicon'
        ) as c
    ),
    -- the df and posting tiers in the vocabulary of kb_ids of every candidate's terms and every source's own
    -- terms, read at once (a term absent or of df 0 is not there)
    term_df as materialized (
        select st.term, sum(st.df)::bigint as df, bit_or(st.tiers) as tiers
        from kb_internal.term_counts(kb_ids, array(
            select unnest(c.terms) from candidates as c union select unnest(s.terms) from src as s
        )) as st
        group by st.term
        having sum(st.df) > 0
    ),
    -- the candidates all of whose terms are known, with their rarest term's df (one join for all of them)
    counted as (
        select c.n, c.source, c.kind, c.target, c.sense, c.terms, min(s.df) as least_df
        from candidates as c
        cross join lateral unnest(c.terms) as x (term)
        join term_df as s on s.term = x.term
        where not c.terms <@ query_terms
        group by c.id, c.n, c.source, c.kind, c.target, c.sense, c.terms
        having count(*) = cardinality(c.terms)
    ),
    -- the first max_translations of each source
    kept as (
        select r.* from (
            select c.*, row_number() over (
                    -- (a source is a glossary entry or a word of the lexicon: a glossary's aliases keep the
                    -- order its author gave them)
                    partition by c.n
                    order by case when c.kind = 'glossary' then c.sense end,
                        c.sense >= kb_internal.lexicon_single_source(), c.least_df desc, c.sense, c.target
                ) as place
            from counted as c
        ) as r
        where r.place <= max_translations
    ),
    concepts as (
        select k.n, least(sum(k.least_df), n_chunks) as df
        from kept as k group by k.n
    ),
    -- the source's own df (its rarest term's; 0 when one is absent): a word the knowledge already uses as
    -- often as its translations needs them little
    own as (
        select c.n, c.df, coalesce((
            select min(coalesce(d.df, 0)) from unnest(src.terms) as t (term) left join term_df as d on d.term = t.term
        ), 0) as source_df,
        array(select t from unnest(src.terms) as t where t = any(query_terms) order by t) as covers
        from concepts as c join src on src.n = c.n
    )
    select k.source, c.covers, k.target, x.term, x.df, x.tiers, c.df,
        case when k.kind = 'glossary' then glossary_weight
            else lexicon_weight * (c.df / (c.df + c.source_df)) ^ 2
        end / cardinality(k.terms)
        * ln(1 + (n_chunks - greatest(c.df, x.df) + 0.5) / (greatest(c.df, x.df) + 0.5))
        / ln(1 + (n_chunks - x.df + 0.5) / (x.df + 0.5)),
        k.kind
    from kept as k
    join own as c on c.n = k.n
    cross join lateral unnest(k.terms) as t (term)
    join term_df as x on x.term = t.term
    order by k.n, k.place, x.term;
end
$$;

-- The question as the lexicon and the glossaries write it in the other language, for the vector leg: when
-- the caller passed no phrasing of its own (also empty or NULL), the question is Chinese or English, and at
-- least kb.settings.translation_min_share of the chunks of kb_ids are in the other language (their language
-- profile, kb.language_profile: a Chinese question over Chinese runbooks and English API pages is translated
-- too, or the embedding's pull towards its own language buries the English pages). Then: per source, the
-- translation into the other language that
-- kb_internal.query_translations ranks first, in the order of the sources, then the question's own Latin terms that no source covers and the
-- knowledge holds (identifiers: tls, user_id, 401). NULL otherwise, or when the translations and identifiers
-- carry less than half of the question's dictionary words and identifiers.
create or replace function kb_internal.translated_question(query text, kb_ids integer[], also text[] default null)
returns text
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    asked constant text := kb_internal.text_language(query);
    target constant text := case asked when 'zh' then 'en' when 'en' then 'zh' end;
    terms constant text[] := kb_internal.query_terms(query);
    sources jsonb;      -- kb_internal.translation_sources: computed once, for the translations and the count below
    share double precision;     -- of the knowledge's chunks in the target language
    chosen jsonb;       -- [{translation, covers}] per source, in the sources' order
    covered text[];     -- the question's terms the chosen translations carry
    kept text[];        -- its identifiers, kept as they are
    words integer;      -- the question's words the lexicon or a glossary knows (kb_internal.translation_sources)
begin
    if target is null or coalesce(cardinality(also), 0) > 0 then
        return null;
    end if;
    select (kb.language_profile(sum(k.zh_chunks)::bigint, sum(k.en_chunks)::bigint, sum(k.other_chunks)::bigint)
        ->> target)::double precision into share
    from kb.knowledge_bases as k where k.id = any(kb_ids);
    if share is null or share = 0 or share < kb_internal.setting_number('translation_min_share') then
        return null;
    end if;
    sources := kb_internal.translation_sources(query, kb_ids);
    select jsonb_agg(jsonb_build_object('translation', t.translation, 'covers', to_jsonb(t.covers)) order by t.place)
    into chosen
    from (
        -- per source, the translation the term legs rank first (glossary aliases, then of the best-attested
        -- translations the commonest in the knowledge: kb_internal.query_translations)
        select distinct on (q.source) q.source, q.translation, q.covers, q.place
        from (
            select r.source, r.translation, min(r.covers) as covers, min(r.place) as place
            from kb_internal.query_translations(query, kb_ids, sources, terms) with ordinality as r (
                source, covers, translation, term, df, tiers, concept_df, weight, kind, place
            )
            where kb_internal.text_language(r.translation) = target
            group by r.source, r.translation
        ) as q
        order by q.source, q.place
    ) as t;
    if chosen is null then
        return null;
    end if;
    covered := array(select jsonb_array_elements_text(c -> 'covers') from jsonb_array_elements(chosen) as c);
    kept := array(
        select w.term from (
            select q.term, min(q.o) as o
            from unnest(terms) with ordinality as q (term, o)
            where q.term ~ '^[a-z0-9_]+$' and not q.term = any(covered)
            group by q.term order by min(q.o) limit 64
        ) as w
        -- a term the knowledge holds (an identifier), not the rest of the question's prose
        where exists (select from kb_internal.term_counts(kb_ids, array[w.term]))
        order by w.o limit 16
    );
    -- a translation of less than half of the question's dictionary words (and identifiers) would pull its
    -- embedding towards what the question is not about ("the oxygen quota of the Mars base" -> 配额)
    words := (
        select count(*) from jsonb_array_elements(sources) as w
        where w ->> 'lang' in (asked, '') and not w ->> 'source' = any(kept)
    );
    if 2 * (jsonb_array_length(chosen) + cardinality(kept)) < words + cardinality(kept) then
        return null;
    end if;
    return array_to_string(array(
        select c ->> 'translation' from jsonb_array_elements(chosen) with ordinality as x (c, n) order by x.n
    ) || kept, ' ');
end
$$;

-- The question's offline translation for the vector leg (kb_internal.translated_question) over the knowledge
-- bases a search of kb would read (NULL: every visible one), or NULL (also when also holds the caller's own
-- phrasings). Raises as kb.hybrid_search does for a bad query or also and for a knowledge base the caller
-- cannot see. Callers that embed queries themselves embed it and pass kb.blend_query_embeddings(question's,
-- translation's) as query_embedding.
create or replace function kb.query_translation(query text, kb text default null, also text[] default null)
returns text
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform kb.check_search_input(query, 1, also);
    return kb_internal.translated_question(
        query,
        case when query_translation.kb is null then kb.visible_kb_ids() else array[kb.resolve_kb(query_translation.kb)] end,
        also
    );
end
$$;

-- The query embedding of a question and its offline translation: the normalised sum of both (each
-- normalised first), halfway between the question's language and the knowledge's; the question's embedding as
-- given when the translation's is NULL, or when the sum has no direction (opposite vectors). Raises
-- data_exception for vectors of different dimensions.
create or replace function kb.blend_query_embeddings(question vector, translation vector)
returns vector
language plpgsql immutable parallel safe
set search_path = pg_catalog, public, pg_temp
as $$
declare
    summed vector;
begin
    if translation is null or question is null then
        return question;
    end if;
    if vector_dims(question) <> vector_dims(translation) then
        raise exception 'the question''s embedding has % dimensions and the translation''s %',
            vector_dims(question), vector_dims(translation) using errcode = 'data_exception';
    end if;
    summed := l2_normalize(question) + l2_normalize(translation);
    return case when vector_norm(summed) > 1e-6 then l2_normalize(summed) else question end;
end
$$;
