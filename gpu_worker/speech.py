"""One engine request -> PCM: engine tokens, frames, streamed windows. The hot loop of a stream.

Where a long segment is spoken as several requests, each join gets a short fade (out at the end
of one request, in at the start of the next): two independent decodes meet there, and a
waveform step between them would click.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np

from gpu_worker.codec import ChunkPlanner, ChunkSchedule
from gpu_worker.engine import EngineRequest, GenerationStats, SamplingOptions, SpeechEngine, Voice
from gpu_worker.orpheus import FrameAssembler
from gpu_worker.scheduler import DecodeRunner
from silence_trim.pcm import apply_fade

JOIN_FADE_SAMPLES = 120  # 5 ms at 24 kHz


@dataclass(slots=True)
class SegmentStats:
    """Totals over a context's engine requests."""

    tokens: int = 0
    frames: int = 0
    invalid_tokens: int = 0
    samples: int = 0
    requests: int = 0
    cut_by_length: int = 0  # requests that ended at their token cap, not at END_OF_SPEECH
    spoke_to_end: int = 0  # requests that ended at END_OF_SPEECH (the rest were aborted)
    window_tokens: int = 0  # tokens of earlier segments put before the prompts (gpu_worker.prompt_window)
    window_cached_tokens: int = 0  # of those, served by the engine's prefix cache


async def speak_request(
    engine: SpeechEngine,
    runner: DecodeRunner,
    voice: Voice,
    request: EngineRequest,
    options: SamplingOptions,
    stats: SegmentStats,
    *,
    noise_offset: int = 0,
    schedule: ChunkSchedule | None = None,
    fade_in: bool = False,
    fade_out: bool = False,
    generated: list[int] | None = None,
    window: int = 0,
) -> AsyncIterator[np.ndarray]:
    """Yield float32 audio chunks (whole frames of 2048 samples) as soon as each window is decoded.

    ``schedule``: when to decode (default: the runner's, which the worker builds from its settings).
    ``fade_in``/``fade_out``: this request joins another before/after it. Fading out holds each
    chunk back until the next one is decoded (the last one is only known at the end).
    ``generated``: gets every id the engine generated, as generated (the context's prompt window).
    ``window``: how many of the prompt's first ids are that window (counted with what the cache served).
    """
    assembler = FrameAssembler()
    planner = ChunkPlanner(schedule or runner.schedule)
    frames = []
    generation = GenerationStats()
    held: np.ndarray | None = None
    first = True

    async def windows() -> AsyncIterator[np.ndarray]:
        async with aclosing(engine.speak(voice, request.prompt, options, request.max_tokens, generation)) as tokens:
            async for ids in tokens:
                if generated is not None:
                    generated.extend(ids)
                for frame in assembler.extend(ids):
                    frames.append(frame)
                    while (window := planner.next_window(len(frames))) is not None:
                        yield await runner.decode(frames, window, noise_offset)
        if (window := planner.final_window(len(frames))) is not None:
            yield await runner.decode(frames, window, noise_offset)

    try:
        async with aclosing(windows()) as decoded:  # closed at once on cancel: the engine request is aborted now
            async for audio in decoded:
                stats.samples += len(audio)
                if first and fade_in:
                    audio = apply_fade(audio, JOIN_FADE_SAMPLES, rising=True)
                first = False
                if not fade_out:
                    yield audio
                    continue
                if held is not None:
                    yield held
                held = audio
            if held is not None:
                yield apply_fade(held, JOIN_FADE_SAMPLES, rising=False)
    finally:
        assembler.finish()
        stats.tokens += generation.tokens
        stats.window_tokens += window
        stats.window_cached_tokens += min(generation.cached_tokens, window)
        stats.frames += len(frames)
        stats.invalid_tokens += assembler.invalid
        stats.requests += 1
        stats.cut_by_length += generation.finished_by == "length"
        stats.spoke_to_end += generation.finished_by == "end_of_speech"
