"""One JSON POST with bounded retries and exponential backoff (:func:`post_json`), and the endpoint the HTTP
embedder and reranker are (:class:`JsonEndpoint`).

Retried: connection errors, timeouts, HTTP 5xx and 429. Not retried: other 4xx (the request is wrong).
Failures raise the caller's error class with the endpoint's message, redacted (:func:`redact`, the rule of
the database's kb_internal.redact): no key, user info or query string of the endpoint reaches a message.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterable


def shown_url(url: str) -> str:
    """``url`` as a message may show it: scheme, host, port and path, without user info, query string or
    fragment (any may hold a secret); "(the configured URL)" when it has no ``scheme://``."""
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*://)(?:[^@/?#]*@)?([^/?#]*)([^?#]*)", url or "")
    return "".join(m.groups()) if m else "(the configured URL)"


def redact(text: str, url: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with ``url`` shown as :func:`shown_url` and, longest first, each of ``secrets`` (API keys, also
    trimmed) and the URL's user info, password, query string, fragment and query values of 4 or more
    characters replaced by ``***``."""
    if url:
        text = text.replace(url, shown_url(url))
    for secret in endpoint_secrets(url, secrets):
        text = text.replace(secret, "***")
    return text


def secret_start_length(text: str, secrets: Iterable[str]) -> int:
    """How many characters at the end of ``text`` may be the start of one of ``secrets`` (0: none); the
    rule of the database's kb_internal.secret_start_length."""
    return max(
        (n for s in secrets for n in range(1, min(len(s) - 1, len(text)) + 1) if text.endswith(s[:n])), default=0
    )


def endpoint_secrets(url: str, secrets: Iterable[str] = ()) -> list[str]:
    """What :func:`redact` hides, longest first (kb_internal.endpoint_secrets)."""
    m = re.match(r"[^:/?#]*://(?:([^@/?#]*)@)?[^?#]*(?:\?([^#]*))?(?:#(.*))?$", url or "")
    userinfo, query, fragment = m.groups() if m else (None, None, None)
    secrets = list(secrets)
    hidden = {s for s in secrets if s} | {s.strip() for s in secrets if s}
    hidden |= {p for p in (userinfo, query, fragment) if p and len(p) >= 4}
    if userinfo and ":" in userinfo:
        hidden.add(userinfo.split(":", 1)[1])
    hidden |= {v for _, _, v in (q.partition("=") for q in (query or "").split("&")) if len(v) >= 4}
    return sorted((h for h in hidden if h), key=lambda h: (-len(h), h))


def redacted_excerpt(text: str, url: str, secrets: Iterable[str], max_chars: int, already_cut: bool = False) -> str:
    """``text`` redacted, then cut to ``max_chars``; where it is cut (or ``already_cut``: read up to a bound)
    the end that may begin a secret is dropped (kb_internal.redacted_excerpt)."""
    secrets = list(secrets)
    hidden = endpoint_secrets(url, secrets)
    if already_cut:
        text = text[: len(text) - secret_start_length(text, hidden)]
    text = redact(text, url, secrets)
    if len(text) > max_chars:
        text = text[:max_chars]
        return text[: len(text) - secret_start_length(text, hidden)] + "…"
    return text + "…" if already_cut else text


BODY_BYTES = 65536  # of an error body, read to be redacted before it is cut
BODY_CHARS = 300  # of it quoted in a message


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
    """POST ``body`` as JSON to ``url`` and return the decoded JSON answer; raise ``error`` on failure, its
    message redacted."""

    def failure(message: str) -> Exception:
        return error(redact(message, url, [api_key]))

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
            raw = e.read(BODY_BYTES + 1)
            detail = redacted_excerpt(
                raw[:BODY_BYTES].decode("utf-8", "replace"), url, [api_key], BODY_CHARS, len(raw) > BODY_BYTES
            )
            last = failure(f"{url} answered HTTP {e.code}: {detail}")
            if e.code < 500 and e.code != 429:
                raise last from e
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            last = failure(f"{url} unreachable: {getattr(e, 'reason', e)}")
        except ValueError as e:
            raise failure(f"{url} did not answer JSON") from e
    raise error(f"{last} (after {retries + 1} attempts)")


class JsonEndpoint:
    """An http(s) endpoint answering JSON, with its key and retry policy; ``error`` is the class its
    failures raise (subclasses set it)."""

    error: type[Exception] = RuntimeError

    def __init__(self, url: str, api_key: str, *, what: str, timeout: float, retries: int, backoff: float) -> None:
        if not url.startswith(("http://", "https://")):
            raise self.error(f"{what} URL must be http(s), got {shown_url(url)}")
        self.url, self.api_key, self.timeout, self.retries, self.backoff = url, api_key, timeout, retries, backoff
        self.shown = shown_url(url)  # the URL as messages show it

    def redact(self, text: str) -> str:
        """``text`` without this endpoint's secrets (:func:`redact`)."""
        return redact(text, self.url, [self.api_key])

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
