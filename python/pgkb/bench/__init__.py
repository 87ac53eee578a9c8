"""`pgkb bench`: tooling, not product. ``run`` drives one benchmark run (search latency by mode, HNSW recall,
index builds and sizes, concurrency, MCP overhead) over a knowledge base that ``load`` fills with the
synthetic corpus of ``data``; ``recall``, ``concurrency`` and ``mcp`` measure one thing each; ``ingest``
measures ingestion throughput against the raw encoder."""
