"""Finding the images of a document: ``![alt](src "title")`` and ``<img src alt title>`` in Markdown (with the
heading path around them and a caption: the title attribute, a ``<figcaption>``, the short text of the
image's paragraph or a "图 1 …" / "Figure 1: …" paragraph right after it), and "Figure N" caption lines of
a PDF page. Only references are collected here; reading, checking and captioning the images is
pgkb.images' job at ingest."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from html.parser import HTMLParser

from pgkb.chunking.model import ImageRef

# "Figure 3: …", "Fig. 2 …", "Chart 1", "Table 2", "图 1 …", "图1-2：…", "表 3"
FIGURE_CAPTION_RE = re.compile(
    r"^\s*(?:figure|fig\.?|chart|table|image|图表|图|圖|表)\s*[0-9０-９]+(?:[.\-－][0-9]+)*(?:\s|[.:：、．\-—]|$)",
    re.IGNORECASE,
)
_MAX_PARAGRAPH_CAPTION = 300  # longer paragraph text around an image is body text, not its caption


class _ImgParser(HTMLParser):
    """``<img>`` attributes and ``<figcaption>`` text of an HTML fragment."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.images: list[dict[str, str]] = []
        self.figcaption: list[str] = []
        self._in_caption = 0

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append({k: (v or "") for k, v in attrs})
        elif tag == "figcaption":
            self._in_caption += 1

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        if tag == "figcaption":
            self._in_caption = max(0, self._in_caption - 1)

    def handle_data(self, data):
        if self._in_caption:
            self.figcaption.append(data)


def html_images(fragment: str) -> list[tuple[str, str, str]]:
    """(src, alt, caption) of every ``<img>`` with a src in an HTML fragment; caption: its title attribute,
    else the fragment's ``<figcaption>`` text."""
    if "<img" not in fragment.lower():
        return []
    parser = _ImgParser()
    try:
        parser.feed(fragment)
        parser.close()
    except Exception:  # html.parser copes with nearly anything; a fragment it cannot read has no images
        return []
    figcaption = _squash(" ".join(parser.figcaption))
    return [
        (a["src"].strip(), _squash(a.get("alt", "")), _squash(a.get("title", "")) or figcaption)
        for a in parser.images
        if a.get("src", "").strip()
    ]


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def markdown_image_refs(tokens, heading_levels: int, heading_title: Callable[[int], str]) -> list[ImageRef]:
    """The images of a parsed Markdown document (markdown-it tokens), in document order, each with the
    heading path of the section it is in (headings of level <= heading_levels; ``heading_title(i)`` is the
    title of the heading opened by tokens[i], as the chunker shows it)."""
    refs: list[ImageRef] = []
    stack: list[tuple[int, str]] = []
    waiting: list[int] = []  # refs of an image-only paragraph: the next paragraph may be their caption
    for i, t in enumerate(tokens):
        if t.type == "heading_open" and t.level == 0:
            waiting = []
            level = int(t.tag[1])
            if level <= heading_levels:
                while stack and stack[-1][0] >= level:
                    stack.pop()
                stack.append((level, heading_title(i)))
            continue
        path = tuple(title for _, title in stack)
        if t.type == "html_block":
            start = len(refs)
            for src, alt, caption in html_images(t.content):
                refs.append(ImageRef(src, alt, caption, path))
            waiting = list(range(start, len(refs)))
            continue
        if t.type != "inline" or (i > 0 and tokens[i - 1].type == "heading_open"):
            continue
        found: list[tuple[str, str, str]] = []
        text: list[str] = []
        for c in t.children or []:
            if c.type == "image":
                found.append((c.attrGet("src") or "", _squash(c.content), _squash(c.attrGet("title") or "")))
            elif c.type == "html_inline":
                found.extend(html_images(c.content))
            elif c.type in ("text", "code_inline"):
                text.append(c.content)
            elif c.type in ("softbreak", "hardbreak"):
                text.append(" ")
        around = _squash("".join(text))
        if not found:
            if waiting and around and FIGURE_CAPTION_RE.match(around) and len(around) <= _MAX_PARAGRAPH_CAPTION:
                for n in waiting:
                    if not refs[n].caption:
                        refs[n] = dataclasses.replace(refs[n], caption=around)
            waiting = []
            continue
        start = len(refs)
        context = around if len(around) <= _MAX_PARAGRAPH_CAPTION else ""
        for src, alt, caption in found:
            if src.strip():
                refs.append(ImageRef(src.strip(), alt, caption or context, path))
        waiting = list(range(start, len(refs))) if not around else []
    return refs


def figure_captions(page_text: str) -> list[str]:
    """The "Figure N …" / "图 N …" lines of a PDF page's text, in order."""
    return [_squash(line) for line in page_text.split("\n") if FIGURE_CAPTION_RE.match(line) and len(line) <= 300]
