-- 025 image captions under row-level security, like every other table that holds knowledge-base rows (its
-- policy, visible with its knowledge base, is in db/functions/10_identity.sql). Users never read the table
-- (the caption functions of 33_image_captions.sql run as its owner); RLS is the second line behind that,
-- and `pgkb db doctor` checks it is on.

alter table kb.image_captions enable row level security;
