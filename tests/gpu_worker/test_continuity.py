"""Continuity across a context's segments (gpu_worker.prompt_window) on the session's real worker:
each segment after the first is prompted with the earlier ones, the engine's prefix cache serves
them, a start can opt out, and the first segment is spoken exactly as without a window."""

from __future__ import annotations

from gpu_worker.client.connection import Speech, WorkerClient, collect
from gpu_worker.orpheus import SAMPLES_PER_FRAME
from gpu_worker.protocol import ContextOptions

TEXTS = ["The first sentence sets the tone.", "The second one follows it.", "And a third one ends the reply."]
FRAMES = 12  # per segment: the stand-in speaks to its cap, so each segment is exactly this long
OPTIONS = dict(max_tokens=7 * FRAMES + 1, seed=5, trim_silence=False)


async def speak(url: str, **options) -> Speech:
    async with await WorkerClient.connect(url) as client:
        stream = await client.start("tara", TEXTS[0], options=ContextOptions(**OPTIONS, **options))
        for text in TEXTS[1:]:
            await stream.flush()
            await stream.push(text)
        return await collect(stream)


async def test_later_segments_are_prompted_with_the_earlier_ones_and_the_cache_serves_them(worker):
    on = await speak(worker.url)
    stats = on.done.stats
    assert stats.segments == 3 and stats.engine_requests == 3 and stats.finish_reason == "length"
    # segment 2 carries turn 1, segment 3 turns 1 and 2: each turn holds its 7 * FRAMES + 1 generated ids
    assert stats.window_tokens >= 3 * (7 * FRAMES + 1)
    # A KV block is served from the cache only when every id in it (and before it) matches what the
    # engine computed for the previous request, so hits reaching past a turn's text prove that the
    # window repeats the generated audio ids token for token.
    assert stats.window_cached_tokens > 100 and stats.window_cached_tokens >= stats.window_tokens // 2


async def test_a_start_can_opt_out_and_the_first_segment_is_the_same_either_way(worker):
    on = await speak(worker.url)
    off = await speak(worker.url, continuity=False)
    assert off.done.stats.window_tokens == 0 and off.done.stats.window_cached_tokens == 0
    segment = FRAMES * SAMPLES_PER_FRAME * 2  # bytes of one segment's PCM
    assert len(on.pcm) == len(off.pcm) == 3 * segment
    assert on.pcm[:segment] == off.pcm[:segment]  # no window before the first segment
    assert on.pcm[segment:2 * segment] != off.pcm[segment:2 * segment]  # the window changed what followed
