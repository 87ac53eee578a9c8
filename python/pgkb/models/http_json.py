"""One JSON POST with bounded retries and exponential backoff (:func:`post_json`), and the endpoint the HTTP
embedder and reranker are (:class:`JsonEndpoint`).

Retried: connection errors, timeouts, HTTP 5xx and 429. Not retried: other 4xx (the request is wrong).
Failures raise the caller's error class with the endpoint's message.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request


def post_json(
    url: str,
    body: object,
    *,
    api_key: str = "",
    timeout: float,
    retries: int,
    backoff: float,
    error: type[Exception],
) -> object:
    """POST ``body`` as JSON to ``url`` and return the decoded JSON answer; raise ``error`` on failure."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last: Exception | None = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode("utf-8", "replace")
            last = error(f"{url} answered HTTP {e.code}: {detail}")
            if e.code < 500 and e.code != 429:
                raise last from e
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            last = error(f"{url} unreachable: {getattr(e, 'reason', e)}")
        except ValueError as e:
            raise error(f"{url} did not answer JSON") from e
    raise error(f"{last} (after {retries + 1} attempts)")


class JsonEndpoint:
    """An http(s) endpoint answering JSON, with its key and retry policy; ``error`` is the class its
    failures raise (subclasses set it)."""

    error: type[Exception] = RuntimeError

    def __init__(self, url: str, api_key: str, *, what: str, timeout: float, retries: int, backoff: float) -> None:
        if not url.startswith(("http://", "https://")):
            raise self.error(f"{what} URL must be http(s), got {url!r}")
        self.url, self.api_key, self.timeout, self.retries, self.backoff = url, api_key, timeout, retries, backoff

    def post(self, body: object) -> object:
        """The decoded JSON answer to ``body`` (see :func:`post_json`)."""
        return post_json(
            self.url,
            body,
            api_key=self.api_key,
            timeout=self.timeout,
            retries=self.retries,
            backoff=self.backoff,
            error=self.error,
        )
