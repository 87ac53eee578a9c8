-- requires: plpython3u
-- In-database query embedding over HTTP: one POST to an OpenAI-compatible /v1/embeddings endpoint
-- (pgkb embed-server, Ollama, vLLM, TEI, OpenAI). Skipped by `pgkb db migrate` where plpython3u is not
-- available (managed PostgreSQL); kb.embed_query then reports that queries need a caller-side embedding.

create extension if not exists plpython3u;

-- POST {"model", "input": [text]} to url and return data[0].embedding. Raises with the endpoint's
-- message on HTTP errors, timeouts and malformed answers; the caller decides how to degrade.
create or replace function kb.http_embedding(
    url text, model text, input text, api_key text default '', timeout_ms integer default 3000
)
returns real[]
language plpython3u volatile
set search_path = pg_catalog, pg_temp
as $$
import json
import urllib.error
import urllib.request

if not url or not url.startswith(("http://", "https://")):
    plpy.error("embedding_url must be an http(s) URL, got %r" % (url,))
body = json.dumps({"model": model, "input": [input]}).encode("utf-8")
headers = {"Content-Type": "application/json"}
if api_key:
    headers["Authorization"] = "Bearer " + api_key
request = urllib.request.Request(url, data=body, headers=headers, method="POST")
try:
    with urllib.request.urlopen(request, timeout=max(timeout_ms, 1) / 1000.0) as response:
        answer = json.loads(response.read().decode("utf-8"))
except urllib.error.HTTPError as e:
    detail = e.read()[:300].decode("utf-8", "replace")
    plpy.error("embedding endpoint %s answered HTTP %s: %s" % (url, e.code, detail))
except (urllib.error.URLError, OSError, ValueError) as e:
    plpy.error("embedding endpoint %s unreachable: %s" % (url, getattr(e, "reason", e)))
try:
    vector = answer["data"][0]["embedding"]
    return [float(x) for x in vector]
except (KeyError, IndexError, TypeError, ValueError):
    plpy.error("embedding endpoint %s returned no data[0].embedding" % (url,))
$$;
