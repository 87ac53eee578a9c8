"""HTML: a small tree builder over html.parser; ``<main>`` / ``<article>`` / ``<body>``, headings, ``<pre>`` and
``<table>`` become structure, page chrome (script, style, nav, …) is dropped."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from pgkb.chunking.blocks import _Block, _chunks_from_blocks
from pgkb.chunking.markdown import _stem
from pgkb.chunking.model import ChunkedDocument, ChunkingOptions, _check_text

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
