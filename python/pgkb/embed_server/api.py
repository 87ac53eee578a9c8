"""The embed server's requests: their limits, their validation (bad input is always a 4xx, never a 500) and
the OpenAI-style error answer, :class:`ApiError`."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "MAX_DOCUMENTS",
    "MAX_INPUTS",
    "MAX_TEXT_CHARS",
    "MAX_TOTAL_CHARS",
    "ApiError",
    "check_bool",
    "check_model",
    "check_text",
    "parse_embeddings",
    "parse_rerank",
]

MAX_INPUTS = 256  # texts per /v1/embeddings request
MAX_DOCUMENTS = 1000  # documents per rerank request (Cohere's limit)
MAX_TEXT_CHARS = 32_768  # characters per text, query or document
MAX_TOTAL_CHARS = 65_536  # characters per embedding request (as sent, before cutting)


class ApiError(Exception):
    """An HTTP error answer: status, OpenAI-style type and code, and a message for the caller."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        type_: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.type = status, message, code, type_
        self.headers = headers or {}


def check_text(value: object, what: str) -> str:
    """A text of a request: a non-empty string within MAX_TEXT_CHARS, no NUL byte, valid Unicode."""
    if not isinstance(value, str):
        raise ApiError(400, f"{what} must be a string, got {type(value).__name__}", "invalid_type")
    if not value.strip():
        raise ApiError(400, f"{what} is empty", "empty_input")
    if len(value) > MAX_TEXT_CHARS:
        raise ApiError(400, f"{what} has {len(value)} characters; the limit is {MAX_TEXT_CHARS}", "input_too_long")
    if "\x00" in value:
        raise ApiError(400, f"{what} contains a NUL byte", "invalid_text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{what} contains an unpaired surrogate (invalid Unicode)", "invalid_text") from e
    return value


def check_model(body: dict, names: Sequence[str], kind: str) -> str:
    """The model a request names (default: the first of ``names``); 404 when it is not served here."""
    model = body.get("model")
    if model is None or model == "":
        return names[0]
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", "invalid_type")
    if model not in names:
        raise ApiError(
            404,
            f"the {kind} model {model!r} is not served here; this server serves {names[0]!r}",
            "model_not_found",
        )
    return model


def check_bool(body: dict, key: str, default: bool) -> bool:
    """An optional boolean field of a request."""
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false", "invalid_type")
    return value


def parse_embeddings(body: dict, dimension: int, model_name: str) -> tuple[list[str], bool]:
    """The texts of an embeddings request and whether to answer in base64; ApiError for bad input."""
    raw = body.get("input")
    if raw is None:
        raise ApiError(400, "'input' is required: a string or an array of strings", "missing_input")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise ApiError(400, "'input' must be a string or an array of strings", "invalid_type")
    if not raw:
        raise ApiError(400, "'input' is an empty array", "empty_input")
    if len(raw) > MAX_INPUTS:
        raise ApiError(400, f"'input' has {len(raw)} texts; the limit is {MAX_INPUTS} per request", "too_many_inputs")
    if any(isinstance(x, (int, list)) and not isinstance(x, bool) for x in raw):
        raise ApiError(400, "token arrays are not supported: send 'input' as text", "invalid_type")
    texts = [check_text(x, f"input[{i}]") for i, x in enumerate(raw)]
    total = sum(map(len, texts))
    if total > MAX_TOTAL_CHARS:
        raise ApiError(
            400, f"'input' has {total} characters in all; the limit is {MAX_TOTAL_CHARS} per request", "input_too_long"
        )
    fmt = body.get("encoding_format")
    if fmt not in (None, "float", "base64"):
        raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", "invalid_encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or dims != dimension):
        raise ApiError(
            400,
            f"'dimensions' must be {dimension} for {model_name!r} (no truncation)",
            "invalid_dimensions",
        )
    return texts, fmt == "base64"


def parse_rerank(body: dict, docs_key: str) -> tuple[str, list[str]]:
    """The query and the texts of a rerank request (``docs_key``: Cohere's documents, TEI's texts)."""
    if body.get("query") is None:
        raise ApiError(400, "'query' is required", "missing_query")
    query = check_text(body["query"], "'query'")
    raw = body.get(docs_key)
    if raw is None:
        raise ApiError(400, f"'{docs_key}' is required: an array of texts", "missing_documents")
    if not isinstance(raw, list):
        raise ApiError(400, f"'{docs_key}' must be an array", "invalid_type")
    if not raw:
        raise ApiError(400, f"'{docs_key}' is an empty array", "empty_input")
    if len(raw) > MAX_DOCUMENTS:
        raise ApiError(
            400, f"'{docs_key}' has {len(raw)} entries; the limit is {MAX_DOCUMENTS} per request", "too_many_inputs"
        )
    docs = []
    for i, d in enumerate(raw):
        if isinstance(d, dict) and docs_key == "documents":
            d = d.get("text")
        docs.append(check_text(d, f"{docs_key}[{i}]"))
    return query, docs
