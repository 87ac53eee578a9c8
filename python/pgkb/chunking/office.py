"""PDF (pypdf, per page, metadata ``page``) and DOCX (python-docx: heading styles, tables)."""

from __future__ import annotations

import io
import re

from pgkb.chunking.blocks import _Block, _chunks_from_blocks
from pgkb.chunking.images import figure_captions
from pgkb.chunking.markdown import _stem
from pgkb.chunking.model import (
    Chunk,
    ChunkedDocument,
    ChunkingError,
    ChunkingOptions,
    ImageRef,
    _normalize_newlines,
)


def chunk_pdf(
    data: bytes, name: str = "", options: ChunkingOptions | None = None, *, images: bool = False
) -> ChunkedDocument:
    """Chunk a PDF's text layer, page by page (metadata ``page``, 1-based). Scanned pages give no text.
    ``images``: also extract the images of every page (pypdf ``page.images``, which needs Pillow) as
    ImageRefs ``page-N-K`` with the page's "Figure N …" lines as captions; one that cannot be extracted
    comes with its ``error``."""
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
    refs = _pdf_images(reader, pages) if images else []
    return ChunkedDocument(pdf_title or _stem(name), meta, chunks, "pdf", refs)


def _pdf_images(reader, pages: list[str]) -> list[ImageRef]:
    refs: list[ImageRef] = []
    for n, page in enumerate(reader.pages, start=1):
        try:
            found = page.images
            count = len(found)
        except Exception as e:  # a broken resource dictionary: the page's images are lost, its text is not
            refs.append(ImageRef(f"page-{n}", page=n, error=f"cannot list the images of page {n}: {_reason(e)}"))
            continue
        captions = figure_captions(pages[n - 1])
        for k in range(count):
            caption = captions[k] if len(captions) == count else "; ".join(captions)[:300]
            try:
                image = found[k]
                refs.append(ImageRef(f"page-{n}-{k + 1}", caption=caption, page=n, data=bytes(image.data)))
            except Exception as e:  # undecodable stream, unsupported filter, Pillow missing ...
                refs.append(ImageRef(f"page-{n}-{k + 1}", caption=caption, page=n, error=_reason(e)))
    return refs


def _reason(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:300] if first else type(e).__name__


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
