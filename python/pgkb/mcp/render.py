"""Text renderings of results within the response budget (contents trimmed, never whole results)."""

from __future__ import annotations

from pgkb.chunking import breadcrumb
from pgkb.mcp.output import (
    SearchOutput,
    SearchResultItem,
)
from pgkb.search import SearchResponse
from pgkb.serving.arguments import (
    _shown,
)
from pgkb.serving.config import (
    RESPONSE_BUDGET_CHARS,
)


def _trim(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[: max(0, limit - 12)].rstrip() + " …[trimmed]", True


def render_search(response: SearchResponse, notes: list[str]):
    """A CallToolResult: structured content + concise text, within RESPONSE_BUDGET_CHARS (contents trimmed,
    never whole results)."""
    from mcp.types import CallToolResult, TextContent

    hits = response.results
    # text and structured content both carry the contents: half the budget each, minus the fixed parts
    overhead = 600 + sum(400 + len(h.title) * 2 + len(h.source) * 2 + 40 * len(h.heading_path) for h in hits)
    budget = max(2000, (RESPONSE_BUDGET_CHARS - overhead) // 2)
    trimmed_ranks: list[int] = []
    contents: list[str] = []
    remaining = budget
    for i, hit in enumerate(hits):
        share = remaining // (len(hits) - i)  # fair share; unused share goes to later results
        content, cut = _trim(hit.content, max(200, share))
        if cut:
            trimmed_ranks.append(i + 1)
        contents.append(content)
        remaining -= len(content)
    notes = list(notes)
    if trimmed_ranks:
        notes.append(
            f"content of results {', '.join(map(str, trimmed_ranks))} was trimmed to fit the response size "
            "budget; get_document(doc_id, kb, chunk_index) returns the full text"
        )
    items = []
    for rank, (hit, content) in enumerate(zip(hits, contents, strict=True), 1):
        item = SearchResultItem(
            rank=rank,
            content=content,
            title=hit.title,
            kb=hit.kb,
            doc_id=hit.doc_key,
            chunk_index=hit.chunk_index,
            heading_path=list(hit.heading_path),
            source=hit.source,
            uri=hit.uri,
            also_in=hit.also_in,
            score=hit.final_score,
            fused_score=hit.score,
            vector_rank=hit.vector_rank,
            lexical_rank=hit.lexical_rank,
            fuzzy_rank=hit.fuzzy_rank,
            rerank_score=hit.rerank_score,
            content_trimmed=rank in trimmed_ranks,
        ).model_dump(mode="json")
        if item["rerank_score"] is None:
            del item["rerank_score"]
        items.append(item)
    if response.below_min_score:
        notes.append(f"{response.below_min_score} results scored below PGKB_RERANK_MIN_SCORE and were dropped")
    if response.translation:
        notes.append(
            f"part of the knowledge is in another language than the query: it was also searched as its word-by-word "
            f"offline translation ({_shown(response.translation)}); your own translation in `also` finds more"
        )
    output = SearchOutput(
        query=response.query,
        kb=response.kb,
        top_k=response.top_k,
        result_count=len(items),
        results=[],
        degraded=response.degraded,
        degraded_reason=response.degraded_reason,
        reranked=response.reranked,
        trimmed=bool(trimmed_ranks),
        notes=notes,
        timings_ms=response.timings_ms,
        question_id=response.question_id,
    ).model_dump(mode="json")
    output["results"] = items

    lines: list[str] = []
    if response.degraded:
        lines.append(f"Note: degraded results — {response.degraded_reason}")
    lines.extend(f"Note: {n}" for n in notes)
    if not items:
        where = f' in knowledge base "{response.kb}"' if response.kb else ""
        lines.append(f'No results for "{_shown(response.query)}"{where}. Try other words or list_knowledge_bases.')
    for item in items:
        location = breadcrumb(item["title"] or item["doc_id"], item["heading_path"])
        also = f"; also in {', '.join(item['also_in'])}" if item["also_in"] else ""
        lines.append(f"[{item['rank']}] {location} (score {item['score']:.4f}, {item['source']}{also})")
        lines.append(item["content"])
        lines.append("")
    text = "\n".join(lines).rstrip() + "\n"
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=output)


def render_document(doc: dict, budget: int) -> tuple[dict, str]:
    """Fit a document's chunks into ``budget`` characters (text and structured both carry them: half each);
    chunks left out are named in the notes."""
    notes: list[str] = []
    half = max(2000, budget // 2 - 2000)
    chunks, used, omitted_from = [], 0, None
    for chunk in doc["chunks"]:
        room = half - used
        if room < 200:
            omitted_from = chunk["chunk_index"]
            break
        content, cut = _trim(chunk["content"], room)
        chunks.append({**chunk, "content": content, "content_trimmed": cut})
        used += len(content) + 40
        if cut:
            notes.append(f"chunk {chunk['chunk_index']} was trimmed to fit the size budget")
    if omitted_from is not None:
        last = doc["chunks"][-1]["chunk_index"]
        notes.append(
            f"chunks {omitted_from}..{last} were left out to fit the size budget; call get_document with "
            f"chunk_index={omitted_from} (and a window) to read them"
        )
    out = {**doc, "chunks": chunks, "trimmed": bool(notes), "notes": notes}
    lines = [f"# {doc['title'] or doc['doc_id']}", f"{doc['source']} ({doc['kb']}, {doc['chunk_count']} chunks)"]
    lines.extend(f"Note: {n}" for n in notes)
    for chunk in chunks:
        heading = " > ".join(chunk["heading_path"])
        lines.append("")
        lines.append(f"[chunk {chunk['chunk_index']}]" + (f" {heading}" if heading else ""))
        lines.append(chunk["content"])
    return out, "\n".join(lines) + "\n"


def render_answer(question: str, kb: str | None, row: dict, notes: list[str]):
    """A CallToolResult for ask_knowledge: the answer, then its numbered sources (structured: AskOutput)."""
    from mcp.types import CallToolResult, TextContent

    from pgkb.answer import notes as answer_notes
    from pgkb.answer import source_line
    from pgkb.mcp.output import AskOutput, Citation

    notes = list(notes) + [_shown(n, 400) for n in answer_notes(row)]
    citations = [
        {
            **c,
            "heading_path": list(c.get("heading_path") or []),
            "page": c.get("page"),
            "also_in": c.get("also_in") or [],
        }
        for c in row["citations"] or []
    ]
    output = AskOutput(
        question=question,
        kb=kb,
        answer=row["answer"],
        found=bool(row["found"]),
        mode=row["mode"],
        model=row["model"],
        citations=[Citation.model_validate(c) for c in citations],
        dropped_citations=row["dropped_citations"] or 0,
        uncited=bool(row["uncited"]),
        notes=notes,
        timings_ms={k: round(float(row[f"{k}_ms"] or 0), 1) for k in ("retrieve", "generate", "total")},
        question_id=(row["evidence"] or {}).get("question_id"),
    ).model_dump(mode="json")
    lines = [row["answer"]]
    if citations:
        lines += ["", "Sources:"] + [source_line(c) for c in citations]
    lines += [f"Note: {n}" for n in notes]
    if output["question_id"] is not None:
        lines.append(
            f"(question_id {output['question_id']}: when the person says whether this helped, rate_answer records it)"
        )
    return CallToolResult(content=[TextContent(type="text", text="\n".join(lines) + "\n")], structured_content=output)


def render_prompt(question: str, messages: list, sources: list, degraded: str) -> str:
    """The answer_with_citations prompt text: kb.answer_prompt's rules (its system message) and its numbered
    sources and question (its user message), followed by where each source is (uri, source URL) so the
    answer can link them."""
    parts = [m["content"] for m in messages]
    if sources:
        where = [
            f"[{s['n']}] {s['uri']}" + (f" ({s['source_url']})" if s.get("source_url") else "")
            + (f", page {s['page']}" if s.get("page") is not None else "")
            for s in sources
        ]  # fmt: skip
        parts.append("Where the sources are (for links; read a kb:// URI as a resource for the whole document):\n"
                     + "\n".join(where))  # fmt: skip
    if degraded:
        parts.append(f"(Note: {degraded}.)")
    return "\n\n".join(parts)


def render_saved(saved):
    """A CallToolResult for save_knowledge (structured: SaveOutput)."""
    from mcp.types import CallToolResult, TextContent

    from pgkb.mcp.output import SaveOutput

    uri = saved.uri
    notes = [saved.note] if saved.note else []
    output = SaveOutput(
        kb=saved.kb, doc_id=saved.doc_key, uri=uri, chunk_count=saved.chunk_count, changed=saved.changed,
        searchable_now=saved.embedded, notes=notes,
    ).model_dump(mode="json")  # fmt: skip
    text = f"Saved {uri} ({saved.chunk_count} chunks" + ("" if saved.changed else ", unchanged") + ")."
    text += (
        " It is searchable now." if saved.embedded else " Keyword search finds it now; semantic search once embedded."
    )
    return CallToolResult(
        content=[TextContent(type="text", text="\n".join([text, *[f"Note: {n}" for n in notes]]) + "\n")],
        structured_content=output,
    )


def render_rating(rating_id: int, question_id: int | None, helpful: bool):
    """A CallToolResult for rate_answer (structured: RateOutput)."""
    from mcp.types import CallToolResult, TextContent

    from pgkb.mcp.output import RateOutput

    output = RateOutput(rating_id=rating_id, question_id=question_id, helpful=helpful).model_dump(mode="json")
    what = f"question {question_id}" if question_id is not None else "the answer (kept alone: it was not logged)"
    text = f"Rated {what} {'helpful' if helpful else 'not helpful'}."
    return CallToolResult(content=[TextContent(type="text", text=text + "\n")], structured_content=output)
