"""Metadata conditions (db/functions/48_metadata_filter.sql) inside the search legs, and kb.retrieve's
absolute 0..1 score (db/functions/57_retrieve.sql): every operator against hand-made metadata, the errors
for conditions pgkb cannot honour, visibility, and the score's monotonicity and threshold."""

from __future__ import annotations

import json

import fixture_docs
import psycopg
import pytest
from pgvector import Vector

DOCS = {  # doc_key -> document metadata
    "a.md": {"category": "ops", "tags": ["deploy", "k8s"], "year": 2023, "published": "2023-05-01", "owner": "sre"},
    "b.md": {"category": "hr", "tags": ["leave"], "year": "2021", "published": "2021-01-10T08:00:00Z", "owner": ""},
    "c.md": {"category": "ops-legacy", "year": 2019, "published": "not a date"},
}


@pytest.fixture
def meta(db):
    db.execute("select kb.create_user('alice', 'alice')")
    db.execute("select kb.create_user('bob', 'bob')")
    db.execute("select kb.create_knowledge_base('m', 'public', owner => 'alice')")
    for key, metadata in DOCS.items():
        db.execute(
            "select * from kb.replace_document(kb => 'm', doc_key => %s, title => %s, chunks => %s::jsonb,"
            " metadata => %s::jsonb)",
            [key, key, json.dumps([{"content": f"shared word quokka in {key}"}]), json.dumps(metadata)],
        )
    return db


def keys(db, condition) -> set[str]:
    rows = db.execute(
        "select doc_key from kb.hybrid_search('quokka', 10, 'm', vector_weight => 0, metadata_condition => %s)",
        [json.dumps(condition)],
    ).fetchall()
    return {r[0] for r in rows}


def one(name, op, value=None, **extra):
    item = {"name": name, "comparison_operator": op, **extra}
    if value is not None:
        item["value"] = value
    return {"conditions": [item]}


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (one("category", "contains", "ops"), {"a.md", "c.md"}),
        (one("category", "not contains", "ops"), {"b.md"}),
        (one("tags", "contains", "k8s"), {"a.md"}),  # an array field: element membership
        (one("category", "start with", "ops-"), {"c.md"}),
        (one("category", "end with", "s"), {"a.md"}),
        (one("category", "is", "hr"), {"b.md"}),
        (one("category", "is not", "hr"), {"a.md", "c.md"}),
        (one("owner", "empty"), {"b.md", "c.md"}),  # "" and missing
        (one("owner", "not empty"), {"a.md"}),
        (one("category", "in", ["hr", "ops"]), {"a.md", "b.md"}),
        (one("category", "not in", ["hr", "ops"]), {"c.md"}),
        (one("tags", "in", ["leave", "nothing"]), {"b.md"}),
        (one("year", "=", 2021), {"b.md"}),  # a numeric string field counts as a number
        (one("year", "≠", 2021), {"a.md", "c.md"}),
        (one("year", ">", "2020"), {"a.md", "b.md"}),  # a numeric string value too
        (one("year", "<", 2021), {"c.md"}),
        (one("year", "≥", 2021), {"a.md", "b.md"}),
        (one("year", "≤", 2021), {"b.md", "c.md"}),
        (one("published", "before", "2022-01-01"), {"b.md"}),  # c.md's "not a date" matches neither
        (one("published", "after", "2021-01-10T07:00:00Z"), {"a.md", "b.md"}),
        (one("published", "after", 1_600_000_000), {"a.md", "b.md"}),  # Unix seconds
        (one("missing", "is", "x"), set()),
        (
            {"logical_operator": "or", "conditions": [one("category", "is", "hr")["conditions"][0],
                                                      one("year", "<", 2020)["conditions"][0]]},
            {"b.md", "c.md"},
        ),
        (
            {"logical_operator": "and", "conditions": [one("category", "contains", "ops")["conditions"][0],
                                                       one("year", ">", 2020)["conditions"][0]]},
            {"a.md"},
        ),
    ],
)  # fmt: skip
def test_every_operator(meta, condition, expected):
    assert keys(meta, condition) == expected


def test_containment_filter_and_condition_combine(meta):
    rows = meta.execute(
        "select doc_key from kb.hybrid_search('quokka', 10, 'm', vector_weight => 0, filter => %s,"
        " metadata_condition => %s)",
        ['{"category": "ops"}', json.dumps(one("year", ">", 2000))],
    ).fetchall()
    assert {r[0] for r in rows} == {"a.md"}
    # the condition is applied inside the legs: top_k 1 still finds the one matching document
    rows = meta.execute(
        "select doc_key from kb.hybrid_search('quokka', 1, 'm', vector_weight => 0, metadata_condition => %s)",
        [json.dumps(one("category", "is", "ops-legacy"))],
    ).fetchall()
    assert [r[0] for r in rows] == ["c.md"]


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ([], "must be a JSON object"),
        ({}, "conditions must be an array"),
        ({"conditions": []}, "is empty"),
        ({"logical_operator": "xor", "conditions": [{"name": "a", "comparison_operator": "is", "value": "x"}]},
         'must be "and" or "or"'),
        (one("a", "all of", "x"), 'comparison_operator "all of" is not supported'),
        (one("a", "exists"), "is not supported"),
        (one("a", "null"), "is not supported"),
        ({"conditions": [{"comparison_operator": "is", "value": "x"}]}, 'must be an object with a "name"'),
        ({"conditions": [{"name": ["a", "b"], "comparison_operator": "is", "value": "x"}]}, '"name"'),
        (one("a", ">", "ten"), "value must be a finite number"),
        (one("a", "=", True), "value must be a finite number"),
        (one("a", "before", "yesterday"), "ISO-8601"),
        (one("a", "after", "2024-02-30"), "ISO-8601"),
        (one("a", "in", []), "list of 1 to 100 strings"),
        (one("a", "in", [{"x": 1}]), "list of 1 to 100 strings"),
        (one("a", "contains", ["x"]), "value must be a string"),
        (one("a", "is"), "value must be a string"),
        ({"conditions": [{"name": "a", "comparison_operator": "is", "value": "x"}] * 21}, "at most 20"),
    ],
)  # fmt: skip
def test_conditions_pgkb_cannot_honour_are_errors(meta, condition, message):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message.replace("(", r"\(")):
        keys(meta, condition)


def test_condition_never_reaches_invisible_documents(meta, connect_as):
    meta.execute("select kb.create_knowledge_base('bob-private', 'private', owner => 'bob')")
    meta.execute(
        "select * from kb.replace_document(kb => 'bob-private', doc_key => 'secret.md', title => 's',"
        ' chunks => %s::jsonb, metadata => \'{"category": "ops"}\')',
        [json.dumps([{"content": "quokka secret"}])],
    )
    alice = connect_as("alice")
    rows = alice.execute(
        "select doc_key from kb.hybrid_search('quokka', 10, vector_weight => 0, metadata_condition => %s)",
        [json.dumps(one("category", "contains", "ops"))],
    ).fetchall()
    assert {r[0] for r in rows} == {"a.md", "c.md"}
    with pytest.raises(psycopg.errors.NoDataFound, match='unknown knowledge base "bob-private"'):
        alice.execute("select * from kb.retrieve('quokka', 5, 'bob-private')")
    with pytest.raises(psycopg.errors.NoDataFound, match='unknown knowledge base "nope"'):
        alice.execute("select * from kb.retrieve('quokka', 5, 'nope')")


# ------------------------------------------------------------------------------------------- kb.retrieve


@pytest.fixture
def docs(db, embedder):
    db.execute("select kb.create_knowledge_base('team-docs', 'public')")
    fixture_docs.load(db, embedder, "team-docs")
    return db


def retrieve(db, embedder, query, top_k=10, threshold=0.0):
    vector = Vector(embedder.embed(["query: " + query])[0])
    return db.execute(
        "select doc_key, fused_score, relevance, score from kb.retrieve(%s, %s, 'team-docs', %s,"
        " score_threshold => %s)",
        [query, top_k, vector, threshold],
    ).fetchall()


@pytest.mark.parametrize(
    ("query", "relevant"),
    [
        ("登录态失效怎么排查", "guide/login.md"),
        ("退款多久到账", "policy/refund.md"),
        ("how to roll back a deployment", "ops/deploy.md"),
        ("TiDB 内存限制", "db/tidb.md"),
    ],
)
def test_scores_follow_pgkb_order_and_separate_relevant_hits(docs, embedder, query, relevant):
    rows = retrieve(docs, embedder, query)
    order = [r[0] for r in docs.execute(
        "select doc_key from kb.hybrid_search(%s, 10, 'team-docs', %s)",
        [query, Vector(embedder.embed(["query: " + query])[0])],
    ).fetchall()]  # fmt: skip
    assert [r[0] for r in rows] == order  # same hits, same order as kb.hybrid_search
    scores = [r[3] for r in rows]
    assert all(0 <= s <= 1 for s in scores)
    assert scores == sorted(scores, reverse=True)  # monotone in pgkb's ranking
    assert all(r[3] <= r[2] for r in rows)  # never above the hit's own relevance
    assert rows[0][0] == relevant and rows[0][3] >= 0.5  # the answer clears the default threshold of 0.5
    irrelevant = [r[2] for r in rows if not r[0].startswith(relevant.split("/")[0])]
    assert max(irrelevant) < 0.5, rows  # the rest do not


def test_threshold_keeps_a_prefix_and_unrelated_queries_get_nothing(docs, embedder):
    everything = retrieve(docs, embedder, "登录态失效怎么排查")
    kept = retrieve(docs, embedder, "登录态失效怎么排查", threshold=0.5)
    assert kept and kept == everything[: len(kept)] and len(kept) < len(everything)
    assert all(r[3] >= 0.5 for r in kept)
    assert retrieve(docs, embedder, "best pizza recipe", threshold=0.5) == []
    assert retrieve(docs, embedder, "今天天气怎么样", threshold=0.5) == []


def test_lexical_only_relevance_is_term_coverage(docs):
    rows = docs.execute(
        "select doc_key, relevance from kb.retrieve('tidb_mem_quota_query kubectl', 5, 'team-docs')"
        " where doc_key = 'db/tidb.md'"
    ).fetchall()
    # no query embedding: relevance is the share of the query's terms in the chunk; of tidb_mem_quota_query,
    # tidb, mem, quota, query and kubectl, the TiDB chunk holds all but kubectl
    terms = docs.execute("select array(select distinct unnest(kb.lexical_terms('tidb_mem_quota_query kubectl')))")
    n = len(terms.fetchone()[0])
    assert rows == [("db/tidb.md", pytest.approx((n - 1) / n))]


@pytest.mark.parametrize("threshold", [-0.1, 1.5, float("nan")])
def test_threshold_out_of_range_is_an_error(docs, threshold):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="score_threshold must be between 0 and 1"):
        docs.execute("select * from kb.retrieve('x', 5, score_threshold => %s)", [threshold])
