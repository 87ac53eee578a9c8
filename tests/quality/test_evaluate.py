"""`pgkb eval` (pgkb.quality.evaluate): metrics on hand-computed examples, a tiny BEIR folder and a tiny
doc-questions folder evaluated end to end against a real PostgreSQL, reuse of an unchanged knowledge base,
and clear errors for bad input."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from pgkb.cli import build_parser
from pgkb.config import Settings, packaged_db_dir
from pgkb.quality import evaluate
from pgkb.quality.datasets import EvalError, Query, load_beir, load_questions, read_qrels, replace_queries, sample
from pgkb.quality.metrics import ModeResult, dedupe, mrr_at, ndcg_at, percentile, recall_at, score_mode
from pgkb.quality.searching import SearchSettings, embed_queries, other_kb_key, search_mode
from pgvector import Vector

# ------------------------------------------------------------------------------------------- metrics


def test_dedupe_keeps_first_rank_of_each_document():
    assert dedupe(["d1", "d1", "d2", "d1", "d3", "d2"]) == ["d1", "d2", "d3"]


def test_chunks_count_for_their_document_after_dedupe():
    chunk_docs = ["a", "a", "a", "a", "b"]  # four chunks of a, then b
    assert recall_at(chunk_docs, {"b": 1}, 2) == 0.0  # on chunks b is 5th
    assert recall_at(dedupe(chunk_docs), {"b": 1}, 2) == 1.0  # on documents it is 2nd
    assert mrr_at(dedupe(chunk_docs), {"b": 1}) == 0.5


def test_recall():
    ranked = ["a", "b", "c", "d"]
    assert recall_at(ranked, {"b": 1, "x": 1}, 1) == 0.0
    assert recall_at(ranked, {"b": 1, "x": 1}, 2) == 0.5
    assert recall_at(ranked, {"b": 1, "d": 2}, 10) == 1.0
    assert recall_at(ranked, {"b": 1, "c": 0}, 2) == 1.0  # score 0 = judged not relevant
    assert recall_at(ranked, {"b": 1, "x": 1}, 2, any_relevant=True) == 1.0  # alternatives: any one is a hit
    assert recall_at(ranked, {"x": 1}, 10, any_relevant=True) == 0.0
    assert recall_at(ranked, {}, 10) == 0.0


def test_mrr():
    assert mrr_at(["a", "b", "c"], {"c": 1}) == pytest.approx(1 / 3)
    assert mrr_at(["a", "b", "c"], {"b": 1, "c": 1}) == 0.5
    assert mrr_at([str(i) for i in range(20)], {"12": 1}, 10) == 0.0  # beyond the cut-off
    assert mrr_at(["a"], {"a": 0}) == 0.0


def test_ndcg_with_graded_qrels():
    # gains: d1=1 at rank 1, d3=2 at rank 3; ideal order 2, 1, 1
    dcg = 1 / math.log2(2) + 2 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at(["d1", "d2", "d3"], {"d1": 1, "d3": 2, "d4": 1}) == pytest.approx(dcg / idcg)
    assert dcg / idcg == pytest.approx(0.63879, abs=1e-5)
    assert ndcg_at(["d3", "d1", "d4"], {"d1": 1, "d3": 2, "d4": 1}) == pytest.approx(1.0)
    assert ndcg_at(["x", "y"], {"d1": 1}) == 0.0
    assert ndcg_at([str(i) for i in range(10)] + ["d1"], {"d1": 1}, 10) == 0.0  # rank 11 is outside @10


def test_ndcg_any_relevant_scores_the_first_hit_only():
    assert ndcg_at(["a", "b", "c"], {"b": 1, "c": 1}, any_relevant=True) == pytest.approx(1 / math.log2(3))
    assert ndcg_at(["b", "c"], {"b": 1, "c": 1}, any_relevant=True) == 1.0


def test_percentile_interpolates():
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) == 0.0


def test_score_mode_means_and_by_kind():
    queries = [
        Query("1", "q1", {"a": 1}, "short"),
        Query("2", "q2", {"b": 1}, "short"),
        Query("3", "q3", {"c": 1}, "typo"),
    ]
    result = ModeResult([["a", "x"], ["x", "y", "z", "w", "v", "b"], ["c"]], [1.0, 2.0, 3.0])
    m = score_mode(queries, result, any_relevant=False)
    assert m["recall@1"] == pytest.approx(0.6667, abs=1e-4)
    assert m["recall@5"] == pytest.approx(0.6667, abs=1e-4)
    assert m["recall@10"] == 1.0
    assert m["mrr@10"] == pytest.approx(round((1 + 1 / 6 + 1) / 3, 4))
    assert m["p50_ms"] == 2.0 and m["p95_ms"] == pytest.approx(2.9)
    assert m["by_kind"] == {"short": {"recall@5": 0.5, "n": 2}, "typo": {"recall@5": 1.0, "n": 1}}


def test_sample_is_seeded_and_keeps_order():
    queries = [Query(str(i), f"q{i}", {"a": 1}) for i in range(50)]
    a, b = sample(queries, 10, 0), sample(queries, 10, 0)
    assert [q.id for q in a] == [q.id for q in b] and len(a) == 10
    assert [int(q.id) for q in a] == sorted(int(q.id) for q in a)
    assert sample(queries, 100, 0) == queries


# ------------------------------------------------------------------------------------------ datasets

CORPUS = [
    {"_id": key, "title": title, "text": text}
    for key, title, text in [
        ("zh-refund", "退款政策", "订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。"),
        ("zh-login", "登录态失效", "用户登录后 token 过期会导致登录态失效，请检查 Redis 中 session 的过期时间。"),
        ("zh-tidb", "TiDB 内存", "通过 tidb_mem_quota_query 限制单条 SQL 的内存使用，超出配额的查询会被取消。"),
        ("en-deploy", "Deployment", "Build the Docker image and roll it out with kubectl apply. "
         "Roll back with kubectl rollout undo."),
        ("en-backup", "Backups", "Nightly pg_dump backups are kept for 30 days in the object store."),
    ]
]  # fmt: skip
QUERIES = [
    {"_id": "q1", "text": "退款多久到账", "metadata": {"kind": "zh"}},
    {"_id": "q2", "text": "登录态失效怎么排查", "metadata": {"kind": "zh"}},
    {"_id": "q3", "text": "tidb_mem_quota_query", "metadata": {"kind": "identifier"}},
    {"_id": "q4", "text": "how do I roll back a deployment", "metadata": {"kind": "en"}},
    {"_id": "q5", "text": "unjudged query"},
]
QRELS = (
    "query-id\tcorpus-id\tscore\n"
    "q1\tzh-refund\t1\nq2\tzh-login\t2\nq2\tzh-refund\t0\nq3\tzh-tidb\t1\nq4\ten-deploy\t1\n"
)


def write_beir(folder: Path, corpus=CORPUS, queries=QUERIES, qrels=QRELS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in corpus), "utf-8")
    (folder / "queries.jsonl").write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries), "utf-8")
    (folder / "qrels.tsv").write_text(qrels, "utf-8")
    return folder


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["eval", *argv])


def settings_for(db) -> Settings:
    info = db.info
    url = f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}"
    return Settings(database_url=url, db_dir=packaged_db_dir(), embed_provider="offline")


class CountingEmbedder:
    """The session's offline embedder, recording every text it is asked to embed."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.dimension = inner, inner.name, inner.dimension
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts.extend(texts)
        return self.inner.embed(texts)

    def passages(self) -> list[str]:
        return [t for t in self.texts if not t.startswith("query: ")]


def test_read_qrels_header_and_grades(tmp_path):
    path = tmp_path / "qrels.tsv"
    path.write_text(QRELS, "utf-8")
    assert read_qrels(path)["q2"] == {"zh-login": 2.0, "zh-refund": 0.0}


@pytest.mark.parametrize(
    ("qrels", "message"),
    [
        ("query-id\tcorpus-id\tscore\nq1\tzh-refund\n", r"qrels.tsv:2: expected 3 tab-separated columns"),
        ("query-id\tcorpus-id\tscore\nq1\tzh-refund\t1\nq2\tzh-login\thigh\n", r"qrels.tsv:3: score 'high'"),
        ("query-id\tcorpus-id\tscore\nq1\tzh-refund\t0\n", r"no relevance judgments"),
    ],
)
def test_malformed_qrels_is_a_clear_error(tmp_path, capsys, qrels, message):
    folder = write_beir(tmp_path / "bad", qrels=qrels)
    with pytest.raises(EvalError, match=message):
        load_beir(folder)
    assert evaluate.run(parse(str(folder)), Settings(None, Path("."))) == 2
    assert "pgkb: eval:" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["corpus.jsonl", "queries.jsonl", "qrels.tsv"])
def test_missing_files_are_clear_errors(tmp_path, capsys, missing):
    folder = write_beir(tmp_path / "set")
    (folder / missing).unlink()
    assert evaluate.run(parse(str(folder)), Settings(None, Path("."))) == 2
    assert f"not found: {folder / missing}" in capsys.readouterr().err


def test_bad_arguments_are_clear_errors(tmp_path, capsys):
    folder = write_beir(tmp_path / "set")
    cases = [
        (parse(str(folder), "--modes", "vector,semantic"), "unknown mode 'semantic'"),
        (parse(str(folder), "--modes", "hybrid+rerank"), "hybrid+rerank needs a reranker"),
        (parse(str(tmp_path / "nope")), "dataset folder not found"),
        (parse(), "nothing to evaluate"),
        (parse("--docs", str(tmp_path)), "needs both --docs DIR and --questions"),
        (parse(str(folder), "--docs", str(tmp_path), "--questions", "q.jsonl"), "not both"),
        (parse(str(folder), "--depth", "0"), "--depth must be between"),
        (parse(str(folder), "--max-queries", "0"), "--max-queries must be at least 1"),
    ]
    for args, message in cases:
        assert evaluate.run(args, Settings(None, Path("."))) == 2, message
        assert message in capsys.readouterr().err


def test_malformed_jsonl_and_questions(tmp_path):
    folder = write_beir(tmp_path / "set")
    (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "退款"}\n{not json\n', "utf-8")
    with pytest.raises(EvalError, match=r"queries.jsonl:2: not valid JSON"):
        load_beir(folder)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\ntext\n", "utf-8")
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "1", "query": "x", "relevant": []}\n', "utf-8")
    with pytest.raises(EvalError, match="non-empty list of paths"):
        load_questions(docs, questions)
    questions.write_text('{"id": "1", "query": "x", "relevant": ["b.md"]}\n', "utf-8")
    with pytest.raises(EvalError, match="relevant files not found .*b.md"):
        load_questions(docs, questions)


# -------------------------------------------------------------------------------------- end to end

KEYS = {"recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10", "p50_ms", "p95_ms", "by_kind"}


def check_shape(report: dict, modes: list[str]) -> None:
    assert set(report) == {"dataset", "model", "n_queries", "searched_kbs", "modes"}
    assert isinstance(report["dataset"], str) and isinstance(report["model"], str)
    assert isinstance(report["n_queries"], int)
    assert list(report["modes"]) == modes
    for m in report["modes"].values():
        assert set(m) == KEYS
        assert all(isinstance(m[k], float) and m[k] >= 0 for k in KEYS - {"by_kind"})
        assert all(m[k] <= 1 for k in KEYS - {"by_kind", "p50_ms", "p95_ms"})
        for by in m["by_kind"].values():
            assert set(by) == {"recall@5", "n"} and isinstance(by["n"], int) and isinstance(by["recall@5"], float)


def documents(db, kb: str) -> dict[str, tuple]:
    rows = db.execute(
        "select d.doc_key, d.id, d.content_hash, d.updated_at from kb.documents d"
        " join kb.knowledge_bases k on k.id = d.kb_id where k.name = %s",
        [kb],
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def test_beir_end_to_end_and_reuse(db, embedder, tmp_path, capsys):
    folder = write_beir(tmp_path / "tiny-set")
    out = tmp_path / "report.json"
    counting = CountingEmbedder(embedder)
    assert evaluate.run(parse(str(folder), "--out", str(out)), settings_for(db), embedder=counting) == 0
    captured = capsys.readouterr()
    report = json.loads(out.read_text("utf-8"))
    modes = ["vector", "lexical", "fuzzy", "hybrid"]
    check_shape(report, modes)
    assert report["dataset"] == "tiny-set" and report["model"] == "multilingual-e5-small"
    assert report["n_queries"] == 4  # q5 has no judgment
    assert len(counting.passages()) == 5  # one chunk per document, each embedded once
    # each query embedded once for all modes, with its offline translation (kb.query_translation, as the
    # clients embed) in the same call when it has one: the Latin identifier over this mostly Chinese set
    translations = [
        db.execute("select kb.query_translation(%s, 'eval-tiny-set')", [q["text"]]).fetchone()[0] for q in QUERIES[:4]
    ]
    assert translations[2] and not translations[0] and not translations[1], translations
    queries = [t for t in counting.texts if t.startswith("query: ")]
    wanted = [q["text"] for q in QUERIES[:4]] + [t for t in translations if t]
    assert sorted(queries) == sorted(f"query: {t}" for t in wanted)
    hybrid, lexical = report["modes"]["hybrid"], report["modes"]["lexical"]
    assert hybrid["recall@10"] == 1.0 and report["modes"]["vector"]["recall@10"] == 1.0
    assert hybrid["recall@1"] >= 0.75 and lexical["recall@1"] >= 0.75
    assert report["modes"]["fuzzy"]["by_kind"]["identifier"] == {"recall@5": 1.0, "n": 1}
    assert set(hybrid["by_kind"]) == {"zh", "identifier", "en"}
    assert "| hybrid |" in captured.out and "Recall@5 by kind" in captured.out
    assert "kb `eval-tiny-set`" in captured.out
    before = documents(db, "eval-tiny-set")
    assert set(before) == {d["_id"] for d in CORPUS}
    assert db.execute(
        "select count(*) from kb.embeddings e join kb.chunks c on c.id = e.chunk_id"
        " join kb.knowledge_bases k on k.id = c.kb_id where k.name = 'eval-tiny-set'"
    ).fetchone() == (5,)

    # second run: nothing re-embedded or rewritten, same numbers
    again = CountingEmbedder(embedder)
    out2 = tmp_path / "report2.json"
    assert evaluate.run(parse(str(folder), "--out", str(out2)), settings_for(db), embedder=again) == 0
    assert again.passages() == [] and len(again.texts) == len(wanted)  # the queries (and a translation) only
    assert documents(db, "eval-tiny-set") == before
    report2 = json.loads(out2.read_text("utf-8"))
    for mode in modes:
        assert {k: v for k, v in report2["modes"][mode].items() if "ms" not in k} == {
            k: v for k, v in report["modes"][mode].items() if "ms" not in k
        }
    assert "loaded: 0 added, 0 changed, 5 unchanged, 0 removed" in capsys.readouterr().err

    # one document edited, one gone: only the edited one is embedded again, the gone one deleted
    corpus = [dict(d) for d in CORPUS if d["_id"] != "en-backup"]
    corpus[0]["text"] += "节假日顺延。"
    write_beir(folder, corpus=corpus)
    third = CountingEmbedder(embedder)
    args = parse(str(folder), "--modes", "lexical", "--kb", "eval-tiny-set", "--max-queries", "2")
    assert evaluate.run(args, settings_for(db), embedder=third) == 0
    assert len(third.passages()) == 1 and "节假日顺延" in third.passages()[0]
    after = documents(db, "eval-tiny-set")
    assert set(after) == set(before) - {"en-backup"}
    assert after["zh-login"] == before["zh-login"] and after["zh-refund"] != before["zh-refund"]
    assert "### tiny-set — 2 queries" in capsys.readouterr().out


@pytest.mark.slow
def test_beir_option_is_the_positional_folder(db, embedder, tmp_path, capsys):
    folder = write_beir(tmp_path / "opt-set")
    reports = []
    for argv in (("--beir", str(folder)), (str(folder),), (str(folder), "--beir", str(folder))):
        out = tmp_path / f"report{len(reports)}.json"
        args = parse(*argv, "--modes", "lexical,vector", "--out", str(out))
        assert evaluate.run(args, settings_for(db), embedder=embedder) == 0, capsys.readouterr().err
        reports.append(json.loads(out.read_text("utf-8")))
    assert reports[0]["dataset"] == "opt-set" and reports[0]["n_queries"] == 4
    assert [
        {m: {k: v for k, v in r.items() if "ms" not in k} for m, r in report["modes"].items()} for report in reports
    ] == [{m: {k: v for k, v in r.items() if "ms" not in k} for m, r in reports[0]["modes"].items()}] * 3
    assert "kb `eval-opt-set`" in capsys.readouterr().out

    other = write_beir(tmp_path / "other-set")
    for args, message in [
        (parse(str(folder), "--beir", str(other)), "two BEIR folders given"),
        (parse("--beir", str(folder), "--docs", str(tmp_path), "--questions", "q.jsonl"), "not both"),
        (parse("--beir", str(tmp_path / "nope")), "dataset folder not found"),
    ]:
        assert evaluate.run(args, settings_for(db), embedder=embedder) == 2, message
        assert message in capsys.readouterr().err
    from pgkb.cli import build_parser

    assert build_parser().parse_args(["eval", "--beir", str(folder)]).beir == str(folder)


MD = {
    "guide/login.md": "# 登录态失效排查\n\n## 排查步骤\n\n用户登录后 token 过期会导致登录态失效，先查 session。\n",
    "guide/refund.md": "# 退款政策\n\n订单签收后 7 天内可申请无理由退款，3 个工作日内原路退回。\n",
    "ops/deploy.md": "# Deployment\n\nBuild the Docker image, then `kubectl apply`.\n\n"
    "Roll back with `kubectl rollout undo`.\n",
}
QUESTIONS = [
    {"id": "t1", "query": "token 过期后登录态失效怎么办", "relevant": ["guide/login.md"], "kind": "paraphrase"},
    {"id": "t2", "query": "kubectl rollout undo", "relevant": ["ops/deploy.md"], "kind": "identifier"},
    {"id": "t3", "query": "退款几天到账", "relevant": ["guide/refund.md", "guide/login.md"], "kind": "short"},
]


def test_doc_questions_end_to_end(db, embedder, tmp_path, capsys):
    root = tmp_path / "vue-like"
    for rel, text in MD.items():
        (root / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "files" / rel).write_text(text, "utf-8")
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in QUESTIONS), "utf-8")
    out = tmp_path / "q.json"
    counting = CountingEmbedder(embedder)
    args = parse("--docs", str(root / "files"), "--questions", str(questions), "--out", str(out), "--modes",
                 "hybrid,vector,lexical")  # fmt: skip
    assert evaluate.run(args, settings_for(db), embedder=counting) == 0
    report = json.loads(out.read_text("utf-8"))
    check_shape(report, ["hybrid", "vector", "lexical"])
    assert report["dataset"] == "vue-like" and report["n_queries"] == 3
    hybrid = report["modes"]["hybrid"]
    assert hybrid["recall@5"] == 1.0 and hybrid["recall@1"] >= 2 / 3  # any relevant file counts as a hit
    assert hybrid["by_kind"]["identifier"] == {"recall@5": 1.0, "n": 1}
    assert set(documents(db, "eval-vue-like")) == set(MD)
    embedded = len(counting.passages())
    assert embedded >= 3
    capsys.readouterr()

    again = CountingEmbedder(embedder)
    assert evaluate.run(args, settings_for(db), embedder=again) == 0
    assert again.passages() == [] and len(again.texts) == 3
    assert "3 unchanged" in capsys.readouterr().err


class KeywordReranker:
    """Scores a text 1 when it mentions 'Backups', else 0 (checks that the rerank order is applied)."""

    name = "keyword"

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def score(self, query, documents):
        self.calls.append((query, list(documents)))
        return [1.0 if "Backups" in d else 0.0 for d in documents]


@pytest.mark.slow
def test_hybrid_rerank_mode_reorders_the_fused_top(db, embedder, tmp_path):
    folder = write_beir(tmp_path / "rr")
    out = tmp_path / "rr.json"
    reranker = KeywordReranker()
    args = parse(str(folder), "--out", str(out), "--rerank-depth", "5", "--modes", "hybrid,hybrid+rerank")
    assert evaluate.run(args, settings_for(db), embedder=embedder, reranker=reranker) == 0
    report = json.loads(out.read_text("utf-8"))
    check_shape(report, ["hybrid", "hybrid+rerank"])
    assert len(reranker.calls) == 1 + 4  # one untimed warm-up, then each query once
    assert all(len(docs) == 5 for _q, docs in reranker.calls)
    assert reranker.calls[0][1][0].startswith("退款政策\n")  # breadcrumb (title) line, then the content
    assert report["modes"]["hybrid+rerank"]["recall@1"] == 0.0  # "Backups" is never relevant, now always 1st
    assert report["modes"]["hybrid+rerank"]["recall@10"] == report["modes"]["hybrid"]["recall@10"]
    # all available modes by default, hybrid+rerank included when a reranker is configured
    assert evaluate.run(parse(str(folder), "--out", str(out)), settings_for(db), embedder=embedder,
                        reranker=reranker) == 0  # fmt: skip
    assert list(json.loads(out.read_text("utf-8"))["modes"]) == list(evaluate.MODES)


def test_module_entry_point_reports_bad_input(tmp_path):
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pgkb.cli", "eval", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PGKB_RERANK_MODEL": "", "PGKB_RERANK_URL": ""},
    )  # fmt: skip
    assert done.returncode == 2 and "pgkb: eval: dataset folder not found" in done.stderr


def test_refuses_to_sync_into_a_knowledge_base_it_did_not_create(db, embedder, tmp_path, capsys):
    db.execute(
        "select kb.replace_document(kb => 'team-docs', doc_key => 'a.md', title => 'A',"
        ' chunks => \'[{"content": "团队文档"}]\'::jsonb)'
    )
    folder = write_beir(tmp_path / "set")
    assert evaluate.run(parse(str(folder), "--kb", "team-docs"), settings_for(db), embedder=embedder) == 2
    assert "holds 1 documents not loaded by pgkb eval" in capsys.readouterr().err
    assert set(documents(db, "team-docs")) == {"a.md"}


def test_embedding_endpoint_down_stops_the_load_and_evaluates_nothing(db, tmp_path, capsys, dead_embedding_url):
    from pgkb.models.embedding import HttpEmbedder

    folder = write_beir(tmp_path / "down-set")
    down = HttpEmbedder(dead_embedding_url, "multilingual-e5-small", 384, retries=0)
    assert evaluate.run(parse(str(folder), "--modes", "lexical"), settings_for(db), embedder=down) == 1
    captured = capsys.readouterr()
    assert "loading stopped early, nothing evaluated" in captured.err and "looks down" in captured.err
    assert "| lexical |" not in captured.out
    failed = db.execute("select doc_key from kb.ingest_failures order by doc_key").fetchall()
    assert len(failed) == 3  # three documents in a row, each tried alone after the batch failed; then it stops
    assert db.execute("select count(*) from kb.documents").fetchone() == (0,)


# ------------------------------------------------------------------- translated questions, mixed runs


def test_queries_file_asks_other_texts_with_the_same_judgments(tmp_path):
    dataset = load_beir(write_beir(tmp_path / "tiny-set"))
    translated = tmp_path / "en.jsonl"
    translated.write_text(
        json.dumps({"_id": "q1", "text": "How long does a refund take?"}) + "\n"
        + json.dumps({"id": "q4", "query": "如何回滚部署"}, ensure_ascii=False) + "\n",
        "utf-8",
    )  # fmt: skip
    replace_queries(dataset, translated)
    assert [(q.id, q.text, q.relevant, q.kind) for q in dataset.queries] == [
        ("q1", "How long does a refund take?", {"zh-refund": 1.0}, "zh"),
        ("q4", "如何回滚部署", {"en-deploy": 1.0}, "en"),
    ]
    for line, message in [
        ({"_id": "q9", "text": "x"}, "'q9' is not a judged question"),
        ({"_id": "q5", "text": "x"}, "'q5' is not a judged question"),  # q5 has no judgment
        ({"_id": "q1", "text": " "}, 'no "text"'),
    ]:
        translated.write_text(json.dumps(line) + "\n", "utf-8")
        with pytest.raises(EvalError, match=message):
            replace_queries(load_beir(tmp_path / "tiny-set"), translated)
    translated.write_text(json.dumps({"_id": "q1", "text": "a"}) + "\n" + json.dumps({"_id": "q1", "text": "b"}) + "\n")
    with pytest.raises(EvalError, match="'q1' is given twice"):
        replace_queries(load_beir(tmp_path / "tiny-set"), translated)


@pytest.mark.slow
def test_mixed_run_searches_every_knowledge_base_and_judges_only_its_own(db, embedder, tmp_path, capsys):
    """Another set holding near-copies of this one's documents under the same keys: in a mixed run its hits
    compete for the ranks but never count as relevant."""
    own = write_beir(tmp_path / "own-set")
    twin_corpus = [{**d, "text": d["text"] + " (copy)"} for d in CORPUS]
    twin = write_beir(tmp_path / "twin-set", corpus=twin_corpus)
    for folder in (own, twin):
        assert evaluate.run(parse(str(folder), "--modes", "lexical"), settings_for(db), embedder=embedder) == 0
    capsys.readouterr()
    spec = evaluate.configured_embedder(db, settings_for(db), embedder)[0]
    emb = embed_queries(db, spec, embedder, ["退款多久到账"], kb="eval-own-set")[0]
    alone, _ = search_mode(db, "hybrid", "退款多久到账", emb, "eval-own-set", spec, SearchSettings(depth=10))
    mixed, _ = search_mode(
        db, "hybrid", "退款多久到账", emb, "eval-own-set", spec, SearchSettings(depth=10), mixed=True
    )
    assert set(alone) <= {d["_id"] for d in CORPUS}
    assert other_kb_key("eval-twin-set", "zh-refund") in mixed[:2] and "zh-refund" in mixed[:2]
    assert len(mixed) > len(alone)

    out = tmp_path / "mixed.json"
    args = parse(str(own), "--modes", "hybrid", "--mixed", "--out", str(out))
    assert evaluate.run(args, settings_for(db), embedder=embedder) == 0
    report = json.loads(out.read_text("utf-8"))
    assert {"eval-own-set", "eval-twin-set"} <= set(report["searched_kbs"])
    printed = capsys.readouterr().out
    assert "Searched together with" in printed and "`eval-twin-set`" in printed
    # the twin's copies take ranks: MRR can only fall against the run on the set alone
    args = parse(str(own), "--modes", "hybrid", "--out", str(tmp_path / "alone.json"))
    assert evaluate.run(args, settings_for(db), embedder=embedder) == 0
    solo = json.loads((tmp_path / "alone.json").read_text("utf-8"))
    assert solo["searched_kbs"] == ["eval-own-set"]
    assert report["modes"]["hybrid"]["mrr@10"] <= solo["modes"]["hybrid"]["mrr@10"]
    assert report["modes"]["hybrid"]["recall@10"] == solo["modes"]["hybrid"]["recall@10"] == 1.0


def test_from_log_replays_the_questions_rated_helpful(db, embedder, tmp_path, capsys, connect_as):
    """`pgkb eval --from-log --kb NAME`: the knowledge base's logged questions rated helpful, judged on the
    documents their answers cited (an ask) or their first document (a search), searched in every mode over
    the knowledge base as it is; the replay itself is not logged."""
    folder = write_beir(tmp_path / "set")
    assert (
        evaluate.run(parse(str(folder), "--kb", "eval-set", "--modes", "lexical"), settings_for(db), embedder=embedder)
        == 0
    )
    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.set_knowledge_base_visibility('eval-set', 'public')")
    nothing = parse("--from-log", "--kb", "eval-set")
    assert evaluate.run(nothing, settings_for(db), embedder=embedder) == 2
    assert "was rated helpful" in capsys.readouterr().err
    db.execute("select kb.set_question_log('eval-set', 30)")
    alice = connect_as("alice")
    question = "登录态失效怎么排查"  # embedded here, as pgkb's clients do (no embedding endpoint in the tests)
    vector = Vector(embedder.embed([f"query: {question}"])[0])
    [(found,)] = alice.execute(
        "select found from kb.ask(%s, kb => 'eval-set', query_embedding => %s)", [question, vector]
    ).fetchall()
    assert found
    alice.execute("select kb.rate_answer(true, kb.last_question_id())")
    alice.execute("select * from kb.lexical_search('订单签收后退款', 5, 'eval-set')").fetchall()
    alice.execute("select kb.rate_answer(true, kb.last_question_id())")
    alice.execute("select * from kb.lexical_search('tidb_mem_quota_query', 5, 'eval-set')").fetchall()
    alice.execute("select kb.rate_answer(false, kb.last_question_id())")  # unhelpful: not in the set
    logged = db.execute("select count(*) from kb.questions").fetchone()[0]
    out = tmp_path / "log.json"
    args = parse("--from-log", "--kb", "eval-set", "--since", "1 day", "--modes", "lexical,hybrid", "--out", str(out))
    assert evaluate.run(args, settings_for(db), embedder=embedder) == 0, capsys.readouterr().err
    report = json.loads(out.read_text("utf-8"))
    assert report["dataset"] == "log-eval-set" and report["n_queries"] == 2
    cited = db.execute("select documents from kb.rated_questions('eval-set') where mode = 'ask'").fetchone()[0]
    assert "zh-login" in cited
    for mode in ("lexical", "hybrid"):
        assert report["modes"][mode]["mrr@10"] == 1.0, report["modes"][mode]  # a judged document first, each
        assert {k: v["n"] for k, v in report["modes"][mode]["by_kind"].items()} == {"ask": 1, "lexical": 1}
    assert report["modes"]["hybrid"]["recall@10"] == 1.0  # kb.ask's own retrieval: every cited document
    assert "log-eval-set" in capsys.readouterr().out
    assert db.execute("select count(*) from kb.questions").fetchone()[0] == logged  # the replay logs nothing
    for argv, message in (
        (("--from-log",), "--from-log needs --kb"),
        (("--from-log", "--kb", "eval-set", str(folder)), "none of: a BEIR folder"),
        (("--from-log", "--kb", "eval-set", "--ask"), "none of: --ask"),
        (("--from-log", "--kb", "eval-set", "--since", "soon"), "soon"),
    ):
        assert evaluate.run(parse(*argv), settings_for(db), embedder=embedder) == 2, argv
        assert message in capsys.readouterr().err, argv
