-- 037 kb.list_knowledge_bases says which knowledge bases the caller manages (can_manage: owner or
-- administrator), so the page offers an owner their question log's gaps. A new column changes the
-- function's result type: it is dropped here and db/functions/55_reads.sql creates it again.

drop function if exists kb.list_knowledge_bases();
