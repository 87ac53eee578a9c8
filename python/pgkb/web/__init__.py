"""`pgkb serve`: one HTTP server (default 127.0.0.1:8767) for people and for Dify.

- ``POST /retrieval`` -- Dify's External Knowledge API (``dify``): ``{knowledge_id, query, retrieval_setting:
  {top_k, score_threshold}, metadata_condition?}`` with ``Authorization: Bearer <key>`` answers
  ``{"records": [{content, score, title, metadata}]}`` through kb.retrieve. Errors: ``{error_code, error_msg}``
  with 1001 (malformed Authorization header, HTTP 403), 1002 (unknown key, 403), 2001 (the knowledge base
  does not exist -- or is not visible to the key's user, the same answer -- 404), and HTTP 400 / 413 for
  malformed or oversized bodies.
- ``GET /`` -- the search page for employees (``static/``: plain HTML, CSS and JavaScript, no build step and
  nothing fetched from elsewhere) over the JSON endpoints (``api``): ``GET /api/kbs``, ``POST /api/search``,
  ``POST /api/document``, ``POST /api/ask`` (501 while the database has no kb.ask).
- ``GET /healthz``, ``GET /readyz``, ``GET /metrics`` -- pgkb.serving.monitoring (no token; /metrics for
  loopback clients unless PGKB_METRICS_ACCESS says otherwise).

Keys and tokens are API keys kept in the database (`pgkb key create`, kb.create_api_key) or, for development,
PGKB_MCP_TOKENS ("token1:alice,token2:bob") -- the same as `pgkb mcp` accepts (pgkb.serving.auth.bearer_user);
every call acts as the key's pgkb user, so the database's visibility rules decide what anyone sees. Requests
carrying an ``Origin`` other than the page itself, a loopback origin or one listed in PGKB_MCP_ALLOWED_ORIGINS
are refused (403); bound to a loopback address, the ``Host`` header must name a loopback address (421). Bodies
are at most MAX_BODY_BYTES (413 beyond). Database access (pool, acting user, concurrency slots, embedder) is
pgkb.serving's, shared with `pgkb mcp`.
"""
