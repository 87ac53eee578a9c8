-- requires: plpython3u
-- In-database chat completion over HTTP for kb.ask: one POST to an OpenAI-compatible /chat/completions
-- endpoint (DeepSeek, Qwen/DashScope compatible mode, OpenAI, vLLM, Ollama, LM Studio). Skipped by
-- `pgkb db migrate` where plpython3u is not available; kb.ask then answers extractively.

create extension if not exists plpython3u;

-- POST {model, messages, max_tokens, temperature, stream} to url (a base URL gets /chat/completions
-- appended) and return {content, model, finish_reason}; model is the one asked for (pgkb's setting), never the
-- name the endpoint sends back, which a user would otherwise see unredacted. The bearer key comes from kb.settings chat_api_key,
-- else the server environment variable named by chat_api_key_env; it never appears in a message, in the
-- content or in a delta (nor does the URL's query or user info): all pass through kb_internal.redact. Raises on
-- HTTP errors (status and a body excerpt, redacted before it is cut: kb_internal.redacted_excerpt), timeouts, malformed answers; timeout_ms bounds the whole
-- call. stream: SSE, each delta sent as a NOTICE 'pgkb-delta:' || delta while it arrives, except an end
-- that may begin a secret (kb_internal.endpoint_secrets), held back until the next delta shows it is none.
create or replace function kb_internal.chat_completion(
    url text, model text, messages jsonb, timeout_ms integer default 20000, max_tokens integer default 1024,
    temperature double precision default 0, stream boolean default false
)
returns jsonb
language plpython3u volatile
set search_path = pg_catalog, pg_temp
as $$
import json
import math
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

DELTA_PREFIX = "pgkb-delta:"
MAX_BYTES = 4 * 1024 * 1024

if not url or not url.startswith(("http://", "https://")):
    plpy.error("chat_url must be an http(s) URL", sqlstate="22023")
if timeout_ms is None or not 1 <= timeout_ms <= 600000:
    plpy.error("chat timeout_ms must be between 1 and 600000", sqlstate="22023")
if max_tokens is None or not 1 <= max_tokens <= 1000000:
    plpy.error("chat max_tokens must be between 1 and 1000000", sqlstate="22023")
if temperature is None or not (isinstance(temperature, float) and math.isfinite(temperature)) or not 0 <= temperature <= 2:
    plpy.error("chat temperature must be a number between 0 and 2", sqlstate="22023")

conf = plpy.execute("select kb_internal.setting('chat_api_key') as key, kb_internal.setting('chat_api_key_env') as env")[0]
api_key = (conf["key"] or "").strip()
if not api_key and (conf["env"] or "").strip():
    api_key = os.environ.get(conf["env"].strip(), "").strip()

parts = urllib.parse.urlsplit(url)
path = parts.path.rstrip("/")
if not path.endswith("/chat/completions"):
    path += "/chat/completions"
target = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
redaction = plpy.prepare("select kb_internal.redact($1, $2, $3) as text", ["text", "text", "text[]"])
secrets = plpy.execute(plpy.prepare("select kb_internal.endpoint_secrets($1, $2) as s", ["text", "text[]"]),
                       [target, [api_key]])[0]["s"] or []


def clean(text):
    """text with the endpoint's secrets blanked out (kb_internal.redact)."""
    return plpy.execute(redaction, [str(text), target, [api_key]])[0]["text"]


excerpt = plpy.prepare("select kb_internal.redacted_excerpt($1, $2, $3, 400, $4) as text",
                       ["text", "text", "text[]", "boolean"])
secret_start = plpy.prepare("select kb_internal.secret_start_length($1, $2) as n", ["text", "text[]"])
BODY_CHARS = 4096  # of a failed answer's body, quoted after redaction


def fail(what, sqlstate="58000", already_cut=False):
    # redacted, then cut (kb_internal.redacted_excerpt): a cut first could leave the start of a secret visible
    message = "chat endpoint %s %s" % (target, what)
    plpy.error(plpy.execute(excerpt, [message, target, [api_key], already_cut])[0]["text"], sqlstate=sqlstate)


def body_excerpt(raw):
    """(text, cut): the start of an answer's body, to be quoted by fail(..., already_cut=cut)."""
    return " ".join(raw[:BODY_CHARS].decode("utf-8", "replace").split()), len(raw) > BODY_CHARS


def held_back(text):
    """How many characters at the end of text may be the start of a secret (0: none)."""
    return plpy.execute(secret_start, [text, secrets])[0]["n"]


deadline = time.monotonic() + timeout_ms / 1000.0


def remaining():
    left = deadline - time.monotonic()
    if left <= 0:
        fail("timed out after %d ms" % timeout_ms)
    return left


body = {
    "model": model,
    "messages": json.loads(messages) if isinstance(messages, str) else messages,
    "max_tokens": max_tokens,
    "temperature": temperature,
    "stream": bool(stream),
}
headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
if api_key:
    headers["Authorization"] = "Bearer " + api_key
request = urllib.request.Request(target, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")

try:
    response = urllib.request.urlopen(request, timeout=remaining())
except urllib.error.HTTPError as e:
    try:
        detail, cut = body_excerpt(e.read(BODY_CHARS + 1))
    except Exception:
        detail, cut = "", False
    fail("answered HTTP %s: %s" % (e.code, detail), already_cut=cut)
except (socket.timeout, TimeoutError):
    fail("timed out after %d ms" % timeout_ms)
except (urllib.error.URLError, OSError, ValueError) as e:
    reason = getattr(e, "reason", e)
    if isinstance(reason, (socket.timeout, TimeoutError)):
        fail("timed out after %d ms" % timeout_ms)
    fail("unreachable: %s" % (reason,))


def set_read_timeout():
    # each read waits at most until the deadline
    try:
        response.fp.raw._sock.settimeout(remaining())
    except AttributeError:
        remaining()


def read_all():
    chunks, size = [], 0
    while True:
        set_read_timeout()
        piece = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
        if not piece:
            return b"".join(chunks)
        size += len(piece)
        if size > MAX_BYTES:
            fail("answered more than %d bytes" % MAX_BYTES)
        chunks.append(piece)


def message_of(answer):
    try:
        choice = answer["choices"][0]
        content = choice["message"]["content"]
        if not isinstance(content, str):
            raise TypeError
        return {"content": content, "model": model, "finish_reason": choice.get("finish_reason")}
    except (KeyError, IndexError, TypeError, AttributeError):
        fail("returned no choices[0].message.content")


try:
    with response:
        kind = response.headers.get("Content-Type", "")
        if not stream or "text/event-stream" not in kind:
            raw = read_all()
            try:
                answer = json.loads(raw.decode("utf-8"))
            except ValueError:
                detail, cut = body_excerpt(raw)
                fail("returned malformed JSON: %s" % detail, already_cut=cut)
            message = message_of(answer)
            message["content"] = clean(message["content"])
            return json.dumps(message)
        # Server-sent events: "data: {chunk}" lines, "data: [DONE]" at the end
        content, finish, size, done, pending = [], None, 0, False, ""
        while not done:
            set_read_timeout()
            line = response.readline(MAX_BYTES)
            if not line:
                break
            size += len(line)
            if size > MAX_BYTES:
                fail("streamed more than %d bytes" % MAX_BYTES)
            line = line.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            try:
                event = json.loads(data)
            except ValueError:
                fail("streamed a malformed event: %s" % data)
            if isinstance(event, dict) and event.get("error"):
                fail("streamed an error: %s" % json.dumps(event["error"]))
            try:
                choice = (event.get("choices") or [{}])[0]
                delta = (choice.get("delta") or {}).get("content") or ""
                if not isinstance(delta, str):
                    raise TypeError
            except (AttributeError, TypeError, IndexError):
                fail("streamed an event without choices[0].delta: %s" % data)
            finish = choice.get("finish_reason") or finish
            if delta:
                content.append(delta)
                pending += delta
                ready = len(pending) - held_back(pending)
                if ready > 0:
                    plpy.notice(DELTA_PREFIX + clean(pending[:ready]))
                    pending = pending[ready:]
        if not done and finish is None:
            fail("ended the stream before [DONE]")
        if pending:
            plpy.notice(DELTA_PREFIX + clean(pending))
        return json.dumps({"content": clean("".join(content)), "model": model, "finish_reason": finish})
except (socket.timeout, TimeoutError):
    fail("timed out after %d ms" % timeout_ms)
except (OSError, ValueError) as e:
    fail("failed while answering: %s" % (e,))
$$;
