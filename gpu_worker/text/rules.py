"""The rule engine a language's normalizer runs on: ordered regex rules -> pieces of spoken text.

A language is a list of `Rule`s in priority order. `Rules.pieces` scans the written text once,
left to right: at each position the first rule whose pattern matches *and* whose `speak` accepts
the match (returns a string, not None) makes one `Piece`; when none does, the word or the
punctuation fallback does. A rule may look at the text around its match (the word before "VIII",
the word after "Dr.") but consumes only its match, so every written character belongs to exactly
one piece, and every spoken word knows the written span it came from.

One combined regex finds the candidate rule at each position (one C-level scan instead of a
Python loop over rules); a rule that declines is followed by the next rules at the same position.
Pure functions over strings, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = ["Piece", "Rule", "Rules", "Speak"]

Speak = Callable[[re.Match[str], str], "str | None"]
_NAMED_GROUP: Final = re.compile(r"\(\?P<\w+>")


@dataclass(frozen=True, slots=True)
class Piece:
    """A written span [start, end) and what is said for it. `kind` names the rule ("word" and
    "punct" for the fallbacks); `spoken` may be "" (a dropped symbol) or several words."""

    start: int
    end: int
    spoken: str
    kind: str
    space_before: bool  # whitespace separated it from the piece before, in the written text


@dataclass(frozen=True)
class Rule:
    """One reading: `pattern` (named groups allowed, no back-references: the combined regex strips
    group names) and `speak(match, text)` -> the spoken words, or None to let later rules try."""

    name: str
    pattern: str
    speak: Speak
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))


class Rules:
    """A language's rules compiled once; `pieces(text)` is the whole normalizer's hot path."""

    def __init__(self, rules: Sequence[Rule], word: Rule, punct: Rule) -> None:
        self._rules = (*rules, word, punct)
        alternatives = "|".join(f"(?P<r{i}>{_NAMED_GROUP.sub('(?:', r.pattern)})" for i, r in enumerate(self._rules))
        self._scan = re.compile(rf"\s*(?:{alternatives})", re.S)
        self._space = re.compile(r"\s+")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self._rules)

    def pieces(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        pos, end = 0, len(text)
        scan = self._scan.match
        while pos < end:
            m = scan(text, pos)
            if m is None:  # only whitespace is left
                break
            index = int(m.lastgroup[1:])  # type: ignore[index]
            start = m.start(m.lastgroup)
            piece = self._speak(text, start, index, m.end())
            out.append(Piece(piece[0], piece[1], piece[2], piece[3], start > pos))
            pos = piece[1]
        return out

    def _speak(self, text: str, start: int, index: int, stop: int) -> tuple[int, int, str, str]:
        rules = self._rules
        rule = rules[index]
        own = rule.regex.match(text, start)
        spoken = rule.speak(own, text) if own is not None else None
        i = index
        while spoken is None:  # the rule declined: the next rules that match here, in order
            i += 1
            rule = rules[i]
            own = rule.regex.match(text, start)
            if own is not None and own.end() > start:
                spoken = rule.speak(own, text)
        return start, own.end(), spoken, rule.name
