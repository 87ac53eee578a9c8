"""`pgkb sweep`: compare search settings (nDCG@10 grid) on datasets `pgkb eval` has loaded."""

from __future__ import annotations


def register(sub) -> None:
    from pgkb.quality.sweep import SWEEP_MODES, SWEEPABLE

    parser = sub.add_parser("sweep", help="compare search settings on datasets `pgkb eval` has loaded (nDCG@10 grid)")
    parser.add_argument("--beir", action="append", default=[], metavar="DIR", help="BEIR folder (repeatable)")
    parser.add_argument(
        "--questions", action="append", default=[], nargs=2, metavar=("DOCS", "FILE"),
        help="doc-questions: documents folder and questions JSONL (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--grid", action="append", default=[], metavar="KEY=V1,V2",
        help=f"values to combine (repeatable); KEY one of {', '.join(SWEEPABLE)}",
    )  # fmt: skip
    parser.add_argument("--modes", default="hybrid", help=f"comma-separated, of {', '.join(SWEEP_MODES)}")
    parser.add_argument("--max-queries", type=int, default=None, help="a seeded sample of N queries per dataset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the report as JSON to this file")
    parser.set_defaults(func=run)


def run(args, settings) -> int:
    from pgkb.quality import sweep

    return sweep.run(args, settings)
