"""pgkb: a private knowledge base inside PostgreSQL.

The product, one module or package per step: ``chunking/`` -> ``models/`` (embedders, rerankers) -> ``ingest`` /
``worker`` -> (the database: db/migrations, db/functions) -> ``search`` -> ``mcp/`` (the MCP server). Around it:
``config`` (environment), ``cluster`` (the embedded PostgreSQL), ``migrate``, ``db`` (connections),
``service_role`` (the least-privileged role servers use), ``embed_server`` (HTTP embeddings / rerank),
``launcher`` (`pgkb up` / `down`) and ``cli``. Tooling, apart from the product: ``quality/`` (`pgkb eval`,
`pgkb sweep`) and ``bench/`` (`pgkb bench`).
"""
