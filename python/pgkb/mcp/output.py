"""The tools' structured output (pydantic models: the output schemas clients see)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SearchResultItem(BaseModel):
    rank: int = Field(description="1 = best")
    content: str = Field(description="the chunk's text (may be trimmed, see content_trimmed)")
    title: str
    kb: str = Field(description="knowledge base")
    doc_id: str = Field(description="the document key; pass it to get_document")
    chunk_index: int
    heading_path: list[str]
    source: str = Field(description="source URL, else the kb://<kb>/<doc_key> resource URI")
    uri: str = Field(description="kb://<kb>/<doc_key>: read it as a resource for the whole document")
    also_in: list[str] = Field(default=[], description="kb:// URIs of other documents holding the same text")
    score: float = Field(description="the ranking score: rerank_score when reranked, else fused_score")
    fused_score: float = Field(description="fused score of the search legs (kb.hybrid_search score; higher is better)")
    vector_rank: int | None = Field(description="rank in the vector (semantic) leg; null: not found by it")
    lexical_rank: int | None = Field(description="rank in the BM25 leg")
    fuzzy_rank: int | None = Field(description="rank in the fuzzy (typo-correcting BM25) leg")
    rerank_score: float | None = Field(default=None, description="cross-encoder score (only when reranked)")
    content_trimmed: bool = False


class SearchOutput(BaseModel):
    query: str
    kb: str | None
    top_k: int
    result_count: int
    results: list[SearchResultItem]
    degraded: bool = Field(description="true when results are lexical-only or not reranked because of a failure")
    degraded_reason: str | None
    reranked: bool
    trimmed: bool = Field(description="true when some contents were shortened to fit the size budget")
    notes: list[str]
    timings_ms: dict[str, float]
    question_id: int | None = Field(
        default=None,
        description="the question log's id of this call (null: not logged); pass it to rate_answer",
    )


class DocumentChunk(BaseModel):
    chunk_index: int
    heading_path: list[str]
    chunk_type: str
    content: str
    content_trimmed: bool = False


class DocumentOutput(BaseModel):
    kb: str
    doc_id: str
    title: str
    source: str
    uri: str
    chunk_count: int = Field(description="chunks in the whole document")
    updated_at: str
    chunks: list[DocumentChunk]
    trimmed: bool = Field(description="true when chunks or contents were left out to fit the size budget")
    notes: list[str]


class KnowledgeBaseInfo(BaseModel):
    name: str
    visibility: str
    description: str
    document_count: int
    chunk_count: int
    last_updated: str | None
    languages: dict = Field(
        description="shares of its chunks in Chinese (zh), English (en) and other languages, and the main one "
        "(zh, en, other, mixed; null when empty): ask in the main language"
    )
    can_manage: bool = Field(
        default=False, description="you own it or administer pgkb: you may read its question log and gaps"
    )


class KnowledgeBasesOutput(BaseModel):
    knowledge_bases: list[KnowledgeBaseInfo]


class Citation(BaseModel):
    n: int = Field(description="the [n] of the answer that cites this source")
    chunk_id: int
    kb: str = Field(description="knowledge base")
    doc_key: str = Field(description="the document key (doc_id for get_document)")
    title: str | None
    heading_path: list[str]
    page: int | str | None = Field(default=None, description="page of the document (PDFs), when known")
    source_url: str | None
    uri: str = Field(description="kb://<kb>/<doc_key>: read it as a resource for the whole document")
    also_in: list[str] = Field(default=[], description="kb:// URIs of other documents holding the same text")
    quote: str | None = Field(description="the sentence of the chunk that supports the citing statement")


class AskOutput(BaseModel):
    question: str
    kb: str | None
    answer: str = Field(description="the answer with [n] citations, or the not-found sentence")
    found: bool = Field(description='false: the knowledge base holds no answer ("not found"); nothing was made up')
    mode: str = Field(
        description="llm (chat endpoint), extractive (passages of the sources, offline), closest (the nearest "
        "passages, not an answer) or not_found"
    )
    model: str | None = Field(description="the chat model that wrote the answer (mode llm)")
    citations: list[Citation]
    dropped_citations: int = Field(description="citation numbers the answer gave that named no source (removed)")
    uncited: bool = Field(description="true when the answer states something but cites no source")
    notes: list[str]
    timings_ms: dict[str, float]
    question_id: int | None = Field(
        default=None,
        description="the question log's id of this call (null: not logged); pass it to rate_answer",
    )


class SaveOutput(BaseModel):
    kb: str
    doc_id: str = Field(description="the note's document key; saving it again under this doc_key replaces it")
    uri: str = Field(description="kb://<kb>/<doc_key>")
    chunk_count: int
    changed: bool = Field(description="false when the same note was already saved")
    searchable_now: bool = Field(description="true when its chunks were embedded in this call")
    notes: list[str]


class RateOutput(BaseModel):
    rating_id: int
    question_id: int | None = Field(description="the logged question rated (null: the rating is kept alone)")
    helpful: bool
