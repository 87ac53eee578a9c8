"""The front door and its guides stay true: README.md links every guide under docs/, every relative link and
anchor in README.md and docs/*.md resolves, README.md states no figure without a dated source, and no page
copies a test count by hand. Pure file reading: no database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDES = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *GUIDES]

# a number with a unit of time, size, ratio or percent: `12 ms`, `2 min 33 s`, `1.2 GB`, `3.03×`, `2.5x`, `85%`
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)*\s?"
    r"(?:ms|µs|s|sec|min|minutes?|h|hours?|seconds?|days?|[KMGT]i?B|kB|%|×)(?![\w])"
    r"|(?<![\w.])\d+(?:\.\d+)?x(?![\w])"
)
DATE = re.compile(r"20\d\d-\d\d-\d\d")
GUIDE_LINK = re.compile(r"\]\((?:docs/)?[\w.-]+\.md(?:#[^)]*)?\)")
# a test count copied by hand: `930 passed`, `2 skipped`, `279 of 1197 tests`, `73 tests`
TEST_COUNT = re.compile(r"\b\d[\d,]*\s+(?:passed|skipped|xfailed|(?:of\s+\d[\d,]*\s+)?tests)\b")
LINK = re.compile(r"!?\[(?:[^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> str:
    """The text with fenced code blocks blanked out (their lines kept empty, so line numbers stay)."""
    lines, inside = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            inside = not inside
            lines.append("")
        else:
            lines.append("" if inside else line)
    return "\n".join(lines)


def undated_figures(text: str) -> list[str]:
    """The lines holding a figure (a number with a unit) but neither a date nor a link to a docs/*.md page."""
    return [
        line.strip()
        for line in text.split("\n")
        if FIGURE.search(line) and not DATE.search(line) and not GUIDE_LINK.search(line)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings, repeated ones numbered as GitHub does (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text(encoding="utf-8")).split("\n"):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def relative_links(path: Path) -> list[str]:
    """The links of a page's prose that point into the repository (not to the web, not mail)."""
    targets = LINK.findall(prose(path.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_rule_finds_the_old_readmes_figures():
    """The figure rule catches what issue 35 found: a time, a size, a test count without a date or a source."""
    old = [
        "| `make run` (then `make stop`) | 1.6 min (97 s), about 1.4 GB on disk | 294 MB (no torch) |",
        "same linters and mypy, then only the fast tier: 279 of 1197 tests,",
        "about 18 min: 13 min 43 s after the system packages (pytest: 930 passed, 2 skipped, 11 min 25 s)",
        "rebuild every knowledge base's posting lists: about 35 s at 100,000 chunks",
        "hybrid p95 / plain p95 = 3.03×, recall 85%",
    ]
    for line in old[:1] + old[2:]:
        assert undated_figures(line) == [line]
    assert TEST_COUNT.search(old[1]) and TEST_COUNT.search(old[2])
    fine = [
        "`make check`: 2 min 35 s on the shared 2-core VM at load 4–5 (2026-12-02)",
        "what it costs: [benchmarks](docs/benchmarks.md#todays-figures) has 12 ms",
        "ports 8765 and 8766, top_k 5, 384-d vectors, 100k chunks, 2 cores",
    ]
    assert undated_figures("\n".join(fine)) == []


def test_anchors_are_githubs():
    heading = "Run 27: pgkb bench --vectors anchored, 100000 chunks, 200 queries (2026-12-03 17:55 UTC)"
    assert slug(heading) == "run-27-pgkb-bench---vectors-anchored-100000-chunks-200-queries-2026-12-03-1755-utc"
    assert slug("Settings in `kb.settings`") == "settings-in-kbsettings"
    assert slug("Today's figures") == "todays-figures"


def test_every_readme_figure_has_a_dated_source():
    """A figure in README.md (a number with a unit of time, size, ratio or percent) carries a date on its line,
    or a link to the guide that holds the measured, dated figure."""
    assert undated_figures(README.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_test_count_is_copied_by_hand(page):
    """Test counts go stale with the next test: pytest prints them, no page repeats them."""
    lines = [line for line in page.read_text(encoding="utf-8").split("\n") if TEST_COUNT.search(line)]
    assert lines == []


def test_the_readme_links_every_guide():
    text = README.read_text(encoding="utf-8")
    linked = {m.split("#")[0] for m in relative_links(README)}
    assert len(text.split("\n")) <= 320, "README.md is the front door: at most about 300 lines"
    assert [g.name for g in GUIDES if f"docs/{g.name}" not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    """Every relative link names a file or folder that exists, and an anchor names a heading of its page."""
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        missing_anchor = bool(anchor) and dest.suffix == ".md" and dest.exists() and anchor not in anchors(dest)
        if not dest.exists() or missing_anchor:
            broken.append(target)
    assert broken == []
