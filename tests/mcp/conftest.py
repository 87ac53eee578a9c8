"""tests/mcp: every MCP result a test receives is checked for paths on the server (tests/served_bodies.py)."""

from served_bodies import no_server_paths, record_mcp_results  # noqa: F401 (autouse fixtures)
