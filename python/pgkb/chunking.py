"""Split documents (Markdown, plain text, HTML, PDF, DOCX) into chunks for retrieval.

Sizes are counted in **characters** (Python ``str`` length, i.e. Unicode code points), not tokens, so they
are tokenizer-independent and deterministic. Characters are not worth the same in every script: 800
characters of Chinese are roughly 500-1000 tokens (a CJK character is about 0.6-1.3 tokens, depending on the
tokenizer), 800 characters of English only about 150-250 tokens (about 4 characters per token). Keep
``max_chars`` (plus the breadcrumb) within the embedding model's input limit for CJK text.

Rules, in order:

* Markdown is parsed with a CommonMark parser (markdown-it-py, GFM tables enabled): a ``#`` line inside a
  fenced code block is code, never a heading.
* YAML (``---``) or TOML (``+++``) front matter becomes document metadata (its keys, JSON-safe), never chunk
  text; front matter that does not parse (or is not a mapping) is kept as the string ``front_matter_raw``
  (with ``front_matter_error``). Title: front matter ``title``, else the first h1, else the file name stem.
* Headings of level 1..``heading_levels`` (default 3) open sections; each chunk carries its heading path
  (``("部署指南", "配置 TLS")``; a trailing ``{#anchor}`` is removed from the text and the deepest anchor is
  put in metadata ``anchor``). Deeper headings stay in the text, kept with the block that follows them.
  A chunk never spans two sections. ``Chunk.content`` is the chunk's Markdown source without breadcrumb;
  ``Chunk.embedding_text(title)`` prefixes ``"title > h1 > h2"`` for the embedder.
* Within a section, blocks are packed greedily up to ``max_chars``. A block that is too long is split
  recursively: at blank lines, then line ends, then sentence ends (``。！？；`` and ``. ? !`` followed by
  a space; the punctuation stays with its sentence), then spaces, and only as a last resort hard every
  ``max_chars`` characters (in equal parts). A too-long list or quote is first cut around the code blocks and
  tables nested in it, which are then handled like top-level ones (never cut inside a line or row).
* A fenced code block or table longer than ``max_chars / 2`` becomes its own chunk (``chunk_type`` ``code`` /
  ``table``); a smaller one stays with the text around it (``text``). An oversized code block is split only
  between lines, each part re-fenced (a single line longer than the limit stays whole); an oversized table
  only between rows, each part repeating the header and delimiter rows. Parts get ``part``/``parts``.
* FAQ: each section below a heading that contains FAQ / Q&A / 常见问题 / 问答, and each ``Q: … A: …``
  entry (``**Q:**``, ``Q：``, ``问：`` … ``答：``), is its own entry: ``chunk_type`` ``faq``, metadata
  ``question``; entries are never packed together.
* VuePress/VitePress containers: ``::: tip 提示`` marker lines are removed, the title (``提示``) stays as text.
* Raw HTML blocks keep their text (tags and comments removed; entities stay as written); ``<script>`` and
  ``<style>`` elements are page code and are dropped.
* Fragments shorter than ``min_chars`` are merged into a neighbour of the same section (or FAQ entry) when
  the result fits. Apart from the markup named above (front matter, heading markers, container markers,
  HTML tags, scripts/styles), no text is dropped.
* ``overlap`` > 0 prefixes each text chunk that continues a split with up to ``overlap`` characters of the
  end of the previous chunk of the same section (starting at a sentence or word boundary when one exists);
  packing then uses ``max_chars - overlap`` so chunks still stay within ``max_chars``.
* Plain text is split by the same splitter (no sections); HTML uses ``<main>``, else ``<article>``, else
  ``<body>``, drops script/style/nav/…, and h1..h6/``<pre>``/``<table>`` become structure; PDF text is split
  per page (metadata ``page``, 1-based; chunks never span pages); DOCX (needs ``python-docx``) maps
  "Heading N"/"Title" paragraph styles to headings and tables to tables.

The output is deterministic: the same input and options give the same chunks.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

import yaml
from markdown_it import MarkdownIt

__all__ = [
    "Chunk",
    "breadcrumb",
    "ChunkedDocument",
    "ChunkingError",
    "ChunkingOptions",
    "chunk_bytes",
    "chunk_docx",
    "chunk_file",
    "chunk_html",
    "chunk_markdown",
    "chunk_pdf",
    "chunk_text",
]

CHUNK_TYPES = ("text", "code", "table", "faq")


class ChunkingError(ValueError):
    """The input cannot be chunked (unsupported type, invalid encoding, binary data, corrupt PDF...)."""


@dataclass(frozen=True)
class ChunkingOptions:
    max_chars: int = 800
    overlap: int = 0
    min_chars: int = 80
    heading_levels: int = 3
    # Embed the "title > h1 > h2" breadcrumb line before the content. Only `pgkb eval` turns it off (to
    # measure it); `pgkb ingest` and the worker always embed it.
    heading_prefix: bool = True

    def __post_init__(self) -> None:
        if self.max_chars < 20:
            raise ValueError("max_chars must be at least 20")
        if not 0 <= self.overlap <= self.max_chars // 2:
            raise ValueError("overlap must be between 0 and max_chars / 2")
        if not 0 <= self.min_chars < self.max_chars:
            raise ValueError("min_chars must be between 0 and max_chars - 1")
        if not 1 <= self.heading_levels <= 6:
            raise ValueError("heading_levels must be between 1 and 6")

    def fingerprint(self) -> str:
        """The options as they enter content hashes; the same text as before heading_prefix existed, so
        adding it did not make every stored document look changed."""
        base = (
            f"ChunkingOptions(max_chars={self.max_chars}, overlap={self.overlap}, min_chars={self.min_chars}, "
            f"heading_levels={self.heading_levels})"
        )
        return base if self.heading_prefix else base + "+no-heading-prefix"


def breadcrumb(title: str, heading_path: tuple[str, ...] | list[str]) -> str:
    """``"title > h1 > h2"``, skipping empty parts and a heading that repeats the part before it."""
    parts: list[str] = []
    for p in (title, *heading_path):
        if p and (not parts or parts[-1] != p):
            parts.append(p)
    return " > ".join(parts)


@dataclass(frozen=True)
class Chunk:
    content: str
    heading_path: tuple[str, ...] = ()
    chunk_type: str = "text"
    metadata: dict = field(default_factory=dict)

    def breadcrumb(self, title: str = "") -> str:
        return breadcrumb(title, self.heading_path)

    def embedding_text(self, title: str = "") -> str:
        """The text to embed: ``"title > h1 > h2"`` breadcrumb line, then the content."""
        crumb = self.breadcrumb(title)
        return f"{crumb}\n{self.content}" if crumb else self.content

    def to_json(self) -> dict:
        """The chunk as kb.replace_document expects it."""
        return {
            "content": self.content,
            "heading_path": list(self.heading_path),
            "chunk_type": self.chunk_type,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class ChunkedDocument:
    title: str
    metadata: dict
    chunks: list[Chunk]
    source_type: str

    def chunks_json(self) -> list[dict]:
        return [c.to_json() for c in self.chunks]

    def embedding_texts(self, heading_prefix: bool = True) -> list[str]:
        if not heading_prefix:
            return [c.content for c in self.chunks]
        return [c.embedding_text(self.title) for c in self.chunks]


# --------------------------------------------------------------------------------------------------
# Internal representation: a document is a list of blocks; headings cut it into sections.


@dataclass
class _Block:
    kind: str  # heading | text | code | table
    text: str
    level: int = 0  # heading level
    anchor: str = ""
    sticky: bool = False  # a deeper heading kept as text: goes with the next block
    protected: list[tuple[int, int]] = field(default_factory=list)  # char spans never cut (text blocks)
    head: list[str] = field(default_factory=list)  # code: opening fence; table: header + delimiter rows
    body: list[str] = field(default_factory=list)  # code lines / table rows
    tail: list[str] = field(default_factory=list)  # code: closing fence
    meta: dict = field(default_factory=dict)


@dataclass
class _Section:
    path: tuple[str, ...]
    blocks: list[_Block]
    meta: dict
    faq: bool = False


@dataclass
class _Atom:
    text: str
    kind: str = "text"
    standalone: bool = False
    glue: str = "\n\n"  # put before this atom when it follows another atom in the same chunk
    heading: bool = False
    meta: dict = field(default_factory=dict)  # only kept for standalone atoms (code/table parts)
    verbatim: bool = False  # a code block or table: leading indentation matters


_ANCHOR_RE = re.compile(r"\s*\{#([^}\s]*)\}\s*$")
_FAQ_HEADING_RE = re.compile(r"\bfaqs?\b|\bq\s*&\s*a\b|常见问题|常見問題|问答|問答|疑难解答", re.IGNORECASE)
_Q_LINE_RE = re.compile(r"^\s*(?:\*\*|__)?\s*(?:Q|问|問|Question)\s*\d*\s*(?:\*\*|__)?\s*[:：]", re.IGNORECASE)
_A_MARK_RE = re.compile(r"(?:^|\s|\*\*|__)(?:A|答|Answer)\s*\d*\s*(?:\*\*|__)?\s*[:：]", re.IGNORECASE)
_Q_STRIP_RE = re.compile(
    r"^\s*(?:\*\*|__)?\s*(?:Q|问|問|Question)\s*\d*\s*(?:\*\*|__)?\s*[:：]\s*(?:\*\*|__)?\s*", re.I
)
_CONTAINER_RE = re.compile(r"^(\s*):::+\s*(?:([A-Za-z][\w-]*)\b)?\s*(.*?)\s*:*\s*$")

# Split levels of the recursive splitter: cut *after* each match, so separators stay with the text before.
_SPLIT_LEVELS = (
    re.compile(r"\n(?:[ \t]*\n)+"),  # paragraphs
    re.compile(r"\n"),  # lines
    re.compile(r"[。！？；]+[”’」』）)\]\"']*[ \t]*|[.!?]+[”’\")\]']*(?:[ \t]+|$)"),  # sentences
    re.compile(r"[ \t]+"),  # words
)


def _normalize_newlines(text: str) -> str:
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _check_text(text: str, what: str) -> str:
    if "\x00" in text:
        raise ChunkingError(f"{what}: contains NUL bytes (binary data, not text)")
    return _normalize_newlines(text)


def _jsonable(value: Any) -> Any:
    """Front matter values as JSON-safe data (dates as ISO strings, other objects as strings)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    return str(value)


# --------------------------------------------------------------------------------------------------
# Splitting


def _split(text: str, budget: int, protected: list[tuple[int, int]] | None = None) -> list[str]:
    """Pieces of ``text``, each at most ``budget`` characters where possible; ``"".join(result) == text``."""
    prot = protected or []
    out: list[str] = []
    _split_range(text, 0, len(text), budget, 0, prot, out)
    return [p for p in out if p]


def _inside(pos: int, prot: list[tuple[int, int]]) -> tuple[int, int] | None:
    for s, e in prot:
        if s < pos < e:
            return s, e
    return None


def _split_range(text: str, start: int, end: int, budget: int, level: int, prot, out: list[str]) -> None:
    if end - start <= budget:
        out.append(text[start:end])
        return
    if level >= len(_SPLIT_LEVELS):  # hard split, never inside a protected span
        pos = start
        size = -(-(end - start) // -(-(end - start) // budget))  # equal parts, no tiny tail
        while end - pos > budget:
            cut = pos + size
            span = _inside(cut, prot)
            if span:
                cut = span[0] if span[0] > pos else span[1]
            if cut >= end:
                break
            out.append(text[pos:cut])
            pos = cut
        out.append(text[pos:end])
        return
    cuts = [
        m.end()
        for m in _SPLIT_LEVELS[level].finditer(text, start, end)
        if start < m.end() < end and not _inside(m.end(), prot)
    ]
    if not cuts:
        _split_range(text, start, end, budget, level + 1, prot, out)
        return
    bounds = [start, *cuts, end]
    for a, b in zip(bounds, bounds[1:], strict=False):
        _split_range(text, a, b, budget, level + 1, prot, out)


def _render(atoms: list[_Atom]) -> str:
    out = ""
    for i, a in enumerate(atoms):
        if i == 0:
            out = a.text
        elif a.glue:
            out = out.rstrip() + a.glue + a.text.lstrip("\n")
        else:
            out += a.text
    # keep the indentation of a leading code block or table; trim it off text
    return out.strip("\n").rstrip() if atoms and atoms[0].verbatim else out.strip()


def _block_atoms(block: _Block, opts: ChunkingOptions, budget: int) -> list[_Atom]:
    small = opts.max_chars // 2
    if block.kind in ("code", "table"):
        full = block.text.strip("\n")
        if len(full) <= small:
            return [_Atom(full, "text", verbatim=True)]
        if len(full) <= budget:
            return [_Atom(full, block.kind, standalone=True, meta=dict(block.meta), verbatim=True)]
        head, tail = block.head, block.tail
        overhead = sum(len(x) + 1 for x in head + tail)
        groups: list[list[str]] = []
        cur: list[str] = []
        cur_len = 0
        for line in block.body:
            if cur and cur_len + len(line) + 1 + overhead > budget:
                groups.append(cur)
                cur, cur_len = [], 0
            cur.append(line)
            cur_len += len(line) + 1
        if cur:
            groups.append(cur)
        return [
            _Atom(
                "\n".join(head + g + tail).strip("\n"),
                block.kind,
                standalone=True,
                meta={**block.meta, "part": i + 1, "parts": len(groups)},
                verbatim=True,
            )
            for i, g in enumerate(groups)
        ]
    if block.sticky:
        return [_Atom(block.text.strip(), heading=True)]
    pieces = _split(block.text, budget, block.protected)
    atoms = [_Atom(p, glue="\n\n" if i == 0 else "") for i, p in enumerate(pieces)]
    return [a for a in atoms if a.text.strip()]


def _pack(atoms: list[_Atom], budget: int, min_chars: int) -> list[list[_Atom]]:
    chunks: list[list[_Atom]] = []
    cur: list[_Atom] = []
    for a in atoms:
        if a.standalone:
            carry: list[_Atom] = []
            if cur and cur[-1].heading and len(_render([cur[-1], a])) <= budget:
                carry = [cur.pop()]
            if cur:
                chunks.append(cur)
            chunks.append([*carry, a])
            cur = []
            continue
        if cur and len(_render([*cur, a])) > budget:
            if cur[-1].heading and len(cur) > 1:
                h = cur.pop()
                chunks.append(cur)
                cur = [h]
                if len(_render([*cur, a])) > budget:
                    chunks.append(cur)
                    cur = []
            else:
                chunks.append(cur)
                cur = []
        cur.append(a)
    if cur:
        chunks.append(cur)
    # Rebalance: a short last part of a split borrows atoms from the part before it.
    for i in range(1, len(chunks)):
        prev, last = chunks[i - 1], chunks[i]
        if any(a.standalone for a in prev + last):
            continue
        while len(_render(last)) < min_chars and len(prev) > 1 and len(_render([prev[-1], *last])) <= budget:
            last.insert(0, prev.pop())
    # Merge fragments shorter than min_chars into a neighbour when the result fits.
    changed = True
    while changed and len(chunks) > 1:
        changed = False
        for i, c in enumerate(chunks):
            text = _render(c)
            if len(text) >= min_chars or any(a.standalone for a in c):
                continue
            options = [i - 1, i + 1]
            if text.endswith((":", "：")):
                options.reverse()
            for j in options:
                if 0 <= j < len(chunks):
                    merged = chunks[j] + c if j < i else c + chunks[j]
                    if len(_render(merged)) <= budget:
                        chunks[min(i, j)] = merged
                        del chunks[max(i, j)]
                        changed = True
                        break
            if changed:
                break
    return chunks


def _tail_for_overlap(text: str, n: int) -> str:
    if n <= 0 or not text:
        return ""
    tail = text[-n:]
    if len(tail) < len(text):
        for rx in (_SPLIT_LEVELS[2], _SPLIT_LEVELS[3], _SPLIT_LEVELS[1]):
            m = rx.search(tail)
            if m and m.end() < len(tail):
                tail = tail[m.end() :]
                break
    return tail.strip()


def _section_chunks(sec: _Section, opts: ChunkingOptions) -> list[Chunk]:
    budget = opts.max_chars - opts.overlap
    groups: list[tuple[list[_Block], dict, bool]] = []  # blocks, extra metadata, is_faq
    if sec.faq:
        q = sec.path[-1] if sec.path else ""
        groups.append((sec.blocks, {"question": q} if q else {}, True))
    else:
        groups.extend(_faq_entries(sec.blocks))
    out: list[Chunk] = []
    for blocks, extra, is_faq in groups:
        atoms = [a for b in blocks for a in _block_atoms(b, opts, budget)]
        packed = _pack(atoms, budget, opts.min_chars)
        prev_text = None
        for group in packed:
            content = _render(group)
            if not content:
                continue
            standalone = next((a for a in group if a.standalone), None)
            kind = standalone.kind if standalone else ("faq" if is_faq else "text")
            meta: dict = {**sec.meta, **extra, **(standalone.meta if standalone else {})}
            if opts.overlap and prev_text is not None and kind in ("text", "faq"):
                tail = _tail_for_overlap(prev_text, opts.overlap)
                if tail:
                    content = f"{tail}\n{content}"
                    meta["overlap_chars"] = len(tail) + 1
            prev_text = content if kind in ("text", "faq") else None
            out.append(Chunk(content, sec.path, kind, meta))
    return out


def _faq_entries(blocks: list[_Block]) -> list[tuple[list[_Block], dict, bool]]:
    """Split a section's blocks into (prelude, Q/A entries...) when it contains ``Q: … A: …`` entries."""
    pieces: list[_Block] = []
    found = False
    for b in blocks:
        if (
            b.kind == "text"
            and not b.sticky
            and not b.protected
            and any(_Q_LINE_RE.match(x) for x in b.text.split("\n"))
        ):
            found = True
            cur: list[str] = []
            for line in b.text.split("\n"):
                if _Q_LINE_RE.match(line) and any(x.strip() for x in cur):
                    pieces.append(dataclasses.replace(b, text="\n".join(cur)))
                    cur = []
                cur.append(line)
            pieces.append(dataclasses.replace(b, text="\n".join(cur)))
        else:
            pieces.append(b)
    if not found:
        return [(blocks, {}, False)]
    groups: list[tuple[list[_Block], dict, bool]] = []
    cur_blocks: list[_Block] = []
    cur_q: str | None = None

    def close() -> None:
        if not cur_blocks:
            return
        text = "\n".join(b.text for b in cur_blocks)
        if cur_q is not None and _A_MARK_RE.search(text):
            groups.append((list(cur_blocks), {"question": cur_q}, True))
        elif groups and not groups[-1][2]:
            groups[-1][0].extend(cur_blocks)
        else:
            groups.append((list(cur_blocks), {}, False))

    for b in pieces:
        if b.kind == "text" and _Q_LINE_RE.match(b.text):
            close()
            cur_blocks = [b]
            first = b.text.split("\n", 1)[0]
            q = _Q_STRIP_RE.sub("", first)
            q = re.split(r"\s*(?:\*\*|__)?\s*(?:A|答|Answer)\s*(?:\*\*|__)?\s*[:：]", q, maxsplit=1)[0]
            cur_q = q.strip("*_ \t")
        else:
            cur_blocks.append(b)
    close()
    return groups


def _sections(blocks: list[_Block], opts: ChunkingOptions, base_meta: dict | None = None) -> list[_Section]:
    sections: list[_Section] = [_Section((), [], dict(base_meta or {}))]
    stack: list[tuple[int, str, str]] = []  # level, text, anchor
    for b in blocks:
        if b.kind == "heading" and b.level <= opts.heading_levels:
            while stack and stack[-1][0] >= b.level:
                stack.pop()
            stack.append((b.level, b.text, b.anchor))
            path = tuple(x[1] for x in stack)
            meta = dict(base_meta or {})
            if b.anchor:
                meta["anchor"] = b.anchor
            faq = any(_FAQ_HEADING_RE.search(x[1]) for x in stack[:-1])
            sections.append(_Section(path, [], meta, faq))
        elif b.kind == "heading":
            sections[-1].blocks.append(dataclasses.replace(b, kind="text", sticky=True))
        else:
            sections[-1].blocks.append(b)
    # A heading with neither text nor sub-sections would vanish: keep its text as content.
    for i, s in enumerate(sections):
        has_child = i + 1 < len(sections) and sections[i + 1].path[: len(s.path)] == s.path and s.path
        if s.path and not s.blocks and not has_child:
            s.blocks.append(_Block("text", s.path[-1]))
    return sections


def _chunks_from_blocks(blocks: list[_Block], opts: ChunkingOptions, base_meta: dict | None = None) -> list[Chunk]:
    chunks: list[Chunk] = []
    for sec in _sections(blocks, opts, base_meta):
        if any(b.text.strip() for b in sec.blocks):
            chunks.extend(_section_chunks(sec, opts))
    return chunks


# --------------------------------------------------------------------------------------------------
# Markdown


def _front_matter(text: str) -> tuple[dict, str]:
    """(document metadata, text without front matter)."""
    m = re.match(r"(---|\+\+\+)[ \t]*\n", text)
    if not m:
        return {}, text
    fence = m.group(1)
    close = re.compile(r"^(?:---|\.\.\.)[ \t]*$" if fence == "---" else r"^\+\+\+[ \t]*$", re.MULTILINE)
    end = close.search(text, m.end() - 1)
    if not end:
        return {}, text
    raw = text[m.end() : end.start()]
    rest = text[end.end() :].lstrip("\n")
    fmt = "yaml" if fence == "---" else "toml"
    try:
        if fmt == "yaml":
            data = yaml.safe_load(raw) if raw.strip() else {}
        else:
            if tomllib is None:  # pragma: no cover
                raise ValueError("no TOML parser (tomllib/tomli) available")
            data = tomllib.loads(raw)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValueError(f"front matter is a {type(data).__name__}, not a mapping")
        data = _jsonable(data)
        json.dumps(data)
        return data, rest
    except Exception as e:  # malformed front matter never fails the document
        return {
            "front_matter_raw": raw,
            "front_matter_error": f"{fmt}: {str(e).splitlines()[0] if str(e) else e}",
        }, rest


_MD = MarkdownIt("commonmark", {"html": True}).enable("table")


def _code_lines(tokens) -> set[int]:
    lines: set[int] = set()
    for t in tokens:
        if t.type in ("fence", "code_block") and t.map:
            lines.update(range(t.map[0], t.map[1]))
    return lines


def _rewrite_containers(text: str) -> str:
    """Replace ``::: kind title`` / ``:::`` marker lines (outside code) with the title / a blank line."""
    if ":::" not in text:
        return text
    lines = text.split("\n")
    code = _code_lines(_MD.parse(text))
    changed = False
    for i, line in enumerate(lines):
        if i in code or not line.lstrip().startswith(":::"):
            continue
        m = _CONTAINER_RE.match(line)
        if m:
            lines[i] = m.group(1) + m.group(3) if m.group(3) else ""
            changed = True
    return "\n".join(lines) if changed else text


def _inline_plain(token) -> str:
    parts: list[str] = []
    for c in token.children or []:
        if c.type in ("text", "code_inline"):
            parts.append(c.content)
        elif c.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif c.type == "image":
            parts.append(c.content)
    return re.sub(r"\s+", " ", "".join(parts)).strip()


class _TagStripper(HTMLParser):
    """Text of a raw HTML block in Markdown; entities stay encoded (the content is Markdown source)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        elif tag in ("br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)

    def handle_entityref(self, name):
        self.handle_data(f"&{name};")

    def handle_charref(self, name):
        self.handle_data(f"&#{name};")


def _strip_tags(fragment: str) -> str:
    p = _TagStripper()
    p.feed(fragment)
    p.close()
    text = "".join(p.parts)
    lines = [re.sub(r"[ \t]+", " ", x).strip() for x in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _special_block(t, lines: list[str]) -> _Block:
    """A code block or table from its token; its source lines may be indented or quoted (nested)."""
    start, end = t.map
    if t.type == "fence":
        body = lines[start + 1 : end]
        tail: list[str] = []
        closing = t.markup[0] * len(t.markup)
        last = body[-1].strip().lstrip(">").strip() if body else ""
        if last.startswith(closing) and not last.strip(closing[0]):
            tail = [body.pop()]
        meta = {"language": t.info.split()[0]} if t.info.strip() else {}
        full = "\n".join([lines[start], *body, *tail])
        return _Block("code", full, head=[lines[start]], body=body, tail=tail or [closing], meta=meta)
    rows = lines[start:end]
    while rows and not rows[-1].strip():
        rows.pop()
    if t.type == "code_block":
        return _Block("code", "\n".join(rows), body=rows)
    return _Block("table", "\n".join(rows), head=rows[:2], body=rows[2:])


def _markdown_blocks(text: str, max_chars: int) -> list[_Block]:
    text = _rewrite_containers(text)
    tokens = _MD.parse(text)
    lines = text.split("\n")
    blocks: list[tuple[int, _Block]] = []
    covered: set[int] = set()
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.level != 0 or t.nesting == -1 or not t.map:
            i += 1
            continue
        start, end = t.map
        j = i
        if t.nesting == 1:  # find the matching close token
            depth = 0
            while j < len(tokens):
                depth += tokens[j].nesting
                if depth == 0:
                    break
                j += 1
        inner = tokens[i + 1 : j]
        covered.update(range(start, end))
        src = "\n".join(lines[start:end]).strip("\n")
        if t.type == "heading_open":
            title = _inline_plain(inner[0]) if inner else ""
            anchor = ""
            m = _ANCHOR_RE.search(title)
            if m:
                anchor, title = m.group(1), title[: m.start()].strip()
            level = int(t.tag[1])
            heading = _Block("heading", title or src.lstrip("#").strip(), level=level, anchor=anchor)
            heading.meta = {"source": src}  # kept as text for headings deeper than heading_levels
            blocks.append((start, heading))
        elif t.type in ("fence", "code_block", "table_open"):
            blocks.append((start, _special_block(t, lines)))
        elif t.type == "html_block":
            plain = _strip_tags(src)
            if plain:
                blocks.append((start, _Block("text", plain)))
        elif t.type == "hr":
            pass
        else:  # paragraph, list, blockquote
            nested = [x for x in inner if x.type in ("fence", "code_block", "table_open") and x.map]
            src = "\n".join(lines[start:end]).rstrip()
            if nested and len(src) > max_chars:
                # Too long to stay whole: cut it around its code blocks and tables, which are then
                # handled (kept whole, or split at lines / rows) like top-level ones.
                pos = start
                for x in nested:
                    part = "\n".join(lines[pos : x.map[0]]).strip("\n").rstrip()
                    if part.strip():
                        blocks.append((pos, _Block("text", part)))
                    blocks.append((x.map[0], _special_block(x, lines)))
                    pos = x.map[1]
                part = "\n".join(lines[pos:end]).strip("\n").rstrip()
                if part.strip():
                    blocks.append((pos, _Block("text", part)))
            else:
                offsets = [0]
                for ln in lines[start:end]:
                    offsets.append(offsets[-1] + len(ln) + 1)
                prot = [
                    (offsets[x.map[0] - start], min(len(src), offsets[x.map[1] - start] - 1))
                    for x in nested + [x for x in inner if x.type == "html_block" and x.map]
                ]
                blocks.append((start, _Block("text", src, protected=prot)))
        i = j + 1
    # Lines no token covers (link reference definitions...) are kept as text.
    gap: list[int] = []
    for n, line in enumerate(lines + [""]):
        if n < len(lines) and n not in covered and line.strip():
            gap.append(n)
            continue
        if gap:
            blocks.append((gap[0], _Block("text", "\n".join(lines[gap[0] : gap[-1] + 1]))))
            gap = []
    blocks.sort(key=lambda x: x[0])
    return [b for _, b in blocks]


def chunk_markdown(text: str, name: str = "", options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Chunk a Markdown document (CommonMark + GFM tables, front matter, VitePress containers)."""
    opts = options or ChunkingOptions()
    text = _check_text(text, name or "markdown")
    meta, body = _front_matter(text)
    blocks = _markdown_blocks(body, opts.max_chars)
    # Deeper headings kept as text keep their Markdown source ("#### foo").
    for b in blocks:
        if b.kind == "heading":
            if b.level > opts.heading_levels:
                b.text = b.meta.get("source", b.text)
            b.meta = {}
    title = meta.get("title") if isinstance(meta.get("title"), str) and meta.get("title", "").strip() else ""
    if not title:
        title = next((b.text for b in blocks if b.kind == "heading" and b.level == 1 and b.text), "")
    title = title.strip() or _stem(name)
    return ChunkedDocument(title, meta, _chunks_from_blocks(blocks, opts), "markdown")


def _stem(name: str) -> str:
    return Path(name).stem if name else ""


# --------------------------------------------------------------------------------------------------
# Plain text


def chunk_text(text: str, name: str = "", options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Chunk plain text: paragraphs (blank lines), then lines, sentences, words."""
    opts = options or ChunkingOptions()
    text = _check_text(text, name or "text")
    blocks = [_Block("text", text)] if text.strip() else []
    return ChunkedDocument(_stem(name), {}, _chunks_from_blocks(blocks, opts), "text")


# --------------------------------------------------------------------------------------------------
# HTML

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_DROP = {"script", "style", "nav", "noscript", "template", "svg", "head", "iframe", "object", "canvas", "button"}
_BLOCK = {
    "p", "div", "section", "article", "main", "header", "footer", "aside", "blockquote", "ul", "ol", "dl", "dt", "dd",
    "figure", "figcaption", "details", "summary", "address", "form", "fieldset", "body", "html", "hr",
}  # fmt: skip
_AUTOCLOSE = {"p", "li", "dt", "dd", "tr", "td", "th", "option"}
_SCOPE = {"ul", "ol", "dl", "table", "tbody", "thead", "tfoot", "body", "html", "div", "section", "article", "main"}


class _Node:
    __slots__ = ("tag", "attrs", "children")

    def __init__(self, tag: str, attrs: dict) -> None:
        self.tag = tag
        self.attrs = attrs
        self.children: list[_Node | str] = []


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = _Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = _Node(tag, {k: v or "" for k, v in attrs})
        if tag == "body":  # an unclosed <head> must not swallow the page
            for k, n in enumerate(self.stack):
                if n.tag == "head":
                    del self.stack[k:]
                    break
        if tag in _AUTOCLOSE or tag in _BLOCK or tag in ("table", "pre", "h1", "h2", "h3", "h4", "h5", "h6"):
            for k in range(len(self.stack) - 1, 0, -1):
                t = self.stack[k].tag
                if t == tag and tag in _AUTOCLOSE or (t == "p" and tag != "p" and k == len(self.stack) - 1):
                    del self.stack[k:]
                    break
                if t in _SCOPE:
                    break
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in _VOID and self.stack[-1].tag == tag:
            self.stack.pop()

    def handle_endtag(self, tag):
        for k in range(len(self.stack) - 1, 0, -1):
            if self.stack[k].tag == tag:
                del self.stack[k:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def _find(node: _Node, tag: str) -> _Node | None:
    for c in node.children:
        if isinstance(c, _Node):
            if c.tag == tag:
                return c
            if c.tag not in _DROP or tag == "title":
                found = _find(c, tag)
                if found:
                    return found
    return None


def _node_text(node: _Node, keep_space: bool = False) -> str:
    parts: list[str] = []

    def walk(n: _Node) -> None:
        for c in n.children:
            if isinstance(c, str):
                parts.append(c)
            elif c.tag == "br":
                parts.append("\n")
            elif c.tag == "img":
                parts.append(c.attrs.get("alt", ""))
            elif c.tag not in _DROP:
                walk(c)

    walk(node)
    text = "".join(parts)
    return text if keep_space else re.sub(r"\s+", " ", text).strip()


class _HtmlWalker:
    def __init__(self) -> None:
        self.blocks: list[_Block] = []
        self.buf: list[str] = []

    def flush(self) -> None:
        text = "".join(self.buf)
        self.buf = []
        lines = [re.sub(r"\s+", " ", x).strip() for x in text.split("\x00")]
        text = "\n".join(x for x in lines if x)
        if text and text != "-":
            self.blocks.append(_Block("text", text))

    def walk(self, node: _Node, list_depth: int = 0) -> None:
        for c in node.children:
            if isinstance(c, str):
                self.buf.append(c)
                continue
            tag = c.tag
            if tag in _DROP:
                continue
            if re.fullmatch(r"h[1-6]", tag):
                self.flush()
                text = _node_text(c)
                if text:
                    self.blocks.append(_Block("heading", text, level=int(tag[1]), anchor=c.attrs.get("id", "")))
            elif tag == "pre":
                self.flush()
                self.blocks.append(self._code(c))
            elif tag == "table":
                self.flush()
                b = self._table(c)
                if b:
                    self.blocks.append(b)
            elif tag == "br":
                self.buf.append("\x00")
            elif tag == "img":
                if c.attrs.get("alt"):
                    self.buf.append(f" {c.attrs['alt']} ")
            elif tag == "li":
                self.flush()
                self.buf.append("  " * max(0, list_depth - 1) + "- ")
                self.walk(c, list_depth)
                self.flush()
            elif tag in ("ul", "ol"):
                self.flush()
                self.walk(c, list_depth + 1)
                self.flush()
            elif tag in _BLOCK:
                self.flush()
                self.walk(c, list_depth)
                self.flush()
            else:
                self.walk(c, list_depth)

    @staticmethod
    def _code(pre: _Node) -> _Block:
        code = pre
        lang = ""
        for n in [pre, *[c for c in pre.children if isinstance(c, _Node) and c.tag == "code"]]:
            m = re.search(r"(?:language|lang)-([\w+#-]+)", n.attrs.get("class", ""))
            if m:
                lang = m.group(1)
            if n is not pre:
                code = n
        body = _node_text(code, keep_space=True).strip("\n").split("\n")
        fence = "```"
        while any(line.lstrip().startswith(fence) for line in body):
            fence += "`"
        head = [fence + lang]
        return _Block(
            "code",
            "\n".join([*head, *body, fence]),
            head=head,
            body=body,
            tail=[fence],
            meta={"language": lang} if lang else {},
        )

    @staticmethod
    def _table(table: _Node) -> _Block | None:
        rows: list[list[str]] = []

        def walk(n: _Node) -> None:
            for c in n.children:
                if isinstance(c, _Node) and c.tag not in _DROP and c.tag != "table":
                    if c.tag == "tr":
                        cells = [
                            _node_text(x).replace("|", "\\|")
                            for x in c.children
                            if isinstance(x, _Node) and x.tag in ("td", "th")
                        ]
                        if any(cells):
                            rows.append(cells)
                    else:
                        walk(c)

        walk(table)
        if not rows:
            return None
        width = max(len(r) for r in rows)
        lines = ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
        head = [lines[0], "| " + " | ".join(["---"] * width) + " |"]
        return _Block("table", "\n".join(head + lines[1:]), head=head, body=lines[1:])


def chunk_html(text: str, name: str = "", options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Chunk an HTML page: main content (``<main>``, else ``<article>``, else ``<body>``), h1..h6 as structure."""
    opts = options or ChunkingOptions()
    text = _check_text(text, name or "html")
    builder = _TreeBuilder()
    builder.feed(text)
    builder.close()
    root = builder.root
    main = _find(root, "main") or _find(root, "article") or _find(root, "body") or root
    walker = _HtmlWalker()
    walker.walk(main)
    walker.flush()
    blocks = walker.blocks
    for b in blocks:
        if b.kind == "heading" and b.level > opts.heading_levels:
            b.text = "#" * b.level + " " + b.text
    title_node = _find(root, "title")
    title = _node_text(title_node) if title_node else ""
    if not title:
        title = next((b.text for b in blocks if b.kind == "heading" and b.level == 1), "")
    meta = {}
    desc = _find_meta(root, "description")
    if desc:
        meta["description"] = desc
    return ChunkedDocument(title or _stem(name), meta, _chunks_from_blocks(blocks, opts), "html")


def _find_meta(node: _Node, name: str) -> str:
    for c in node.children:
        if isinstance(c, _Node):
            if c.tag == "meta" and c.attrs.get("name", "").lower() == name:
                return c.attrs.get("content", "").strip()
            found = _find_meta(c, name)
            if found:
                return found
    return ""


# --------------------------------------------------------------------------------------------------
# PDF


def chunk_pdf(data: bytes, name: str = "", options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Chunk a PDF's text layer, page by page (metadata ``page``, 1-based). Scanned pages give no text."""
    opts = options or ChunkingOptions()
    if b"%PDF-" not in data[:1024]:
        raise ChunkingError(f"{name or 'pdf'}: not a PDF file (no %PDF- header)")
    try:
        from pypdf import PdfReader

        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ChunkingError(f"{name or 'pdf'}: the PDF is encrypted")
        pages = [p.extract_text() or "" for p in reader.pages]
        info = reader.metadata
        pdf_title = str(info.title).strip() if info and info.title else ""
    except ChunkingError:
        raise
    except Exception as e:
        raise ChunkingError(f"{name or 'pdf'}: cannot read PDF ({type(e).__name__}: {e})") from e
    chunks: list[Chunk] = []
    for n, page_text in enumerate(pages, start=1):
        page_text = _normalize_newlines(page_text.replace("\x00", ""))
        if page_text.strip():
            chunks.extend(_chunks_from_blocks([_Block("text", page_text)], opts, {"page": n}))
    meta: dict = {"pages": len(pages)}
    return ChunkedDocument(pdf_title or _stem(name), meta, chunks, "pdf")


# --------------------------------------------------------------------------------------------------
# DOCX (optional: python-docx)


def chunk_docx(data: bytes, name: str = "", options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Chunk a .docx file: "Heading N"/"Title" styles are headings, tables are tables (needs python-docx)."""
    opts = options or ChunkingOptions()
    try:
        import docx
        from docx.table import Table
        from docx.text.paragraph import Paragraph
    except ImportError as e:
        raise ChunkingError("reading .docx needs the python-docx package (pip install python-docx)") from e
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as e:
        raise ChunkingError(f"{name or 'docx'}: cannot read DOCX ({type(e).__name__}: {e})") from e
    blocks: list[_Block] = []
    para: list[str] = []
    title = (document.core_properties.title or "").strip()

    def flush() -> None:
        if para:
            blocks.append(_Block("text", "\n".join(para)))
            para.clear()

    body = document.element.body
    for el in body.iterchildren():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "p":
            p = Paragraph(el, document)
            text = p.text.strip()
            style = (p.style.name if p.style is not None else "") or ""
            m = re.match(r"Heading (\d)", style)
            if text and (m or style == "Title"):
                flush()
                level = int(m.group(1)) if m else 1
                if style == "Title" and not title:
                    title = text
                blocks.append(_Block("heading", text, level=level))
                if level > opts.heading_levels:
                    blocks[-1].text = "#" * level + " " + text
            elif text:
                para.append(text)
            else:
                flush()
        elif tag == "tbl":
            flush()
            rows = [
                [c.text.strip().replace("|", "\\|").replace("\n", " ") for c in r.cells]
                for r in Table(el, document).rows
            ]
            if rows:
                width = max(len(r) for r in rows)
                lines = ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
                head = [lines[0], "| " + " | ".join(["---"] * width) + " |"]
                blocks.append(_Block("table", "\n".join(head + lines[1:]), head=head, body=lines[1:]))
    flush()
    if not title:
        title = next((b.text for b in blocks if b.kind == "heading" and b.level == 1), "")
    return ChunkedDocument(title or _stem(name), {}, _chunks_from_blocks(blocks, opts), "docx")


# --------------------------------------------------------------------------------------------------
# Dispatch

_MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd", ".mdx"}
_TEXT_SUFFIXES = {".txt", ".text", ".rst", ".log", ""}
_HTML_SUFFIXES = {".html", ".htm", ".xhtml"}


def _decode(data: bytes, name: str) -> str:
    if b"\x00" in data:
        raise ChunkingError(f"{name}: contains NUL bytes (binary data, not text)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ChunkingError(f"{name}: not valid UTF-8 (byte offset {e.start}: {e.reason})") from e


def chunk_bytes(data: bytes, name: str, options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Chunk a file's bytes; the type comes from ``name``'s suffix (.md, .txt, .html, .pdf, .docx)."""
    suffix = Path(name).suffix.lower()
    if suffix == ".pdf":
        return chunk_pdf(data, name, options)
    if suffix == ".docx":
        return chunk_docx(data, name, options)
    if suffix in _MARKDOWN_SUFFIXES:
        return chunk_markdown(_decode(data, name), name, options)
    if suffix in _HTML_SUFFIXES:
        return chunk_html(_decode(data, name), name, options)
    if suffix in _TEXT_SUFFIXES:
        return chunk_text(_decode(data, name), name, options)
    raise ChunkingError(f"{name}: unsupported file type {suffix!r} (supported: .md, .txt, .html, .pdf, .docx)")


def chunk_file(path: Path | str, options: ChunkingOptions | None = None) -> ChunkedDocument:
    """Read and chunk a file, by suffix. Raises ChunkingError for unsupported or invalid input."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ChunkingError(f"{path}: cannot read ({e.strerror or e})") from e
    return chunk_bytes(data, path.name, options)
