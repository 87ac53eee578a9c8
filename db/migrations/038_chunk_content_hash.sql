-- 038 each chunk's content hash, computed at write time on every write path (issue 33): the search's
-- de-duplication of equal texts (also_in) compares it, so fusion ranks on ids and hashes and reads the
-- content of the final top_k alone. A stored generated column: rewriting kb.chunks once at the upgrade.

alter table kb.chunks add column content_hash uuid generated always as (md5(content)::uuid) stored;
