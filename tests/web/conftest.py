"""tests/web: every response body ``call`` receives is checked for paths on the server (tests/served_bodies.py)."""

from served_bodies import no_server_paths  # noqa: F401 (an autouse fixture)
