"""The format-independent core: a document as blocks, cut into sections by headings, packed into chunks
of at most ``max_chars`` (recursive splitting, code/table parts, FAQ entries, small-fragment merging, overlap)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from pgkb.chunking.model import Chunk, ChunkingOptions


@dataclass
class _Block:
    kind: str  # heading | text | code | table
    text: str
    level: int = 0  # heading level
    anchor: str = ""
    sticky: bool = False  # a deeper heading kept as text: goes with the next block
    protected: list[tuple[int, int]] = field(default_factory=list)  # char spans never cut (text blocks)
    head: list[str] = field(default_factory=list)  # code: opening fence; table: header + delimiter rows
    body: list[str] = field(default_factory=list)  # code lines / table rows
    tail: list[str] = field(default_factory=list)  # code: closing fence
    meta: dict = field(default_factory=dict)


@dataclass
class _Section:
    path: tuple[str, ...]
    blocks: list[_Block]
    meta: dict
    faq: bool = False


@dataclass
class _Atom:
    text: str
    kind: str = "text"
    standalone: bool = False
    glue: str = "\n\n"  # put before this atom when it follows another atom in the same chunk
    heading: bool = False
    meta: dict = field(default_factory=dict)  # only kept for standalone atoms (code/table parts)
    verbatim: bool = False  # a code block or table: leading indentation matters


_ANCHOR_RE = re.compile(r"\s*\{#([^}\s]*)\}\s*$")
_FAQ_HEADING_RE = re.compile(r"\bfaqs?\b|\bq\s*&\s*a\b|常见问题|常見問題|问答|問答|疑难解答", re.IGNORECASE)
_Q_LINE_RE = re.compile(r"^\s*(?:\*\*|__)?\s*(?:Q|问|問|Question)\s*\d*\s*(?:\*\*|__)?\s*[:：]", re.IGNORECASE)
_A_MARK_RE = re.compile(r"(?:^|\s|\*\*|__)(?:A|答|Answer)\s*\d*\s*(?:\*\*|__)?\s*[:：]", re.IGNORECASE)
_Q_STRIP_RE = re.compile(
    r"^\s*(?:\*\*|__)?\s*(?:Q|问|問|Question)\s*\d*\s*(?:\*\*|__)?\s*[:：]\s*(?:\*\*|__)?\s*", re.I
)
_CONTAINER_RE = re.compile(r"^(\s*):::+\s*(?:([A-Za-z][\w-]*)\b)?\s*(.*?)\s*:*\s*$")

# Split levels of the recursive splitter: cut *after* each match, so separators stay with the text before.
_SPLIT_LEVELS = (
    re.compile(r"\n(?:[ \t]*\n)+"),  # paragraphs
    re.compile(r"\n"),  # lines
    re.compile(r"[。！？；]+[”’」』）)\]\"']*[ \t]*|[.!?]+[”’\")\]']*(?:[ \t]+|$)"),  # sentences
    re.compile(r"[ \t]+"),  # words
)


# --------------------------------------------------------------------------------------------------
# Splitting


def _split(text: str, budget: int, protected: list[tuple[int, int]] | None = None) -> list[str]:
    """Pieces of ``text``, each at most ``budget`` characters where possible; ``"".join(result) == text``."""
    prot = protected or []
    out: list[str] = []
    _split_range(text, 0, len(text), budget, 0, prot, out)
    return [p for p in out if p]


def _inside(pos: int, prot: list[tuple[int, int]]) -> tuple[int, int] | None:
    for s, e in prot:
        if s < pos < e:
            return s, e
    return None


def _split_range(text: str, start: int, end: int, budget: int, level: int, prot, out: list[str]) -> None:
    if end - start <= budget:
        out.append(text[start:end])
        return
    if level >= len(_SPLIT_LEVELS):  # hard split, never inside a protected span
        pos = start
        size = -(-(end - start) // -(-(end - start) // budget))  # equal parts, no tiny tail
        while end - pos > budget:
            cut = pos + size
            span = _inside(cut, prot)
            if span:
                cut = span[0] if span[0] > pos else span[1]
            if cut >= end:
                break
            out.append(text[pos:cut])
            pos = cut
        out.append(text[pos:end])
        return
    cuts = [
        m.end()
        for m in _SPLIT_LEVELS[level].finditer(text, start, end)
        if start < m.end() < end and not _inside(m.end(), prot)
    ]
    if not cuts:
        _split_range(text, start, end, budget, level + 1, prot, out)
        return
    bounds = [start, *cuts, end]
    for a, b in zip(bounds, bounds[1:], strict=False):
        _split_range(text, a, b, budget, level + 1, prot, out)


def _render(atoms: list[_Atom]) -> str:
    out = ""
    for i, a in enumerate(atoms):
        if i == 0:
            out = a.text
        elif a.glue:
            out = out.rstrip() + a.glue + a.text.lstrip("\n")
        else:
            out += a.text
    # keep the indentation of a leading code block or table; trim it off text
    return out.strip("\n").rstrip() if atoms and atoms[0].verbatim else out.strip()


def _block_atoms(block: _Block, opts: ChunkingOptions, budget: int) -> list[_Atom]:
    small = opts.max_chars // 2
    if block.kind in ("code", "table"):
        full = block.text.strip("\n")
        if len(full) <= small:
            return [_Atom(full, "text", verbatim=True)]
        if len(full) <= budget:
            return [_Atom(full, block.kind, standalone=True, meta=dict(block.meta), verbatim=True)]
        head, tail = block.head, block.tail
        overhead = sum(len(x) + 1 for x in head + tail)
        groups: list[list[str]] = []
        cur: list[str] = []
        cur_len = 0
        for line in block.body:
            if cur and cur_len + len(line) + 1 + overhead > budget:
                groups.append(cur)
                cur, cur_len = [], 0
            cur.append(line)
            cur_len += len(line) + 1
        if cur:
            groups.append(cur)
        return [
            _Atom(
                "\n".join(head + g + tail).strip("\n"),
                block.kind,
                standalone=True,
                meta={**block.meta, "part": i + 1, "parts": len(groups)},
                verbatim=True,
            )
            for i, g in enumerate(groups)
        ]
    if block.sticky:
        return [_Atom(block.text.strip(), heading=True)]
    pieces = _split(block.text, budget, block.protected)
    atoms = [_Atom(p, glue="\n\n" if i == 0 else "") for i, p in enumerate(pieces)]
    return [a for a in atoms if a.text.strip()]


def _pack(atoms: list[_Atom], budget: int, min_chars: int) -> list[list[_Atom]]:
    chunks: list[list[_Atom]] = []
    cur: list[_Atom] = []
    for a in atoms:
        if a.standalone:
            carry: list[_Atom] = []
            if cur and cur[-1].heading and len(_render([cur[-1], a])) <= budget:
                carry = [cur.pop()]
            if cur:
                chunks.append(cur)
            chunks.append([*carry, a])
            cur = []
            continue
        if cur and len(_render([*cur, a])) > budget:
            if cur[-1].heading and len(cur) > 1:
                h = cur.pop()
                chunks.append(cur)
                cur = [h]
                if len(_render([*cur, a])) > budget:
                    chunks.append(cur)
                    cur = []
            else:
                chunks.append(cur)
                cur = []
        cur.append(a)
    if cur:
        chunks.append(cur)
    # Rebalance: a short last part of a split borrows atoms from the part before it.
    for i in range(1, len(chunks)):
        prev, last = chunks[i - 1], chunks[i]
        if any(a.standalone for a in prev + last):
            continue
        while len(_render(last)) < min_chars and len(prev) > 1 and len(_render([prev[-1], *last])) <= budget:
            last.insert(0, prev.pop())
    # Merge fragments shorter than min_chars into a neighbour when the result fits.
    changed = True
    while changed and len(chunks) > 1:
        changed = False
        for i, c in enumerate(chunks):
            text = _render(c)
            if len(text) >= min_chars or any(a.standalone for a in c):
                continue
            options = [i - 1, i + 1]
            if text.endswith((":", "：")):
                options.reverse()
            for j in options:
                if 0 <= j < len(chunks):
                    merged = chunks[j] + c if j < i else c + chunks[j]
                    if len(_render(merged)) <= budget:
                        chunks[min(i, j)] = merged
                        del chunks[max(i, j)]
                        changed = True
                        break
            if changed:
                break
    return chunks


def _tail_for_overlap(text: str, n: int) -> str:
    if n <= 0 or not text:
        return ""
    tail = text[-n:]
    if len(tail) < len(text):
        for rx in (_SPLIT_LEVELS[2], _SPLIT_LEVELS[3], _SPLIT_LEVELS[1]):
            m = rx.search(tail)
            if m and m.end() < len(tail):
                tail = tail[m.end() :]
                break
    return tail.strip()


def _section_chunks(sec: _Section, opts: ChunkingOptions) -> list[Chunk]:
    budget = opts.max_chars - opts.overlap
    groups: list[tuple[list[_Block], dict, bool]] = []  # blocks, extra metadata, is_faq
    if sec.faq:
        q = sec.path[-1] if sec.path else ""
        groups.append((sec.blocks, {"question": q} if q else {}, True))
    else:
        groups.extend(_faq_entries(sec.blocks))
    out: list[Chunk] = []
    for blocks, extra, is_faq in groups:
        atoms = [a for b in blocks for a in _block_atoms(b, opts, budget)]
        packed = _pack(atoms, budget, opts.min_chars)
        prev_text = None
        for group in packed:
            content = _render(group)
            if not content:
                continue
            standalone = next((a for a in group if a.standalone), None)
            kind = standalone.kind if standalone else ("faq" if is_faq else "text")
            meta: dict = {**sec.meta, **extra, **(standalone.meta if standalone else {})}
            if opts.overlap and prev_text is not None and kind in ("text", "faq"):
                tail = _tail_for_overlap(prev_text, opts.overlap)
                if tail:
                    content = f"{tail}\n{content}"
                    meta["overlap_chars"] = len(tail) + 1
            prev_text = content if kind in ("text", "faq") else None
            out.append(Chunk(content, sec.path, kind, meta))
    return out


def _faq_entries(blocks: list[_Block]) -> list[tuple[list[_Block], dict, bool]]:
    """Split a section's blocks into (prelude, Q/A entries...) when it contains ``Q: … A: …`` entries."""
    pieces: list[_Block] = []
    found = False
    for b in blocks:
        if (
            b.kind == "text"
            and not b.sticky
            and not b.protected
            and any(_Q_LINE_RE.match(x) for x in b.text.split("\n"))
        ):
            found = True
            cur: list[str] = []
            for line in b.text.split("\n"):
                if _Q_LINE_RE.match(line) and any(x.strip() for x in cur):
                    pieces.append(dataclasses.replace(b, text="\n".join(cur)))
                    cur = []
                cur.append(line)
            pieces.append(dataclasses.replace(b, text="\n".join(cur)))
        else:
            pieces.append(b)
    if not found:
        return [(blocks, {}, False)]
    groups: list[tuple[list[_Block], dict, bool]] = []
    cur_blocks: list[_Block] = []
    cur_q: str | None = None

    def close() -> None:
        if not cur_blocks:
            return
        text = "\n".join(b.text for b in cur_blocks)
        if cur_q is not None and _A_MARK_RE.search(text):
            groups.append((list(cur_blocks), {"question": cur_q}, True))
        elif groups and not groups[-1][2]:
            groups[-1][0].extend(cur_blocks)
        else:
            groups.append((list(cur_blocks), {}, False))

    for b in pieces:
        if b.kind == "text" and _Q_LINE_RE.match(b.text):
            close()
            cur_blocks = [b]
            first = b.text.split("\n", 1)[0]
            q = _Q_STRIP_RE.sub("", first)
            q = re.split(r"\s*(?:\*\*|__)?\s*(?:A|答|Answer)\s*(?:\*\*|__)?\s*[:：]", q, maxsplit=1)[0]
            cur_q = q.strip("*_ \t")
        else:
            cur_blocks.append(b)
    close()
    return groups


def _sections(blocks: list[_Block], opts: ChunkingOptions, base_meta: dict | None = None) -> list[_Section]:
    sections: list[_Section] = [_Section((), [], dict(base_meta or {}))]
    stack: list[tuple[int, str, str]] = []  # level, text, anchor
    for b in blocks:
        if b.kind == "heading" and b.level <= opts.heading_levels:
            while stack and stack[-1][0] >= b.level:
                stack.pop()
            stack.append((b.level, b.text, b.anchor))
            path = tuple(x[1] for x in stack)
            meta = dict(base_meta or {})
            if b.anchor:
                meta["anchor"] = b.anchor
            faq = any(_FAQ_HEADING_RE.search(x[1]) for x in stack[:-1])
            sections.append(_Section(path, [], meta, faq))
        elif b.kind == "heading":
            sections[-1].blocks.append(dataclasses.replace(b, kind="text", sticky=True))
        else:
            sections[-1].blocks.append(b)
    # A heading with neither text nor sub-sections would vanish: keep its text as content.
    for i, s in enumerate(sections):
        has_child = i + 1 < len(sections) and sections[i + 1].path[: len(s.path)] == s.path and s.path
        if s.path and not s.blocks and not has_child:
            s.blocks.append(_Block("text", s.path[-1]))
    return sections


def _chunks_from_blocks(blocks: list[_Block], opts: ChunkingOptions, base_meta: dict | None = None) -> list[Chunk]:
    chunks: list[Chunk] = []
    for sec in _sections(blocks, opts, base_meta):
        if any(b.text.strip() for b in sec.blocks):
            chunks.extend(_section_chunks(sec, opts))
    return chunks
