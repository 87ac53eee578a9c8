"""Every knowledge base's term dictionary as the searches read it (kb_internal.term_dictionary: the rows of
kb.term_stats written since the last compaction, else the entries of kb.term_blocks; migration 049): what tests
compare the BM25 statistics with, whether or not a knowledge base was compacted. A FROM item with columns kb_id,
term, df, tiers, blocked_to, recent_ids, recent_tfs and recent_dls (terms at df > 0 only)."""

TERM_DICTIONARY = (
    "(select k.id as kb_id, d.term, d.df, d.tiers, d.blocked_to, d.recent_ids, d.recent_tfs, d.recent_dls"
    " from kb.knowledge_bases as k cross join lateral kb_internal.term_dictionary(k.id) as d)"
)
