"""Metadata conditions are evaluated on the caller's visible documents only (issue 20, finding 1).

bob keeps documents whose metadata no number parses from (``"1e999"``, a JSON number beyond double
precision) in his private knowledge base; alice filters her own on the same field. Her search must neither
fail on bob's values nor read bob's documents (an error or a plan row count would tell her his field names),
in every leg; a stored value out of double precision's range simply does not match.
"""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest
from pgvector import Vector

DIM = 384
CONDITION = {
    "logical_operator": "and",
    "conditions": [{"name": "year", "comparison_operator": ">", "value": 5}],
}
VEC = Vector(np.array([1.0] + [0.0] * (DIM - 1), dtype=np.float32))


def chunk(text: str) -> str:
    return json.dumps([{"content": text, "embedding": [1.0] + [0.0] * (DIM - 1)}])


@pytest.fixture
def tenants(db):
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("select kb.create_knowledge_base('probe-alice', 'private', owner => 'alice')")
    db.execute("select kb.create_knowledge_base('bob-private', 'private', owner => 'bob')")
    for year in (3, 2024):
        db.execute(
            "select kb.replace_document('probe-alice', %s, 'checklist', %s::jsonb, metadata => %s::jsonb)",
            [f"a{year}.md", chunk(f"release checklist {year}"), json.dumps({"year": year})],
        )
    for i, year in enumerate(['"1e999"', "1e999", '"-1e999"', "1e-999"]):
        db.execute(
            "select kb.replace_document('bob-private', %s, 'checklist', %s::jsonb, metadata => %s::jsonb)",
            [f"b{i}.md", chunk(f"bob checklist secret {i}"), '{"year": ' + year + "}"],
        )
    return db


SEARCHES = {
    "hybrid": "select doc_key from kb.hybrid_search('checklist', kb => %s, query_embedding => %s,"
    " metadata_condition => %s::jsonb)",
    "hybrid-all-visible": "select doc_key from kb.hybrid_search('checklist', kb => %s, query_embedding => %s,"
    " metadata_condition => %s::jsonb, candidates => 1)",
    "retrieve": "select doc_key from kb.retrieve('checklist', 5, %s, %s, null, %s::jsonb)",
}


@pytest.mark.parametrize("lexical_leg", ["numpy", "blocks", "scan"])
@pytest.mark.parametrize("search", list(SEARCHES))
def test_other_users_unparsable_numbers_neither_fail_nor_match(tenants, connect_as, search, lexical_leg):
    tenants.execute("update kb.settings set value = %s where key = 'lexical_leg'", [lexical_leg])
    alice = connect_as("alice")
    kb = None if search == "hybrid-all-visible" else "probe-alice"
    rows = alice.execute(SEARCHES[search], [kb, VEC, json.dumps(CONDITION)]).fetchall()
    assert {r[0] for r in rows} == {"a2024.md"}


def test_out_of_range_stored_numbers_do_not_match(tenants):
    """Even where they are visible (the administrator), values beyond double precision match no number."""
    for op, value in ((">", 5), ("<", 5), ("≠", 5)):
        condition = {"conditions": [{"name": "year", "comparison_operator": op, "value": value}]}
        rows = tenants.execute(
            "select doc_key from kb.hybrid_search('checklist', kb => 'bob-private', query_embedding => %s,"
            " metadata_condition => %s::jsonb)",
            [VEC, json.dumps(condition)],
        ).fetchall()
        keys = {r[0] for r in rows}
        # ≠ is the negation of =: a value that is no number is "not 5"; > and < match none of them
        assert keys == ({"b0.md", "b1.md", "b2.md", "b3.md"} if op == "≠" else {"b3.md"} if op == "<" else set())


@pytest.mark.parametrize("value", ['"1e999"', '"-1e999"', "1e999", "-1e400", '"NaN"', '"Infinity"'])
def test_out_of_range_condition_values_are_invalid_parameters(db, value):
    text = '{"conditions": [{"name": "year", "comparison_operator": ">", "value": ' + value + "}]}"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="metadata condition 1"):
        db.execute("select kb.check_metadata_condition(%s::jsonb)", [text])


def _leg_plans(conn, sql: str, args) -> list[dict]:
    """The plans of every statement the search ran inside its functions (auto_explain, as JSON)."""
    plans: list[dict] = []
    conn.add_notice_handler(
        lambda d: (
            plans.append(json.loads(d.message_primary.split("\n", 1)[1]))
            if (d.message_primary or "").startswith("duration:")
            else None
        )
    )
    conn.execute("load 'auto_explain'")
    for setting, value in (
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_analyze", "on"),
        ("auto_explain.log_nested_statements", "on"),
        ("auto_explain.log_format", "json"),
        ("client_min_messages", "log"),
    ):
        conn.execute(f"set {setting} = '{value}'")
    try:
        conn.execute(sql, args).fetchall()
    finally:
        conn.execute("reset client_min_messages")
        conn.execute("set auto_explain.log_min_duration = -1")
    return plans


def _filtered_rows(node: dict) -> int:
    """Rows a metadata filter ran on in this plan: those of every node whose Filter calls it (kept plus
    removed), summed over loops."""
    own = 0
    if "document_matches" in node.get("Filter", ""):
        own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 1)
    return own + sum(_filtered_rows(child) for child in node.get("Plans", []))


@pytest.mark.parametrize("lexical_leg", ["numpy", "blocks", "scan"])
def test_the_legs_filter_only_rows_of_the_searched_knowledge_bases(tenants, lexical_leg):
    """EXPLAIN ANALYZE of every statement inside the legs: the filter runs on alice's two documents (or
    chunks) only, never on bob's 64 documents (which are not searched)."""
    tenants.execute("update kb.settings set value = %s where key = 'lexical_leg'", [lexical_leg])
    tenants.execute(
        "select kb.replace_document('bob-private', 'b' || g || '-bulk.md', 'other', %s::jsonb,"
        " metadata => '{\"year\": 1}'::jsonb) from generate_series(1, 60) as g",
        [chunk("bob unrelated words")],
    )
    condition = json.dumps({"conditions": [{"name": "year", "comparison_operator": "≥", "value": 0}]})
    plans = _leg_plans(
        tenants,
        "select doc_key from kb.hybrid_search('checklist', kb => 'probe-alice', query_embedding => %s,"
        " metadata_condition => %s::jsonb)",
        [VEC, condition],
    )
    filtered = [_filtered_rows(p["Plan"]) for p in plans]
    worst = max(range(len(plans)), key=lambda i: filtered[i])
    assert filtered[worst] <= 4, (filtered[worst], plans[worst]["Query Text"][:300])
