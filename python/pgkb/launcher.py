"""`pgkb up` / `pgkb down`: the whole local knowledge base in one command (what `make run` calls).

`up`: start the database (embedded unless PGKB_DATABASE_URL), migrate, create the MCP service role
(`pgkb_mcp`, member of pgkb_service) and the pgkb user the IDE acts as, start `pgkb embed-server` (so
`kb.hybrid_search('…')` from psql gets its vector leg) and `pgkb mcp --transport http` in the background,
ingest the docs (examples/kb unless --docs) into a public knowledge base, run one sample search, and print
how to connect with psql and ready-to-paste MCP configuration for TRAE, Cursor, Claude Code and VS Code.
`down`: stop both servers and the embedded database. Pid and log files live in PGKB_STATE_DIR
(default ${XDG_STATE_HOME:-~/.local/state}/pgkb).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from pgkb.config import Settings
from pgkb.db import connect, database_url
from pgkb.ingest import IngestOptions, ingest
from pgkb.migrate import migrate
from pgkb.models.embedding import EmbeddingError, load_embedder, model_spec
from pgkb.models.vision import load_captioner
from pgkb.service_role import SERVICE_ROLE, ensure_service_role, login_url

REPO = Path(__file__).resolve().parents[2]
SAMPLE_QUERY = "登录态失效怎么排查"


def state_dir() -> Path:
    base = (
        os.environ.get("PGKB_STATE_DIR")
        or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "pgkb"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _say(message: str) -> None:
    print(f"pgkb: {message}", flush=True)


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _start_background(
    name: str, argv: list[str], env: dict[str, str], ready: Callable[[], bool], timeout: float
) -> int:
    """Start a detached process (pid and log in the state dir) unless one is already serving."""
    pid_file, log_file = state_dir() / f"{name}.pid", state_dir() / f"{name}.log"
    if ready():
        _say(f"{name} already running")
        return int(pid_file.read_text()) if pid_file.exists() else 0
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {log_file}")
        if ready():
            _say(f"{name} started (pid {proc.pid}, log {log_file})")
            return proc.pid
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not become ready in {timeout:.0f} s; see {log_file}")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def embed_server_problem(health: dict | None, model: str, dimension: int, port: int) -> str | None:
    """Why the server answering /health on the embed port cannot serve the registry's default model (health:
    its JSON answer, None when it sent none), with how to resolve it; None when it can."""
    if health is None or not isinstance(health.get("model"), str) or not isinstance(health.get("dimension"), int):
        found = "a server that is not pgkb embed-server (its /health says no model and dimension)"
    elif health["model"] == model and health["dimension"] == dimension:
        return None
    else:
        found = f"pgkb embed-server serving {health['model']!r} ({health['dimension']} dimensions)"
    return (
        f"port {port} has {found}, but the default embedding model is {model!r} ({dimension} dimensions): "
        f"stop that server (`make stop` if `make run` started it) or choose another port (pgkb up --embed-port)"
    )


def _health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            answer = json.loads(r.read(65536))
            return answer if isinstance(answer, dict) else None
    except (OSError, ValueError):
        return None


def sample_line(i: int, doc_key: str, path: str | None, score: object, vector_used: bool) -> str:
    """One hit of the sample search: rank, document, its heading path when it has one, score, legs."""
    headings = f"  [{path}]" if path else ""
    return f"  {i}. {doc_key}{headings}  score {score}  {'hybrid' if vector_used else 'lexical only'}"


def _prepare_identity(conn, user: str) -> None:
    """The MCP service login role and the pgkb user it acts for."""
    ensure_service_role(conn)
    conn.execute("select kb.create_user(%s)", [user])


def mcp_configs(pgkb: str, env: dict[str, str], http_url: str) -> str:
    """Ready-to-paste MCP client configuration (absolute paths, env vars) for the supported IDEs."""
    stdio = {"command": pgkb, "args": ["mcp"], "env": env}
    cursor = json.dumps({"mcpServers": {"pgkb": stdio}}, ensure_ascii=False, indent=2)
    vscode = json.dumps({"servers": {"pgkb": {"type": "stdio", **stdio}}}, ensure_ascii=False, indent=2)
    vscode_http = json.dumps({"servers": {"pgkb": {"type": "http", "url": http_url}}}, indent=2)
    claude_env = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    return f"""
== MCP: stdio (the IDE starts `pgkb mcp`; the database and embed-server must already run: `make run`) ==

TRAE (Settings > MCP > Add > Manual) and Cursor (~/.cursor/mcp.json):
{cursor}

VS Code (.vscode/mcp.json):
{vscode}

Claude Code:
  claude mcp add pgkb {claude_env} -- {pgkb} mcp

To let agents save what they learned into knowledge bases the user may write (the save_knowledge tool; the
IDE asks the person before each save): "args": ["mcp", "--allow-writes"] (Claude Code: `... -- {pgkb} mcp
--allow-writes`).

== MCP: streamable HTTP (already running at {http_url}) ==

Cursor / TRAE: {{"mcpServers": {{"pgkb": {{"url": "{http_url}"}}}}}}
VS Code:
{vscode_http}
Claude Code:
  claude mcp add --transport http pgkb {http_url}
"""


def up(docs: Path | None, kb: str, user: str, embed_port: int, mcp_port: int) -> int:
    docs = (docs or REPO / "examples" / "kb").resolve()
    if not docs.is_dir():  # before anything starts; examples/kb is in a checkout, not in an installed wheel
        raise FileNotFoundError(f"{docs} is not a directory: pass the folder to ingest with --docs")
    settings = Settings.from_env()
    url = database_url(settings, migrated=False, writable=True)  # migrated just below, with the report shown
    _say("database ready")
    with connect(url, vector=False) as conn:
        for line in migrate(conn, settings.db_dir).lines():
            _say(line)
    with connect(url) as conn:
        _prepare_identity(conn, user)
        embed_url = f"http://127.0.0.1:{embed_port}/v1/embeddings"
        conn.execute("update kb.settings set value = %s where key = 'embedding_url'", [embed_url])
        env = dict(os.environ)
        _start_background(
            "embed-server",
            [sys.executable, "-m", "pgkb.cli", "embed-server", "--port", str(embed_port)],
            env,
            lambda: _healthy(f"http://127.0.0.1:{embed_port}/health"),
            timeout=120,
        )
        default = model_spec(conn, None)
        problem = embed_server_problem(
            _health(f"http://127.0.0.1:{embed_port}/health"), default.name, default.dimension, embed_port
        )
        if problem:
            raise EmbeddingError(problem)
        conn.execute("select kb.create_knowledge_base(%s, 'public')", [kb])
        spec = model_spec(conn, settings.embed_model)
        embedder, captioner = load_embedder(settings, spec), load_captioner(settings)
        summary = ingest(conn, url, docs, kb, spec, embedder, IngestOptions(), captioner=captioner)
        _say(f"ingested {docs} into {kb!r}: {summary.line()}")
        for failure in summary.failures:
            _say(f"  failed {failure['doc_key']}: {failure['error']}")
        mcp_env = {
            "PGKB_DATABASE_URL": login_url(url, SERVICE_ROLE),
            "PGKB_USER": user,
            "PGKB_EMBED_PROVIDER": "http",
            "PGKB_EMBED_URL": embed_url,
        }
        _start_background(
            "mcp",
            [sys.executable, "-m", "pgkb.cli", "mcp", "--transport", "http", "--port", str(mcp_port)],
            {**os.environ, **mcp_env},
            lambda: _port_open("127.0.0.1", mcp_port),
            timeout=60,
        )
        rows = conn.execute(
            "select doc_key, array_to_string(heading_path, ' > '), round(score::numeric, 4), vector_used"
            " from kb.hybrid_search(%s, 3)",
            [SAMPLE_QUERY],
        ).fetchall()
    print(f"\nSample search, as psql runs it: SELECT * FROM kb.hybrid_search('{SAMPLE_QUERY}');")
    for i, (doc_key, path, score, vector_used) in enumerate(rows, 1):
        print(sample_line(i, doc_key, path, score, vector_used))
    if not rows:
        print("  (no results)")
    print(f'\npsql:\n  psql "{url}"')
    print(mcp_configs(str(Path(sys.executable).parent / "pgkb"), mcp_env, f"http://127.0.0.1:{mcp_port}/mcp"))
    print("Stop everything with `make stop` (pgkb down).")
    return 0


def down() -> int:
    for name in ("mcp", "embed-server"):
        pid_file = state_dir() / f"{name}.pid"
        if not pid_file.exists():
            continue
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            pass
        pid_file.unlink(missing_ok=True)
        _say(f"stopped {name}")
    settings = Settings.from_env()
    if not settings.database_url:
        from pgkb.cluster import embedded_cluster_from_env

        embedded_cluster_from_env().stop()
        _say("database stopped")
    return 0
