"""The SQL text model (db/functions/00_text.sql): kb.fold_text, kb.lexical_terms, kb_internal.is_blank."""

from __future__ import annotations

import json
import re
import time
import unicodedata

import pytest
from pgkb.config import Settings

TRADITIONAL = "這是一個關於資料庫連線池滿了怎麼辦的說明文件，請參閱運維手冊。登錄態失效怎麼排查？"
SIMPLIFIED = "这是一个关于数据库连接池满了怎么办的说明文件，请参阅运维手册。登录态失效怎么排查？"


def fold_table() -> tuple[str, dict[str, str]]:
    """The precheck's bracket expression and the character table, as written in 00_text.sql."""
    text = (Settings.from_env().db_dir / "functions" / "00_text.sql").read_text(encoding="utf-8")
    body = text[text.index("create or replace function kb.fold_text") :]
    precheck = re.search(r"if folded ~ '\[([^\]]*)\]'", body).group(1)
    table = json.loads(re.search(r"'(\{[^']*\})'::jsonb", body).group(1))
    return precheck, table


def test_fold_table_and_precheck_list_the_same_characters(db):
    precheck, table = fold_table()
    assert len(table) == len(precheck) == len(set(precheck)) > 4000
    assert set(precheck) == set(table)
    assert all(len(k) == len(v) == 1 and k != v for k, v in table.items())
    keys = "".join(table)
    assert db.execute("select kb.fold_text(%s)", [keys]).fetchone()[0] == "".join(table.values())


@pytest.mark.parametrize(
    ("text", "folded"),
    [
        ("登錄態失效怎麼排查", "登录态失效怎么排查"),
        ("ＡＢＣ　Ｔｉｄｂ", "abc tidb"),  # NFKC: full-width letters and ideographic space
        ("Ｒｅｄｉｓ 緩存擊穿", "redis 缓存击穿"),
        ("𠁞𠌥 plain", "𠀾𠆿 plain"),  # outside the BMP
        ("", ""),
    ],
)
def test_fold_text(db, text, folded):
    assert db.execute("select kb.fold_text(%s)", [text]).fetchone()[0] == folded


def test_fold_text_is_linear_on_traditional_text(db):
    """Issue 9: translate() rescanned its 4105-character table for every character, so Traditional text
    cost ~130x Simplified text of the same length (1 MB: 19-36 s). Now a table lookup per character."""

    def seconds(text):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            db.execute("select length(kb.fold_text(%s))", [text]).fetchone()
            best = min(best, time.perf_counter() - t0)
        return best

    n = 1_000_000 // len(TRADITIONAL.encode())  # about 1 MB
    traditional, simplified = seconds(TRADITIONAL * n), seconds(SIMPLIFIED * n)
    assert traditional < 15 * simplified, (traditional, simplified)
    expected = unicodedata.normalize("NFKC", TRADITIONAL).translate(str.maketrans(fold_table()[1])).lower()
    assert db.execute("select kb.fold_text(%s)", [TRADITIONAL * 3]).fetchone()[0] == expected * 3


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("x" * 100, ["x" * 64]),
        ("getUserName", ["getusername", "get", "user", "name"]),
        ("a_" + "b" * 70, ["a_" + "b" * 62, "b" * 64]),
        ("数据库", ["数据", "据库"]),
    ],
)
def test_lexical_terms_are_at_most_64_characters(db, text, terms):
    assert db.execute("select kb.lexical_terms(%s)", [text]).fetchone()[0] == terms


@pytest.mark.parametrize(
    ("text", "blank"),
    [
        ("", True),
        (" \t\r\n", True),
        ("\u3000\u00a0\u202f\u2007", True),  # ideographic, no-break, narrow no-break, figure space
        ("\u200b\u200c\u200d\u2060\ufeff\u00ad", True),  # zero-width space / joiners, word joiner, BOM, soft hyphen
        ("\u2028\u2029\u0085\x01\x7f", True),  # line / paragraph separators, NEL, controls
        ("\ufe0f\U000e0041", True),  # variation selector, tag character
        ("x", False),
        ("\u200b退\u200b", False),
        ("\u00a0.", False),
        ("😀", False),
    ],
)
def test_is_blank(db, text, blank):
    assert db.execute("select kb_internal.is_blank(%s)", [text]).fetchone()[0] is blank


@pytest.mark.parametrize(
    ("text", "scripts"),
    [
        ("退款多久到账", ["nonlatin"]),
        ("How long does a refund take?", ["latin"]),
        ("列表渲染 v-for 与对象", ["nonlatin"]),  # identifiers in a Chinese title do not make it Latin
        ("Redis 缓存击穿", ["nonlatin"]),  # one identifier beside four Chinese characters
        ("退款 creatUser", ["latin", "nonlatin"]),  # both: a document in either script could match a term
        ("kubectl 回滚", ["nonlatin", "latin"]),
        ("FAQ — “Login” …", ["latin"]),  # typographic punctuation is no script
        ("Руководство пользователя", ["nonlatin"]),  # Cyrillic: not Latin letters either
        ("Réseau local", ["latin"]),
        ("401", []),
        ("— …", []),
        ("", []),
    ],
)
def test_text_scripts(db, text, scripts):
    assert db.execute("select kb_internal.text_scripts(%s)", [text]).fetchone()[0] == scripts
