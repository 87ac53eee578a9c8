-- 031 posting ids as gaps: a block's chunk ids are stored as the gap to the id before (postings_format 3,
-- db/functions/31_postings.sql), 1 byte when every gap is below 256, 2 below 65536; format 2 stored each id's
-- offset from the block's first, which a short list spread over a knowledge base needed 4 bytes for (at 100,000
-- chunks, 18.5 of 29.5 million postings). Every knowledge base is rebuilt by db/functions/54_postings_rebuild.sql
-- in the same `pgkb db migrate`: the old blocks go here at once (TRUNCATE, so the table keeps no dead rows;
-- a format 2 payload would read as wrong ids now).

truncate kb.postings;

alter table kb.knowledge_bases alter column postings_format set default 3;
