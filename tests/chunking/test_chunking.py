"""pgkb.chunking: documents in the repository (examples/kb and the fixture corpus tests/fixtures/chunking:
Markdown with front matter, containers, raw HTML, code blocks, tables, FAQ entries; an HTML page), the real
Vue docs (zh-CN) when the shared datasets folder is next to the checkout, plus hand-written edge cases.
Pure Python, no database."""

from __future__ import annotations

import html
import json
import re
import string
from pathlib import Path

import pytest
from pgkb.chunking import (
    Chunk,
    ChunkedDocument,
    ChunkingError,
    ChunkingOptions,
    chunk_bytes,
    chunk_file,
    chunk_html,
    chunk_markdown,
    chunk_pdf,
    chunk_text,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "chunking"
REPO_FILES = sorted((REPO / "examples" / "kb").rglob("*.md")) + sorted(FIXTURES.glob("*.md"))
VUE = REPO.parent / "shared" / "datasets" / "vue-docs-zh-cn" / "files"
VUE_FILES = sorted(VUE.rglob("*.md")) if VUE.is_dir() else []
needs_vue = pytest.mark.skipif(not VUE_FILES, reason=f"Vue docs dataset not found at {VUE} (not part of the repo)")
# the Markdown corpora the "no text dropped" properties run on: the repository's always, the Vue docs as an extra
CORPORA = {"repo": (REPO, REPO_FILES), "vue": (VUE, VUE_FILES)}
each_corpus = pytest.mark.parametrize("corpus", ["repo", pytest.param("vue", marks=needs_vue)])

# --------------------------------------------------------------------------------------------------
# "No text dropped", checked independently of the implementation: the reference is the Markdown source
# minus what the chunker is documented to strip (front matter, h1-h3 heading lines — checked separately
# against heading paths —, ::: container markers, raw <script>/<style> blocks), and both sides are compared
# after removing HTML tags/comments, ASCII punctuation and whitespace (markup: fences, pipes, #, *, ...).
# Every remaining character (letters, digits, CJK text and punctuation) must appear in the chunks, in order.

_PUNCT = re.compile("[" + re.escape(string.punctuation) + r"\s]+")
_TAG = re.compile(r"<!--.*?-->|<[^<>\n]*>", re.DOTALL)
_FENCE = re.compile(r"^[\s>]*(`{3,}|~{3,})(.*)$")


def _norm(text: str) -> str:
    return _PUNCT.sub("", html.unescape(_TAG.sub("", text)))


def _heading_norm(text: str) -> str:
    text = re.sub(r"\{#[^}]*\}\s*$", "", text.strip().lstrip("#"))
    return _norm(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text))


def _reference(md: str) -> tuple[str, list[str]]:
    """(expected text, h1-h3 heading texts) of a Markdown document, by a line scan."""
    md = md.replace("\r\n", "\n").replace("\r", "\n")
    md = re.sub(r"\A(---|\+\+\+)\n.*?\n\1[ \t]*\n", "", md, flags=re.DOTALL)
    keep: list[str] = []
    headings: list[str] = []
    fence: str | None = None
    raw_end: str | None = None
    for line in md.split("\n"):
        if raw_end:
            if raw_end in line:
                raw_end = None
            continue
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
                fence = None
            keep.append(line)
            continue
        if m:
            fence = m.group(1)
            keep.append(line)
            continue
        if re.match(r"^ {0,3}#{1,3}(\s|$)", line):
            headings.append(_heading_norm(line))
            continue
        if re.match(r"^\s*:::", line):
            line = re.sub(r"^\s*:::+\s*(?:[A-Za-z][\w-]*)?", "", line)
        tag = re.match(r"^ {0,3}<(script|style)\b", line, re.IGNORECASE)
        if tag:
            if f"</{tag.group(1).lower()}>" not in line.lower():
                raw_end = f"</{tag.group(1)}>"
            continue
        keep.append(line)
    return _norm("\n".join(keep)), [h for h in headings if h]


def _assert_subsequence(expected: str, actual: str, where: str) -> None:
    pos = 0
    for i, ch in enumerate(expected):
        pos = actual.find(ch, pos)
        if pos < 0:
            raise AssertionError(f"{where}: text lost at reference char {i}: ...{expected[max(0, i - 40) : i + 40]}...")
        pos += 1


def _assert_no_text_dropped(md: str, doc: ChunkedDocument, where: str) -> None:
    expected, headings = _reference(md)
    actual = _norm("\n".join(c.content for c in doc.chunks))
    _assert_subsequence(expected, actual, where)
    paths = {_norm(h) for c in doc.chunks for h in c.heading_path}
    # (a "## x" line nested in a list item is no section heading: it stays in the content)
    missing = [h for h in headings if h not in paths and h not in actual]
    assert not missing, f"{where}: headings missing from heading paths: {missing}"


# --------------------------------------------------------------------------------------------------
# Real documents


def test_repo_corpus_has_every_construct() -> None:
    """The repository's corpus keeps exercising what the properties below are about: front matter (YAML
    and TOML), containers, raw HTML and scripts, code and tables long enough to be split, FAQ entries."""
    sources = "\n".join(f.read_text("utf-8") for f in REPO_FILES)
    for construct in ("\n+++\n", "\n::: tip", "\n<script setup>", "\n<div", "\n<style", "{#", "\n~~~", "Q:", "问："):
        assert construct in sources, construct
    chunks = [c for f in REPO_FILES for c in chunk_file(f).chunks]
    assert {c.chunk_type for c in chunks} == {"text", "code", "table", "faq"}
    assert {c.chunk_type for c in chunks if c.metadata.get("parts", 1) > 1} >= {"code", "table"}
    assert len(REPO_FILES) >= 15


@each_corpus
def test_all_files_no_text_dropped_and_within_limits(corpus: str) -> None:
    root, files = CORPORA[corpus]
    if corpus == "vue":
        assert len(files) == 116
    opts = ChunkingOptions()
    for f in files:
        md = f.read_text("utf-8")
        doc = chunk_file(f, opts)
        where = str(f.relative_to(root))
        _assert_no_text_dropped(md, doc, where)
        expected, _ = _reference(md)
        actual = _norm("".join(c.content for c in doc.chunks))
        assert len(actual) <= len(expected) * 1.05 + 50, (
            f"{where}: chunks repeat text ({len(actual)} > {len(expected)})"
        )
        for c in doc.chunks:
            assert c.content.strip() and c.content == c.content.rstrip()
            assert c.chunk_type in ("text", "code", "table", "faq")
            json.dumps(c.to_json(), ensure_ascii=False)
            # only a code line or protected block longer than the limit may exceed it; none in these docs
            assert len(c.content) <= opts.max_chars, (where, c.heading_path, len(c.content))
        json.dumps(doc.metadata)
        assert doc.title and doc.source_type == "markdown"


@each_corpus
def test_no_text_dropped_with_small_limit_and_overlap(corpus: str) -> None:
    root, files = CORPORA[corpus]
    opts = ChunkingOptions(max_chars=300, overlap=60, min_chars=40, heading_levels=2)
    for f in files if corpus == "repo" else files[::7]:
        md = f.read_text("utf-8")
        doc = chunk_file(f, opts)
        _assert_no_text_dropped(md, doc, str(f.relative_to(root)))
        assert all(len(c.content) <= opts.max_chars for c in doc.chunks if c.chunk_type == "text"), f


@each_corpus
def test_deterministic(corpus: str) -> None:
    _, files = CORPORA[corpus]
    first = [chunk_file(f).chunks for f in files]
    second = [chunk_file(f).chunks for f in files]
    assert first == second


def test_html_page_no_text_dropped() -> None:
    """An HTML page: every character of <main> reaches the chunks, except its <script> and <nav>; the page
    chrome outside <main> (head, nav, footer) does not. The reference is a regex over this hand-written page."""
    page = (FIXTURES / "page.html").read_text("utf-8")
    main = re.search(r"<main>(.*)</main>", page, re.DOTALL).group(1)
    main = re.sub(r"<(script|nav)\b.*?</\1>", "", main, flags=re.DOTALL)
    headings = [_norm(h) for h in re.findall(r"<h[1-6]>(.*?)</h[1-6]>", main)]
    body = _norm(re.sub(r"<h[1-6]>.*?</h[1-6]>", "", main))
    for opts in (ChunkingOptions(), ChunkingOptions(max_chars=60, min_chars=0)):
        doc = chunk_file(FIXTURES / "page.html", opts)
        text = "\n".join(c.content for c in doc.chunks)
        _assert_subsequence(body, _norm(text), f"page.html {opts}")
        assert [h for h in headings if h not in {_norm(p) for c in doc.chunks for p in c.heading_path}] == []
        for chrome in ("首页", "本页目录", "版权所有", "analytics", "console", "sans-serif"):
            assert chrome not in text, chrome
    assert doc.source_type == "html" and doc.title == "值班手册（HTML 版）"


@needs_vue
def test_vue_front_matter_title_containers() -> None:
    doc = chunk_file(VUE / "src/api/built-in-components.md")
    assert doc.metadata == {"pageClass": "api"}  # front matter: metadata, not text
    assert doc.title == "内置组件"  # first h1 (no title in front matter)
    assert all("pageClass" not in c.content for c in doc.chunks)
    first = doc.chunks[0]
    assert first.heading_path == ("内置组件",)
    assert first.content.startswith("组件注册和使用\n内置组件无需注册")  # ":::info 组件注册和使用" -> title kept
    assert all(":::" not in c.content for c in doc.chunks)
    transition = [c for c in doc.chunks if c.heading_path == ("内置组件", "<Transition>")]
    assert transition and transition[0].metadata["anchor"] == "transition"
    assert "{#" not in "".join(h for c in doc.chunks for h in c.heading_path)


@needs_vue
def test_vue_table_and_code() -> None:
    doc = chunk_file(VUE / "src/guide/best-practices/accessibility.md")
    tables = [c for c in doc.chunks if c.chunk_type == "table"]
    assert len(tables) == 1
    t = tables[0]
    assert t.heading_path == ("无障碍访问", "内容结构", "Landmarks")
    assert t.content.startswith("| HTML    | ARIA Role ") and "必须为该元素提供 label |" in t.content
    # the short line after the table is merged into it (min_chars) rather than left alone
    assert t.content.endswith("[阅读更多有关标题的细节](https://www.w3.org/TR/wai-aria-1.2/#landmark_roles)")
    doc = chunk_file(VUE / "src/api/built-in-components.md")
    code = [c for c in doc.chunks if c.chunk_type == "code"]
    assert code and all(c.content.count("```") % 2 == 0 for c in doc.chunks)
    parts = [c for c in code if c.metadata.get("parts", 1) > 1]
    assert parts and all(c.metadata["language"] for c in parts)


@needs_vue
def test_vue_faq_page() -> None:
    doc = chunk_file(VUE / "src/about/faq.md")
    faq = [c for c in doc.chunks if c.chunk_type == "faq"]
    assert len(faq) >= 12
    q = [c for c in faq if c.heading_path == ("常见问题", "谁在维护 Vue？")]
    assert len(q) == 1 and q[0].metadata["question"] == "谁在维护 Vue？"
    assert q[0].content.startswith("Vue 是一个独立的社区驱动的项目。")
    # one entry per chunk: a chunk never holds two questions
    assert len({c.heading_path for c in faq}) == len(faq)
    assert all(len(c.heading_path) >= 2 for c in faq)


@needs_vue
def test_vue_script_setup_is_not_text() -> None:
    doc = chunk_file(VUE / "src/error-reference/index.md")
    text = "\n".join(c.content for c in doc.chunks)
    assert "onMounted" not in text and "import" not in text
    assert "下表提供了代码和其原始的完整信息字符串的映射。" in text


# --------------------------------------------------------------------------------------------------
# Markdown structure


def test_heading_path_content_and_embedding_text() -> None:
    md = "# 部署指南\n\n简介段落。\n\n## 配置 TLS\n\n把证书放到 `/etc/pgkb/tls` 目录。\n"
    doc = chunk_markdown(md, "deploy.md", ChunkingOptions(min_chars=0))
    assert doc.title == "部署指南"
    assert [(c.heading_path, c.content) for c in doc.chunks] == [
        (("部署指南",), "简介段落。"),
        (("部署指南", "配置 TLS"), "把证书放到 `/etc/pgkb/tls` 目录。"),
    ]
    c = doc.chunks[1]
    assert c.embedding_text(doc.title) == "部署指南 > 配置 TLS\n把证书放到 `/etc/pgkb/tls` 目录。"
    assert c.embedding_text("运维手册") == "运维手册 > 部署指南 > 配置 TLS\n把证书放到 `/etc/pgkb/tls` 目录。"
    assert doc.embedding_texts()[0] == "部署指南\n简介段落。"
    assert doc.embedding_texts(heading_prefix=False) == ["简介段落。", "把证书放到 `/etc/pgkb/tls` 目录。"]
    assert c.to_json() == {
        "content": "把证书放到 `/etc/pgkb/tls` 目录。",
        "heading_path": ["部署指南", "配置 TLS"],
        "chunk_type": "text",
        "metadata": {},
    }
    assert doc.chunks_json()[1] == c.to_json()


def test_hash_inside_fenced_code_is_not_a_heading() -> None:
    md = "# Title\n\n## Setup\n\n```bash\n# install the package\npip install pgkb\n## not a heading either\n```\n"
    doc = chunk_markdown(md)
    assert [c.heading_path for c in doc.chunks] == [("Title", "Setup")]
    assert "# install the package" in doc.chunks[0].content
    assert "## not a heading either" in doc.chunks[0].content


def test_heading_levels_option_and_deep_headings_stay_with_their_text() -> None:
    body = "段落内容，足够长的一段话。" * 5
    md = f"# A\n\n## B\n\n### C\n\n{body}\n\n#### D\n\n{body}\n"
    doc = chunk_markdown(md, options=ChunkingOptions(heading_levels=2))
    assert {c.heading_path for c in doc.chunks} == {("A", "B")}
    text = "\n".join(c.content for c in doc.chunks)
    assert "### C" in text and "#### D" in text
    doc = chunk_markdown(md, options=ChunkingOptions(max_chars=100, min_chars=10))
    d = [c for c in doc.chunks if "#### D" in c.content]
    assert len(d) == 1 and d[0].content.startswith("#### D\n\n段落内容")  # never left at the end of a chunk


def test_heading_without_text_is_kept() -> None:
    doc = chunk_markdown("# Guide\n\nIntro text here.\n\n## Empty section\n")
    assert doc.chunks[-1].heading_path == ("Guide", "Empty section")
    assert doc.chunks[-1].content == "Empty section"


def test_title_from_front_matter_then_h1_then_name() -> None:
    assert chunk_markdown("---\ntitle: 手册\n---\n# 一级\n\n正文\n", "x.md").title == "手册"
    assert chunk_markdown("正文\n\n# 一级\n", "x.md").title == "一级"
    assert chunk_markdown("正文\n", "docs/install-guide.md").title == "install-guide"


def test_containers_keep_title_and_text() -> None:
    md = "# T\n\n::: tip 提示\n这是提示内容。\n:::\n\n:::warning\n警告内容。\n:::\n\n```md\n::: tip in code\n```\n"
    text = "\n".join(c.content for c in chunk_markdown(md).chunks)
    assert "提示\n这是提示内容。" in text and "警告内容。" in text and "warning" not in text
    assert "::: tip in code" in text  # markers inside code are code


def test_html_blocks_keep_text() -> None:
    md = '# T\n\n<div class="note">\n  <p>HTML 块里的文字 &amp; 实体</p>\n  <!-- 注释 -->\n</div>\n\n正文。\n'
    doc = chunk_markdown(md)
    text = "\n".join(c.content for c in doc.chunks)
    assert "HTML 块里的文字 &amp; 实体" in text and "<div" not in text and "注释" not in text


def test_link_reference_definitions_are_kept() -> None:
    md = "See [the docs][d].\n\n[d]: https://example.com/docs\n"
    text = "\n".join(c.content for c in chunk_markdown(md).chunks)
    assert "[d]: https://example.com/docs" in text


# --------------------------------------------------------------------------------------------------
# Splitting


def test_chinese_sentences_keep_their_punctuation() -> None:
    sentences = [f"这是第{i}句话，用来测试中文句子的切分是否正确{'！' if i % 3 else '。'}" for i in range(40)]
    doc = chunk_markdown("".join(sentences), options=ChunkingOptions(max_chars=120, min_chars=10))
    assert len(doc.chunks) > 5
    for c in doc.chunks:
        assert len(c.content) <= 120
        assert c.content.endswith(("。", "！")), c.content
        assert not c.content.startswith(("。", "！", "，"))
    assert "".join(c.content for c in doc.chunks) == "".join(sentences)


def test_english_sentences_and_semicolon() -> None:
    text = " ".join(f"Sentence number {i} is here; it ends now. Does it? Yes!" for i in range(30))
    doc = chunk_text(text, options=ChunkingOptions(max_chars=150, min_chars=10))
    for c in doc.chunks:
        assert len(c.content) <= 150 and c.content.endswith((".", "?", "!", ";")), c.content
    assert " ".join(c.content for c in doc.chunks) == text


def test_paragraphs_preferred_over_sentences() -> None:
    paras = ["第一段。" * 20, "第二段。" * 20, "第三段。" * 20]  # 80 chars each
    doc = chunk_text("\n\n".join(paras), options=ChunkingOptions(max_chars=170, min_chars=10))
    assert [c.content for c in doc.chunks] == ["\n\n".join(paras[:2]), paras[2]]


def test_long_line_without_spaces_is_hard_split() -> None:
    line = "甲乙丙丁戊己庚辛壬癸" * 250  # 2500 chars, no break opportunity
    doc = chunk_markdown(line, options=ChunkingOptions(max_chars=800))
    assert [len(c.content) for c in doc.chunks] == [625, 625, 625, 625]  # equal parts, no tiny tail
    assert "".join(c.content for c in doc.chunks) == line


def test_words_split_on_spaces() -> None:
    text = " ".join(f"word{i:03d}" for i in range(300))
    doc = chunk_text(text, options=ChunkingOptions(max_chars=200))
    assert all(len(c.content) <= 200 for c in doc.chunks)
    assert " ".join(c.content for c in doc.chunks) == text


def test_overlap() -> None:
    text = "".join(f"第{i}句，这里是一些用于测试重叠的中文内容。" for i in range(60))
    opts = ChunkingOptions(max_chars=200, overlap=40, min_chars=20)
    doc = chunk_text(text, options=opts)
    assert len(doc.chunks) > 3
    assert "overlap_chars" not in doc.chunks[0].metadata
    for prev, cur in zip(doc.chunks, doc.chunks[1:], strict=False):
        n = cur.metadata["overlap_chars"]
        assert 0 < n <= 41 and len(cur.content) <= 200
        tail = cur.content[: n - 1]
        assert prev.content.endswith(tail) and tail.startswith("第")  # starts at a sentence boundary
    no_overlap = "".join(c.content[c.metadata.get("overlap_chars", 0) :] for c in doc.chunks)
    assert no_overlap == text


def test_invalid_options() -> None:
    with pytest.raises(ValueError):
        ChunkingOptions(max_chars=100, overlap=60)
    with pytest.raises(ValueError):
        ChunkingOptions(heading_levels=0)
    with pytest.raises(ValueError):
        ChunkingOptions(max_chars=100, min_chars=100)


def test_tiny_fragments_are_merged_within_a_section() -> None:
    md = "# A\n\n" + "长段落内容。" * 60 + "\n\n短尾。\n\n# B\n\n短。\n"
    doc = chunk_markdown(md, options=ChunkingOptions(max_chars=400, min_chars=80))
    a = [c for c in doc.chunks if c.heading_path == ("A",)]
    assert all(len(c.content) >= 80 for c in a)
    assert a[-1].content.endswith("短尾。")
    b = [c for c in doc.chunks if c.heading_path == ("B",)]
    assert [c.content for c in b] == ["短。"]  # not merged across sections


# --------------------------------------------------------------------------------------------------
# Code blocks and tables


def test_small_code_stays_with_text_large_code_is_its_own_chunk() -> None:
    small = "```js\nconst a = 1\n```"
    large = "```python\n" + "\n".join(f"value_{i} = compute({i})  # step" for i in range(15)) + "\n```"
    md = f"# T\n\n示例：\n\n{small}\n\n后面的说明文字。\n\n## Big\n\n{large}\n"
    doc = chunk_markdown(md)
    t = [c for c in doc.chunks if c.heading_path == ("T",)]
    assert len(t) == 1 and t[0].chunk_type == "text" and small in t[0].content
    big = [c for c in doc.chunks if c.heading_path == ("T", "Big")]
    assert len(big) == 1 and big[0].chunk_type == "code" and big[0].content == large
    assert big[0].metadata == {"language": "python"}


def test_oversized_code_block_split_at_lines() -> None:
    lines = [f"    result_{i} = transform(data[{i}], scale={i * 3})" for i in range(60)]
    long_line = "    payload = '" + "x" * 400 + "'"
    lines.insert(30, long_line)
    md = "# Code\n\n```python\n" + "\n".join(lines) + "\n```\n"
    doc = chunk_markdown(md, options=ChunkingOptions(max_chars=300))
    code = doc.chunks
    assert len(code) > 5 and all(c.chunk_type == "code" for c in code)
    body: list[str] = []
    for i, c in enumerate(code, start=1):
        parts = c.content.split("\n")
        assert parts[0] == "```python" and parts[-1] == "```"
        assert c.metadata == {"language": "python", "part": i, "parts": len(code)}
        assert len(c.content) <= 300 or long_line in parts
        body.extend(parts[1:-1])
    assert body == lines  # every line whole, in order
    assert [c for c in code if long_line in c.content][0].content == f"```python\n{long_line}\n```"


def test_oversized_table_split_between_rows_with_header_repeated() -> None:
    header = "| 参数 | 说明 | 默认值 |\n| --- | --- | :---: |"
    rows = [f"| option_{i} | 第 {i} 个选项的详细说明文字 | {i} |" for i in range(80)]
    md = "# 配置\n\n## 参数表\n\n" + header + "\n" + "\n".join(rows) + "\n\n表格之后的文字。\n"
    doc = chunk_markdown(md, options=ChunkingOptions(max_chars=400))
    tables = [c for c in doc.chunks if c.chunk_type == "table"]
    assert len(tables) > 3
    seen: list[str] = []
    for c in tables:
        assert c.content.startswith(header + "\n") and len(c.content) <= 400
        seen.extend(x for x in c.content.split("\n")[2:] if x.startswith("| option_"))
        assert c.heading_path == ("配置", "参数表")
    assert seen == rows
    assert doc.chunks[-1].content.endswith(rows[-1] + "\n\n表格之后的文字。")  # short tail merged


def test_code_nested_in_long_list_is_not_cut() -> None:
    code = "  ```ts\n" + "\n".join(f"  function f{i}(): void" for i in range(40)) + "\n  ```"
    md = "- **类型**\n\n" + code + "\n\n- **详细信息**\n\n  " + "说明文字。" * 30 + "\n"
    doc = chunk_markdown(md, options=ChunkingOptions(max_chars=400))
    code_chunks = [c for c in doc.chunks if c.chunk_type == "code"]
    assert code_chunks
    for c in doc.chunks:
        assert c.content.count("```") % 2 == 0, c.content
    assert all(ln in "\n".join(c.content for c in doc.chunks) for ln in code.split("\n")[1:-1])


def test_unclosed_fence_runs_to_the_end() -> None:
    doc = chunk_markdown("# T\n\n```js\nlet a = 1\n# not heading\n")
    assert [c.heading_path for c in doc.chunks] == [("T",)]
    assert "# not heading" in doc.chunks[0].content


# --------------------------------------------------------------------------------------------------
# FAQ


def test_faq_bold_q_a_pairs() -> None:
    md = (
        "# 帮助\n\n以下是一些问题。\n\n**Q:** 如何重置密码？\n**A:** 在设置页点击“重置密码”。\n\n"
        "**Q:** 支持哪些数据库？\n\n**A:** 目前只支持 PostgreSQL 16 及以上版本。\n"
    )
    doc = chunk_markdown(md, options=ChunkingOptions(min_chars=0))
    faq = [c for c in doc.chunks if c.chunk_type == "faq"]
    assert [c.metadata["question"] for c in faq] == ["如何重置密码？", "支持哪些数据库？"]
    assert faq[0].content == "**Q:** 如何重置密码？\n**A:** 在设置页点击“重置密码”。"
    assert faq[1].content == "**Q:** 支持哪些数据库？\n\n**A:** 目前只支持 PostgreSQL 16 及以上版本。"
    assert doc.chunks[0].chunk_type == "text" and doc.chunks[0].content == "以下是一些问题。"


def test_faq_plain_and_chinese_markers_even_without_blank_lines() -> None:
    md = "Q: What is pgkb?\nA: A knowledge base in PostgreSQL.\nQ: Is it free?\nA: Yes.\n\n"
    md += "问：支持中文吗？\n答：支持。\n"
    doc = chunk_markdown(md, options=ChunkingOptions(min_chars=0))
    assert [(c.chunk_type, c.metadata.get("question")) for c in doc.chunks] == [
        ("faq", "What is pgkb?"),
        ("faq", "Is it free?"),
        ("faq", "支持中文吗？"),
    ]
    assert doc.chunks[2].content == "问：支持中文吗？\n答：支持。"


def test_faq_one_line_q_and_a() -> None:
    doc = chunk_markdown("**Q:** 能离线使用吗？ **A:** 可以。\n\n**Q:** 收费吗？ **A:** 不收费。\n")
    assert [c.metadata["question"] for c in doc.chunks] == ["能离线使用吗？", "收费吗？"]


def test_faq_question_headings() -> None:
    md = "# 产品\n\n## 常见问题\n\n### 如何安装？\n\n运行安装脚本。\n\n### 如何升级？\n\n运行升级脚本。\n\n"
    md += "## 其他\n\n普通内容。\n"
    doc = chunk_markdown(md)
    assert [(c.chunk_type, c.heading_path[-1], c.metadata.get("question")) for c in doc.chunks] == [
        ("faq", "如何安装？", "如何安装？"),
        ("faq", "如何升级？", "如何升级？"),
        ("text", "其他", None),
    ]


def test_q_without_answer_is_not_faq() -> None:
    doc = chunk_markdown("Q: this line only looks like a question\n\nMore text.\n")
    assert all(c.chunk_type == "text" for c in doc.chunks)


# --------------------------------------------------------------------------------------------------
# Front matter and degenerate input


def test_yaml_front_matter_is_metadata() -> None:
    md = "---\ntitle: 部署\ndate: 2024-05-01\ntags: [ops, tls]\n---\n\n正文内容。\n"
    doc = chunk_markdown(md)
    assert doc.title == "部署"
    assert doc.metadata == {"title": "部署", "date": "2024-05-01", "tags": ["ops", "tls"]}
    assert [c.content for c in doc.chunks] == ["正文内容。"]


def test_toml_front_matter() -> None:
    md = '+++\ntitle = "TOML 文档"\nweight = 3\n[extra]\nauthor = "ops"\n+++\n\n# 标题\n\n正文。\n'
    doc = chunk_markdown(md)
    assert doc.title == "TOML 文档"
    assert doc.metadata == {"title": "TOML 文档", "weight": 3, "extra": {"author": "ops"}}
    assert all("+++" not in c.content and "weight" not in c.content for c in doc.chunks)


def test_malformed_front_matter_is_kept_raw() -> None:
    md = "---\ntitle: [unclosed\n  : bad: yaml:\n---\n# 标题\n\n正文。\n"
    doc = chunk_markdown(md, "bad.md")
    assert doc.metadata["front_matter_raw"] == "title: [unclosed\n  : bad: yaml:\n"
    assert doc.metadata["front_matter_error"].startswith("yaml:")
    assert doc.title == "标题"
    assert [c.content for c in doc.chunks] == ["正文。"]
    doc = chunk_markdown("+++\ntitle = \n+++\nbody\n")
    assert doc.metadata["front_matter_raw"] == "title = \n" and doc.chunks[0].content == "body"
    doc = chunk_markdown("---\n- just\n- a list\n---\nbody\n")
    assert "front_matter_raw" in doc.metadata


def test_empty_whitespace_and_front_matter_only() -> None:
    for text in ("", "   \n\n\t\n", "---\ntitle: 只有元数据\n---\n", "\r\n\r\n"):
        doc = chunk_markdown(text, "empty.md")
        assert doc.chunks == []
    assert chunk_markdown("---\ntitle: 只有元数据\n---\n").title == "只有元数据"
    assert chunk_text("  \n ", "a.txt").chunks == []
    assert chunk_html("<html><body>  </body></html>").chunks == []


def test_mixed_line_endings() -> None:
    md = "# 标题\r\n\r\n第一段。\r\n\r第二段\n\r\n```\r\n# 代码\r\n```\r\n"
    doc = chunk_markdown(md, options=ChunkingOptions(min_chars=0))
    assert doc.chunks[0].heading_path == ("标题",)
    text = doc.chunks[0].content
    assert "\r" not in text and text.startswith("第一段。\n\n第二段") and "# 代码" in text


def test_horizontal_rule_is_not_front_matter() -> None:
    doc = chunk_markdown("正文一。\n\n---\n\n正文二。\n", options=ChunkingOptions(min_chars=0))
    assert doc.metadata == {}
    assert "正文一。" in doc.chunks[0].content and "正文二。" in doc.chunks[-1].content


# --------------------------------------------------------------------------------------------------
# Other formats and errors


def test_txt(tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    text = "第一段文字。\n第一段第二行。\n\n" + "第二段很长。" * 100
    p.write_text(text, "utf-8")
    doc = chunk_file(p, ChunkingOptions(max_chars=200))
    assert doc.source_type == "text" and doc.title == "notes"
    assert all(c.heading_path == () and len(c.content) <= 200 for c in doc.chunks)
    assert "".join(c.content for c in doc.chunks).replace("\n", "") == text.replace("\n", "")


def test_html(tmp_path: Path) -> None:
    page = """<!doctype html><html><head><title>部署手册</title><style>body{color:red}</style>
    <script>var secret = 1;</script><meta name="description" content="怎么部署"></head>
    <body><nav><a href="/">首页</a> <a href="/x">导航链接</a></nav>
    <div class="sidebar">侧栏</div>
    <main>
      <h1>部署</h1><p>介绍 &amp; 概览。<br>第二行</p>
      <h2 id="tls">配置 TLS</h2>
      <p>把证书放到目录里。</p>
      <ul><li>第一项<li>第二项</ul>
      <pre><code class="language-bash">sudo systemctl restart pgkb
# 不是标题</code></pre>
      <h4>细节</h4><p>更多细节。</p>
      <table><tr><th>参数</th><th>说明</th></tr><tr><td>port</td><td>端口 | 号</td></tr></table>
      <script>alert("no")</script>
    </main><footer>版权</footer></body></html>"""
    p = tmp_path / "page.html"
    p.write_text(page, "utf-8")
    doc = chunk_file(p, ChunkingOptions(min_chars=0))
    assert doc.source_type == "html" and doc.title == "部署手册"
    assert doc.metadata == {"description": "怎么部署"}
    text = "\n".join(c.content for c in doc.chunks)
    for gone in ("secret", "首页", "导航链接", "侧栏", "版权", "alert", "color:red"):
        assert gone not in text
    assert [c.heading_path for c in doc.chunks] == [("部署",), ("部署", "配置 TLS")]
    assert doc.chunks[0].content == "介绍 & 概览。\n第二行"
    assert doc.chunks[1].metadata == {"anchor": "tls"}
    tls = doc.chunks[1].content
    assert "- 第一项\n\n- 第二项" in tls
    assert "```bash\nsudo systemctl restart pgkb\n# 不是标题\n```" in tls
    assert "#### 细节" in tls and "| 参数 | 说明 |\n| --- | --- |\n| port | 端口 \\| 号 |" in tls


def test_html_unclosed_head() -> None:
    doc = chunk_html("<html><head><title>T</title><body><p>正文在这里</p></body></html>")
    assert doc.title == "T" and [c.content for c in doc.chunks] == ["正文在这里"]


def test_html_without_main_uses_article_then_body() -> None:
    doc = chunk_html("<body><div>外面</div><article><h2>文章</h2><p>正文</p></article></body>", "a.html")
    assert [(c.heading_path, c.content) for c in doc.chunks] == [(("文章",), "正文")]
    assert doc.title == "a"
    doc = chunk_html("<p>只有段落<p>第二段", options=ChunkingOptions(min_chars=0))
    assert [c.content for c in doc.chunks] == ["只有段落\n\n第二段"]


def _make_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF with one Helvetica text line per page (correct xref offsets)."""
    n = len(pages)
    objs: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + b" ".join(f"{4 + 2 * i} 0 R".encode() for i in range(n)) + b"] /Count %d >>" % n,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, text in enumerate(pages):
        esc = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({esc}) Tj ET".encode("latin-1")
        objs.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>".encode()
        )
        objs.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for k, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def test_pdf(tmp_path: Path) -> None:
    data = _make_pdf(["Page one talks about backups.", "", "Page three explains TLS (certificates)."])
    doc = chunk_pdf(data, "manual.pdf", ChunkingOptions(min_chars=0))
    assert doc.source_type == "pdf" and doc.title == "manual" and doc.metadata == {"pages": 3}
    assert [(c.metadata, c.content) for c in doc.chunks] == [
        ({"page": 1}, "Page one talks about backups."),
        ({"page": 3}, "Page three explains TLS (certificates)."),
    ]
    p = tmp_path / "manual.pdf"
    p.write_bytes(data)
    assert chunk_file(p, ChunkingOptions(min_chars=0)).chunks == doc.chunks


def test_corrupt_pdf_raises_chunking_error() -> None:
    good = _make_pdf(["hello"])
    for bad in (b"not a pdf at all", b"%PDF-1.4\n" + b"\x8f\x00garbage" * 50, good[: len(good) // 3]):
        with pytest.raises(ChunkingError, match="PDF"):
            chunk_pdf(bad, "broken.pdf")


def test_chunk_file_errors(tmp_path: Path) -> None:
    bad_utf8 = tmp_path / "latin1.md"
    bad_utf8.write_bytes("café".encode("latin-1"))
    with pytest.raises(ChunkingError, match="not valid UTF-8"):
        chunk_file(bad_utf8)
    binary = tmp_path / "data.txt"
    binary.write_bytes(b"abc\x00def")
    with pytest.raises(ChunkingError, match="NUL"):
        chunk_file(binary)
    with pytest.raises(ChunkingError, match="unsupported file type '.exe'"):
        chunk_bytes(b"MZ", "tool.exe")
    with pytest.raises(ChunkingError, match="cannot read"):
        chunk_file(tmp_path / "missing.md")
    with pytest.raises(ChunkingError, match="NUL"):
        chunk_markdown("a\x00b")


def test_bom_is_dropped(tmp_path: Path) -> None:
    p = tmp_path / "bom.md"
    p.write_bytes("\ufeff# 标题\n\n正文。\n".encode())
    doc = chunk_file(p)
    assert doc.title == "标题" and doc.chunks[0].content == "正文。"


def test_docx(tmp_path: Path) -> None:
    docx = pytest.importorskip("docx", reason="python-docx not installed (optional)")
    d = docx.Document()
    d.add_heading("安装手册", level=1)
    d.add_paragraph("第一步：下载。")
    d.add_heading("配置", level=2)
    d.add_paragraph("编辑配置文件。")
    t = d.add_table(rows=2, cols=2)
    t.cell(0, 0).text, t.cell(0, 1).text, t.cell(1, 0).text, t.cell(1, 1).text = "键", "值", "port", "5432"
    p = tmp_path / "manual.docx"
    d.save(str(p))
    doc = chunk_file(p, ChunkingOptions(min_chars=0))
    assert doc.source_type == "docx" and doc.title == "安装手册"
    assert [(c.heading_path, c.content) for c in doc.chunks] == [
        (("安装手册",), "第一步：下载。"),
        (("安装手册", "配置"), "编辑配置文件。\n\n| 键 | 值 |\n| --- | --- |\n| port | 5432 |"),
    ]
    with pytest.raises(ChunkingError, match="DOCX"):
        chunk_bytes(b"PK\x03\x04 not really a zip", "x.docx")


def test_chunk_is_frozen() -> None:
    c = Chunk("x")
    with pytest.raises(AttributeError):
        c.content = "y"  # type: ignore[misc]


def test_options_fingerprint_is_stable_across_versions() -> None:
    """Content hashes include the fingerprint: the defaults must keep the text they had before
    heading_prefix existed, or every stored document would be re-embedded after an upgrade."""
    assert (
        ChunkingOptions().fingerprint() == "ChunkingOptions(max_chars=800, overlap=0, min_chars=80, heading_levels=3)"
    )
    assert ChunkingOptions(max_chars=400).fingerprint() != ChunkingOptions().fingerprint()
    assert ChunkingOptions(heading_prefix=False).fingerprint() != ChunkingOptions().fingerprint()
