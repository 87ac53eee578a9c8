-- 027 answer_closest: the offline answer's third outcome. An extractive answer whose first source holds
-- little of the question's words (kb.answer_evidence top_known_coverage) rests on the vector's sense of
-- meaning alone, which the offline model gets wrong across languages: kb.ask then shows the closest passages as
-- such (mode 'closest', found false) instead of a confident answer.

insert into kb.settings (key, value, description) values
(
    'answer_min_coverage', '0.4',
    'kb.ask, extractive answers: below this idf coverage of the question by the first source, the answer is '
    || 'mode ''closest'' (closest passages, not an answer) instead of ''extractive'' (0..1; 0 turns it off)'
)
on conflict (key) do nothing;
