"""`pgkb serve` as a subprocess against the real database: Dify's External Knowledge API (requests shaped
like the spec's examples, every error code, visibility, metadata conditions, the score threshold), the
page's JSON API and its input checks, the Origin / Host guard, and the page itself in a real headless
Chromium (selenium + Debian's chromium-driver).

World (server_process's): team-docs (public, the fixture docs), alice-notes (private to alice, zebramarker),
bob-notes (private to bob, bobmarker), empty-kb (alice); tokens alice-token and bob-token (PGKB_MCP_TOKENS), and
API keys from the database (kb.create_api_key) in the API-key tests."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import fixture_docs
import pytest
import served_bodies
from server_process import (  # noqa: F401 (world is a fixture)
    api_key,
    free_port,
    http_request,
    running,
    seconds_until,
    server_env,
    world,
)

pytestmark = pytest.mark.slow  # starts `pgkb serve`

TOKENS = "alice-token:alice,bob-token:bob"
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}


@pytest.fixture
def web(world):
    # kb.ask embeds questions in the database; there is no endpoint here, so it searches lexically (as test_ask)
    world.execute("update kb.settings set value = '' where key = 'embedding_url'")
    port = free_port()
    # no deadline on query embeddings: the first one (model load) must not degrade a test to lexical-only
    env = {**os.environ, **server_env(world, PGKB_MCP_TOKENS=TOKENS, PGKB_MCP_EMBED_TIMEOUT_MS="0")}
    env.pop("PGKB_USER", None)
    with running(["serve", "--port", str(port)], env, port):
        yield f"http://127.0.0.1:{port}"


def call(url: str, body=None, headers: dict | None = None, method: str | None = None) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of one request (server_process.http_request); every body is recorded for
    the server-path check (served_bodies)."""
    status, raw, got = http_request(url, body, headers, method)
    served_bodies.record(raw)
    try:
        return status, json.loads(raw), got
    except ValueError:
        return status, {"raw": raw.decode(errors="replace")}, got


def retrieval(**overrides) -> dict:
    """The spec's example request (top_k 2, score_threshold 0.5) with pgkb's names."""
    body = {
        "knowledge_id": "team-docs",
        "query": "登录态失效怎么排查",
        "retrieval_setting": {"top_k": 2, "score_threshold": 0.5},
    }
    body.update(overrides)
    return body


DROP_ASK = (
    "drop function kb.ask(text, integer, text, jsonb, text, boolean, vector, text, double precision, text[], vector[])"
)


# ------------------------------------------------------------------------------------------------- Dify


def test_dify_spec_request_gets_the_documented_response(web):
    status, out, headers = call(web + "/retrieval", retrieval(), ALICE)
    assert status == 200 and headers["content-type"] == "application/json"
    assert list(out) == ["records"] and 1 <= len(out["records"]) <= 2
    for record in out["records"]:
        assert set(record) == {"content", "score", "title", "metadata"}
        assert isinstance(record["content"], str) and isinstance(record["title"], str)
        assert 0.5 <= record["score"] <= 1
        assert isinstance(record["metadata"], dict)  # an object, never null
    top = out["records"][0]
    assert top["title"] == "登录态失效排查手册" and "token 过期" in top["content"]
    assert top["metadata"] == {
        "kb": "team-docs",
        "doc_id": "guide/login.md",
        "chunk_index": 0,
        "heading_path": ["排查步骤"],
        "path": "kb://team-docs/guide/login.md",
    }
    scores = [r["score"] for r in out["records"]]
    assert scores == sorted(scores, reverse=True)


def test_dify_threshold(web):
    everything = call(web + "/retrieval", retrieval(retrieval_setting={"top_k": 10, "score_threshold": 0.0}), ALICE)[1]
    scores = [r["score"] for r in everything["records"]]
    assert len(scores) == 7 and scores == sorted(scores, reverse=True)  # every chunk of team-docs, pgkb's order
    kept = call(web + "/retrieval", retrieval(retrieval_setting={"top_k": 10, "score_threshold": 0.5}), ALICE)[1]
    assert kept["records"] == [r for r in everything["records"] if r["score"] >= 0.5]  # a prefix
    assert 0 < len(kept["records"]) < len(scores)
    nothing = call(web + "/retrieval", retrieval(query="best pizza recipe"), ALICE)
    assert nothing[:2] == (200, {"records": []})
    integer = call(web + "/retrieval", retrieval(retrieval_setting={"top_k": 1, "score_threshold": 1}), ALICE)
    assert integer[:2] == (200, {"records": []})  # an integer threshold is a number too


def test_dify_authorization_errors(web):
    url = web + "/retrieval"
    bad_format = {
        "error_code": 1001,
        "error_msg": "Invalid Authorization header format. Expected 'Bearer <api-key>' format.",
    }
    for headers in (
        {},
        {"Authorization": "alice-token"},
        {"Authorization": "Basic YWxpY2U6eA=="},
        {"Authorization": "Bearer "},
    ):
        assert call(url, retrieval(), headers)[:2] == (403, bad_format), headers
    for token in ("wrong", "alice-token2", "alice"):
        assert call(url, retrieval(), {"Authorization": f"Bearer {token}"})[:2] == (
            403, {"error_code": 1002, "error_msg": "Authorization failed"}
        )  # fmt: skip
    # authorization is checked before the body is read
    assert call(url, b"{not json", {"Authorization": "Bearer wrong"})[1]["error_code"] == 1002


def test_dify_knowledge_bases_follow_visibility_without_an_existence_oracle(web):
    url = web + "/retrieval"
    mine = call(url, retrieval(knowledge_id="alice-notes", query="zebramarker"), ALICE)[1]["records"]
    assert [r["metadata"]["doc_id"] for r in mine][:1] == ["zebramarker.md"]
    hidden = call(url, retrieval(knowledge_id="bob-notes", query="bobmarker"), ALICE)
    missing = call(url, retrieval(knowledge_id="no-such-kb", query="bobmarker"), ALICE)
    assert hidden[0] == missing[0] == 404
    assert hidden[1]["error_code"] == missing[1]["error_code"] == 2001
    assert hidden[1]["error_msg"].replace("bob-notes", "X") == missing[1]["error_msg"].replace("no-such-kb", "X")
    assert call(url, retrieval(knowledge_id="bob-notes", query="bobmarker"), BOB)[0] == 200
    assert call(url, retrieval(knowledge_id="x" * 500), ALICE)[1]["error_code"] == 2001


def test_dify_metadata_condition(web, world):
    for key, metadata in (
        ("hr/leave.md", {"category": "hr", "year": 2024}),
        ("ops/old.md", {"category": "ops", "year": 2019}),
    ):
        world.execute(
            "select * from kb.replace_document(kb => 'team-docs', doc_key => %s, title => %s, chunks => %s::jsonb,"
            " metadata => %s::jsonb)",
            [key, key, json.dumps([{"content": f"请假流程 vacation policy ({key})"}]), json.dumps(metadata)],
        )
    url = web + "/retrieval"
    setting = {"top_k": 5, "score_threshold": 0.0}

    def docs(condition):
        status, out, _ = call(
            url, retrieval(query="请假流程", retrieval_setting=setting, metadata_condition=condition), ALICE
        )
        assert status == 200, out
        return [r["metadata"]["doc_id"] for r in out["records"]]

    only_hr = docs(
        {"logical_operator": "and", "conditions": [{"name": "category", "comparison_operator": "is", "value": "hr"}]}
    )
    assert only_hr == ["hr/leave.md"]
    recent = docs({"conditions": [{"name": "year", "comparison_operator": "≥", "value": 2020}]})
    assert recent == ["hr/leave.md"]
    either = docs({"logical_operator": "or", "conditions": [
        {"name": "category", "comparison_operator": "is", "value": "hr"},
        {"name": "year", "comparison_operator": "<", "value": 2020},
    ]})  # fmt: skip
    assert set(either) == {"hr/leave.md", "ops/old.md"}
    records = call(url, retrieval(query="请假流程", retrieval_setting=setting), ALICE)[1]["records"]
    hr = [r for r in records if r["metadata"]["doc_id"] == "hr/leave.md"]
    assert hr and hr[0]["metadata"]["category"] == "hr"  # the document's metadata comes along
    status, out, _ = call(url, retrieval(metadata_condition={"conditions": [
        {"name": "category", "comparison_operator": "all of", "value": ["a"]}]}), ALICE)  # fmt: skip
    assert status == 400 and out["error_code"] == 400 and "all of" in out["error_msg"]
    assert call(url, retrieval(metadata_condition=[1]), ALICE)[0] == 400


@pytest.mark.parametrize(
    "value, reason",
    [
        (b'"1e999"', "double precision"),
        (b"1e999", "1e999"),
        (b'"NaN"', "must be a finite number"),
        (b"-1e400", "1e400"),
    ],
)
def test_dify_out_of_range_condition_value_is_a_400_with_a_reason(web, value, reason):
    """A value no double holds is the caller's mistake (400 and why), not an unavailable database (503)."""
    condition = {"conditions": [{"name": "year", "comparison_operator": ">", "value": "VALUE"}]}
    body = json.dumps(retrieval(metadata_condition=condition)).encode().replace(b'"VALUE"', value)
    status, out, _ = call(web + "/retrieval", body, ALICE)
    assert status == 400 and out["error_code"] == 400, out
    assert reason in out["error_msg"] and "out of range for type" not in out["error_msg"], out


MALFORMED_DIFY_BODIES = [
    (b"", 400, "empty"),
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b'{"query": NaN}', 400, "NaN"),
    (b"\xff\xfe", 400, "not UTF-8"),
    (b"[" * 5000 + b"]" * 5000, 400, "nested deeper"),
    (json.dumps(retrieval(query="\ud800")).encode(), 400, "unpaired surrogate"),  # json escapes it: \\ud800
    (json.dumps(retrieval(query="a\x00b")).encode(), 400, "NUL"),
    (json.dumps(retrieval(query="x" * 70_000)).encode(), 413, "larger than"),
    (json.dumps(retrieval(query="x" * 5000)).encode(), 400, "at most 4000"),
    (json.dumps(retrieval(query="   ")).encode(), 400, "must not be empty"),
    (json.dumps(retrieval(query=7)).encode(), 400, "query must be a string"),
    (json.dumps(retrieval(knowledge_id="")).encode(), 400, "knowledge_id"),
    (json.dumps({"knowledge_id": "team-docs", "query": "x"}).encode(), 400, "retrieval_setting"),
    (json.dumps(retrieval(retrieval_setting={"top_k": 0, "score_threshold": 0.5})).encode(), 400, "top_k"),
    (json.dumps(retrieval(retrieval_setting={"top_k": 51, "score_threshold": 0.5})).encode(), 400, "top_k"),
    (json.dumps(retrieval(retrieval_setting={"top_k": "5", "score_threshold": 0.5})).encode(), 400, "top_k"),
    (json.dumps(retrieval(retrieval_setting={"top_k": True, "score_threshold": 0.5})).encode(), 400, "top_k"),
    (json.dumps(retrieval(retrieval_setting={"top_k": 5})).encode(), 400, "score_threshold"),
    (json.dumps(retrieval(retrieval_setting={"top_k": 5, "score_threshold": 1.5})).encode(), 400, "threshold"),
]  # fmt: skip


def test_dify_malformed_bodies(web):
    for body, status, message in MALFORMED_DIFY_BODIES:
        got, out, _ = call(web + "/retrieval", body, ALICE)
        assert got == status and out["error_code"] == status and message in out["error_msg"], (body[:100], out)


# ---------------------------------------------------------------------------------------- the page's API


def test_api_needs_a_token(web):
    assert call(web + "/api/kbs")[0] == 401
    assert call(web + "/api/kbs", headers={"Authorization": "Bearer nope"})[0] == 401
    assert call(web + "/api/search", {"query": "退款"})[0] == 401
    status, out, _ = call(web + "/api/kbs", headers=ALICE)
    assert status == 200 and out["user"] == "alice"
    assert [k["name"] for k in out["knowledge_bases"]] == ["alice-notes", "empty-kb", "team-docs"]


def test_api_search_highlights_with_the_database_tokenizer(web):
    status, out, _ = call(web + "/api/search", {"query": "登录态失效", "kb": "team-docs"}, ALICE)
    assert status == 200 and out["degraded"] is False
    top = out["results"][0]
    assert (top["title"], top["heading_path"], top["source"], top["page"]) == (
        "登录态失效排查手册", ["排查步骤"], "kb://team-docs/guide/login.md", None
    )  # fmt: skip
    assert {p["text"] for p in top["snippet"] if p["hit"]} == {"登录", "登录态失效"}  # 用户登录后 … 导致登录态失效
    assert "".join(p["text"] for p in top["snippet"]).startswith("用户登录后 token 过期")
    # visibility: alice never sees bob's notes, and his knowledge base answers like a missing one
    everywhere = call(web + "/api/search", {"query": "bobmarker zebramarker", "top_k": 20}, ALICE)[1]
    assert {r["kb"] for r in everywhere["results"]} <= {"team-docs", "alice-notes"}
    hidden = call(web + "/api/search", {"query": "bobmarker", "kb": "bob-notes"}, ALICE)
    missing = call(web + "/api/search", {"query": "bobmarker", "kb": "nope"}, ALICE)
    assert hidden[0] == missing[0] == 404
    assert hidden[1]["error"].replace("bob-notes", "X") == missing[1]["error"].replace("nope", "X")


def test_api_search_and_ask_take_other_phrasings(web):
    """also: the question's translation is searched too (fused once) and marked in the snippets; /api/kbs
    says each knowledge base's language in words."""
    listed = call(web + "/api/kbs", headers=ALICE)[1]
    assert listed["language"].startswith("mostly Chinese"), listed  # all alice may read
    kbs = {k["name"]: k for k in listed["knowledge_bases"]}
    assert kbs["team-docs"]["language"].startswith("mostly Chinese") and kbs["team-docs"]["languages"]["zh"] > 0.5
    assert kbs["empty-kb"]["language"] == ""
    body = {"query": "qqzzunheardof", "kb": "team-docs"}
    assert call(web + "/api/search", body, ALICE)[1]["results"][0]["title"] != "退款政策"  # the vector leg's guess
    status, out, _ = call(web + "/api/search", {**body, "also": ["退款"]}, ALICE)
    assert status == 200 and out["also"] == ["退款"]
    assert out["results"][0]["title"] == "退款政策"
    assert "退款" in {p["text"] for p in out["results"][0]["snippet"] if p["hit"]}
    status, row, _ = call(web + "/api/ask", {**body, "question": body["query"], "also": ["退款"]}, ALICE)
    assert status == 200 and row["citations"][0]["title"] == "退款政策", row


BAD_API_INPUT = [
    ("/api/search", b"", 400, "empty"),
    ("/api/search", b"{", 400, "not valid JSON"),
    ("/api/search", b'"just a string"', 400, "JSON object"),
    ("/api/search", b'{"query": "\\udc00x"}', 400, "unpaired surrogate"),
    ("/api/search", json.dumps({"query": "x" * 70_000}).encode(), 413, "larger than"),
    ("/api/search", json.dumps({"query": ""}).encode(), 400, "query must not be empty"),
    ("/api/search", json.dumps({"kb": "team-docs"}).encode(), 400, "query is required"),
    ("/api/search", json.dumps({"query": " \u3000 "}).encode(), 400, "must not be empty"),
    ("/api/search", json.dumps({"query": "x" * 4001}).encode(), 400, "at most 4000"),
    ("/api/search", json.dumps({"query": ["x"]}).encode(), 400, "must be a string"),
    ("/api/search", json.dumps({"query": "x", "top_k": 0}).encode(), 400, "top_k must be between 1 and 20"),
    ("/api/search", json.dumps({"query": "x", "top_k": 21}).encode(), 400, "top_k must be between 1 and 20"),
    ("/api/search", json.dumps({"query": "x", "top_k": 2.0}).encode(), 400, "top_k must be an integer"),
    ("/api/search", json.dumps({"query": "x", "kb": 5}).encode(), 400, "kb must be a string"),
    ("/api/document", json.dumps({"doc_id": ""}).encode(), 400, "doc_id must not be empty"),
    ("/api/document", json.dumps({"doc_id": "x", "window": 99}).encode(), 400, "window"),
    ("/api/document", json.dumps({"doc_id": "bobmarker.md", "kb": "bob-notes"}).encode(), 404, "unknown"),
    ("/api/ask", json.dumps({"question": None}).encode(), 400, "question is required"),
    ("/api/ask", json.dumps({"question": "x", "top_k": 100}).encode(), 400, "top_k"),
    ("/api/search", json.dumps({"query": "x", "also": "登录"}).encode(), 400, "also must be a list of strings"),
    ("/api/search", json.dumps({"query": "x", "also": [1]}).encode(), 400, "also[1] must be a string"),
    ("/api/search", json.dumps({"query": "x", "also": ["a", "b", "c", "d"]}).encode(), 400, "at most"),
    ("/api/search", json.dumps({"query": "x", "also": ["\u3000"]}).encode(), 400, "also[1] must not be empty"),
    ("/api/search", b'{"query": "x", "also": ["\\udc00"]}', 400, "unpaired surrogate"),
    ("/api/ask", json.dumps({"question": "x", "also": {"a": 1}}).encode(), 400, "also must be a list"),
]  # fmt: skip


def test_api_bad_input(web):
    for path, body, status, message in BAD_API_INPUT:
        got, out, _ = call(web + path, body, ALICE)
        assert got == status and message in out["error"], (path, body[:100], out)


def test_api_document(web):
    status, doc, _ = call(
        web + "/api/document", {"kb": "team-docs", "doc_id": "guide/login.md", "chunk_index": 1}, ALICE
    )
    assert status == 200 and doc["title"] == "登录态失效排查手册" and doc["chunk_count"] == 2
    assert [c["chunk_index"] for c in doc["chunks"]] == [0, 1]


def test_api_ask_hands_kb_ask_through_and_answers_501_without_it(web, world):
    status, out, _ = call(web + "/api/ask", {"question": "无理由退款", "kb": "team-docs", "top_k": 3}, ALICE)
    assert status == 200, out
    assert {"answer", "found", "citations", "mode", "model"} <= set(out)
    assert out["found"] is True and out["answer"], out
    assert "policy/refund.md" in {c["doc_key"] for c in out["citations"]}
    for citation in out["citations"]:
        assert {"n", "kb", "doc_key", "title", "heading_path", "uri"} <= set(citation)
    hidden = call(web + "/api/ask", {"question": "bobmarker", "kb": "bob-notes"}, ALICE)
    missing = call(web + "/api/ask", {"question": "bobmarker", "kb": "nope"}, ALICE)
    assert hidden[0] == missing[0] == 404
    assert hidden[1]["error"].replace("bob-notes", "X") == missing[1]["error"].replace("nope", "X")
    # a database without kb.ask (older or partly migrated): 501 with a clear message
    world.execute(DROP_ASK)
    status, out, _ = call(web + "/api/ask", {"question": "退款多久到账"}, ALICE)
    assert status == 501 and "kb.ask" in out["error"] and "lacks a function" in out["error"], out


def test_the_path_check_has_server_paths_to_find(world):
    """The world's team-docs record their sources as paths on the server (tests/served_bodies.py fails any
    test whose responses show one), so the check after each test here can fail."""
    paths = served_bodies.server_paths(world)
    sources = [p for p in paths if p.endswith(".md")]
    assert len(sources) == len(fixture_docs.DOCS), paths
    assert served_bodies.leaks([json.dumps({"source": sources[0]})], paths)


def test_api_shows_sources_people_can_open_and_each_title_once(web, world):
    # alice-notes' guide/login.md opens with a heading that repeats its title: shown once
    status, out, _ = call(web + "/api/search", {"query": "alice 自己记录的登录问题", "kb": "alice-notes"}, ALICE)
    assert status == 200 and out["results"], out
    top = out["results"][0]
    assert (top["title"], top["heading_path"], top["source"]) == (
        "alice 的登录笔记", ["问题"], "kb://alice-notes/guide/login.md"
    )  # fmt: skip
    status, doc, _ = call(web + "/api/document", {"kb": "alice-notes", "doc_id": "guide/login.md"}, ALICE)
    assert status == 200 and doc["chunks"][0]["heading_path"] == ["问题"], doc
    # team-docs' sources are paths on the server: the page gets the kb:// URI
    status, doc, _ = call(web + "/api/document", {"kb": "team-docs", "doc_id": "guide/login.md"}, ALICE)
    assert status == 200 and doc["source"] == "kb://team-docs/guide/login.md", doc
    status, out, _ = call(web + "/api/ask", {"question": "无理由退款", "kb": "team-docs"}, ALICE)
    assert status == 200 and out["citations"], out
    assert all(c["source_url"] is None for c in out["citations"])
    # a web address is handed out as it is
    world.execute(
        "update kb.documents set source_url = 'https://git.example.com/refund.md' where doc_key = 'policy/refund.md'"
    )
    top = call(web + "/api/search", {"query": "无理由退款", "kb": "team-docs"}, ALICE)[1]["results"][0]
    assert top["source"] == "https://git.example.com/refund.md"


def test_api_ask_says_when_the_answer_is_lexical_only(world, dead_embedding_url):
    """The embedding service down (the server's, and the database's, which is not asked again)."""
    world.execute("update kb.settings set value = %s where key = 'embedding_url'", [dead_embedding_url])
    port = free_port()
    env = {**os.environ, **server_env(world, PGKB_MCP_TOKENS=TOKENS, PGKB_EMBED_PROVIDER="http")}
    env.update(PGKB_EMBED_URL=dead_embedding_url)
    env.pop("PGKB_USER", None)
    with running(["serve", "--port", str(port)], env, port):
        status, out, _ = call(f"http://127.0.0.1:{port}/api/ask", {"question": "无理由退款", "kb": "team-docs"}, ALICE)
    assert status == 200 and out["found"] is True, out
    said = out["evidence"]["lexical_only"]
    assert said.startswith("lexical only: query embedding failed (") and "unreachable" in said, said
    assert said in out["notes"]  # what the page shows under the answer


def test_api_one_result_per_text_and_where_else_it_is(web, world):
    refund = fixture_docs.DOCS[1][2][0][0]
    for key in ("refund-copy.md", "refund-again.md"):  # twice in alice's private notes
        world.execute(
            "select * from kb.replace_document('alice-notes', %s, '退款政策', %s::jsonb)",
            [key, json.dumps([{"content": refund}])],
        )
    copies_of_alice = ["kb://alice-notes/refund-again.md", "kb://alice-notes/refund-copy.md"]
    for token, also_in in ((ALICE, copies_of_alice), (BOB, [])):
        status, out, _ = call(web + "/api/search", {"query": "无理由退款", "top_k": 10}, token)
        assert status == 200
        copies = [r for r in out["results"] if "无理由退款" in "".join(p["text"] for p in r["snippet"])]
        assert len(copies) == 1 and copies[0]["doc_id"] == "policy/refund.md", out["results"]
        assert copies[0]["also_in"] == also_in  # bob cannot read alice-notes: nothing said about it
    status, out, _ = call(web + "/api/ask", {"question": "无理由退款"}, ALICE)
    assert status == 200 and len({c["quote"] for c in out["citations"]}) == len(out["citations"]), out
    records = call(web + "/retrieval", retrieval(query="无理由退款", knowledge_id="alice-notes"), ALICE)[1]["records"]
    assert [r["content"] for r in records].count(refund) == 1, records
    top = records[0]["metadata"]
    assert sorted([f"kb://alice-notes/{top['doc_id']}", *top["also_in"]]) == copies_of_alice, records


def test_origin_and_host_guard(web):
    port = web.rsplit(":", 1)[1]
    assert call(web + "/api/kbs", headers={**ALICE, "Origin": "https://evil.example.com"})[0] == 403
    assert call(web + "/retrieval", retrieval(), {**ALICE, "Origin": "https://evil.example.com"})[0] == 403
    assert call(web + "/api/kbs", headers={**ALICE, "Origin": f"http://127.0.0.1:{port}"})[0] == 200
    assert call(web + "/api/kbs", headers={**ALICE, "Origin": "http://localhost:3000"})[0] == 200
    assert call(web + "/api/kbs", headers={**ALICE, "Host": f"attacker.example:{port}"})[0] == 421
    assert call(web + "/", headers={"Host": "rebound.example"}, method="GET")[0] == 421


def test_page_is_self_contained(web):
    status, page, headers = call(web + "/", method="GET")
    html = page["raw"]
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in headers["content-security-policy"] and "script-src 'self'" in headers[
        "content-security-policy"]  # fmt: skip
    for name in ("/", "/app.js", "/style.css"):
        status, body, _ = call(web + name, method="GET")
        assert status == 200
        text = body["raw"]
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name  # nothing external
    assert '<script src="/app.js"' in html and '<link rel="stylesheet" href="/style.css">' in html
    assert call(web + "/nothing-here", method="GET")[0] == 404


# --------------------------------------------------------------------------------------- a real browser


def chromium():
    """Debian's chromium and chromium-driver, or a skip saying which is missing."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("chromium and chromium-driver are not installed (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (dev extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    flags = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000")
    for flag in flags:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def test_page_in_a_real_browser(web, world):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser = chromium()
    # results are re-rendered while a condition reads them: a stale element means "look again"
    wait = WebDriverWait(browser, 90, ignored_exceptions=(StaleElementReferenceException,))
    try:
        browser.get(web + "/")
        assert browser.find_element(By.ID, "app").is_displayed() is False
        # a wrong token is refused
        browser.find_element(By.ID, "token").send_keys("wrong-token\n")
        wait.until(ec.visibility_of_element_located((By.ID, "signin-error")))
        assert "not valid" in browser.find_element(By.ID, "signin-error").text
        # sign in: the knowledge-base picker lists what alice may see
        browser.find_element(By.ID, "token").clear()
        browser.find_element(By.ID, "token").send_keys("alice-token\n")
        wait.until(ec.visibility_of_element_located((By.ID, "query")))
        assert browser.find_element(By.ID, "who-name").text == "Signed in as alice"
        picker = Select(browser.find_element(By.ID, "kb"))
        assert [o.get_attribute("value") for o in picker.options] == ["", "alice-notes", "empty-kb", "team-docs"]
        assert browser.execute_script("return sessionStorage.getItem('pgkb-token')") == "alice-token"
        # the language of everything alice may read, until she picks a knowledge base
        assert browser.find_element(By.ID, "language").text.startswith("The knowledge is mostly Chinese")
        # search
        picker.select_by_value("team-docs")
        browser.find_element(By.ID, "query").send_keys("登录态失效\n")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#results li.result"))
        first = browser.find_elements(By.CSS_SELECTOR, "#results li.result")[0]
        assert first.find_element(By.CSS_SELECTOR, ".crumbs").text.replace("\n", "") == "登录态失效排查手册›排查步骤"
        assert "登录态失效" in [m.text for m in first.find_elements(By.TAG_NAME, "mark")]
        assert "team-docs" in first.find_element(By.CSS_SELECTOR, ".meta").text
        wait.until(ec.visibility_of_element_located((By.ID, "answer")))  # kb.ask's answer with citations
        assert browser.find_element(By.ID, "answer-text").text
        cited = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#citations li")]
        assert any(c.startswith("登录态失效排查手册") for c in cited), cited
        # click the source: a document without a URL opens in the side panel at the hit
        source = first.find_element(By.CSS_SELECTOR, ".source")
        assert source.text == "kb://team-docs/guide/login.md"
        source.click()
        wait.until(lambda b: b.find_element(By.ID, "doc-title").text == "登录态失效排查手册")
        hit = browser.find_element(By.CSS_SELECTOR, "#doc-chunks .chunk.hit")
        assert "token 过期会导致登录态失效" in hit.text
        assert len(browser.find_elements(By.CSS_SELECTOR, "#doc-chunks .chunk")) == 2
        browser.find_element(By.ID, "doc-close").click()
        assert browser.find_element(By.ID, "doc-view").is_displayed() is False
        # the knowledge's language, and a translation in "Also as" found where the words alone find nothing
        assert "mostly Chinese" in picker.first_selected_option.text
        assert browser.find_element(By.ID, "language").text.startswith("The knowledge is mostly Chinese")
        query = browser.find_element(By.ID, "query")
        query.clear()
        browser.find_element(By.ID, "also").send_keys("退款")
        query.send_keys("qqzzunheardof\n")
        first_crumbs = (By.CSS_SELECTOR, "#results li.result:first-child .crumbs")
        wait.until(lambda b: b.find_element(*first_crumbs).text.startswith("退款政策"))
        browser.find_element(By.ID, "also").clear()
        # markup in a query is text, never HTML
        # without kb.ask (/api/ask answers 501) the answer section stays hidden
        world.execute(DROP_ASK)
        picker.select_by_value("")
        query = browser.find_element(By.ID, "query")
        query.clear()
        query.send_keys("<img src=x onerror=alert(1)> zebramarker\n")
        crumbs = (By.CSS_SELECTOR, "#results li.result .crumbs")
        wait.until(lambda b: any("zebramarker 笔记" in c.text for c in b.find_elements(*crumbs)))
        assert browser.find_elements(By.CSS_SELECTOR, "#results img") == []
        assert browser.find_element(By.ID, "query").get_attribute("value").startswith("<img")
        wait.until(lambda b: b.execute_script("return askSupported === false"))
        assert browser.find_element(By.ID, "answer").is_displayed() is False
        # sign out forgets the token
        browser.find_element(By.ID, "sign-out").click()
        assert browser.execute_script("return sessionStorage.getItem('pgkb-token')") is None
        assert browser.find_element(By.ID, "signin").is_displayed()
    finally:
        browser.quit()


def test_page_renders_markdown_in_a_real_browser(web, world):
    """Answers and the document panel show Markdown as Markdown: a table is a <table>, code a <pre>; raw
    HTML and javascript: links in a document stay inert."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    content = (
        "退款到账时间取决于支付方式：\n\n| 支付方式 | 到账时间 |\n|---|---|\n| 微信余额 | 实时到账 |\n"
        "| 银行卡 | 1–3 个工作日 |\n\n```bash\nrefundctl status --id 42\n```\n\n"
        '<img src=x onerror="window.pwned=1"> [查看](javascript:window.pwned=2)'
    )
    chunks = json.dumps([{"content": content, "heading_path": ["退款到账时间表"]}])
    world.execute("select kb.replace_document('alice-notes', 'refund-table.md', '退款到账', %s)", [chunks])
    browser = chromium()
    wait = WebDriverWait(browser, 90)
    try:
        browser.get(web + "/")
        browser.find_element(By.ID, "token").send_keys("alice-token\n")
        wait.until(ec.visibility_of_element_located((By.ID, "query")))
        browser.find_element(By.ID, "query").send_keys("退款到账时间 支付方式\n")
        wait.until(ec.visibility_of_element_located((By.ID, "answer")))
        cells = browser.find_elements(By.CSS_SELECTOR, "#answer-text table td")
        assert "实时到账" in [c.text for c in cells], browser.find_element(By.ID, "answer-text").text
        assert browser.find_elements(By.CSS_SELECTOR, "#answer-text pre code")
        assert browser.find_elements(By.CSS_SELECTOR, "#answer-text a.cite")  # [n] links to its citation
        result = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#results li.result") if "退款到账" in r.text)
        result.find_element(By.CSS_SELECTOR, ".source").click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#doc-chunks table"))
        assert browser.find_elements(By.CSS_SELECTOR, "#doc-chunks img") == []
        assert browser.find_elements(By.CSS_SELECTOR, "#answer-text img") == []
        assert not browser.find_elements(By.CSS_SELECTOR, "a[href^='javascript']")
        assert browser.execute_script("return window.pwned === undefined")
    finally:
        browser.quit()


# ------------------------------------------------------------------------------ question log and ratings


def test_api_rates_answers_and_shows_gaps_to_their_owner(web, world):
    """With team-docs' question log on (alice owns it): /api/ask and /api/search answer question_id, a search
    sent with logged false (the page's, beside its ask) is left out, /api/rate records 👍/👎 against bob's own
    question only, and /api/gaps shows alice the unanswered and the unhelpful, never bob (403) and never an
    invisible knowledge base (404, as a missing one)."""
    world.execute("select kb.set_question_log('team-docs', 30)")
    kbs = {k["name"]: k["can_manage"] for k in call(web + "/api/kbs", headers=ALICE)[1]["knowledge_bases"]}
    assert kbs == {"alice-notes": True, "empty-kb": True, "team-docs": True}
    assert {k["name"]: k["can_manage"] for k in call(web + "/api/kbs", headers=BOB)[1]["knowledge_bases"]} == {
        "bob-notes": True, "team-docs": False,
    }  # fmt: skip
    status, asked, _ = call(web + "/api/ask", {"question": "登录态失效怎么排查", "kb": "team-docs"}, BOB)
    assert status == 200 and isinstance(asked["question_id"], int)
    status, found, _ = call(
        web + "/api/search", {"query": "登录态失效怎么排查", "kb": "team-docs", "logged": False}, BOB
    )
    assert status == 200 and found["results"] and found["question_id"] is None
    status, unfound, _ = call(web + "/api/search", {"query": "qqzz 火星基地的氧气配额", "kb": "team-docs"}, BOB)
    assert status == 200 and isinstance(unfound["question_id"], int)
    logged = world.execute("select question, mode, entry_point from kb.questions order by id").fetchall()
    assert logged == [("登录态失效怎么排查", "ask", "page"), ("qqzz 火星基地的氧气配额", "search", "page")]
    # ratings: bob's own questions; alice cannot rate bob's (the error of a missing one)
    note = {"helpful": False, "question_id": asked["question_id"], "note": "没说网关配置"}
    status, rated, _ = call(web + "/api/rate", note, BOB)
    assert status == 200 and isinstance(rated["rating_id"], int)
    assert call(web + "/api/rate", note, ALICE)[0] == 404
    alone = {"helpful": True, "question": "退款多久到账", "kb": "team-docs"}
    assert call(web + "/api/rate", alone, BOB)[0] == 200
    for bad in ({"question_id": asked["question_id"]}, {"helpful": "yes", "question_id": 1}, {"helpful": True},
                {"helpful": True, "question_id": 0}, {"helpful": True, "question_id": asked["question_id"],
                "note": "x" * 2001}):  # fmt: skip
        status, out, _ = call(web + "/api/rate", bad, BOB)
        assert status == 400 and out["error"], (bad, out)
    assert world.execute("select count(*) from kb.answer_ratings").fetchone()[0] == 2
    # gaps: alice sees the unanswered question and the unhelpful answer; bob may not look
    status, gaps, _ = call(web + "/api/gaps", {"kb": "team-docs", "since": "1 day"}, ALICE)
    assert status == 200 and gaps["question_log_days"] == 30
    examples = {q for t in gaps["topics"] for q in t["examples"]}
    assert {"qqzz 火星基地的氧气配额", "登录态失效怎么排查"} <= examples
    assert sum(t["unhelpful"] for t in gaps["topics"]) == 1
    assert call(web + "/api/gaps", {"kb": "team-docs"}, BOB)[0] == 403
    hidden, missing = call(web + "/api/gaps", {"kb": "alice-notes"}, BOB), call(web + "/api/gaps", {"kb": "nope"}, BOB)
    assert hidden[0] == missing[0] == 404 and hidden[1]["error"].replace("alice-notes", "nope") == missing[1]["error"]
    for bad in ({}, {"kb": ""}, {"kb": "team-docs", "since": "soon"}, {"kb": "team-docs", "since": 7}):
        status, out, _ = call(web + "/api/gaps", bad, ALICE)
        assert status == 400 and out["error"], bad


def test_page_rates_answers_and_shows_gaps_in_a_real_browser(web, world):
    """The page: 👍/👎 with a note under an answer lands in kb.answer_ratings against the logged ask (one
    question logged for the page's ask and search), and the owner's "Asked and not found" lists it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    world.execute("select kb.set_question_log('team-docs', 30)")
    browser = chromium()
    wait = WebDriverWait(browser, 90)
    try:
        browser.get(web + "/")
        browser.find_element(By.ID, "token").send_keys("alice-token\n")
        wait.until(ec.visibility_of_element_located((By.ID, "query")))
        assert browser.find_element(By.ID, "gaps").is_displayed()  # alice owns knowledge bases
        Select(browser.find_element(By.ID, "kb")).select_by_value("team-docs")
        browser.find_element(By.ID, "query").send_keys("登录态失效怎么排查\n")
        wait.until(ec.visibility_of_element_located((By.ID, "answer")))
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#results li.result"))
        browser.find_element(By.ID, "rate-note").send_keys("没说网关配置")
        browser.find_element(By.ID, "rate-down").click()
        wait.until(lambda b: "not helpful" in b.find_element(By.ID, "rate-status").text)
        assert browser.find_element(By.ID, "rate-up").get_attribute("disabled")
        rows = world.execute(
            "select q.question, q.mode, q.entry_point, r.helpful, r.note from kb.answer_ratings as r"
            " join kb.questions as q on q.id = r.question_id"
        ).fetchall()
        assert rows == [("登录态失效怎么排查", "ask", "page", False, "没说网关配置")]
        assert world.execute("select count(*) from kb.questions").fetchone()[0] == 1  # the ask alone
        # the owner's gaps: the unhelpful answer, as a topic
        Select(browser.find_element(By.ID, "gaps-kb")).select_by_value("team-docs")
        browser.find_element(By.ID, "gaps-show").click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#gaps-list li.gap"))
        topic = browser.find_element(By.CSS_SELECTOR, "#gaps-list li.gap")
        assert "1 rated unhelpful" in topic.text and "登录态失效怎么排查" in topic.text
        # bob owns bob-notes only: his gaps picker does not offer team-docs
        browser.find_element(By.ID, "sign-out").click()
        assert browser.find_element(By.ID, "gaps").is_displayed() is False
        browser.find_element(By.ID, "token").send_keys("bob-token\n")
        wait.until(ec.visibility_of_element_located((By.ID, "query")))
        offered = [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "gaps-kb")).options]
        assert offered == ["bob-notes"]
    finally:
        browser.quit()


# ----------------------------------------------------------------------------------------------- API keys


def test_api_key_lifecycle_without_env_tokens(world, connect_as, tmp_path):
    """`pgkb serve` with API keys from the database alone (no PGKB_MCP_TOKENS): alice makes a key and uses it
    on the page's API and Dify's; wrong and malformed keys are refused; revoked and expired keys are refused
    within 1 s with no restart; the key is in no log -- the server's (--verbose), the query log, PostgreSQL's
    (every statement of the service role logged)."""
    alice = connect_as("alice")
    key_id, key = api_key(alice, "laptop")
    auth = {"Authorization": f"Bearer {key}"}
    query_log = tmp_path / "queries.jsonl"
    server_log = Path(world.execute("show data_directory").fetchone()[0]) / "server.log"
    log_from = server_log.stat().st_size
    dbname = world.info.dbname
    world.execute(f"alter role svc in database {dbname} set log_statement = 'all'")
    env = {**os.environ, **server_env(world, PGKB_MCP_EMBED_TIMEOUT_MS="0", PGKB_QUERY_LOG=str(query_log))}
    env.pop("PGKB_MCP_TOKENS", None)
    env.pop("PGKB_USER", None)
    port = free_port()
    try:
        with running(["serve", "--port", str(port), "--verbose"], env, port) as server:
            url = f"http://127.0.0.1:{port}"
            status, out, _ = call(url + "/api/kbs", headers=auth)
            assert status == 200 and out["user"] == "alice"
            assert {k["name"] for k in out["knowledge_bases"]} == {"team-docs", "alice-notes", "empty-kb"}
            status, out, _ = call(url + "/api/search", {"query": "zebramarker", "kb": "alice-notes"}, auth)
            assert status == 200 and "zebramarker" in out["results"][0]["title"]
            setting = {"top_k": 5, "score_threshold": 0}
            status, out, _ = call(
                url + "/retrieval", retrieval(knowledge_id="alice-notes", retrieval_setting=setting), auth
            )
            assert status == 200 and out["records"]
            used = "select last_used_at is not null from kb.api_keys where key_id = %s"
            assert world.execute(used, [key_id]).fetchone()[0]

            refused_by_dify = (403, {"error_code": 1002, "error_msg": "Authorization failed"})
            for bad in (
                "pgkb_",
                key.upper(),
                key + "0",
                key[:-1],
                f"pgkb_{key_id}_{'0' * 64}",  # alice's key id with another secret
                f"pgkb_{'0' * 16}_{key[22:]}",  # her secret under another id
                "x" * 8000,
            ):
                headers = {"Authorization": f"Bearer {bad}"}
                assert call(url + "/api/kbs", headers=headers)[0] == 401, bad
                assert call(url + "/retrieval", retrieval(), headers)[:2] == refused_by_dify, bad

            alice.execute("select kb.revoke_api_key(%s)", [key_id])
            assert seconds_until(lambda: call(url + "/api/kbs", headers=auth)[0] == 401) < 1.0
            assert call(url + "/retrieval", retrieval(), auth)[:2] == refused_by_dify

            short_id, short = api_key(alice, "short", "2 seconds")
            short_auth = {"Authorization": f"Bearer {short}"}
            assert call(url + "/api/kbs", headers=short_auth)[0] == 200
            expires_in = "select extract(epoch from expires_at - clock_timestamp()) from kb.api_keys where key_id = %s"
            time.sleep(max(0.0, float(world.execute(expires_in, [short_id]).fetchone()[0])))
            assert seconds_until(lambda: call(url + "/api/kbs", headers=short_auth)[0] == 401) < 1.0
    finally:
        world.execute(f"alter role svc in database {dbname} reset log_statement")
    with server_log.open("rb") as f:
        f.seek(log_from)
        database_log = f.read().decode(errors="replace")
    assert "kb_service.verify_api_key" in database_log  # the service role's statements were logged
    assert '"user": "alice"' in query_log.read_text()
    for text in (server.stderr_text, query_log.read_text(), database_log):
        assert key[22:] not in text and short[22:] not in text
