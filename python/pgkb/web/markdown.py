"""Markdown as the page shows it: knowledge-base text rendered to HTML on the server by markdown-it-py
(CommonMark plus tables and strikethrough). Raw HTML is off (it shows as text), an image shows as a link
to it (nothing loads), and links go only to http(s) and kb:// (any other target stays text); links open in
a new tab with no referrer. In an answer, the [n] markers of its citations become links to them (#citation-n)."""

from __future__ import annotations

import html
import re
from collections.abc import Collection

from markdown_it import MarkdownIt
from markdown_it.token import Token

LINK_SCHEMES = ("http://", "https://", "kb://")
# rendering costs grow with a text's shape (a table thousands of columns wide): longer texts are shown as
# plain, escaped text, so one request's rendering stays bounded whatever a knowledge base holds
MAX_RENDERED_CHARS = 8000
_MARKER = re.compile(r"\[(\d{1,6})\]")


def _allowed_link(url: str) -> bool:
    return url.strip().lower().startswith(LINK_SCHEMES)


def _link_open(self, tokens, idx, options, env) -> str:
    token = tokens[idx]
    if not (token.attrGet("href") or "").startswith("#citation-"):
        token.attrSet("target", "_blank")
        token.attrSet("rel", "noopener noreferrer")
    return self.renderToken(tokens, idx, options, env)


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"]).disable("image")
    md.validateLink = _allowed_link  # type: ignore[method-assign]  # markdown-it-py's hook: replace the method
    md.add_render_rule("link_open", _link_open)
    return md


_MD = _parser()


def _cite(children: list[Token], numbers: Collection[int]) -> list[Token]:
    """Inline tokens with each [n] of a known citation in a text token turned into a link to #citation-n."""
    out: list[Token] = []
    for token in children:
        if token.type != "text" or not _MARKER.search(token.content):
            out.append(token)
            continue
        last = 0
        for match in _MARKER.finditer(token.content):
            if int(match.group(1)) not in numbers:
                continue
            if match.start() > last:
                out.append(Token("text", "", 0, content=token.content[last : match.start()]))
            out.append(Token("link_open", "a", 1, attrs={"href": f"#citation-{match.group(1)}", "class": "cite"}))
            out.append(Token("text", "", 0, content=match.group(0)))
            out.append(Token("link_close", "a", -1))
            last = match.end()
        if last < len(token.content):
            out.append(Token("text", "", 0, content=token.content[last:]))
    return out


def render(text: str | None, citations: Collection[int] = ()) -> str:
    """HTML for Markdown ``text``; [n] for n in ``citations`` becomes a link to that citation. A text longer
    than MAX_RENDERED_CHARS is its escaped self in a <pre>."""
    text = text or ""
    if len(text) > MAX_RENDERED_CHARS:
        return f'<pre class="plain">{html.escape(text)}</pre>\n'
    tokens = _MD.parse(text)
    if citations:
        for token in tokens:
            if token.type == "inline" and token.children:
                token.children = _cite(token.children, citations)
    return _MD.renderer.render(tokens, _MD.options, {})
