"""The entry point: `normalize(text, language="en")` -> what the voice reads, word by word.

The written text is read by its language's rules (`languages.language(code)`), after a
pronunciation dictionary if one is given (`dictionary.apply`). The result keeps, for every
spoken word, the span of the written text it came from and the index of that written word
(written words are the whitespace-separated runs of the caller's text): aligned transcripts map
audio back to what the caller wrote through it.

Bounded: text over `MAX_TEXT_CHARS` is refused (`TextTooLong`), numbers over 15 digits are read
digit by digit, and every rule's pattern is linear in its match, so the cost is linear in the text.
Pure, no I/O, standard library only: the gateway, the CLI and the trainer may all import it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gpu_worker.errors import TextTooLong
from gpu_worker.text.languages import language as rules_for
from gpu_worker.text.rules import Piece

if TYPE_CHECKING:
    from gpu_worker.text.dictionary import Dictionary

__all__ = ["MAX_TEXT_CHARS", "Normalized", "SpokenWord", "normalize", "prepare", "render"]

MAX_TEXT_CHARS: Final = 100_000  # far above a request's text (protocol.MAX_TEXT_CHARS); a bound, not a policy
_EXPANSION: Final = 4  # a dictionary may lengthen the text this much before it is refused

# Length-preserving (one character for one), so spans stay spans of the caller's text.
_SAME_LENGTH: Final = str.maketrans({
    **{c: " " for c in "\u00a0\u2002\u2003\u2009\u200a\u202f\u205f\u3000\t\r\n\v\f"},
    **{chr(c): " " for c in range(0x20) if chr(c) not in "\t\r\n\v\f"}, "\x7f": " ",
    "’": "'", "‘": "'", "ʼ": "'", "“": '"', "”": '"', "„": '"', "−": "-", "‐": "-", "‑": "-", "‒": "-",
    "\u200b": " ", "\ufeff": " ", "\u00ad": " ",
})
SPOKEN_WORD: Final = re.compile(r"<[^<>\s]+>|[\w']+(?:-[\w']+)*")  # a word or a kept tag (the aligner counts these)
_WRITTEN_WORD: Final = re.compile(r"\S+")
_NO_SPACE_BEFORE: Final = frozenset(",.;:!?)]…")
_NO_SPACE_AFTER: Final = frozenset("([")


@dataclass(frozen=True, slots=True)
class SpokenWord:
    """One spoken word: its span in `Normalized.text`, the written span it was read from, and the
    index of the written word (whitespace-separated run) that span starts in."""

    text: str
    start: int
    end: int
    written_start: int
    written_end: int
    written_index: int


@dataclass(frozen=True, slots=True)
class Normalized:
    written: str  # the caller's text, as given
    text: str  # what the voice reads (the prompt's text)
    words: tuple[SpokenWord, ...]

    def source(self, word: SpokenWord) -> str:
        """The written text a spoken word came from ("$5" for both "five" and "dollars")."""
        return self.written[word.written_start:word.written_end]


def prepare(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """The text the rules read: type- and length-checked, odd spaces, quotes and dashes made plain
    (one character for one, so offsets into it are offsets into the caller's text)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    if len(text) > limit:
        raise TextTooLong(f"the text holds {len(text):,} characters; the normalizer reads at most {limit:,}: "
                          "send it in smaller pieces")
    return text.translate(_SAME_LENGTH)


def _wordy_end(spoken: str) -> bool:
    return spoken[-1].isalnum() or spoken[-1] == ">"


def _wordy_start(spoken: str) -> bool:
    return spoken[0].isalnum() or spoken[0] == "<"


def render(pieces: Iterable[Piece], previous: str | None) -> tuple[str, list[tuple[Piece, int]]]:
    """The spoken text of `pieces` following `previous` (the spoken text of the piece before them,
    None at the start), and where each piece starts in it. One space where the written text had
    whitespace, or between two words the written text joined ("AT&T", "Wow<gasp>"); none before
    closing punctuation or after an opening bracket. Shared by `normalize` and the stream, so both
    produce the same characters."""
    parts: list[str] = []
    placed: list[tuple[Piece, int]] = []
    length = 0
    for piece in pieces:
        spoken = piece.spoken
        if not spoken:
            continue
        if previous is None:
            sep = ""
        elif spoken[0] in _NO_SPACE_BEFORE or previous[-1] in _NO_SPACE_AFTER:
            sep = ""
        elif piece.space_before or (_wordy_end(previous) and _wordy_start(spoken)):
            sep = " "
        else:
            sep = ""
        parts.append(sep)
        length += len(sep)
        placed.append((piece, length))
        parts.append(spoken)
        length += len(spoken)
        previous = spoken
    return "".join(parts), placed


def words_of(placed: Sequence[tuple[Piece, int]], written_starts: Sequence[int], offset: int = 0,
             source_span: Callable[[int, int], tuple[int, int]] | None = None) -> list[SpokenWord]:
    """The spoken words of rendered pieces, each with its written span (through `source_span` when
    a dictionary rewrote the text) and written-word index."""
    out = []
    for piece, at in placed:  # punctuation has no words; a symbol said by name ("&" "and") has
        w_start, w_end = source_span(piece.start, piece.end) if source_span else (piece.start, piece.end)
        index = max(0, bisect.bisect_right(written_starts, w_start) - 1)
        for m in SPOKEN_WORD.finditer(piece.spoken):
            out.append(SpokenWord(m[0], offset + at + m.start(), offset + at + m.end(), w_start, w_end, index))
    return out


def normalize(text: str, language: str = "en", *, dictionary: Dictionary | None = None) -> Normalized:
    """What the voice reads for `text` ("" for empty or blank text). Raises TextTooLong over
    `MAX_TEXT_CHARS`, UnknownLanguage for a language without rules, TypeError for a non-str."""
    written = text
    plain = prepared = prepare(text)
    rules = rules_for(language)
    source_span = None
    if dictionary is not None and dictionary.rules:
        from gpu_worker.text.dictionary import apply

        rewritten = apply(dictionary, plain)
        if len(rewritten.text) > _EXPANSION * MAX_TEXT_CHARS:
            raise TextTooLong(f"the pronunciation dictionary {dictionary.name!r} makes the text longer than "
                              f"{_EXPANSION * MAX_TEXT_CHARS:,} characters")
        plain, source_span = rewritten.text, rewritten.source_span
    spoken, placed = render(rules.pieces(plain), None)
    starts = [m.start() for m in _WRITTEN_WORD.finditer(prepared)]
    return Normalized(written, spoken, tuple(words_of(placed, starts, source_span=source_span)))
