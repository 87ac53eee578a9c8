"""What to tell a caller about the language of the knowledge it searches, from the database's language profile
(kb.language_profile / kb.knowledge_languages: shares of chunks in Chinese, English and other languages, and
the main one). The MCP server puts it in its instructions and tool descriptions, so an IDE agent that writes
English asks a Chinese knowledge base in Chinese and passes its own wording in ``also``."""

from __future__ import annotations

NAMES = {"zh": "Chinese", "en": "English", "other": "other languages"}


def describe(profile: dict | None) -> str:
    """The profile in a few words: "mostly Chinese (79 %; English 21 %)", "" for no knowledge."""
    if not profile or profile.get("main") is None:
        return ""
    shares = sorted(((float(profile.get(k) or 0), k) for k in NAMES), reverse=True)
    parts = [f"{NAMES[k]} {round(v * 100)} %" for v, k in shares if v >= 0.005]
    if profile["main"] == "mixed":
        return "mixed: " + ", ".join(parts)
    return f"mostly {NAMES[profile['main']]} ({parts[0].split(' ', 1)[-1]}" + (
        f"; {', '.join(parts[1:])})" if len(parts) > 1 else ")"
    )


def advice(profile: dict | None) -> str:
    """The sentence an agent reads: which language to write ``query`` in and what to put in ``also``."""
    words = describe(profile)
    if not words:
        return ""
    main = profile["main"] if profile else None
    if main == "zh":
        return (
            f"The knowledge is {words}: write `query` in Chinese, and put your English wording of the same "
            "question in `also` (and the reverse for an English question you cannot translate)."
        )
    if main == "en":
        return (
            f"The knowledge is {words}: write `query` in English, and put the wording in the user's language in `also`."
        )
    return (
        f"The knowledge is {words}: write `query` in the user's language and put its translation (Chinese or "
        "English) in `also`."
    )
