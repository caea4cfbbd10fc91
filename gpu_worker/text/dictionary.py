"""Pronunciation dictionaries: "sounds-like" rules applied to the written text before normalization.

A rule says: where this word or phrase is written, read this instead ("Nguyen" -> "win",
"SQL" -> "sequel", "voicering" -> "voice ring"). Orpheus reads text, not IPA, so the replacement
is spelled the way it sounds. A rule matches whole words by default (its ends on word
boundaries) and ignores case unless it says otherwise; where rules overlap the longest written
form wins, then the earliest rule. Tags (`<laugh>`) are never rewritten.

`apply` returns the rewritten text with a map back to the caller's text, so `normalize` still
reports, for every spoken word, the written span it came from (a replaced phrase: the whole
phrase). Validation bounds a dictionary (`MAX_RULES`, `MAX_WRITTEN_CHARS`, `MAX_SPOKEN_CHARS`)
so a tenant's dictionary cannot make the hot path slow or the prompt unbounded.

The stored form (`to_json`, `from_json`) is what the gateway keeps in Redis per tenant and the
workers read back; `version` is a hash of the rules, so it changes whenever they do and a cache
keyed by it never serves a stale rule. `merge` joins the dictionaries one request names (the
first named wins where two give the same written form), within the same `MAX_RULES`.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from gpu_worker.text.tags import TAG

__all__ = ["DICTIONARY_NAME", "MAX_RULES", "MAX_SPOKEN_CHARS", "MAX_WRITTEN_CHARS", "MAX_WRITTEN_WORDS", "Dictionary",
           "InvalidDictionary", "PronunciationRule", "Rewritten", "apply", "merge"]

MAX_RULES: Final = 1000
MAX_WRITTEN_CHARS: Final = 100
MAX_WRITTEN_WORDS: Final = 6
MAX_SPOKEN_CHARS: Final = 200
DICTIONARY_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_NAME: Final = DICTIONARY_NAME
_RULE_FIELDS: Final = frozenset({"written", "spoken", "case_sensitive", "whole_word"})
_FORBIDDEN: Final = re.compile(r"[<>\x00-\x1f\x7f]")


class InvalidDictionary(ValueError):
    """A rule or dictionary that breaks a limit; the message names the rule and the limit."""


@dataclass(frozen=True, slots=True)
class PronunciationRule:
    written: str  # the word or phrase as written
    spoken: str  # what to read instead, spelled as it sounds
    case_sensitive: bool = False
    whole_word: bool = True

    def __post_init__(self) -> None:
        written, spoken = self.written, self.spoken
        if not isinstance(written, str) or not isinstance(spoken, str):
            raise InvalidDictionary("a rule's written and spoken forms are strings")
        if not written.strip() or written != written.strip():
            raise InvalidDictionary(f"rule {written!r}: the written form is empty or has spaces at its ends")
        if len(written) > MAX_WRITTEN_CHARS or len(written.split()) > MAX_WRITTEN_WORDS:
            raise InvalidDictionary(f"rule {written[:40]!r}: the written form is over {MAX_WRITTEN_CHARS} characters "
                                    f"or {MAX_WRITTEN_WORDS} words")
        if not spoken.strip() or len(spoken) > MAX_SPOKEN_CHARS:
            raise InvalidDictionary(f"rule {written!r}: the spoken form must hold 1 to {MAX_SPOKEN_CHARS} characters")
        for side, value in (("written", written), ("spoken", spoken)):
            if _FORBIDDEN.search(value):
                raise InvalidDictionary(f"rule {written!r}: the {side} form holds '<', '>' or a control character "
                                        "(tags cannot be rewritten or produced by a dictionary)")

    def key(self) -> str:
        return self.written if self.case_sensitive else self.written.casefold()

    def to_json(self) -> dict:
        return {"written": self.written, "spoken": self.spoken, "case_sensitive": self.case_sensitive,
                "whole_word": self.whole_word}


@dataclass(frozen=True, slots=True)
class Dictionary:
    name: str
    rules: tuple[PronunciationRule, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidDictionary(f"dictionary name {self.name!r}: use 1-64 letters, digits, '_', '.', '-'")
        rules = tuple(self.rules)
        object.__setattr__(self, "rules", rules)
        if len(rules) > MAX_RULES:
            raise InvalidDictionary(f"dictionary {self.name!r} has {len(rules)} rules; the limit is {MAX_RULES}")
        seen: set[tuple[bool, str]] = set()
        for rule in rules:
            if not isinstance(rule, PronunciationRule):
                raise InvalidDictionary(f"dictionary {self.name!r}: rules are PronunciationRule, not {type(rule).__name__}")
            k = (rule.case_sensitive, rule.key())
            if k in seen:
                raise InvalidDictionary(f"dictionary {self.name!r}: the written form {rule.written!r} appears twice")
            seen.add(k)

    @property
    def longest_words(self) -> int:
        return max((len(r.written.split()) for r in self.rules), default=0)

    @property
    def version(self) -> str:
        """A hash of the rules (16 hex digits): equal rules, equal version; any change, a new one."""
        canonical = json.dumps([r.to_json() for r in self.rules], separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    def to_json(self) -> dict:
        return {"name": self.name, "rules": [r.to_json() for r in self.rules]}

    @classmethod
    def from_json(cls, data: dict) -> Dictionary:
        """{"name": ..., "rules": [{"written", "spoken", "case_sensitive"?, "whole_word"?}]} (the API's shape)."""
        if not isinstance(data, dict) or not isinstance(data.get("rules", []), list):
            raise InvalidDictionary("a dictionary is an object with a name and a list of rules")
        raw = data.get("rules", [])
        if len(raw) > MAX_RULES:  # before building any: a hostile list costs nothing more
            raise InvalidDictionary(f"dictionary has {len(raw)} rules; the limit is {MAX_RULES}")
        rules = []
        for i, r in enumerate(raw):
            if not isinstance(r, dict):
                raise InvalidDictionary(f"rule {i}: a rule is an object {{\"written\": ..., \"spoken\": ...}}")
            unknown = set(r) - _RULE_FIELDS
            if unknown:
                shown = ", ".join(sorted(repr(str(k)[:30]) for k in unknown)[:5])
                raise InvalidDictionary(f"rule {i}: unknown field(s) {shown}; a rule has written, spoken, "
                                        "case_sensitive, whole_word")
            if "written" not in r or "spoken" not in r:
                raise InvalidDictionary(f"rule {i}: a rule needs both 'written' and 'spoken'")
            for flag in ("case_sensitive", "whole_word"):
                if flag in r and not isinstance(r[flag], bool):
                    raise InvalidDictionary(f"rule {i}: '{flag}' must be true or false")
            rules.append(PronunciationRule(**r))
        return cls(data.get("name", ""), tuple(rules))


def merge(dictionaries: Sequence[Dictionary]) -> Dictionary | None:
    """One dictionary of all of `dictionaries`' rules, in order (None for none, the one itself for
    one). Where two give the same written form (same case rule), the one named first wins. At most
    `MAX_RULES` rules together: InvalidDictionary beyond (the same bound on the hot path as one)."""
    if not dictionaries:
        return None
    if len(dictionaries) == 1:
        return dictionaries[0]
    total = sum(len(d.rules) for d in dictionaries)
    names = ", ".join(repr(d.name) for d in dictionaries)
    seen: set[tuple[bool, str]] = set()
    rules: list[PronunciationRule] = []
    for d in dictionaries:
        for rule in d.rules:
            k = (rule.case_sensitive, rule.key())
            if k not in seen:
                seen.add(k)
                rules.append(rule)
    if len(rules) > MAX_RULES:
        raise InvalidDictionary(f"the dictionaries {names} hold {total} rules together; one request may use at most "
                                f"{MAX_RULES}: name fewer, or merge them into one")
    return Dictionary(dictionaries[0].name, tuple(rules))


@dataclass(frozen=True, slots=True)
class Rewritten:
    """The text after a dictionary, and the replaced spans: (start, end) in `text` -> (start, end)
    in `source`, in order."""

    source: str
    text: str
    replaced: tuple[tuple[int, int, int, int], ...] = ()
    _starts: tuple[int, ...] = field(default=(), repr=False)

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """The caller's span for a span of `text` (a span inside a replacement is the whole written phrase)."""
        return self._map(start, False), self._map(end, True)

    def _map(self, at: int, is_end: bool) -> int:
        i = bisect.bisect_right(self._starts, at) - 1
        shift = 0
        if i >= 0:
            new_start, new_end, old_start, old_end = self.replaced[i]
            if at < new_end or (is_end and at == new_end):
                if is_end and at == new_start:
                    return old_start
                return old_end if is_end else old_start
            shift = old_end - new_end
        return at + shift


@functools.lru_cache(maxsize=64)
def _compiled(dictionary: Dictionary) -> tuple[re.Pattern[str], dict[str, PronunciationRule], dict[str, PronunciationRule]]:
    ordered = sorted(enumerate(dictionary.rules), key=lambda ir: (-len(ir[1].written), ir[0]))
    alternatives = []
    for _, rule in ordered:
        body = re.escape(rule.written)
        if not rule.case_sensitive:
            body = f"(?i:{body})"
        if rule.whole_word:
            body = rf"(?<!\w){body}(?!\w)"
        alternatives.append(body)
    pattern = re.compile(f"(?P<tag>{TAG.pattern})|" + "|".join(alternatives))
    exact = {r.written: r for r in dictionary.rules if r.case_sensitive}
    folded = {r.written.casefold(): r for r in dictionary.rules if not r.case_sensitive}
    return pattern, exact, folded


def apply(dictionary: Dictionary, text: str) -> Rewritten:
    """`text` with the dictionary's rules applied once, left to right (a replacement is not
    rewritten again), tags untouched."""
    if not dictionary.rules:
        return Rewritten(text, text)
    pattern, exact, folded = _compiled(dictionary)
    out: list[str] = []
    replaced: list[tuple[int, int, int, int]] = []
    pos = length = 0
    for m in pattern.finditer(text):
        if m["tag"] is not None:
            continue
        rule = exact.get(m[0]) or folded.get(m[0].casefold())
        if rule is None:  # a case-sensitive form matched only through a case-insensitive twin: keep it
            continue
        out.append(text[pos:m.start()])
        length += m.start() - pos
        out.append(rule.spoken)
        replaced.append((length, length + len(rule.spoken), m.start(), m.end()))
        length += len(rule.spoken)
        pos = m.end()
    out.append(text[pos:])
    return Rewritten(text, "".join(out), tuple(replaced), tuple(r[0] for r in replaced))
