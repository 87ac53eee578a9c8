"""The stdio transport: one JSON-RPC message per line, every line answered (-32700 for unparseable lines,
-32600 for invalid requests, tool errors for invalid Unicode in arguments)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from typing import BinaryIO

from pgkb.serving.arguments import (
    _SURROGATE_MESSAGE,
    _first_line,
    _shown,
)
from pgkb.serving.config import (
    _SURROGATE,
)

log = logging.getLogger("pgkb.mcp")


def _rpc_error(rid, code: int, message: str):
    from mcp_types import ErrorData, JSONRPCError

    return JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(code=code, message=message))


def _surrogate_path(value: object) -> list[str] | None:
    """The keys leading to the first string (or key) of a parsed JSON value holding an unpaired
    surrogate, else None. Iterative: nesting depth costs no recursion."""
    stack: list[tuple[object, list[str]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if _SURROGATE.search(key):
                    return [*path, key]
                stack.append((child, [*path, key]))
        elif isinstance(item, list):
            stack.extend((child, [*path, str(i)]) for i, child in enumerate(item))
    return None


def parse_stdio_line(line: bytes):
    """One line read by the stdio transport -> ``(message, None)`` for the server, ``(None, answer)`` to
    write back at once, or ``(None, None)`` to ignore (blank lines; notifications that cannot be answered).

    JSON-RPC 2.0 answers for what the SDK would drop silently: -32700 (id null) for a line that is not
    UTF-8 JSON (including numbers too long to read); -32600 for JSON that is no JSON-RPC message; an unpaired
    surrogate (which the SDK's JSON parser refuses) in a tool argument is that tool call's error result, and
    anywhere else -32602 / -32600. No unpaired surrogate ever reaches the server, so none can reach an answer.
    """
    import mcp_types as types
    from mcp.shared.message import SessionMessage
    from pydantic import ValidationError

    if not line.strip():
        return None, None
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False)), None
    except ValidationError:
        pass  # find out what is wrong, to say so
    try:
        value = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, _rpc_error(None, types.PARSE_ERROR, "Parse error: the line is not valid UTF-8")
    except (ValueError, RecursionError) as e:
        reason = "a number is too long" if "integer string conversion" in str(e) else _shown(_first_line(e))
        return None, _rpc_error(None, types.PARSE_ERROR, f"Parse error: {reason}")
    if not isinstance(value, dict):
        return None, _rpc_error(
            None, types.INVALID_REQUEST, "Invalid Request: a message must be a JSON object (batches are not supported)"
        )
    rid = value.get("id")
    if isinstance(rid, bool) or not isinstance(rid, (int, str)) or (isinstance(rid, str) and _SURROGATE.search(rid)):
        rid = None
    bad = _surrogate_path(value)
    if bad is None:
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(value, by_name=False)), None
        except ValidationError:
            return None, _rpc_error(
                rid, types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request, notification or response"
            )
    method = value.get("method")
    if "id" not in value and isinstance(method, str):
        log.warning("dropped a notification holding an unpaired surrogate (%s)", _shown(method, 50))
        return None, None
    where = _SURROGATE.sub("\ufffd", ".".join(bad))
    if method == "tools/call" and rid is not None and len(bad) >= 3 and bad[:2] == ["params", "arguments"]:
        from mcp_types import CallToolResult, JSONRPCResponse, TextContent

        argument = _shown(_SURROGATE.sub("\ufffd", bad[2]), 50)
        result = CallToolResult(
            content=[TextContent(type="text", text=f"{argument} {_SURROGATE_MESSAGE}")], is_error=True
        )
        return None, JSONRPCResponse(jsonrpc="2.0", id=rid, result=result.model_dump(by_alias=True, exclude_none=True))
    code, kind = (
        (types.INVALID_PARAMS, "Invalid params") if bad[0] == "params" else (types.INVALID_REQUEST, "Invalid Request")
    )
    return None, _rpc_error(rid, code, f"{kind}: {_shown(where, 100)} {_SURROGATE_MESSAGE}")


def _encode(message) -> bytes:
    """One JSON-RPC message as a line of UTF-8. An answer that cannot be encoded becomes an internal error
    for its request (never a dead transport); an unencodable notification is dropped."""
    try:
        text = message.model_dump_json(by_alias=True, exclude_unset=True)
    except Exception as e:
        log.error("cannot encode a %s: %s", type(message).__name__, _shown(e))
        from mcp_types import INTERNAL_ERROR, JSONRPCError, JSONRPCResponse

        if not isinstance(message, (JSONRPCResponse, JSONRPCError)):
            return b""
        text = _rpc_error(
            message.id, INTERNAL_ERROR, "Internal error: the answer could not be encoded"
        ).model_dump_json(by_alias=True, exclude_unset=True)
    return (text + "\n").encode("utf-8")


@contextlib.asynccontextmanager
async def stdio_transport(stdin: BinaryIO | None = None, stdout: BinaryIO | None = None):
    """MCP over newline-delimited JSON-RPC on stdin/stdout, like the SDK's ``stdio_server`` but answering
    every line (see ``parse_stdio_line``). Yields the server's (read, write) streams. Without explicit
    streams, fd 0 reads the null device and fd 1 writes to stderr while serving (stray output cannot
    corrupt the protocol); both are restored afterwards."""
    import anyio
    from mcp.shared.message import SessionMessage

    restore = None
    if stdin is None or stdout is None:
        sys.stdout.flush()
        wire_in, wire_out = os.dup(0), os.dup(1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        stdin, stdout = os.fdopen(wire_in, "rb"), os.fdopen(wire_out, "wb")

        def restore() -> None:
            os.dup2(wire_out, 1)
            os.dup2(wire_in, 0)

    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    answers = write_send.clone()
    lines, out = anyio.wrap_file(stdin), anyio.wrap_file(stdout)

    async def reader() -> None:
        async with read_send, answers:
            async for line in lines:
                message, answer = parse_stdio_line(line)
                if message is not None:
                    await read_send.send(message)
                elif answer is not None:
                    await answers.send(SessionMessage(answer))

    async def writer() -> None:
        async with write_receive:
            async for item in write_receive:
                data = _encode(item.message)
                if data:
                    await out.write(data)
                    await out.flush()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            yield read_receive, write_send
    finally:
        if restore is not None:
            restore()


async def serve_stdio(server) -> None:
    """Serve ``server`` (an MCPServer) over ``stdio_transport`` until stdin closes."""
    async with stdio_transport() as (read, write):
        lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async runs, over the SDK's transport
        await lowlevel.run(read, write, lowlevel.create_initialization_options())
