"""`pgkb mcp`: the knowledge base as an MCP server (official ``mcp`` SDK 2.x, ``MCPServer``).

Tools (all read-only and idempotent; errors come back as tool errors the model can read):

- ``search_knowledge(query, top_k=5, kb="")`` -- hybrid search (pgkb.search: client-side query embedding,
  kb.hybrid_search, optional rerank). ``top_k`` is capped at MCP_MAX_TOP_K (20): larger values are
  lowered and the response says so. Structured output (``SearchOutput``) plus a concise text rendering
  ``[1] title > heading (score …, source)`` + content. The whole response stays under RESPONSE_BUDGET_CHARS
  (60k characters, ~20k tokens): long contents are trimmed -- never whole results -- and the response
  says which. An empty query is a tool error; no results is not (the text says so). When the embedding
  endpoint fails the results are lexical-only and flagged ``degraded`` with the reason.
- ``get_document(doc_id, kb="", chunk_index=-1, window=2)`` -- a whole document (chunk_index -1) or the
  chunks ``chunk_index ± window`` around a hit, through ``kb.get_document`` as the acting user (the
  database applies visibility). A doc_id present in several visible knowledge bases without ``kb`` is an
  error listing them.
- ``list_knowledge_bases()`` -- ``kb.list_knowledge_bases()``: the knowledge bases the caller can see, with
  document counts and the last update.

Resources: every document is ``kb://<kb>/<doc_key>`` (URI template ``kb://{kb}/{+doc_key}``; the
``source`` of results without a source URL), so clients can open a citation.

Identity: every call runs as a pgkb user -- ``set_config('pgkb.acting_user', user, true)`` in the call's
transaction -- so the database decides what is visible. The server connects with PGKB_DATABASE_URL, a role
that is a member of pgkb_service (unset: the embedded cluster as ``pgkb_mcp``, see pgkb.service_role), and
refuses to serve as a role that bypasses visibility (superuser, BYPASSRLS, pgkb administrator).
stdio: the user is PGKB_USER (unset: no user, public knowledge bases only). HTTP: a bearer token names the
user -- an API key kept in the database (`pgkb key create`) or, for development, a PGKB_MCP_TOKENS entry
("token1:alice,token2:bob"); a request that sends one needs a valid one. Without a token a request is refused
(401), except on a loopback bind with no PGKB_MCP_TOKENS, where it acts as PGKB_USER again.

Transports: stdio (default; the SDK keeps stdout for the protocol, logs go to stderr) and
``--transport http`` (``--host`` 127.0.0.1, ``--port`` 8766): streamable HTTP at ``/mcp``, which the SDK
serves for both protocol generations (the ``initialize`` handshake revisions 2024-11-05 .. 2025-11-25 and
the stateless 2026-07-28 per-request envelope), plus the deprecated HTTP+SSE transport at ``/sse`` and
``/messages/`` for old clients. HTTP requests with an ``Origin`` other than localhost / 127.0.0.1 / [::1]
or the server's own are refused (403) unless listed in PGKB_MCP_ALLOWED_ORIGINS (comma-separated, ``*`` for
any); when bound to a loopback address the ``Host`` header must be a loopback name too (DNS-rebinding
protection). ``/healthz``, ``/readyz`` and ``/metrics`` (pgkb.serving.monitoring) pass those checks but need
no token (/metrics: PGKB_METRICS_ACCESS).

Connections: a pool (psycopg_pool) of at most PGKB_MCP_POOL_SIZE connections (default 8, at least 1 kept
open), opened lazily on the first call -- the server starts and lists its tools while the database is down,
and calls then fail with a readable tool error. Every pooled connection is checked before use, so one
broken by a database restart is replaced, not handed out. The acting user and the statement timeout are
transaction-local (``set_config(..., true)``), so nothing carries over to the next call on a reused
connection.

Robustness: statement_timeout PGKB_STATEMENT_TIMEOUT_MS (default 10000) per call, reported as a clear tool
error; an unreachable embedding endpoint gives degraded lexical-only results, never an error, and so does a
query embedding slower than PGKB_MCP_EMBED_TIMEOUT_MS (default 5000; 0: no limit; it runs in a worker
thread and is abandoned). Arguments are checked strictly before any work: integers must be JSON integers
(not booleans, strings or 2.0), ``chunk_index`` -1 or >= 0, ``window`` 0..20; strings at most 4000
(query), 1000 (doc_id) and 100 (kb) characters, without NUL characters or unpaired surrogates. Error
messages quote at most the first 200 characters of a value. On stdio every line gets its JSON-RPC answer
(``parse_stdio_line``): -32700 for lines that are not UTF-8 JSON, -32600 for JSON that is no JSON-RPC
message, a tool error for an unpaired surrogate in a tool argument (-32602 elsewhere); the server goes on.

Logging: ``--verbose`` logs every stage to stderr. PGKB_QUERY_LOG=<path> appends one JSON line per search:
timestamp, user, query, kb, top_k, each result's doc/chunk/score and leg ranks, per-stage milliseconds.

Run as ``pgkb mcp``. Importing the package does not import the SDK (``server.build_server`` does), so
`pgkb` stays quick to start. Modules: ``output`` (structured output models), ``render`` (text renderings),
``stdio`` and ``http_guard`` (transports), ``server`` (tools, resources, the command). What `pgkb serve`
shares with it lives in pgkb.serving: ``config`` (environment, limits), ``arguments`` (argument checks,
caller errors), ``auth`` (tokens and API keys, Origin / Host checks), ``backend`` (database and embedder).
"""
