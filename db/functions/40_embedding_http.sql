-- requires: plpython3u
-- In-database query embedding over HTTP: one POST to an OpenAI-compatible /v1/embeddings endpoint
-- (pgkb embed-server, Ollama, vLLM, TEI, OpenAI). Skipped by `pgkb db migrate` where plpython3u is not
-- available (managed PostgreSQL); kb_internal.query_embeddings then reports that queries need a caller-side embedding.

create extension if not exists plpython3u;

-- POST {"model", "input": inputs} to url (all of them in one request) and return their embeddings as the rows
-- of a 2-d array, in the inputs' order (data[i].index when the endpoint gives it). Raises with the endpoint's
-- message on HTTP errors (its body redacted before it is cut: kb_internal.redacted_excerpt), timeouts and malformed
-- answers (any failure at all), every message through kb_internal.redact: the URL's user info and query and the
-- key never appear; SQLSTATE 08000 when the endpoint
-- cannot be reached (refused, unresolvable, timed out). The caller decides how to degrade.
create or replace function kb_internal.http_embeddings(
    url text, model text, inputs text[], api_key text default '', timeout_ms integer default 3000
)
returns real[][]
language plpython3u volatile
set search_path = pg_catalog, pg_temp
as $$
import json
import urllib.error
import urllib.request

redaction = plpy.prepare("select kb_internal.redact($1, $2, $3) as message", ["text", "text", "text[]"])
excerpt = plpy.prepare("select kb_internal.redacted_excerpt($1, $2, $3, 300, $4) as message",
                       ["text", "text", "text[]", "boolean"])
BODY_BYTES = 65536  # of an error body, read to be redacted before it is cut


class Failed(Exception):
    sqlstate = "XX000"


class Unreachable(Failed):
    sqlstate = "08000"


def attempt():
    if not url or not url.startswith(("http://", "https://")):
        raise Failed("embedding_url must be an http(s) URL")
    if not inputs:
        raise Failed("no input to embed")
    body = json.dumps({"model": model, "input": list(inputs)}).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=max(timeout_ms, 1) / 1000.0) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        raw = e.read(BODY_BYTES + 1)
        detail = plpy.execute(excerpt, [raw[:BODY_BYTES].decode("utf-8", "replace"), url, [api_key or ""],
                                        len(raw) > BODY_BYTES])[0]["message"]
        raise Failed("embedding endpoint %s answered HTTP %s: %s" % (url, e.code, detail))
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable("embedding endpoint %s unreachable: %s" % (url, getattr(e, "reason", e)))
    try:
        data = json.loads(raw.decode("utf-8"))["data"]
        if len(data) != len(inputs):
            raise ValueError
        order = sorted(range(len(data)), key=lambda i: data[i].get("index", i))
        rows = [[float(x) for x in data[i]["embedding"]] for i in order]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise Failed("embedding endpoint %s returned no embedding for each of the %d inputs" % (url, len(inputs)))
    if len({len(r) for r in rows}) != 1:
        raise Failed("embedding endpoint %s returned embeddings of different dimensions" % (url,))
    return rows


try:
    return attempt()
except Exception as e:  # anything, even an unforeseen error, may quote the URL or the key
    message = str(e) if isinstance(e, Failed) else "embedding endpoint %s failed: %s" % (url, e)
    state = e.sqlstate if isinstance(e, Failed) else Failed.sqlstate
    plpy.error(plpy.execute(redaction, [message, url, [api_key or ""]])[0]["message"], sqlstate=state)
$$;
