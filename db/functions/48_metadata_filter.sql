-- Document filters applied inside the search legs (so top_k fills with matching, visible chunks): the
-- containment `filter` of kb.hybrid_search (matched with @> against kb.documents.metadata) and metadata
-- conditions shaped like Dify's External Knowledge API `metadata_condition`:
--   {"logical_operator": "and" | "or", "conditions": [{"name", "comparison_operator", "value"}, ...]}

-- A metadata value as a double: a JSON number, or a string holding one (decimal, optional exponent of at
-- most 3 digits); NULL for anything else and for values beyond double precision's range (1e999), which
-- therefore match no number. Magnitudes below 1e-300 are 0. Never raises.
create or replace function kb_internal.metadata_number(value jsonb)
returns double precision
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select case
        when parsed.n is null or abs(parsed.n) > 1.7976931348623157e308 then null
        when abs(parsed.n) < 1e-300 then 0
        else parsed.n::double precision
    end
    from (
        select case
            when jsonb_typeof(value) = 'number' then (value #>> '{}')::numeric
            when jsonb_typeof(value) = 'string'
                and btrim(value #>> '{}') ~ '^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d{1,3})?$'
                then btrim(value #>> '{}')::numeric
        end as n
    ) as parsed
$$;

-- A metadata value as epoch seconds: a JSON number as is (kb_internal.metadata_number), a string holding an ISO-8601 date or timestamp
-- (no zone: UTC) converted; NULL for anything else, including strings that are no valid date. Never raises.
create or replace function kb_internal.metadata_epoch(value jsonb)
returns double precision
language plpgsql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    raw text;
begin
    if jsonb_typeof(value) = 'number' then
        return kb_internal.metadata_number(value);
    end if;
    raw := value #>> '{}';
    if jsonb_typeof(value) <> 'string'
        or raw !~ '^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}(:?\d{2})?)?$' then
        return null;
    end if;
    if raw !~ '(Z|[+-]\d{2}(:?\d{2})?)$' then
        raw := raw || '+00';
    end if;
    return extract(epoch from raw::timestamptz);
exception when others then     -- e.g. 2024-02-30: the shape of a date, but none
    return null;
end
$$;

-- The condition checked and normalised, or an invalid_parameter_value error saying what is wrong (never
-- a condition silently ignored): logical_operator 'and' (default) or 'or'; 1..20 conditions, each with a
-- non-empty name and one of the operators below; its value normalised per operator (text, text[] of
-- 1..100 for in / not in, a number for = ≠ > < ≥ ≤, epoch seconds for before / after, none for empty /
-- not empty). The bounds keep a search's filter work small: it runs on every candidate.
create or replace function kb.check_metadata_condition(condition jsonb)
returns jsonb
language plpgsql immutable parallel safe security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    supported constant text [] := array[
        'contains', 'not contains', 'start with', 'end with', 'is', 'is not', 'empty', 'not empty', 'in',
        'not in', '=', '≠', '>', '<', '≥', '≤', 'before', 'after'
    ];
    logical text;
    item jsonb;
    op text;
    value jsonb;
    normalised jsonb := '[]';
    n integer := 0;
begin
    if jsonb_typeof(condition) is distinct from 'object' then
        raise exception 'metadata_condition must be a JSON object with "conditions"'
            using errcode = 'invalid_parameter_value';
    end if;
    logical := coalesce(condition ->> 'logical_operator', 'and');
    if jsonb_typeof(condition -> 'logical_operator') not in ('string', 'null') or logical not in ('and', 'or') then
        raise exception 'metadata_condition.logical_operator must be "and" or "or", got %',
            left((condition -> 'logical_operator')::text, 50) using errcode = 'invalid_parameter_value';
    end if;
    if jsonb_typeof(condition -> 'conditions') is distinct from 'array' then
        raise exception 'metadata_condition.conditions must be an array of conditions'
            using errcode = 'invalid_parameter_value';
    end if;
    if jsonb_array_length(condition -> 'conditions') > 20 then     -- each is tested on every candidate
        raise exception 'metadata_condition has % conditions; at most 20 are accepted',
            jsonb_array_length(condition -> 'conditions') using errcode = 'invalid_parameter_value';
    end if;
    for item in select c.item from jsonb_array_elements(condition -> 'conditions') as c (item) loop
        n := n + 1;
        if jsonb_typeof(item) is distinct from 'object' or jsonb_typeof(item -> 'name') is distinct from 'string'
            or kb_internal.is_blank(item ->> 'name') or length(item ->> 'name') > 200 then
            raise exception 'metadata condition % must be an object with a "name" (a non-empty string)', n
                using errcode = 'invalid_parameter_value';
        end if;
        op := item ->> 'comparison_operator';
        if jsonb_typeof(item -> 'comparison_operator') is distinct from 'string' or not op = any(supported) then
            raise exception 'metadata condition %: comparison_operator % is not supported', n,
                coalesce(left((item -> 'comparison_operator')::text, 50), 'null')
                using errcode = 'invalid_parameter_value',
                    hint = 'supported: ' || array_to_string(supported, ', ');
        end if;
        value := coalesce(item -> 'value', 'null');
        if op in ('empty', 'not empty') then
            value := 'null';
        elsif op in ('in', 'not in') then
            if jsonb_typeof(value) in ('string', 'number') then
                value := jsonb_build_array(value #>> '{}');
            elsif jsonb_typeof(value) = 'array' and jsonb_array_length(value) between 1 and 100
                and not exists (
                    select from jsonb_array_elements(value) as v (x) where jsonb_typeof(v.x) not in ('string', 'number')
                ) then
                value := (select jsonb_agg(v.x #>> '{}') from jsonb_array_elements(value) as v (x));
            else
                raise exception 'metadata condition % (%): value must be a string or a list of 1 to 100 strings',
                    n, op using errcode = 'invalid_parameter_value';
            end if;
        elsif op in ('=', '≠', '>', '<', '≥', '≤') then
            if kb_internal.metadata_number(value) is null then
                raise exception 'metadata condition % (%): value must be a finite number (or a string holding '
                    'one) within double precision''s range, about ±1.8e308', n, op
                    using errcode = 'invalid_parameter_value';
            end if;
            value := to_jsonb(kb_internal.metadata_number(value));
        elsif op in ('before', 'after') then
            if kb_internal.metadata_epoch(value) is null then
                raise exception 'metadata condition % (%): value must be an ISO-8601 date or time '
                    '(e.g. 2024-05-01 or 2024-05-01T08:00:00Z) or Unix seconds', n, op
                    using errcode = 'invalid_parameter_value';
            end if;
            value := to_jsonb(kb_internal.metadata_epoch(value));
        elsif jsonb_typeof(value) in ('string', 'number') then
            value := to_jsonb(value #>> '{}');
        else
            raise exception 'metadata condition % (%): value must be a string', n, op
                using errcode = 'invalid_parameter_value';
        end if;
        normalised := normalised || jsonb_build_array(jsonb_build_object(
            'name', item ->> 'name', 'comparison_operator', op, 'value', value
        ));
    end loop;
    if n = 0 then
        raise exception 'metadata_condition.conditions is empty; pass at least one condition or leave it out'
            using errcode = 'invalid_parameter_value';
    end if;
    return jsonb_build_object('logical_operator', logical, 'conditions', normalised);
end
$$;

-- True when document metadata satisfies one normalised condition (kb.check_metadata_condition). String
-- operators compare the field's text (case-sensitive); on a JSON array field contains / in test its
-- elements. Numeric and date operators need a number (or numeric string, kb_internal.metadata_number) / a date;
-- other fields (and numbers beyond double precision) do not match. The negations (not contains, is not,
-- not in, ≠) and empty also match a missing field.
create or replace function kb_internal.metadata_condition_holds(metadata jsonb, item jsonb)
returns boolean
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    with f as (
        select metadata -> (item ->> 'name') as field, item ->> 'comparison_operator' as op, item -> 'value' as v
    ),
    t as (
        select f.*,
            case when jsonb_typeof(f.field) in ('string', 'number', 'boolean') then f.field #>> '{}' end as txt,
            kb_internal.metadata_number(f.field) as num
        from f
    ),
    verdict as (
        select t.op, case
            when t.op in ('contains', 'not contains') then
                case when jsonb_typeof(t.field) = 'array' then t.field @> jsonb_build_array(t.v)
                else strpos(t.txt, t.v #>> '{}') > 0 end
            when t.op = 'start with' then starts_with(t.txt, t.v #>> '{}')
            when t.op = 'end with' then right(t.txt, length(t.v #>> '{}')) = t.v #>> '{}'
            when t.op in ('is', 'is not') then t.txt = t.v #>> '{}'
            when t.op in ('empty', 'not empty') then
                t.field is null or t.field in ('null', '""', '[]', '{}')
            when t.op in ('in', 'not in') then
                case when jsonb_typeof(t.field) = 'array'
                    then t.field ?| array(select jsonb_array_elements_text(t.v))
                else t.txt in (select jsonb_array_elements_text(t.v)) end
            when t.op in ('=', '≠') then t.num = (t.v #>> '{}')::double precision
            when t.op = '>' then t.num > (t.v #>> '{}')::double precision
            when t.op = '<' then t.num < (t.v #>> '{}')::double precision
            when t.op = '≥' then t.num >= (t.v #>> '{}')::double precision
            when t.op = '≤' then t.num <= (t.v #>> '{}')::double precision
            when t.op = 'before' then kb_internal.metadata_epoch(t.field) < (t.v #>> '{}')::double precision
            when t.op = 'after' then kb_internal.metadata_epoch(t.field) > (t.v #>> '{}')::double precision
        end as positive
        from t
    )
    select case
        when verdict.op in ('not contains', 'is not', 'not in', '≠', 'not empty')
            then not coalesce(verdict.positive, false)
        else coalesce(verdict.positive, false)
    end
    from verdict
$$;

-- The filter the search legs apply, built by kb_internal.search from kb.hybrid_search's `filter` (a JSON object,
-- containment) and `metadata_condition` (checked by kb.check_metadata_condition): NULL when neither is
-- given, else {"contains": ..., "condition": ...} with the parts that are. Raises for a bad condition.
create or replace function kb_internal.document_filter(filter jsonb, metadata_condition jsonb)
returns jsonb
language plpgsql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    return case when filter is not null or metadata_condition is not null then jsonb_strip_nulls(jsonb_build_object(
        'contains', filter,
        'condition', case when metadata_condition is not null then kb.check_metadata_condition(metadata_condition) end
    )) end;
end
$$;

-- True when a document's metadata passes a kb_internal.document_filter (NULL filter: every document). The
-- conditions combine with their logical_operator; containment is always required as well.
create or replace function kb_internal.document_matches(metadata jsonb, doc_filter jsonb)
returns boolean
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select doc_filter is null or (
        (doc_filter -> 'contains' is null or metadata @> (doc_filter -> 'contains'))
        and (doc_filter -> 'condition' is null or (
            select case when doc_filter #>> '{condition,logical_operator}' = 'or'
                then coalesce(bool_or(kb_internal.metadata_condition_holds(metadata, c.item)), false)
                else coalesce(bool_and(kb_internal.metadata_condition_holds(metadata, c.item)), true)
            end
            from jsonb_array_elements(doc_filter #> '{condition,conditions}') as c (item)
        ))
    )
$$;

-- True when a document of knowledge base kb_id passes doc_filter (kb_internal.document_matches) and kb_id is one of
-- kb_ids; false, untested, for any other document (another user's), so its metadata can neither raise nor
-- be probed. The legs' EXISTS also restrict kb.documents by kb_id (an index condition): this guard holds
-- whatever order the planner evaluates their conditions in.
create or replace function kb_internal.visible_document_matches(kb_id integer, kb_ids integer[], metadata jsonb, doc_filter jsonb)
returns boolean
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select case when kb_id = any(kb_ids) then kb_internal.document_matches(metadata, doc_filter) else false end
$$;
