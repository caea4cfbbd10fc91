"""One text segment -> PCM: prompt ids, engine tokens, frames, streamed windows. The hot loop of a stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from gpu_worker.codec import ChunkPlanner, ChunkSchedule
from gpu_worker.engine import GenerationStats, SamplingOptions, SpeechEngine, Voice
from gpu_worker.orpheus import FrameAssembler, max_audio_tokens
from gpu_worker.scheduler import DecodeRunner


@dataclass(slots=True)
class SegmentStats:
    tokens: int = 0
    frames: int = 0
    invalid_tokens: int = 0
    samples: int = 0
    finished_by: str = ""


async def speak_segment(
    engine: SpeechEngine,
    runner: DecodeRunner,
    voice: Voice,
    text: str,
    options: SamplingOptions,
    stats: SegmentStats,
    *,
    noise_offset: int = 0,
    schedule: ChunkSchedule | None = None,
) -> AsyncIterator[np.ndarray]:
    """Yield float32 audio chunks (whole frames of 2048 samples) as soon as each window is decoded."""
    prompt = engine.prompt(voice, text)
    max_tokens = options.max_tokens or max_audio_tokens(text)
    assembler = FrameAssembler()
    planner = ChunkPlanner(schedule or ChunkSchedule())
    frames = []
    generation = GenerationStats()
    try:
        async for ids in engine.speak(voice, prompt, options, max_tokens, generation):
            for frame in assembler.extend(ids):
                frames.append(frame)
                while (window := planner.next_window(len(frames))) is not None:
                    audio = await runner.decode(frames, window, noise_offset)
                    stats.samples += len(audio)
                    yield audio
        if (window := planner.final_window(len(frames))) is not None:
            audio = await runner.decode(frames, window, noise_offset)
            stats.samples += len(audio)
            yield audio
    finally:
        assembler.finish()
        stats.tokens += generation.tokens
        stats.frames += len(frames)
        stats.invalid_tokens += assembler.invalid
        stats.finished_by = generation.finished_by
