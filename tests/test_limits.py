"""pgkb.limits: the bounds the SQL API enforces are the database's (kb.limits()); the Python package reads
them and restates none. The scan below fails when a literal equal to a bound's value appears on a line that
names that bound (e.g. ``MAX_TOP_K = 100``, ``if len(query) > 4000``, ``1e-15 <= norm``)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from pgkb.limits import api_limit, api_limits

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "pgkb"
# words that name each bound in Python code, beyond its own name's (kb.limits() name -> extra words)
ALIASES = {"doc_key_chars": ("doc_id",), "doc_key_bytes": ("doc_id",)}
GENERIC = {"chars", "bytes", "min", "max"}


def words_of(name: str) -> list[str]:
    parts = [p for p in name.split("_") if p not in GENERIC]
    return ["_".join(parts), *ALIASES.get(name, ())]


def pattern(name: str) -> re.Pattern:
    """The words of a bound (``top_k``: top_k, top k, topk), not inside another word."""
    return re.compile("|".join(rf"(?<![a-z]){w.replace('_', '[_ ]?')}(?![a-z])" for w in words_of(name)), re.I)


def restated(limits: dict[str, float], root: Path = PACKAGE) -> list[str]:
    """``path:line: name: code`` for every numeric literal equal to a bound on a line naming that bound."""
    patterns = {name: pattern(name) for name in limits}
    found = []
    for path in sorted(root.rglob("*.py")):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
            if token.type != tokenize.NUMBER or token.string.lower().startswith(("0x", "0o", "0b")):
                continue
            value = float(token.string.replace("_", "").rstrip("jJ"))
            for name, bound in limits.items():
                if value == bound and patterns[name].search(token.line):
                    found.append(f"{path.relative_to(root)}:{token.start[0]}: {name}: {token.line.strip()}")
    return found


def test_no_bound_of_kb_limits_is_restated_in_python(db):
    limits = api_limits(db)
    assert {"query_chars", "top_k", "candidates", "embedding_norm_min", "embedding_norm_max", "kb_name_chars",
            "doc_key_chars", "answer_sources", "evidence_hits"} <= set(limits)  # fmt: skip
    assert restated(limits) == []


def test_the_scan_finds_a_restated_bound(db, tmp_path):
    """The scan above can fail: a module restating top_k and the query length is caught, line by line."""
    (tmp_path / "bad.py").write_text(
        "MAX_TOP_K = 100  # kb.check_search_input's\nQUERY_CHARS = 4_000\nWINDOW = 100\n", encoding="utf-8"
    )
    found = restated(api_limits(db), tmp_path)
    assert [f.split(": ")[0:2] for f in found] == [["bad.py:1", "top_k"], ["bad.py:2", "query_chars"]]


def test_limits_are_read_once_per_connection(db):
    first = api_limits(db)
    db.execute("create temporary table probe as select 1")  # the connection still works; no second read
    assert api_limits(db) is first and api_limit(db, "top_k") == int(first["top_k"])
