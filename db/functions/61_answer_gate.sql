-- The not-found gate: one score from kb.answer_evidence and one threshold, so a calibration (pgkb eval)
-- sweeps a single number. The rule lives here alone; its knobs are kb.settings answer_* (013_answers.sql).

-- The answerability score of evidence, in [0, 1]: (1 - w) * coverage + w * rescaled cosine, the cosine
-- mapped linearly from [answer_vector_floor, answer_vector_ceiling] to [0, 1] and clipped; w is
-- answer_vector_weight. Without a vector score (lexical legs only) it is the coverage alone. Raises on
-- evidence that is not an object holding a numeric coverage.
create or replace function kb.answer_score(evidence jsonb)
returns double precision
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    w double precision := kb_internal.setting('answer_vector_weight')::double precision;
    floor_cos double precision := kb_internal.setting('answer_vector_floor')::double precision;
    ceiling_cos double precision := kb_internal.setting('answer_vector_ceiling')::double precision;
    coverage double precision;
    cosine double precision;
begin
    if evidence is null or jsonb_typeof(evidence) <> 'object'
        or jsonb_typeof(evidence -> 'coverage') is distinct from 'number' then
        raise exception 'evidence must be a JSON object with a numeric "coverage" (see kb.answer_evidence)'
            using errcode = 'invalid_parameter_value';
    end if;
    coverage := least(greatest((evidence ->> 'coverage')::double precision, 0), 1);
    if jsonb_typeof(evidence -> 'vector_score') = 'number' then
        cosine := (evidence ->> 'vector_score')::double precision;
    end if;
    if cosine is null or not (w > 0) or not (ceiling_cos > floor_cos) then
        return coverage;
    end if;
    cosine := least(greatest((cosine - floor_cos) / (ceiling_cos - floor_cos), 0), 1);
    return (1 - w) * coverage + w * cosine;
end
$$;

-- True when the evidence is strong enough to answer: kb.answer_score(evidence) >= min_score, which
-- defaults to the setting answer_min_score when NULL. Raises on a min_score that is not a finite number
-- in [0, 1] and on malformed evidence.
create or replace function kb.answer_gate(evidence jsonb, min_score double precision default null)
returns boolean
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    min_score := coalesce(min_score, kb_internal.setting('answer_min_score')::double precision);
    if not coalesce(min_score between 0 and 1, false) then
        raise exception 'min_score must be a number between 0 and 1, got %', min_score
            using errcode = 'invalid_parameter_value';
    end if;
    return kb.answer_score(evidence) >= min_score;
end
$$;

-- True when evidence that passes kb.answer_gate would answer offline on the strength of meaning alone: the
-- first source holds less than the setting answer_min_coverage of the idf mass of the question's terms that
-- the knowledge bases hold (evidence.top_known_coverage; terms they lack -- a Chinese question's bigrams
-- across word boundaries -- say nothing about the source). kb.ask then gives the closest passages as
-- such (mode 'closest'), not as an answer.
create or replace function kb.answer_is_closest(evidence jsonb)
returns boolean
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    least_coverage double precision := kb_internal.setting('answer_min_coverage')::double precision;
begin
    if evidence is null or jsonb_typeof(evidence) <> 'object' then
        raise exception 'evidence must be a JSON object (see kb.answer_evidence)'
            using errcode = 'invalid_parameter_value';
    end if;
    return coalesce((evidence ->> 'top_known_coverage')::double precision, 0) < least_coverage;
end
$$;
