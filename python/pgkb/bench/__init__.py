"""`pgkb bench`: tooling, not product. ``run`` drives one benchmark run over a knowledge base that ``load``
fills with the synthetic corpus of ``data``; ``latency`` (search latency by mode), ``recall``,
``concurrency`` and ``mcp`` measure one thing each; ``machine`` records what it ran on, ``report`` checks
the goals and writes the Markdown; ``ingest`` measures ingestion throughput against the raw encoder."""
