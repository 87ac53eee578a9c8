"""Run a `pgkb` server command (`mcp --transport http`, `serve`) as a subprocess for a test."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(args: list[str], env: dict[str, str], port: int, timeout: float = 30):
    """``python -m pgkb.cli *args`` until the block ends; yields once ``port`` accepts connections, raises
    with the server's stderr if it exits first. Afterwards its stderr must hold no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgkb.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                stderr = proc.communicate()[1].decode()[-2000:]
                raise RuntimeError(f"{args[0]} server did not start: {stderr}") from None
            time.sleep(0.1)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert b"Traceback" not in proc.stderr.read()
