"""Markdown (CommonMark + GFM tables via markdown-it-py) with YAML/TOML front matter, VuePress/VitePress
containers and raw HTML blocks, into blocks."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

import yaml
from markdown_it import MarkdownIt

from pgkb.chunking.blocks import (
    _ANCHOR_RE,
    _CONTAINER_RE,
    _Block,
    _chunks_from_blocks,
)
from pgkb.chunking.images import markdown_image_refs
from pgkb.chunking.model import (
    ChunkedDocument,
    ChunkingOptions,
    ImageRef,
    _check_text,
    _jsonable,
)


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


def _heading(tokens, i: int, src: str) -> tuple[str, str]:
    """(title, anchor) of the heading opened by tokens[i] (``src``: its source lines)."""
    title = _inline_plain(tokens[i + 1]) if i + 1 < len(tokens) and tokens[i + 1].type == "inline" else ""
    anchor = ""
    m = _ANCHOR_RE.search(title)
    if m:
        anchor, title = m.group(1), title[: m.start()].strip()
    return title or src.lstrip("#").strip(), anchor


def _image_refs(text: str, heading_levels: int) -> list[ImageRef]:
    """The images the Markdown body references (see pgkb.chunking.images)."""
    if "![" not in text and "<img" not in text.lower():
        return []
    text = _rewrite_containers(text)
    tokens = _MD.parse(text)
    lines = text.split("\n")

    def title(i: int) -> str:
        lines_at = tokens[i].map
        assert lines_at is not None  # a heading's open token has its source lines
        start, end = lines_at
        return _heading(tokens, i, "\n".join(lines[start:end]).strip("\n"))[0]

    return markdown_image_refs(tokens, heading_levels, title)


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
            title, anchor = _heading(tokens, i, src)
            level = int(t.tag[1])
            heading = _Block("heading", title, level=level, anchor=anchor)
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
            nested = [(x, x.map) for x in inner if x.type in ("fence", "code_block", "table_open") and x.map]
            src = "\n".join(lines[start:end]).rstrip()
            if nested and len(src) > max_chars:
                # Too long to stay whole: cut it around its code blocks and tables, which are then
                # handled (kept whole, or split at lines / rows) like top-level ones.
                pos = start
                for x, (x_start, x_end) in nested:
                    part = "\n".join(lines[pos:x_start]).strip("\n").rstrip()
                    if part.strip():
                        blocks.append((pos, _Block("text", part)))
                    blocks.append((x_start, _special_block(x, lines)))
                    pos = x_end
                part = "\n".join(lines[pos:end]).strip("\n").rstrip()
                if part.strip():
                    blocks.append((pos, _Block("text", part)))
            else:
                offsets = [0]
                for ln in lines[start:end]:
                    offsets.append(offsets[-1] + len(ln) + 1)
                prot = [
                    (offsets[x_start - start], min(len(src), offsets[x_end - start] - 1))
                    for _, (x_start, x_end) in nested + [(x, x.map) for x in inner if x.type == "html_block" and x.map]
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
    images = _image_refs(body, opts.heading_levels)
    return ChunkedDocument(title, meta, _chunks_from_blocks(blocks, opts), "markdown", images)


def _stem(name: str) -> str:
    return Path(name).stem if name else ""
