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
