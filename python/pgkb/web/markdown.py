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
# what one request renders as Markdown (render_all): markdown-it is linear in its input, but at about 7.5 µs a
# character for the costliest shapes (a run of "["), so 64,000 characters cost at most about half a second
RENDER_BUDGET_CHARS = 64_000
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


def _plain(text: str) -> str:
    return f'<pre class="plain">{html.escape(text)}</pre>\n'


def _deepest(tokens: list[Token]) -> int:
    """The deepest nesting level of tokens and their inline children."""
    return max((t.level + max((c.level for c in t.children or []), default=0) for t in tokens), default=0)


def render(text: str | None, citations: Collection[int] = ()) -> str:
    """HTML for Markdown ``text``; [n] for n in ``citations`` becomes a link to that citation. A text longer
    than MAX_RENDERED_CHARS, or nested as deep as markdown-it's maxNesting (which drops what lies deeper), is
    its escaped self in a <pre>: nothing of a text is ever left out."""
    text = text or ""
    if len(text) > MAX_RENDERED_CHARS:
        return _plain(text)
    tokens = _MD.parse(text)
    if _deepest(tokens) >= _MD.options["maxNesting"] - 1:
        return _plain(text)
    if citations:
        for token in tokens:
            if token.type == "inline" and token.children:
                token.children = _cite(token.children, citations)
    return _MD.renderer.render(tokens, _MD.options, {})


def render_all(texts: list[str]) -> list[str]:
    """HTML for each of ``texts``, as :func:`render` gives it while RENDER_BUDGET_CHARS last (in order), and
    as escaped text after that: what one request renders is bounded whatever a document holds."""
    out, budget = [], RENDER_BUDGET_CHARS
    for text in texts:
        text = text or ""
        if len(text) <= budget:
            out.append(render(text))
            budget -= len(text)
        else:
            out.append(_plain(text))
    return out
