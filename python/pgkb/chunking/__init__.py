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

* Images are collected, not chunked: ``ChunkedDocument.images`` lists the images a Markdown document
  references (``![alt](src "title")``, ``<img>``; with heading path and caption), a PDF's embedded images
  (``images=True``; page and "Figure N" caption) or an image file itself; pgkb.images makes them chunks.

Modules: ``model`` (Chunk, ChunkedDocument, ImageRef, ChunkingOptions, ChunkingError), ``images`` (finding
image references and figure captions), ``blocks`` (the format-independent
sectioning, splitting and packing), one module per format (``markdown``, ``text``, ``html``, ``office`` for PDF
and DOCX) and ``files`` (the chunker for a file name).
"""

from pgkb.chunking.files import chunk_bytes, chunk_file
from pgkb.chunking.html import chunk_html
from pgkb.chunking.markdown import chunk_markdown
from pgkb.chunking.model import Chunk, ChunkedDocument, ChunkingError, ChunkingOptions, ImageRef, breadcrumb
from pgkb.chunking.office import chunk_docx, chunk_pdf
from pgkb.chunking.text import chunk_text

__all__ = [
    "Chunk",
    "breadcrumb",
    "ChunkedDocument",
    "ChunkingError",
    "ChunkingOptions",
    "ImageRef",
    "chunk_bytes",
    "chunk_docx",
    "chunk_file",
    "chunk_html",
    "chunk_markdown",
    "chunk_pdf",
    "chunk_text",
]
