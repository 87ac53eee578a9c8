"""The term dictionary in blocks (migration 049, db/functions/29_term_dictionary.sql): every search reads the
same terms, document frequencies, tiers and recent postings whether a knowledge base's dictionary is in rows,
in compressed blocks, or both (rows written since the last compaction override their block entries, df 0 a
removed term); writes compact it when its rows pass their bound; a rebuild gives the same dictionary."""

from __future__ import annotations

import json

import fixture_docs
import pytest
from chunk_terms import CHUNK_TERMS
from pgkb.config import Settings
from pgkb.migrate import migrate
from pgvector import Vector
from term_dictionary import TERM_DICTIONARY

# every lookup shape: English and Chinese terms, a Traditional query, identifiers, typos of a word (one edit
# away, a prefix) and of Chinese characters inside a run and in a run of two, translations both ways, absent terms
QUERIES = [
    "退款",
    "缓存击穿",
    "Redis 缓存击穿",
    "登錄態失效怎麼排查",
    "tidb_mem_quota_query",
    "tidb_mem_qouta_query",
    "getUserTokne",
    "getUser",
    "kubectl rollback",
    "how do I roll back a release",
    "refund within three days",
    "缓存过期",
    "TLS 证书过期",
    "灯搭何时建立",
    "海边灯塔",
    "东边灯搭",
    "系统响应很慢怎么优化",
    "zzzunknownword 完全没有",
]
EXTRA_DOCS = {
    "lighthouse.md": ("灯塔", "灯塔为何建在岛上？东边的灯塔和西边的灯塔都在海边。getUserToken 返回令牌。"),
    "refund-zh.md": ("退款规则", "退款会在 3 个工作日内原路退回，超过 7 天联系财务。缓存的有效期是 10 分钟。"),
    "tls.md": ("TLS certificates", "Rotate the TLS certificate before it expires; cert-manager renews it."),
    "words.md": ("Word list", " ".join(f"vocabulary{i} 词汇{chr(0x4E00 + i)}{chr(0x4E80 + i)}" for i in range(150))),
}


def word(prefix: str, i: int) -> str:
    """A word of letters only (a digit would make its number a term of its own)."""
    return prefix + "".join(chr(ord("a") + i // 26**k % 26) for k in range(3))


def put(db, key: str, title: str, text: str) -> None:
    db.execute(
        "select kb.replace_document('team-docs', %s, %s, %s::jsonb)", [key, title, json.dumps([{"content": text}])]
    )


@pytest.fixture
def dictionary_db(db, embedder):
    fixture_docs.load(db, embedder)
    for key, (title, text) in EXTRA_DOCS.items():
        put(db, key, title, text)
    return db


def answers(db, embedder) -> dict:
    """What every reader of the dictionary gives: the legs, hybrid, the fuzzy leg's corrections, the
    translations, the answer gate's evidence, and the dictionary itself."""
    ids = [r[0] for r in db.execute("select id from kb.knowledge_bases order by id")]
    out: dict = {"dictionary": sorted(db.execute(f"select * from {TERM_DICTIONARY} as d").fetchall())}
    # the SQL BM25 leg (a server without plpython3u) reads the recent postings through the same reader
    db.execute("update kb.settings set value = 'blocks' where key = 'lexical_leg'")
    out["sql leg"] = [
        db.execute("select chunk_id, lexical_score from kb.lexical_search(%s, 10)", [q]).fetchall() for q in QUERIES
    ]
    db.execute("update kb.settings set value = 'auto' where key = 'lexical_leg'")
    for query in QUERIES:
        vec = Vector(embedder.embed(["query: " + query])[0])
        out[query] = (
            db.execute("select chunk_id, lexical_score from kb.lexical_search(%s, 10)", [query]).fetchall(),
            db.execute("select chunk_id, fuzzy_score from kb.fuzzy_search(%s, 10)", [query]).fetchall(),
            db.execute(
                "select chunk_id, score, lexical_rank, fuzzy_rank, vector_rank"
                " from kb.hybrid_search(%s, top_k => 10, query_embedding => %s)",
                [query, vec],
            ).fetchall(),
            db.execute("select kb_internal.fuzzy_expansions(%s, %s)", [query, ids]).fetchone()[0],
            db.execute("select * from kb_internal.query_translations(%s, %s)", [query, ids]).fetchall(),
            db.execute("select * from kb_internal.lexical_query_terms(%s, %s)", [query, ids]).fetchall(),
            db.execute(
                "select found, mode, answer from kb.ask(%s, mode => 'extractive', query_embedding => %s)", [query, vec]
            ).fetchall(),
        )
    return out


def blocks_and_rows(db) -> tuple[int, int]:
    return db.execute("select (select count(*) from kb.term_blocks), (select count(*) from kb.term_stats)").fetchone()


def compact(db) -> None:
    db.execute("select kb_internal.compact_terms(id) from kb.knowledge_bases")


def assert_counted_from_text(db) -> None:
    counted = f"select x.kb_id, x.term, count(*)::integer from {CHUNK_TERMS} as x group by 1, 2 order by 1, 2"
    assert db.execute(f"select kb_id, term, df from {TERM_DICTIONARY} as d order by 1, 2").fetchall() == (
        db.execute(counted).fetchall()
    )


def test_every_reader_reads_the_same_dictionary_in_rows_in_blocks_and_both(dictionary_db, embedder):
    db = dictionary_db
    assert blocks_and_rows(db)[0] == 0  # below the bound: rows only
    in_rows = answers(db, embedder)
    assert any(e[3] for e in in_rows.values() if isinstance(e, tuple))  # some corrections were found
    assert any(e[4] for e in in_rows.values() if isinstance(e, tuple))  # and some translations
    compact(db)
    blocks, rows = blocks_and_rows(db)
    assert rows == 0 and blocks >= 4  # several blocks of each kind
    assert db.execute("select count(*) from kb.term_blocks where kind = 1").fetchone()[0] >= 2
    assert answers(db, embedder) == in_rows

    # writes on blocks: a changed document, a deleted one, a new one; the changed entries are rows again
    put(db, "lighthouse.md", "灯塔", "灯塔建在岛上，西边的灯塔在海边。getUserToken 返回新的令牌。")
    db.execute("select kb.delete_document('team-docs', 'tls.md')")
    put(db, "new.md", "新文档", "新的退款流程 refundFlow 说明。vocabulary7 词汇")
    blocks, rows = blocks_and_rows(db)
    assert blocks > 0 and rows > 0
    assert db.execute("select count(*) from kb.term_stats where df = 0").fetchone()[0] > 0  # removed terms
    # a removed Chinese bigram keeps its entries in both kinds of block until the next compaction: no reader
    # returns it
    removed = [
        r[0]
        for r in db.execute(
            "select term from kb.term_stats where df = 0 and length(term) = 2 and octet_length(term) = 6"
        )
    ]
    assert removed
    for term in removed:
        assert (
            db.execute(
                "select count(*) from kb.term_blocks where kind = 1 and reverse(%s) = any(terms)", [term]
            ).fetchone()[0]
            == 1
        )
        assert (
            db.execute("select count(*) from kb.term_blocks where kind = 0 and %s = any(terms)", [term]).fetchone()[0]
            == 1
        )
        ids = [r[0] for r in db.execute("select id from kb.knowledge_bases")]
        for sql, args in (
            ("select term from kb_internal.bigrams_ending(%s, right(%s, 1))", [ids, term]),
            (
                "select term from kb_internal.term_range(%s, left(%s, 1), left(%s, 1) || chr(1114111))",
                [ids, term, term],
            ),
            ("select term from kb_internal.term_counts(%s, array[%s])", [ids, term]),
            ("select term from kb_internal.term_entries(%s, array[%s])", [ids, term]),
        ):
            assert term not in {r[0] for r in db.execute(sql, args)}, sql
    assert_counted_from_text(db)
    both = answers(db, embedder)
    assert both != in_rows  # the writes changed what is found
    compact(db)
    assert blocks_and_rows(db)[1] == 0
    assert answers(db, embedder) == both
    # counted again from the chunks' text (and compacted at the end): the same answers, the same document
    # frequencies (tiers kept by writes may be supersets after deletes, recent postings are cut anew)
    db.execute("select kb_internal.recount_terms(id) from kb.knowledge_bases")
    assert blocks_and_rows(db)[1] == 0
    rebuilt = answers(db, embedder)
    assert [e[:3] for e in rebuilt.pop("dictionary")] == [e[:3] for e in both.pop("dictionary")]
    assert rebuilt == both
    assert_counted_from_text(db)


def test_writes_compact_the_dictionary_when_its_rows_pass_their_bound(db):
    """Below 1024 rows a knowledge base's dictionary stays in rows; the write that passes the bound folds them
    into blocks; later writes leave rows again, and the entries they override are gone from the readers."""
    put(db, "a.md", "A", " ".join(word("alpha", i) for i in range(600)))
    assert blocks_and_rows(db)[0] == 0 and blocks_and_rows(db)[1] >= 600
    put(db, "b.md", "B", " ".join(word("bravo", i) for i in range(600)))
    blocks, rows = blocks_and_rows(db)
    assert rows == 0 and blocks > 0
    term_rows, block_terms = db.execute("select term_rows, block_terms from kb.knowledge_bases").fetchone()
    assert term_rows == 0 and block_terms == db.execute(f"select count(*) from {TERM_DICTIONARY} as d").fetchone()[0]
    assert block_terms >= 1200
    put(db, "b.md", "B", f"{word('bravo', 1)} charlie")
    assert blocks_and_rows(db)[1] > 0
    assert_counted_from_text(db)
    assert db.execute("select count(*) from kb.lexical_search(%s, 5)", [word("bravo", 150)]).fetchone()[0] == 0
    assert db.execute("select count(*) from kb.lexical_search(%s, 5)", [word("bravo", 1)]).fetchone()[0] == 1
    assert db.execute("select count(*) from kb.lexical_search(%s, 5)", [word("alpha", 599)]).fetchone()[0] == 1


def test_a_large_dictionary_is_compacted_by_migrate_not_by_its_writes(db):
    """A knowledge base whose dictionary holds more entries in blocks than kb_internal.inline_compaction_terms()
    is never compacted by a write (its compaction could outlast the writer's statement timeout): its rows
    pass the bound, the write goes on, and `pgkb db migrate` compacts it."""
    put(db, "a.md", "A", " ".join(word("alpha", i) for i in range(600)))
    compact(db)
    limit = db.execute("select kb_internal.inline_compaction_terms()").fetchone()[0]
    db.execute("update kb.knowledge_bases set block_terms = %s", [limit + 1])  # as if that large
    bound = db.execute("select kb_internal.term_rows_bound(%s)", [limit + 1]).fetchone()[0]
    for d in range(bound // 1000 + 1):
        put(db, f"b{d}.md", "B", " ".join(word(f"bravo{chr(ord('a') + d)}", i) for i in range(1000)))
    assert db.execute("select count(*) from kb.term_stats").fetchone()[0] > bound  # past it: not compacted
    term_rows = db.execute("select term_rows from kb.knowledge_bases").fetchone()[0]
    assert term_rows > bound
    before = db.execute(f"select * from {TERM_DICTIONARY} as d order by 1, 2").fetchall()
    assert migrate(db, Settings.from_env().db_dir).compacted == ["team-docs"]
    assert blocks_and_rows(db)[1] == 0
    assert db.execute(f"select * from {TERM_DICTIONARY} as d order by 1, 2").fetchall() == before


def test_migrate_compacts_a_dictionary_left_in_rows(db):
    """An upgrade from before migration 049 leaves every term a row (migration 049 counts them): `pgkb db
    migrate` compacts the knowledge bases past the bound, drops the rows of removed terms and gives the rows'
    index space back; the next migrate has nothing to compact."""
    put(db, "a.md", "A", " ".join(word("alpha", i) for i in range(900)))
    db.execute(
        "insert into kb.term_stats (kb_id, term, df) select id, 'removed' || g, 0 from kb.knowledge_bases,"
        " generate_series(1, 300) as g"
    )
    db.execute("update kb.knowledge_bases set term_rows = (select count(*) from kb.term_stats)")
    before = db.execute(f"select * from {TERM_DICTIONARY} as d order by 1, 2").fetchall()
    index_size = "select pg_relation_size('kb.term_stats_pkey')"
    index_before = db.execute(index_size).fetchone()[0]
    report = migrate(db, Settings.from_env().db_dir)
    assert report.compacted == ["team-docs"]
    assert "compacted the term dictionary of knowledge base team-docs" in report.lines()
    assert blocks_and_rows(db)[1] == 0
    assert db.execute(f"select * from {TERM_DICTIONARY} as d order by 1, 2").fetchall() == before
    assert db.execute(index_size).fetchone()[0] < index_before / 4  # rebuilt
    assert "rebuilt the indexes of kb.term_stats (its rows were compacted)" in report.lines()
    assert migrate(db, Settings.from_env().db_dir).compacted == []
