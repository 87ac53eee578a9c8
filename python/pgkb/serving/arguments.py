"""Errors meant for the caller and the checks every tool / API argument passes (types, ranges, lengths,
valid Unicode), with messages that echo at most a bounded part of what the caller sent."""

from __future__ import annotations

from pgkb.serving.config import (
    _SURROGATE,
    MAX_MESSAGE_CHARS,
    SHOWN_CHARS,
)


class ServiceError(Exception):
    """An error meant for the caller (an MCP tool or resource error; an HTTP error of `pgkb serve`)."""


class BadInput(ServiceError):
    """The caller's input was refused, by the checks here or by the database (HTTP 400)."""


class Unsupported(ServiceError):
    """The database lacks a function this call needs (an older or partly migrated schema; HTTP 501)."""


class NotFound(ServiceError):
    """What the caller named does not exist or is not visible to them: the same answer for both (HTTP 404)."""


class Forbidden(ServiceError):
    """The caller sees what they named but may not do this with it, e.g. read the question log of a knowledge
    base they do not own (HTTP 403)."""


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``value`` as echoed in a message: at most ``limit`` characters, a cut one ending in "…"."""
    try:
        text = value if isinstance(value, str) else str(value)
    except ValueError:  # an integer too long to print
        return "(a very long number)"
    return text if len(text) <= limit else text[:limit] + "…"


def _bounded_message(e: BaseException, *values: object) -> str:
    """An error message for the caller: every long argument value it quotes is cut to its first
    SHOWN_CHARS characters, and the whole message to MAX_MESSAGE_CHARS."""
    message = str(e)
    for value in values:
        if isinstance(value, str) and len(value) > SHOWN_CHARS:
            message = message.replace(value, _shown(value))
    return _shown(message, MAX_MESSAGE_CHARS)


def check_text(name: str, value: object, limit: int) -> str:
    """A string argument, or ServiceError: not a string, longer than ``limit`` characters, a NUL character or
    an unpaired surrogate (text that is not valid Unicode). The value itself is never echoed."""
    if not isinstance(value, str):
        raise ServiceError(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise ServiceError(f"{name} is {len(value)} characters long; at most {limit} are accepted")
    if "\x00" in value:
        raise ServiceError(f"{name} contains a NUL character, which is not allowed")
    if _SURROGATE.search(value):
        raise ServiceError(f"{name} {_SURROGATE_MESSAGE}")
    return value


_SURROGATE_MESSAGE = "contains an unpaired surrogate (invalid Unicode); send valid UTF-8 text"


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """An integer argument within [low, high] (booleans are not integers), or ServiceError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServiceError(f"{name} must be an integer, got {type(value).__name__} {_shown(value, 20)}")
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ServiceError(f"{name} must be {bounds}, got {_shown(value, 20)}")
    return value


# Beyond the query: how many phrasings, and whether one is blank or too long, is the database's rule
# (kb.check_search_input, kb.limits() phrasings); this bounds what is read before asking it.
MAX_PHRASINGS_READ = 16
ALSO_DESCRIPTION = (
    "other phrasings of the same question, e.g. its translation into the knowledge's language (at most 3; [] = none)"
)


def check_phrasings(value: object, limit: int = 4000) -> list[str] | None:
    """The ``also`` argument: a list of strings (None or [] for none), each as check_text reads it, or
    ServiceError (not a list, not strings, far too many)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise ServiceError(f"also must be a list of strings, got {type(value).__name__}")
    if len(value) > MAX_PHRASINGS_READ:
        raise ServiceError(f"also holds {len(value)} phrasings; at most 3 are accepted beside the query")
    for i, phrasing in enumerate(value, 1):
        check_text(f"also[{i}]", phrasing, limit)
    return list(value) or None
