"""The MCP server: tools, resources and prompts, served over stdio or streamable HTTP (`pgkb mcp`)."""

import contextlib
import logging
from typing import Annotated

from pydantic import Field

from pgkb.config import Settings
from pgkb.languages import advice, describe
from pgkb.mcp.http_guard import http_app
from pgkb.mcp.output import (
    AskOutput,
    DocumentOutput,
    KnowledgeBasesOutput,
    RateOutput,
    SaveOutput,
    SearchOutput,
)
from pgkb.mcp.render import (
    render_answer,
    render_document,
    render_prompt,
    render_rating,
    render_saved,
    render_search,
)
from pgkb.mcp.stdio import serve_stdio
from pgkb.search import validate
from pgkb.serving.arguments import (
    ALSO_DESCRIPTION,
    ServiceError,
    _bounded_message,
    _shown,
    check_int,
    check_phrasings,
    check_text,
)
from pgkb.serving.auth import bearer, bearer_user
from pgkb.serving.backend import Backend, open_backend
from pgkb.serving.config import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    MAX_ARGUMENT_CHARS,
    MAX_CHUNK_INDEX,
    MAX_NOTE_CHARS,
    MAX_WINDOW,
    MCP_MAX_TOP_K,
    RESOURCE_BUDGET_CHARS,
    RESPONSE_BUDGET_CHARS,
)

log = logging.getLogger("pgkb.mcp")


def build_server(backend: Backend):
    """The MCPServer with pgkb's tools and document resources."""
    from mcp import MCPError
    from mcp.server.mcpserver import Context, MCPServer, ResourceSecurity
    from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
    from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations

    read_only = ToolAnnotations(
        read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False
    )
    config = backend.config
    # the language of what the server's user can see, so an agent asks in it (HTTP users may see other
    # knowledge: list_knowledge_bases gives each one's languages)
    try:
        hint = advice(backend.knowledge_languages(config.default_user))
    except ServiceError:
        hint = ""
    also_hint = (hint + " " if hint else "") + (
        "also: other phrasings of the same question (up to 3), e.g. its translation into the knowledge's "
        "language; every phrasing is searched and the results fused."
    )
    server = MCPServer(
        "pgkb",
        title="pgkb knowledge base",
        instructions=(
            "Search the team's private knowledge base (docs, runbooks, FAQs). "
            + (hint + " " if hint else "")
            + "Use search_knowledge first, then get_document(doc_id, kb, chunk_index) for more context. "
            "ask_knowledge answers a question with numbered citations, or says the knowledge base has no "
            "answer (found = false); the prompt answer_with_citations hands you the sources and the citation "
            "rules to answer yourself. Cite sources by their source URL or kb:// URI. When the person says "
            "whether an answer helped, rate_answer records it."
            + (
                " save_knowledge keeps what you worked out for the team: ask the person first."
                if config.allow_writes
                else ""
            )
        ),
        version=_version(),
        log_level="INFO" if config.verbose else "WARNING",
    )

    def user_of(ctx: Context | None) -> str | None:
        headers = None
        if ctx is not None:
            with contextlib.suppress(ValueError, AttributeError):
                headers = ctx.headers
        token = bearer(headers.get("authorization")) if headers is not None else None
        if headers is not None and (token is not None or config.tokens):  # HTTP, and a token given or required
            user = bearer_user(backend, token)
            if user is None:
                raise ServiceError("unauthorized: send Authorization: Bearer <token>")
            return user
        return config.default_user

    @server.tool(
        name="search_knowledge",
        title="Search the knowledge base",
        annotations=read_only,
        description="Search the knowledge base (hybrid semantic + keyword + fuzzy search; Chinese and English).\n\n"
        "query: the question or keywords. top_k: results to return (1-20; larger values are capped at 20). "
        'kb: search only this knowledge base ("" = every knowledge base you can see). ' + also_hint + "\n"
        "Returns the best-matching passages with title, heading path, source, doc_id and chunk_index; "
        "call get_document(doc_id, kb, chunk_index) to read around a passage.",
    )
    def search_knowledge(
        query: Annotated[str, Field(description="the question or keywords (Chinese or English)")],
        ctx: Context,
        top_k: Annotated[int, Field(strict=True, description=f"results to return, 1-{MCP_MAX_TOP_K}")] = 5,
        kb: Annotated[str, Field(description='one knowledge base to search; "" = all you can see')] = "",
        also: Annotated[list[str], Field(description=ALSO_DESCRIPTION)] = [],  # noqa: B006 (never mutated)
    ) -> Annotated[CallToolResult, SearchOutput]:
        notes = []
        try:
            if check_int("top_k", top_k, 1) > MCP_MAX_TOP_K:
                notes.append(f"top_k {_shown(top_k, 20)} was capped at {MCP_MAX_TOP_K}")
                top_k = MCP_MAX_TOP_K
            check_text("query", query, MAX_ARGUMENT_CHARS)
            query, top_k = validate(query, top_k, MCP_MAX_TOP_K)
            check_text("kb", kb, MAX_ARGUMENT_CHARS)
            phrasings = check_phrasings(also)
            user = user_of(ctx)
            response = backend.search(user, query, top_k, kb.strip() or None, phrasings)
        except (ServiceError, ValueError) as e:
            raise ToolError(_bounded_message(e, query, kb)) from e
        return render_search(response, notes)

    @server.tool(
        name="ask_knowledge",
        title="Answer from the knowledge base",
        annotations=read_only,
        description="Answer a question from the knowledge base, with numbered citations [n] of the passages used. "
        + also_hint
        + "\n\nReturns answer, found, mode and citations ({n, title, heading_path, page, uri, quote, ...}). "
        'found = false means the knowledge base holds no answer: the answer is then "not found" (知识库中未找到'
        "相关信息 for Chinese questions), never a guess. mode: llm (the server's chat model), extractive (the "
        "passages of the sources that hold the answer, verbatim Markdown, when no chat model is configured), "
        "closest (the nearest passages, not an answer) or not_found.",
    )
    def ask_knowledge(
        question: Annotated[str, Field(description="the question (Chinese or English)")],
        ctx: Context,
        top_k: Annotated[int, Field(strict=True, description=f"sources to retrieve, 1-{MCP_MAX_TOP_K}")] = 5,
        kb: Annotated[str, Field(description='one knowledge base to answer from; "" = all you can see')] = "",
        also: Annotated[list[str], Field(description=ALSO_DESCRIPTION)] = [],  # noqa: B006 (never mutated)
    ) -> Annotated[CallToolResult, AskOutput]:
        try:
            check_text("question", question, MAX_ARGUMENT_CHARS)
            check_int("top_k", top_k, 1, MCP_MAX_TOP_K)
            check_text("kb", kb, MAX_ARGUMENT_CHARS)
            question, top_k = validate(question, top_k, MCP_MAX_TOP_K)
            phrasings = check_phrasings(also)
            row = backend.ask(user_of(ctx), question, top_k, kb.strip() or None, phrasings)
        except (ServiceError, ValueError) as e:
            raise ToolError(_bounded_message(e, question, kb)) from e
        return render_answer(question, kb.strip() or None, row, [])

    @server.tool(
        name="rate_answer",
        title="Rate an answer",
        annotations=ToolAnnotations(
            read_only_hint=False, idempotent_hint=True, destructive_hint=False, open_world_hint=False
        ),
        description="Record whether an answer of ask_knowledge (or a search) helped, when the person says so: "
        "the knowledge base's owner sees unhelpful answers among the questions to write documents for.\n\n"
        "helpful: true or false. question_id: the question_id of the answer (0: it had none, because the "
        "knowledge base keeps no question log; then pass question, and kb if you gave one). note: optional, "
        "what was wrong or missing. Rating the same question_id again replaces the rating.",
    )
    def rate_answer(
        helpful: Annotated[bool, Field(strict=True, description="true: the answer helped; false: it did not")],
        ctx: Context,
        question_id: Annotated[int, Field(strict=True, description="the answer's question_id; 0: none")] = 0,
        note: Annotated[str, Field(description="optional: what was wrong or missing")] = "",
        question: Annotated[str, Field(description="with question_id 0: the question asked")] = "",
        kb: Annotated[str, Field(description="with question_id 0: the knowledge base it was asked of")] = "",
    ) -> Annotated[CallToolResult, RateOutput]:
        try:
            check_int("question_id", question_id, 0, 2**63 - 1)
            check_text("note", note, MAX_ARGUMENT_CHARS)
            check_text("question", question, MAX_ARGUMENT_CHARS)
            check_text("kb", kb, MAX_ARGUMENT_CHARS)
            qid = question_id or None
            rating = backend.rate(
                user_of(ctx), helpful, qid, note.strip() or None, question.strip() or None, kb.strip() or None
            )
        except (ServiceError, ValueError) as e:
            raise ToolError(_bounded_message(e, question, kb)) from e
        return render_rating(rating, qid, helpful)

    if config.allow_writes:

        @server.tool(
            name="save_knowledge",
            title="Save a note to the knowledge base",
            annotations=ToolAnnotations(
                read_only_hint=False, idempotent_hint=True, destructive_hint=True, open_world_hint=False
            ),
            description="Save what you worked out (a fix, a cause, a how-to) as a Markdown note in a knowledge "
            "base you may write, so that your team's searches find it. Ask the person before saving.\n\n"
            "kb: the knowledge base (list_knowledge_bases). title: a short title. body: the note in Markdown, "
            "in the knowledge's language. tags: optional keywords. doc_key: optional; saving the same doc_key "
            '(default: "saved/" and the title) again replaces the note. Returns doc_id, kb, chunk_count and '
            "whether it is searchable at once.",
        )
        def save_knowledge(
            kb: Annotated[str, Field(description="the knowledge base to save into")],
            title: Annotated[str, Field(description="a short title")],
            body: Annotated[str, Field(description="the note, in Markdown")],
            ctx: Context,
            tags: Annotated[list[str], Field(description="optional keywords")] = [],  # noqa: B006 (never mutated)
            doc_key: Annotated[str, Field(description='optional key; "" = "saved/" and the title')] = "",
        ) -> Annotated[CallToolResult, SaveOutput]:
            try:
                check_text("kb", kb, MAX_ARGUMENT_CHARS)
                check_text("title", title, MAX_ARGUMENT_CHARS)
                check_text("body", body, MAX_NOTE_CHARS)
                check_text("doc_key", doc_key, MAX_ARGUMENT_CHARS)
                if not isinstance(tags, list) or len(tags) > 16:
                    raise ServiceError("tags must be a list of at most 16 strings")
                for tag in tags:
                    check_text("tag", tag, MAX_ARGUMENT_CHARS)
                saved = backend.save(user_of(ctx), kb.strip(), title, body, tags, doc_key.strip() or None)
            except (ServiceError, ValueError) as e:
                raise ToolError(_bounded_message(e, kb, title, doc_key)) from e
            return render_saved(saved)

    @server.prompt(
        name="answer_with_citations",
        title="Answer with citations from the knowledge base",
        description="The knowledge base's best passages for a question, numbered, with the citation rules: "
        "for answering it yourself with [n] citations (or saying it is not in the knowledge base)",
    )
    def answer_with_citations(
        question: Annotated[str, Field(description="the question (Chinese or English)")],
        ctx: Context,
        kb: Annotated[str, Field(description="one knowledge base; empty = all you can see")] = "",
        top_k: Annotated[str, Field(description=f"sources to include, 1-{MCP_MAX_TOP_K} (default 5)")] = "5",
        also: Annotated[
            str, Field(description="other phrasings of the question, one per line (e.g. its translation)")
        ] = "",
    ) -> str:
        try:
            check_text("question", question, MAX_ARGUMENT_CHARS)
            check_text("kb", kb, MAX_ARGUMENT_CHARS)
            check_text("also", also, 4 * MAX_ARGUMENT_CHARS)
            check_text("top_k", top_k, 20)
            try:
                k = int(top_k.strip() or "5")
            except ValueError:
                shown = _shown(top_k, 20)
                raise ServiceError(f"top_k must be an integer between 1 and {MCP_MAX_TOP_K}, got {shown}") from None
            question, k = validate(question, k, MCP_MAX_TOP_K)
            phrasings = check_phrasings([line for line in also.splitlines() if line.strip()])
            messages, sources, degraded = backend.answer_prompt(
                user_of(ctx), question, k, kb.strip() or None, phrasings
            )
        except (ServiceError, ValueError) as e:  # an MCPError reaches the client with its message
            raise MCPError(INVALID_PARAMS, _bounded_message(e, question, kb)) from e
        return render_prompt(question, messages, sources, degraded)

    @server.tool(name="get_document", title="Read a document", annotations=read_only)
    def get_document(
        doc_id: Annotated[str, Field(description="the doc_id of a search result (the document key)")],
        ctx: Context,
        kb: Annotated[str, Field(description="the result's knowledge base (needed when ambiguous)")] = "",
        chunk_index: Annotated[
            int, Field(strict=True, description="-1: whole document; else the chunk (0, 1, ...) to centre on")
        ] = -1,
        window: Annotated[
            int, Field(strict=True, description=f"chunks before and after chunk_index, 0-{MAX_WINDOW}")
        ] = 2,
    ) -> Annotated[CallToolResult, DocumentOutput]:
        """Read a document of the knowledge base: all of it (chunk_index -1), or the chunks around one hit
        (chunk_index ± window, window 0-20). doc_id is the doc_id of a search result; pass its kb too when the
        same doc_id exists in several knowledge bases. Very long documents are cut to a size budget and the
        result says which chunks were left out."""
        try:
            check_text("doc_id", doc_id, MAX_ARGUMENT_CHARS)
            check_text("kb", kb, MAX_ARGUMENT_CHARS)
            if check_int("chunk_index", chunk_index, -MAX_CHUNK_INDEX, MAX_CHUNK_INDEX) < -1:
                raise ServiceError(
                    f"chunk_index must be -1 (the whole document) or a chunk number >= 0, got {chunk_index}"
                )
            check_int("window", window, 0, MAX_WINDOW)
            doc = backend.document(user_of(ctx), doc_id, kb.strip() or None, chunk_index, window)
        except ServiceError as e:
            raise ToolError(_bounded_message(e, doc_id, kb)) from e
        out, text = render_document(doc, RESPONSE_BUDGET_CHARS)
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=out)

    @server.tool(name="list_knowledge_bases", title="List knowledge bases", annotations=read_only)
    def list_knowledge_bases(ctx: Context) -> Annotated[CallToolResult, KnowledgeBasesOutput]:
        """The knowledge bases you can search, with their document counts, their languages (ask in the main one)
        and when they last changed."""
        try:
            kbs = backend.knowledge_bases(user_of(ctx))
        except ServiceError as e:
            raise ToolError(_bounded_message(e)) from e
        if kbs:
            text = "\n".join(
                f"- {k['name']} ({k['visibility']}): {k['document_count']} documents, "
                + (f"{describe(k['languages'])}, " if describe(k["languages"]) else "")
                + f"last updated {k['last_updated']}"
                + (f" — {k['description']}" if k["description"] else "")
                for k in kbs
            )
        else:
            text = "No knowledge bases are visible to you."
        return CallToolResult(
            content=[TextContent(type="text", text=text + "\n")], structured_content={"knowledge_bases": kbs}
        )

    @server.resource(
        "kb://{kb}/{+doc_key}",
        name="document",
        title="Knowledge base document",
        description="A whole document of the knowledge base (Markdown), e.g. a search result's uri",
        mime_type="text/markdown",
        security=ResourceSecurity(exempt_params={"doc_key"}),  # a database key, not a file path
    )
    def read_document(kb: str, doc_key: str, ctx: Context) -> str:
        try:
            check_text("knowledge base", kb, MAX_ARGUMENT_CHARS)
            check_text("document key", doc_key, MAX_ARGUMENT_CHARS)
            doc = backend.document(user_of(ctx), doc_key, kb, -1, 0)
        except ServiceError as e:
            message = _bounded_message(e, doc_key, kb)
            if message.startswith("unknown"):
                raise ResourceNotFoundError(message) from e
            raise ResourceError(message) from e
        return render_document(doc, RESOURCE_BUDGET_CHARS)[1]

    return server


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("pgkb")
    except Exception:
        return "0"


def serve(
    settings: Settings,
    *,
    transport: str = "stdio",
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    verbose: bool = False,
    rerank: bool = True,
    allow_writes: bool = False,
) -> int:
    """Serve MCP over stdio or streamable HTTP until stopped (`pgkb mcp`); ``allow_writes`` offers the
    save_knowledge tool. Configuration errors and a role that bypasses visibility print to stderr and
    return 2."""
    if verbose:
        log.setLevel(logging.INFO)
    backend = open_backend(settings, command="mcp", verbose=verbose, rerank=rerank)
    if backend is None:
        return 2
    backend.config.allow_writes = allow_writes
    server = build_server(backend)
    try:
        if transport == "stdio":
            import anyio

            anyio.run(serve_stdio, server)
            return 0
        import uvicorn

        app = http_app(server, backend, host)
        log.info("serving MCP on http://%s:%d/mcp", host, port)
        uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info" if verbose else "warning")).run()
        return 0
    finally:
        backend.close()
