"""Orpheus's expressive tags: kept whole through normalization; anything else in `<...>` is read.

The Orpheus fine-tunes were trained with eight tags written in angle brackets; the model makes the
sound (a laugh, a sigh) where the tag stands. A tag must reach the tokenizer exactly as trained
("<laugh>", lower case, no spaces) or the model reads its letters aloud, so known tags are
matched case-insensitively and written back in the trained spelling.

The rule for an unknown `<...>` (`<whisper>`, `<break time="1s"/>`, `</b>`): it is **spoken as
text** — its words are read and the brackets, slashes and quotes dropped ("<whisper>" -> "whisper").
Never half-consumed: a tag-shaped run is either a known tag, or read as words, as one unit. We
read rather than drop because silently losing words is the worse failure: a caller who hears
"whisper" sees the mistake in `voicering normalize` at once. A `<` that opens nothing tag-shaped
(no `>` within `MAX_TAG_CHARS`, or a space or digit right after it) is said "less than" where it
stands alone ("a < b") and dropped where it is stuck to a word.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_TAG_CHARS", "TAG", "TAGS", "is_tag", "known_tag", "strip_tags", "unknown_tag_words"]

TAGS: Final = ("laugh", "chuckle", "sigh", "cough", "sniffle", "groan", "yawn", "gasp")
MAX_TAG_CHARS: Final = 64  # a `<...>` longer than this is not a tag: a stray `<` must not swallow text

# Tag-shaped: `<`, an optional `/`, a letter, then anything but brackets and newlines, then `>`.
TAG: Final = re.compile(r"<\s*/?[A-Za-z][^<>\n]{0,%d}>" % (MAX_TAG_CHARS - 3))
_KNOWN: Final = frozenset(TAGS)
_WORD = re.compile(r"[^\W_]+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")


def known_tag(token: str) -> str | None:
    """'<LAUGH>' -> '<laugh>'; None when the token is not exactly one of `TAGS` in brackets."""
    inner = token[1:-1].strip().lower() if token.startswith("<") and token.endswith(">") else ""
    return f"<{inner}>" if inner in _KNOWN else None


def is_tag(token: str) -> bool:
    return known_tag(token) is not None


def unknown_tag_words(token: str) -> str:
    """What an unknown tag-shaped token is read as: its words ('<break time="1s"/>' -> 'break time 1s')."""
    return " ".join(_WORD.findall(token))


def strip_tags(text: str) -> str:
    """The text without its known tags (a transcript of what is said, for captions and chat history)."""
    kept = " ".join(TAG.sub(lambda m: m[0] if known_tag(m[0]) is None else " ", text).split())
    return _SPACE_BEFORE_PUNCT.sub(r"\1", kept)
