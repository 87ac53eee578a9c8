"""What the MCP server (pgkb.mcp) and the HTTP server of `pgkb serve` (pgkb.web) share: configuration from
the environment and limits (``config``), caller errors and argument checks (``arguments``), bearer tokens
and API keys and the Origin / Host checks (``auth``), and database access -- the connection pool, the acting
user per call, the concurrency slots, API key checks and the query embedder (``backend``)."""
