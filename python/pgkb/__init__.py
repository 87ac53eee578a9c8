"""pgkb: a private knowledge base inside PostgreSQL.

The pipeline, one module per step: chunking -> embedding -> ingest / worker -> (database: db/migrations,
db/functions) -> search (+ rerank) -> mcp_server. Around it: config (environment), cluster (embedded
PostgreSQL), migrate, db (connections), embed_server (HTTP embeddings/rerank), launcher (`pgkb up/down`),
evaluate / sweep (retrieval quality) and bench, bench_* (speed), cli.
"""

__version__ = "0.1.0"
