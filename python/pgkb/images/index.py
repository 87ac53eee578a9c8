"""A document's images as ``image`` chunks (see pgkb.images)."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from pgkb.chunking import Chunk, ChunkedDocument, ImageRef
from pgkb.folder import FolderError, TooLarge, read_inside
from pgkb.images.captions import Captioning
from pgkb.images.check import FILE_FORMATS, MAX_IMAGE_BYTES, PDF_FORMATS, ImageRejected, check_image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")
_SCHEME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*:")
_CJK_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_WORD_CHAR_RE = re.compile(r"\w")
_PDF_IMAGE_RE = re.compile(rb"/Subtype\s*/Image\b")


@dataclass
class ImageStats:
    captioned: int = 0  # image chunks with a caption (fresh or cached)
    cached: int = 0  # ... of which the caption came from the cache
    uncaptioned: int = 0  # image chunks without a caption: no vision endpoint, or too small to caption
    caption_failed: int = 0  # image chunks without a caption because the vision endpoint failed
    failed: int = 0  # bad images, recorded as ingest failures
    skipped: int = 0  # repeats of an image in the same document, and tiny images inside PDFs

    def add(self, other: ImageStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class LocalImage:
    """A Markdown reference resolved to a file under the ingest root (``rel``: root-relative, NFC)."""

    ref: ImageRef
    rel: str
    data: bytes | None = None
    error: str = ""


@dataclass
class DocumentImages:
    chunks: list[Chunk] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (failure doc_key, reason)
    stats: ImageStats = field(default_factory=ImageStats)
    incomplete: bool = False  # a caption failed: the document is worth another try next run


def may_have_images(name: str, data: bytes) -> bool:
    """A cheap look at a file: can it have images to index (before parsing it)?"""
    suffix = Path(name).suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return True
    if suffix == ".pdf":
        return _PDF_IMAGE_RE.search(data) is not None
    if suffix in (".md", ".markdown", ".mdown", ".mkd", ".mdx"):
        return b"![" in data or b"<img" in data.lower()
    return False


def resolve_references(root: Path, doc_path: Path, refs: list[ImageRef]) -> list[LocalImage]:
    """The references to local files inside ``root``, read (at most MAX_IMAGE_BYTES each). Remote URLs,
    data: URLs, absolute paths and paths leading out of ``root`` (also through a symlink) are not images of
    this folder and are left out; a missing or unreadable file comes back with its ``error``. A file is read
    as resolved once, from ``root`` without following a symlink (pgkb.folder.read_inside)."""
    out: list[LocalImage] = []
    root = root.resolve()
    for ref in refs:
        src = ref.source.split("#", 1)[0].split("?", 1)[0].strip()
        if not src or _SCHEME_RE.match(src) or src.startswith(("/", "\\")):
            continue
        path = (doc_path.parent / unquote(src)).resolve()
        try:
            rel = unicodedata.normalize("NFC", path.relative_to(root).as_posix())
        except ValueError:
            continue  # outside the folder
        image = LocalImage(ref, rel)
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            image.error = f"unsupported image type {path.suffix or '(none)'!r} (supported: png, jpg, jpeg, webp, gif)"
        elif not path.is_file():
            image.error = "image file not found"
        else:
            try:
                image.data = read_inside(root, path.relative_to(root).parts, MAX_IMAGE_BYTES)
            except TooLarge as e:
                image.error = f"image is {e.size / 2**20:.1f} MB; the limit is {MAX_IMAGE_BYTES / 2**20:.0f} MB"
            except FolderError as e:
                image.error = str(e)
            except OSError as e:
                image.error = f"cannot read: {e.strerror or e}"
        out.append(image)
    return out


def image_digest(digest: str, captioning: Captioning, local: list[LocalImage]) -> str:
    """The content hash of a document with images: its own hash, what captions depend on, and the
    content of every image file it references (a changed image is a changed document)."""
    h = hashlib.sha256(f"{digest}|{captioning.tag()}".encode())
    for image in local:
        state = hashlib.sha256(image.data).hexdigest() if image.data is not None else f"error:{image.error}"
        h.update(f"|{image.rel}={state}".encode())
    return h.hexdigest()


def incomplete_digest(digest: str) -> str:
    """The hash stored for a document some of whose captions failed: never equal to a computed one, so
    the next run takes the document again (captions that worked come from the cache then)."""
    return hashlib.sha256(f"{digest}|captions-incomplete".encode()).hexdigest()


def document_language(doc: ChunkedDocument, name: str) -> str:
    """``zh`` when the document (or, without text, its name) is mostly CJK, else ``en``."""
    text = " ".join([doc.title, name, *(c.content for c in doc.chunks[:50]), *(r.alt + r.caption for r in doc.images)])
    cjk = len(_CJK_RE.findall(text))
    words = len(_WORD_CHAR_RE.findall(text))
    return "zh" if cjk and cjk >= 0.2 * words else "en"


@dataclass
class _Item:
    ref: ImageRef
    image_id: str  # metadata "image": root-relative path, or doc_key#page-N-K
    failure_key: str
    label: str  # the line naming the image in the chunk
    data: bytes | None
    error: str
    formats: tuple[str, ...]
    from_pdf: bool = False


def image_chunks(
    doc_key: str,
    doc: ChunkedDocument,
    captioning: Captioning,
    local: list[LocalImage] | None = None,
) -> DocumentImages:
    """The ``image`` chunks of a document and its bad images (failures under ``doc_key#img/PATH`` or
    ``doc_key#page-N-K``; for an image file, under its own doc_key). ``local``: the document's resolved
    Markdown references (resolve_references); PDF and image-file images come with ``doc.images``."""
    language = document_language(doc, doc_key)
    zh = language == "zh"
    items: list[_Item] = []
    if local is not None:
        for found in local:
            label = f"图片：{found.rel}" if zh else f"Image: {found.rel}"
            items.append(
                _Item(found.ref, found.rel, f"{doc_key}#img/{found.rel}", label, found.data, found.error, FILE_FORMATS)
            )
    elif doc.source_type == "image":
        for ref in doc.images:
            label = f"图片：{doc_key}" if zh else f"Image: {doc_key}"
            items.append(_Item(ref, doc_key, doc_key, label, ref.data, ref.error, FILE_FORMATS))
    else:  # PDF
        for ref in doc.images:
            n, k = (ref.source.removeprefix("page-").split("-") + [""])[:2]
            label = f"图片：{doc_key} 第 {n} 页第 {k} 张" if zh else f"Image: {doc_key}, page {n}, image {k}"
            items.append(
                _Item(
                    ref,
                    f"{doc_key}#{ref.source}",
                    f"{doc_key}#{ref.source}",
                    label,
                    ref.data,
                    ref.error,
                    PDF_FORMATS,
                    from_pdf=True,
                )
            )

    out = DocumentImages()
    checked = {}
    for item in items:
        if item.data is not None and not item.error:
            try:
                checked[id(item)] = check_image(item.data, item.formats)
            except ImageRejected as e:
                item.error = str(e)
    cached = captioning.cached([c.sha256 for c in checked.values() if not c.small], language)
    seen: set[str] = set()
    for item in items:
        image = checked.get(id(item))
        if image is None:
            out.failures.append((item.failure_key, f"image {item.image_id}: {item.error or 'no image data'}"))
            out.stats.failed += 1
            if not item.from_pdf and doc.source_type != "image":  # the reference's own text still goes in
                out.chunks.append(_chunk(item, None, None, captioning.model, False))
            continue
        if image.sha256 in seen or (item.from_pdf and image.small):
            out.stats.skipped += 1
            continue
        seen.add(image.sha256)
        caption: str | None = None
        if captioning.captioner is not None and not image.small:
            if image.sha256 in cached:
                caption = cached[image.sha256]
                out.stats.cached += 1
            else:
                try:
                    answer = captioning.ask(image, language)
                except ImageRejected as e:
                    out.failures.append((item.failure_key, f"image {item.image_id}: {e}"))
                    out.stats.failed += 1
                    answer = None
                if answer is not None and answer.error:
                    out.stats.caption_failed += 1
                    out.incomplete = True
                caption = answer.text if answer is not None else None
                if answer is not None and not answer.error and caption is not None:
                    cached[image.sha256] = caption  # a repeat in a later document of this run
        if caption:
            out.stats.captioned += 1
        elif captioning.captioner is None or image.small:
            out.stats.uncaptioned += 1
        out.chunks.append(_chunk(item, image, caption, captioning.model, bool(caption)))
    return out


def _chunk(item: _Item, image, caption: str | None, model: str | None, captioned: bool) -> Chunk:
    ref = item.ref
    lines = [caption] if caption else []
    for text in (ref.alt, ref.caption):
        if text and text not in lines:
            lines.append(text)
    lines.append(item.label)
    metadata: dict = {"image": item.image_id, "captioned": captioned, "caption_model": model if captioned else None}
    if ref.page is not None:
        metadata["page"] = ref.page
    if ref.alt:
        metadata["alt"] = ref.alt
    if image is not None:
        metadata.update(
            image_sha256=image.sha256, image_format=image.format.lower(), width=image.width, height=image.height
        )
    return Chunk("\n\n".join(lines), ref.heading_path, "image", metadata)
