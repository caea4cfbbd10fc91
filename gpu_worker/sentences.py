"""Long text -> pieces that each fit one engine request, cut where speech pauses anyway.

A segment may hold thousands of characters, while one engine request must hold its prompt plus
every audio token of its speech within the model's context (``max_model_len``) and under the
audio cap of `orpheus.max_audio_tokens`. Cutting anywhere would truncate audio or make vLLM
refuse the request; cutting at sentence ends (then clause breaks, then spaces) puts each join
where a speaker pauses. Pieces are packed greedily, so text that fits stays one request. Pure:
the caller passes ``fits`` (it owns the tokenizer).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gpu_worker.errors import TextTooLong

# Split after the mark and keep it with its piece; the whitespace after it is the cut.
_SENTENCE_END = re.compile(r"(?<=[.!?…。！？])\s+")
_CLAUSE_BREAK = re.compile(r"(?<=[,;:，、；：—–])\s+")
_SPACE = re.compile(r"\s+")
_LEVELS = (_SENTENCE_END, _CLAUSE_BREAK, _SPACE)


def split_to_fit(text: str, fits: Callable[[str], bool]) -> list[str]:
    """Sentence-aligned pieces of ``text`` (whitespace-normalised), each one ``fits``, packed greedily.

    Raises TextTooLong for a run without any space that no single request can hold.
    """
    text = " ".join(text.split())
    if not text:
        return []
    return _split(text, fits, 0)


def _split(text: str, fits: Callable[[str], bool], level: int) -> list[str]:
    if fits(text):
        return [text]
    if level == len(_LEVELS):
        raise TextTooLong(f"the text holds a run of {len(text)} characters without a space or punctuation "
                          "that is too long for one engine request; add spaces or punctuation")
    parts = [p for p in _LEVELS[level].split(text) if p]
    if len(parts) == 1:
        return _split(text, fits, level + 1)
    pieces: list[str] = []
    current = ""
    for part in parts:
        candidate = f"{current} {part}" if current else part
        if fits(candidate):
            current = candidate
            continue
        if current:
            pieces.append(current)
        if fits(part):
            current = part
        else:  # this part alone is too long: cut it at the next level down
            pieces.extend(_split(part, fits, level + 1))
            current = ""
    if current:
        pieces.append(current)
    return pieces
