"""Every chunk's terms as the database computes them (kb.chunk_terms of its document's title, its headings and its
text): what tests compare the BM25 statistics and the posting lists with, since kb.chunks keeps no terms of its
own (migration 047). A FROM item with columns id, kb_id, term_count (the chunk's), term and tf."""

CHUNK_TERMS = (
    "(select c.id, c.kb_id, c.term_count, t.term, t.tf from kb.chunks as c"
    " join kb.documents as d on d.id = c.document_id"
    " cross join lateral kb.chunk_terms(d.title, c.heading_path, c.content) as t)"
)
