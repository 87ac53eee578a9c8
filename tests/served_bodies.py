"""What the servers under test send to remote users, checked for paths on the server.

The real clients of tests/web (``call``) and tests/mcp (the SDK's ``Client``, over stdio and HTTP alike)
record every response body they receive (:func:`record`; :func:`record_mcp_results` wraps the MCP client).
After each test, :func:`no_server_paths` fails it when a body recorded during it holds the checkout's path or
a source path of a document in the test's database that is not a web address (what `pgkb ingest` records
without --base-url), or such a path's folder: a remote user (the page, Dify, MCP) must be shown the source
URL or the kb:// URI, never where a file lies on the server (db/functions/47_shown_sources.sql).

Use: ``from served_bodies import no_server_paths, record_mcp_results`` in a conftest.py (autouse fixtures)."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]
_bodies: list[str] = []


def record(body: bytes | str) -> None:
    """Keep a response body for the check at the end of the test."""
    _bodies.append(body.decode(errors="replace") if isinstance(body, bytes) else body)


def server_paths(db) -> set[str]:
    """The strings no response may contain: the checkout's path, and every stored source of ``db``'s documents
    that is not an http(s) URL, with its folder."""
    paths = {str(REPO)}
    for (source,) in db.execute(
        "select distinct source_url from kb.documents where source_url is not null and source_url !~* '^https?://'"
    ).fetchall():
        paths |= {source, str(PurePosixPath(source).parent)}
    return {p for p in paths if len(p) > 1}


def leaks(bodies: list[str], paths: set[str]) -> list[str]:
    """``path in body`` for every recorded body holding one of ``paths`` (first 200 characters of the body)."""
    return [f"{p!r} in {body[:200]!r}" for body in bodies for p in sorted(paths) if p in body]


@pytest.fixture(autouse=True)
def no_server_paths(request):
    """Fail a test whose recorded response bodies show a path on the server (see the module docstring)."""
    _bodies.clear()
    db = request.getfixturevalue("db") if "db" in request.fixturenames else None
    yield
    bodies = list(_bodies)
    _bodies.clear()
    if db is not None and bodies:
        found = leaks(bodies, server_paths(db))
        assert not found, "a response shows a path on the server: " + "; ".join(found[:5])


@pytest.fixture(autouse=True)
def record_mcp_results(monkeypatch):
    """Every result the MCP SDK's Client receives (tool calls, resources, prompts) is recorded as JSON."""
    from mcp import Client, MCPError

    def recording(original):
        async def call(self, *args, **kwargs):
            try:
                result = await original(self, *args, **kwargs)
            except MCPError as e:  # an error answer is a response body too
                record(str(e))
                raise
            record(json.dumps(result.model_dump(mode="json"), ensure_ascii=False))
            return result

        return call

    for name in ("call_tool", "read_resource", "get_prompt"):
        monkeypatch.setattr(Client, name, recording(getattr(Client, name)))
