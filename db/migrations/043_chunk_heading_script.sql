-- 043 each chunk's heading script, computed at write time (issue 33): the cross-script rule of fusion compares
-- the script of a chunk's title and headings with the question's, and read the title and ran
-- kb_internal.text_scripts for every candidate at every search. kb.chunks.heading_script holds it
-- (kb_internal.heading_script: 'latin', 'nonlatin', or NULL without letters), written with the chunk.
-- Existing chunks are filled here by text_scripts' rule as it stands at this migration, written out:
-- migrations run before db/functions is applied, and a database from before 028 has no
-- kb_internal.text_scripts. The fill rewrites every chunk row once, under migrate's table locks (about 3 s
-- at 100,000 chunks on the 2-core VM, 2026-12-06).

alter table kb.chunks add column heading_script text;
alter table kb.chunks add constraint chunks_heading_script_check check (heading_script in ('latin', 'nonlatin'));
do $fill$
begin
    with heading as (
        select c.id, concat_ws(' ', d.title, array_to_string(c.heading_path, ' ')) as input
        from kb.chunks as c join kb.documents as d on d.id = c.document_id
    ),
    weights as (
        select h.id, length(regexp_replace(h.input, '[^A-Za-z]+', '', 'g')) as latin,
            regexp_replace(h.input, '[\x01-\x7f—–“”‘’…›‹•·«»€™]+', '', 'g') as other
        from heading as h
    ),
    scripts as (
        select w.id, case
                when w.latin = 0 and octet_length(w.other) = length(w.other) then null
                when 2 * (octet_length(w.other) - length(w.other)) < w.latin / 3.0 then 'latin'
                when w.latin < 2 * (octet_length(w.other) - length(w.other)) / 3.0 then 'nonlatin'
                when 2 * (octet_length(w.other) - length(w.other)) >= w.latin then 'nonlatin'
                else 'latin'
            end as script
        from weights as w
    )
    update kb.chunks as c set heading_script = s.script
    from scripts as s
    where s.id = c.id and s.script is not null;
end
$fill$;
