"""`pgkb sweep` (pgkb.quality.sweep): the grid is parsed strictly, every combination runs through the same SQL as
`pgkb eval` on a knowledge base `pgkb eval` loaded, and the numbers agree with `pgkb eval` run with the same
settings."""

from __future__ import annotations

import argparse
import json

import pytest
from pgkb.cli import build_parser
from pgkb.quality import evaluate, sweep
from pgkb.quality.datasets import EvalError
from pgkb.quality.evaluate import SearchSettings
from test_evaluate import parse, settings_for, write_beir


def sweep_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["sweep", *argv])


def test_grid_is_the_cartesian_product_over_the_defaults():
    combos = sweep.parse_grid(["fusion=dbsf,rrf", "lexical-weight=0.5,1"])
    assert [v for v, _ in combos] == [
        {"fusion": "dbsf", "lexical_weight": 0.5},
        {"fusion": "dbsf", "lexical_weight": 1.0},
        {"fusion": "rrf", "lexical_weight": 0.5},
        {"fusion": "rrf", "lexical_weight": 1.0},
    ]
    settings = combos[2][1]
    assert settings.fusion == "rrf" and settings.lexical_weight == 0.5
    assert settings.candidates == SearchSettings().candidates  # everything else stays at the defaults
    assert sweep.parse_grid([]) == [({}, SearchSettings())]


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        (["depth=10"], "KEY one of"),
        (["lexical_weight"], "KEY one of"),
        (["candidates=ten"], "invalid literal"),
        (["candidates="], "has no values"),
        (["fusion=borda"], "choose from dbsf, rrf"),
        (["rrf_k=10", "rrf_k=20"], "given twice"),
    ],
)
def test_bad_grid_is_a_clear_error(grid, message):
    with pytest.raises(EvalError, match=message):
        sweep.parse_grid(grid)


def test_sweep_matches_eval_and_refuses_unloaded_sets(db, embedder, tmp_path, capsys):
    folder = write_beir(tmp_path / "sweep-set")
    out = tmp_path / "sweep.json"
    args = sweep_args("--beir", str(folder), "--grid", "fusion=dbsf,rrf", "--modes", "hybrid,lexical")
    assert sweep.run(args, settings_for(db), embedder=embedder) == 2
    assert "eval-sweep-set is missing or empty: load it first" in capsys.readouterr().err

    eval_out = tmp_path / "eval-rrf.json"
    argv = (str(folder), "--modes", "hybrid", "--fusion", "rrf", "--out", str(eval_out))
    assert evaluate.run(parse(*argv), settings_for(db), embedder=embedder) == 0
    capsys.readouterr()
    args = sweep_args(
        "--beir", str(folder), "--grid", "fusion=dbsf,rrf", "--modes", "hybrid,lexical", "--out", str(out)
    )
    assert sweep.run(args, settings_for(db), embedder=embedder) == 0
    report = json.loads(out.read_text("utf-8"))
    assert [row["settings"] for row in report["rows"]] == [{"fusion": "dbsf"}, {"fusion": "rrf"}]
    ref = report["datasets"]["sweep-set"]
    assert ref["n_queries"] == 4 and ref["best_leg"] in ("vector", "lexical")
    assert ref["best_ndcg@10"] == ref["legs"][ref["best_leg"]]["ndcg@10"]
    rrf = report["rows"][1]["modes"]["hybrid"]
    assert (
        rrf["datasets"]["sweep-set"]["ndcg@10"] == json.loads(eval_out.read_text("utf-8"))["modes"]["hybrid"]["ndcg@10"]
    )
    assert rrf["worst_delta"] == pytest.approx(rrf["datasets"]["sweep-set"]["ndcg@10"] - ref["best_ndcg@10"], abs=1e-4)
    text = capsys.readouterr().out
    assert "**hybrid**" in text and "**lexical**" in text and "| fusion=rrf |" in text


def test_sweep_arguments_are_checked(db, embedder, tmp_path, capsys):
    folder = write_beir(tmp_path / "args-set")
    for argv, message in [
        ((), "nothing to sweep"),
        (("--beir", str(folder), "--modes", "hybrid+rerank"), "--modes: choose from"),
        (("--beir", str(folder), "--max-queries", "0"), "--max-queries must be at least 1"),
        (("--beir", str(tmp_path / "absent")), "absent"),
    ]:
        assert sweep.run(sweep_args(*argv), settings_for(db), embedder=embedder) == 2, argv
        assert message in capsys.readouterr().err, argv
