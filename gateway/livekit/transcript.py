"""The agent's transcript without Orpheus's tags: an LLM that writes "<laugh>" for the voice
should not show "<laugh>" in the room's captions or chat history.

livekit-agents builds the transcript from the text the agent speaks (`Agent.transcription_node`),
not from the TTS, so the plugin cannot change it from inside `TTS`: `TaggedSpeechAgent` (or
`without_tags` in an agent's own `transcription_node`) does. Streaming: the LLM's pieces arrive
cut anywhere, so a `<` that could still become a known tag ("<la" before "ugh>") is held until it
is one (dropped) or cannot be (passed on); nothing else waits. Only the known tags
(`gpu_worker.text.TAGS`) go: anything else in brackets is spoken as words, so it stays. The
space a tag leaves is closed ("Ha <laugh> yes" -> "Ha yes"). Timed pieces keep their times.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator
from typing import Final

from livekit.agents import Agent, ModelSettings
from livekit.agents.types import TimedString

from gpu_worker.text import MAX_TAG_CHARS, TAG, TAGS, known_tag

__all__ = ["TagFilter", "TaggedSpeechAgent", "without_tags"]

_OPEN: Final = re.compile(r"<\s*([A-Za-z]*)")  # a tag's start: what a held tail must still be


class TagFilter:
    """Known tags removed from text that arrives in pieces (`push` each, `flush` at the end)."""

    def __init__(self) -> None:
        self._held = ""  # a `<...` that may still become a known tag
        self._space = ""  # trailing whitespace passed on only once a word follows it
        self._after_tag = False  # a tag was just removed: the spaces around it are one, or none before punctuation
        self._started = False  # some word was passed on

    def push(self, piece: str) -> str:
        text, self._held = self._held + piece, ""
        start = text.rfind("<")
        if start != -1 and _may_become_known(text[start:]):
            text, self._held = text[:start], text[start:]
        return self._clean(text)

    def flush(self) -> str:
        text, self._held = self._held, ""
        kept = self._clean(text)
        if not self._after_tag:  # the space before a last tag goes with it
            kept += self._space
        self._space = ""
        return kept

    def _clean(self, text: str) -> str:
        out, pos = [], 0
        for match in TAG.finditer(text):
            if known_tag(match[0]) is None:
                continue  # spoken as words, so it stays in the transcript
            out.append(self._pass(text[pos:match.start()]))
            self._after_tag = True
            pos = match.end()
        out.append(self._pass(text[pos:]))
        return "".join(out)

    def _pass(self, text: str) -> str:
        if self._after_tag:
            if self._space or not self._started:
                text = text.lstrip()
            if text[:1] in _PUNCTUATION:
                self._space = ""  # "and <laugh>!" -> "and!"
        body = text.rstrip()
        if not body:
            self._space += text
            return ""
        out, self._space = self._space + body, text[len(body):]
        self._after_tag, self._started = False, True
        return out


_PUNCTUATION: Final = frozenset(",.;:!?")


def _may_become_known(tail: str) -> bool:
    """`tail` (from a `<`, no `>` yet) could still be completed into a known tag."""
    if ">" in tail or len(tail) >= MAX_TAG_CHARS:
        return False
    match = _OPEN.fullmatch(tail.rstrip()) if not tail.endswith(" ") or tail.strip() == "<" else None
    if match is None:
        return False
    letters = match[1].lower()
    return any(tag.startswith(letters) for tag in TAGS)


async def without_tags(text: AsyncIterable[str | TimedString]) -> AsyncIterator[str | TimedString]:
    """The pieces of `text` with Orpheus's known tags taken out (a timed piece keeps its times)."""
    tags = TagFilter()
    async for piece in text:
        kept = tags.push(piece)
        if not kept:
            continue
        if isinstance(piece, TimedString):
            kept = TimedString(kept, start_time=piece.start_time, end_time=piece.end_time)
        yield kept
    if rest := tags.flush():
        yield rest


class TaggedSpeechAgent(Agent):
    """An `Agent` whose transcript leaves out the tags its voice acts (a drop-in for `Agent`)."""

    async def transcription_node(self, text: AsyncIterable[str | TimedString],
                                 model_settings: ModelSettings) -> AsyncIterator[str | TimedString]:
        async for piece in without_tags(Agent.default.transcription_node(self, text, model_settings)):
            yield piece
