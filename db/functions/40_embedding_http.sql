-- requires: plpython3u
-- In-database query embedding over HTTP: one POST to an OpenAI-compatible /v1/embeddings endpoint
-- (pgkb embed-server, Ollama, vLLM, TEI, OpenAI). Skipped by `pgkb db migrate` where plpython3u is not
-- available (managed PostgreSQL); kb_internal.embed_query then reports that queries need a caller-side embedding.

create extension if not exists plpython3u;

-- POST {"model", "input": [text]} to url and return data[0].embedding. Raises with the endpoint's
-- message on HTTP errors, timeouts and malformed answers (any failure at all), every message through
-- kb_internal.redact: the URL's user info and query and the key never appear; SQLSTATE 08000 when the endpoint
-- cannot be reached (refused, unresolvable, timed out). The caller decides how to degrade.
create or replace function kb_internal.http_embedding(
    url text, model text, input text, api_key text default '', timeout_ms integer default 3000
)
returns real[]
language plpython3u volatile
set search_path = pg_catalog, pg_temp
as $$
import json
import urllib.error
import urllib.request

redaction = plpy.prepare("select kb_internal.redact($1, $2, $3) as message", ["text", "text", "text[]"])


class Failed(Exception):
    sqlstate = "XX000"


class Unreachable(Failed):
    sqlstate = "08000"


def attempt():
    if not url or not url.startswith(("http://", "https://")):
        raise Failed("embedding_url must be an http(s) URL")
    body = json.dumps({"model": model, "input": [input]}).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=max(timeout_ms, 1) / 1000.0) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode("utf-8", "replace")
        raise Failed("embedding endpoint %s answered HTTP %s: %s" % (url, e.code, detail))
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable("embedding endpoint %s unreachable: %s" % (url, getattr(e, "reason", e)))
    try:
        answer = json.loads(raw.decode("utf-8"))
        return [float(x) for x in answer["data"][0]["embedding"]]
    except (KeyError, IndexError, TypeError, ValueError):
        raise Failed("embedding endpoint %s returned no data[0].embedding" % (url,))


try:
    return attempt()
except Exception as e:  # anything, even an unforeseen error, may quote the URL or the key
    message = str(e) if isinstance(e, Failed) else "embedding endpoint %s failed: %s" % (url, e)
    state = e.sqlstate if isinstance(e, Failed) else Failed.sqlstate
    plpy.error(plpy.execute(redaction, [message, url, [api_key or ""]])[0]["message"], sqlstate=state)
$$;
