"""pgkb.web.markdown: knowledge-base Markdown as the page shows it -- tables, lists and code rendered; raw HTML,
scripts and links to anything but http(s) / kb:// inert; an answer's [n] linked to its citations."""

from __future__ import annotations

from pgkb.web.markdown import render


def test_tables_lists_and_code_render():
    html = render("| 支付方式 | 到账时间 |\n|---|---|\n| 微信 | 实时 |\n\n- a\n- b\n\n```bash\nkubectl get pods\n```")
    assert "<table>" in html and "<td>微信</td>" in html
    assert "<ul>" in html and "<li>a</li>" in html
    assert '<pre><code class="language-bash">kubectl get pods' in html


def test_markup_and_dangerous_links_stay_inert():
    html = render(
        "<script>alert(1)</script> <img src=x onerror=alert(1)> [x](javascript:alert(1)) "
        "[d](data:text/html,hi) ![i](http://example.com/i.png) [ok](https://example.com/a) [kb](kb://team/faq.md)"
    )
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert 'href="javascript' not in html and 'href="data' not in html
    assert '<a href="https://example.com/a" target="_blank" rel="noopener noreferrer">ok</a>' in html
    assert '<a href="kb://team/faq.md"' in html


def test_citation_markers_link_only_to_given_citations():
    html = render("到账时间见表 [1]\n\n[2]\n\n`[1]` [9]", {1, 2})
    assert '<a href="#citation-1" class="cite">[1]</a>' in html and '<a href="#citation-2" class="cite">[2]</a>' in html
    assert "<code>[1]</code>" in html and "[9]" in html and "#citation-9" not in html
    assert render("[1]") == "<p>[1]</p>\n"


def test_long_texts_are_plain_escaped_text():
    wide = "| " + " | ".join(f"c{i}" for i in range(3000)) + " |\n" + "|---" * 3000 + "|\n<b>x</b>"
    out = render(wide)
    assert out.startswith('<pre class="plain">') and "<table>" not in out and "&lt;b&gt;x&lt;/b&gt;" in out


def test_nothing_nested_deeply_is_dropped():
    """Issue 32, finding 6e: markdown-it drops what lies deeper than its maxNesting (20 levels); such a text is
    shown as escaped text instead."""
    quoted = render("> " * 2000 + "deep text")
    assert "deep text" in quoted and "<pre" in quoted
    nested = render("".join("  " * i + f"- item{i}\n" for i in range(30)))
    assert all(f"item{i}" in nested for i in range(30))
    assert "<blockquote>" in render("> > shallow") and "<pre" not in render("> > shallow")


def test_the_renderer_is_linear():
    """Issue 32, finding 5: the costliest shapes found (runs of "[", "![", "[\\n") cost about 4x for 4x the text."""
    import time

    def took(text: str) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            render(text)
            best = min(best, time.perf_counter() - started)
        return best

    for unit in ("[", "![", "[\n", "[a", "_*"):
        assert took(unit * (8000 // len(unit))) < 8 * took(unit * (2000 // len(unit))) + 0.005, unit


def test_one_answer_renders_a_bounded_amount(monkeypatch):
    """Issue 32, finding 5: /api/document of 80 chunks of 7,980 "[" rendered all of them (17.9 s, 1.29 MB)."""
    from pgkb.web import api, markdown

    rendered: list[int] = []
    real = markdown.render
    monkeypatch.setattr(markdown, "render", lambda text, *a: rendered.append(len(text)) or real(text, *a))
    chunks = [{"chunk_index": i, "heading_path": [], "chunk_type": "text", "content": "[" * 7980} for i in range(80)]
    whole = api.shown_chunks(chunks, -1)
    assert [c["chunk_index"] for c in whole] == list(range(len(whole)))
    assert sum(len(c["content"]) for c in whole) <= api.DOCUMENT_CHARS < 80 * 7980
    assert sum(rendered) <= markdown.RENDER_BUDGET_CHARS and all("content_html" in c for c in whole)
    assert all(c["content_html"].startswith('<pre class="plain">') for c in whole[len(rendered) :])
    around = [c["chunk_index"] for c in api.shown_chunks(chunks, 40)]
    assert 40 in around and around == list(range(around[0], around[-1] + 1)) and around[0] > 20
    assert len(api.shown_chunks(chunks[:1], 0)) == 1
