-- The bounds the SQL API enforces, in one place: the functions that check an input read them here
-- (kb_internal.api_limit), and clients read kb.limits() instead of restating a number.

-- Every bound of the public API, one row each: its name, its value and what it bounds. Public: it holds no
-- data. tests/sql/test_api_limits.py probes each bound at and past its value.
create or replace function kb.limits()
returns table (name text, value double precision, bounds text)
language sql immutable
set search_path = pg_catalog, pg_temp
as $$
    select l.name, l.value::double precision, l.bounds
    from (values
        ('query_chars', 4000, 'characters of a search query or question (kb.check_search_input)'),
        ('top_k', 100, 'results of one search or answer: 1..top_k (kb.check_search_input)'),
        ('candidates', 1000, 'rows per search leg before fusion: 1..candidates'),
        ('embedding_norm_min', 1e-15, 'smallest norm of a usable query or chunk embedding'),
        ('embedding_norm_max', 1e15, 'largest norm of a usable query or chunk embedding'),
        ('doc_key_chars', 1000, 'characters of a document key'),
        ('doc_key_bytes', 2000, 'UTF-8 bytes of a document key'),
        ('kb_name_chars', 100, 'characters of a knowledge base name'),
        ('title_chars', 1000, 'characters of a document title'),
        ('answer_sources', 100, 'hits handed to kb.answer_prompt, kb.cite and the extractive answer'),
        ('evidence_hits', 1000, 'hits handed to kb.answer_evidence'),
        ('phrasings', 4, 'phrasings of one question: the query and up to 3 more in also (each as query_chars bounds it)'),
        ('glossary_entries', 2000, 'glossary entries of one knowledge base (kb.glossary_add)'),
        ('glossary_terms', 8, 'terms of one glossary entry: 2..glossary_terms'),
        ('glossary_term_chars', 64, 'characters of one glossary term')
    ) as l (name, value, bounds)
$$;

-- One bound of kb.limits() by name, for the functions that enforce it; raises for a name it does not have
-- (a mistake in a function, never a user's input).
create or replace function kb_internal.api_limit(limit_name text)
returns double precision
language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    found_value double precision;
begin
    select l.value into found_value from kb.limits() as l where l.name = limit_name;
    if found_value is null then
        raise exception 'kb.limits() has no bound "%"', limit_name using errcode = 'undefined_object';
    end if;
    return found_value;
end
$$;
