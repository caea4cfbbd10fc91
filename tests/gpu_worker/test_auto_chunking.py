"""Auto chunking on the session's real worker: a caller streaming an LLM's tokens without a single
flush hears each sentence as it completes, never cut inside "Dr." or "3:30 p.m.", and a sentence
that outlasts the buffer delay is spoken up to a break that keeps its last words."""

from __future__ import annotations

import asyncio
import re

from gpu_worker.chunking import HOLD_WORDS
from gpu_worker.client.connection import WorkerClient
from gpu_worker.protocol import ContextOptions

REPLY = "Sure, Dr. Smith can see you at 3:30 p.m. today. She is free then. Bye for now."


def tokens(text: str) -> list[str]:
    """Pieces the way an LLM streams them: words with their leading space, some cut in two."""
    return [p for word in re.findall(r"\s*\S+", text) for p in (word[:3], word[3:]) if p]


async def test_each_sentence_is_spoken_as_it_completes_without_a_flush(worker):
    async with await WorkerClient.connect(worker.url) as client:
        stream = await client.start("tara", options=ContextOptions(chunking="auto", max_tokens=7 * 4 + 1, seed=3,
                                                                   max_buffer_delay_ms=5000))
        for piece in tokens(REPLY):
            await stream.push(piece)
        audio = stream.audio().__aiter__()
        first = await asyncio.wait_for(anext(audio), timeout=120)  # before any flush or end: the worker cut
        await stream.end()
        rest = [chunk async for chunk in audio]
    assert first and rest
    # three sentences, three segments: no cut after "Dr." or inside "3:30 p.m."
    assert stream.done.stats.segments == 3


async def test_a_sentence_past_the_buffer_delay_is_spoken_at_a_word_break(worker):
    # Each step is one message, so where the worker cuts depends on the text alone, not on how fast
    # a loaded box delivers messages: pieces that straggle in past the delay would each be cut again.
    async with await WorkerClient.connect(worker.url) as client:
        stream = await client.start("tara", options=ContextOptions(chunking="auto", max_tokens=7 * 4 + 1, seed=4,
                                                                   max_buffer_delay_ms=200))
        await stream.push("this reply goes on and on without any end in sight my good friend ")
        audio = stream.audio().__aiter__()
        # no sentence end, no flush: the delay cut it after "in", holding "sight my good friend"
        # (HOLD_WORDS); the held four are never cut again by the delay, however long they wait
        await asyncio.wait_for(anext(audio), timeout=120)
        # the sentence's end and a complete word after it: cut at once, at the sentence end, before any
        # delay can run; "Bye" alone is too short for the delay to cut, so it waits for `end`
        await stream.push("and then it ends. Bye ")
        await stream.end()
        [chunk async for chunk in audio]
    assert HOLD_WORDS == 4
    assert stream.done.stats.segments == 3
