"""The front door and its guides stay true: README.md links every guide under docs/, every relative link and
anchor in README.md and docs/*.md resolves, no page states a measured figure without a dated source, and no
page copies a test count by hand. Pure file reading: no database."""

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


# a line that states a documented value (a default, a limit, a goal), not a measurement: `default 30 s`,
# `at most 5 s`, `statement_timeout` 30s, `Goal: ≤ 1.5 ×`
DOCUMENTED = re.compile(
    r"default|\bat most\b|\blimits?\b|\bcapped\b|timeout|\bmaximum\b|\bthreshold\b|\bgoals?\b", re.I
)
HEADING = re.compile(r"(#{1,6})\s+\S")


def undated_figures(text: str) -> list[str]:
    """The lines holding a figure (a number with a unit) but neither a date nor a link to a docs/*.md page."""
    return [
        line.strip()
        for line in text.split("\n")
        if FIGURE.search(line) and not DATE.search(line) and not GUIDE_LINK.search(line)
    ]


def undated_measurements(text: str) -> list[str]:
    """The lines of a guide holding a measured figure without a dated source. A figure in inline code, or on a
    line that states a default or a limit, is documented, not measured. A measured figure is dated when its
    line, its paragraph or table (or the paragraph ending in ':' that introduces it), or one of the headings
    above it carries a date, or its line links to a docs/*.md page. A figure in a code block is an example."""
    found: list[str] = []
    dated_headings: dict[int, bool] = {}
    blocks: list[list[str]] = [[]]
    for line in prose(text).split("\n"):
        heading = HEADING.match(line)
        if heading or not line.strip():
            blocks.append([line] if heading else [])
            blocks.append([])
        else:
            blocks[-1].append(line)
    intro: list[str] = []  # the paragraph ending in ':' that introduces the next list or table
    for block in blocks:
        if not block:
            continue
        heading = HEADING.match(block[0])
        if heading:
            level = len(heading.group(1))
            dated_headings = {k: v for k, v in dated_headings.items() if k < level}
            dated_headings[level] = bool(DATE.search(block[0]))
            intro = []
            continue
        context, intro = intro, (block if block[-1].rstrip().endswith(":") else [])
        if any(dated_headings.values()) or any(DATE.search(line) for line in block + context):
            continue
        if any(DOCUMENTED.search(line) for line in context):
            continue
        bare_lines = re.sub(r"`[^`]*`", lambda code: "\n" * code.group(0).count("\n"), "\n".join(block)).split("\n")
        for line, bare in zip(block, bare_lines, strict=True):
            if FIGURE.search(bare) and not DOCUMENTED.search(line) and not GUIDE_LINK.search(line):
                found.append(line.strip())
    return found


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


def test_the_guide_rule_tells_measurements_from_documented_values():
    """In a guide, a measurement needs a date on its line, in its paragraph or in a heading above it; a
    default or a limit needs none."""
    measured = "hybrid p95 129 ms at 100k chunks, the BM25 leg 100 ms"
    documented = ["waits at most 5 s for a lock", "(default 30 s: how long replay waits)", "`statement_timeout = 30s`"]
    assert undated_measurements(measured) == [measured]
    assert undated_measurements("\n".join(documented)) == []
    assert undated_measurements(f"A run on a quiet machine (2026-12-01):\n{measured}") == []
    assert undated_measurements(f"## Run 8 (2026-11-30)\n\n### Latency\n\n{measured}") == []
    assert undated_measurements(f"## Run 8 (2026-11-30)\n\n## Design\n\n{measured}") == [measured]
    assert undated_measurements(f"```\n{measured}\n```") == []
    assert undated_measurements(f"Measured on 2026-11-30:\n\n- {measured}") == []
    assert undated_measurements(f"Measured on 2026-11-30.\n\n- {measured}") == [f"- {measured}"]


def test_anchors_are_githubs():
    heading = "Run 27: pgkb bench --vectors anchored, 100000 chunks, 200 queries (2026-12-03 17:55 UTC)"
    assert slug(heading) == "run-27-pgkb-bench---vectors-anchored-100000-chunks-200-queries-2026-12-03-1755-utc"
    assert slug("Settings in `kb.settings`") == "settings-in-kbsettings"
    assert slug("Today's figures") == "todays-figures"


def test_every_readme_figure_has_a_dated_source():
    """A figure in README.md (a number with a unit of time, size, ratio or percent) carries a date on its line,
    or a link to the guide that holds the measured, dated figure."""
    assert undated_figures(README.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_guide_measurement_has_a_dated_source(guide):
    """Each measured figure of a guide carries the date it was measured (on its line, its paragraph or a heading
    above it), so a reader can tell a figure of today from one of an older version."""
    assert undated_measurements(guide.read_text(encoding="utf-8")) == []


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
