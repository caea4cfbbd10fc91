"""Capacity: how many listeners one worker keeps in real time with mixed cloned voices, and how fast
their first audio comes. The number operators buy GPUs by.

One real `voicering worker` process (engine + codec + websocket server; FP8 weights and KV cache
by default on CUDA) and real websocket clients (`WorkerClient`, up to ``CONN_STREAMS`` streams per
connection). Concurrency ramps through ``levels`` (CUDA: 1, 8, 16, ..., 512; CPU: 1, 2, 4) until a
level fails (a stream errors, or fewer than ``stop_below`` of its streams play without underruns).
In a level every stream speaks one context of ``frames`` frames; starts are spread evenly over
``stagger_s`` (arrivals, not one burst). Each stream is a LoRA voice drawn round-robin from a pool
larger than ``max_loras`` (so adapters swap in the engine's slots and CPU cache), every
``base_every``-th stream the base model.

Per stream: TTFB (start sent -> first chunk at the client), the worker's tokens/s (tokens over the
context's wall time) and the playout through a 100 ms jitter buffer (`bench.playout`: an
underrun is a chunk that arrives after the audio before it finished playing). Per level: TTFB
p50/p90/p99, tokens/s per stream and in total, codec batch sizes and decode ms (the worker's
/metrics histograms, scraped before and after the level), adapter loads, the underrun-free share.
Then, same worker, ``ratio_rounds`` rounds of ``ratio_batch`` (10) streams all-LoRA vs all-base,
the order alternating by round: ``lora_base_ratio_batch_10`` is the median per-round ratio of mean
tokens/s per stream; its LoRA streams use ``max_loras`` voices, so every adapter holds a slot and
the ratio measures LoRA compute, not swapping.

``max_realtime_streams``: the largest level whose streams all completed and >= 99 % never
underran (0 if none). On CPU the worker runs the tiny stand-in: the figures show the bench works
and are labelled CPU; they claim nothing about GPUs, and the GPU targets fail there by design.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from bench.playout import JITTER_BUFFER_S, chunk_seconds, playout
from bench.proxy import Histogram, judge, parse_histogram, quantile, spread

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
WORK = CACHE / "bench-capacity"
BASE_VOICE = "base"  # served by the base model (no adapter)
CONN_STREAMS = 64  # streams per client websocket
REALTIME_SHARE = 0.99
GPU_LEVELS = (1, 8, 16, 32, 64, 128, 256, 384, 512)
CPU_LEVELS = (1, 2, 4)
TEXT = ("Hello there, this is one of many voices speaking at once on a single worker, "
        "and every listener should hear it without a gap.")
TARGETS = {  # figure: (comparison, bound). The first three are GPU targets (H200, vLLM); CPU fails them.
    "max_realtime_streams": (">=", 250),
    "ttfb_ms_p50_at_64": ("<=", 80.0),
    "lora_base_ratio_batch_10": (">=", 0.95),
    "pool_exceeds_max_loras": ("==", True),  # the pool really swaps adapters
    "invalid_tokens": ("==", 0),
}
CODEC_BATCH = "voicering_worker_codec_batch_size"
CODEC_SECONDS = "voicering_worker_codec_decode_seconds"
ADAPTER_LOADS = "voicering_worker_adapter_loads"


@dataclass(frozen=True, slots=True)
class CapacityOptions:
    """One run's settings; `for_device` fills the device's defaults."""

    levels: tuple[int, ...]
    max_loras: int
    max_cpu_loras: int
    pool: int  # LoRA voices streams draw from (> max_loras)
    base_every: int = 8  # every n-th stream speaks with the base model
    frames: int = 12  # frames per context (85.3 ms each)
    stagger_s: float = 1.0  # a level's starts are spread evenly over this
    ratio_batch: int = 10
    ratio_rounds: int = 2
    quantization: str = "none"  # fp8 | none (resolved from auto by for_device)
    stop_below: float = 0.0  # a level whose real-time share is below this ends the ramp
    model: str | None = None  # full-size or real weights; None: the tiny stand-in
    codec: str | None = None
    voices_dir: str | None = None
    stream_timeout_s: float = 300.0
    worker_timeout_s: float = 900.0

    @classmethod
    def for_device(cls, cuda: bool, **overrides: object) -> CapacityOptions:
        """CUDA: FP8, 16 LoRA slots, a 24-voice pool, the full ramp, 6 s contexts, stop once under
        half real time. CPU: no FP8, 2 slots, 4 voices, 1, 2, 4 streams, 1 s contexts, every 4th
        stream the base model (so the short ramp has one)."""
        if cuda:
            base = cls(levels=GPU_LEVELS, max_loras=16, max_cpu_loras=32, pool=24, frames=70, quantization="fp8",
                       stop_below=0.5)
        else:
            base = cls(levels=CPU_LEVELS, max_loras=2, max_cpu_loras=4, pool=4, frames=12, base_every=4)
        given = {k: v for k, v in overrides.items() if v is not None}
        if given.get("quantization") == "auto":
            given["quantization"] = "fp8" if cuda else "none"
        return replace(base, **given)

    @property
    def max_tokens(self) -> int:
        return 7 * self.frames + 1


@dataclass(slots=True)
class StreamResult:
    voice: str
    lora: bool
    ttfb_ms: float | None = None
    arrivals: list[float] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    tokens: int = 0
    invalid_tokens: int = 0
    wall_s: float = 0.0
    error: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.wall_s if self.error is None and self.wall_s > 0 else None


# -- pure pieces ------------------------------------------------------------------------------------

def plan_level(streams: int, pool: Sequence[str], base_every: int, offset: int = 0) -> list[tuple[str, bool]]:
    """(voice, is_lora) per stream: every ``base_every``-th the base model, the rest round-robin over
    the pool starting at ``offset`` (levels shift it, so each level's first voices differ)."""
    plan, k = [], offset
    for i in range(streams):
        if base_every and i % base_every == base_every - 1:
            plan.append((BASE_VOICE, False))
        else:
            plan.append((pool[k % len(pool)], True))
            k += 1
    return plan


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def counter_value(metrics_text: str, name: str) -> float:
    """An unlabelled Prometheus counter's value (0 when the worker has not created it)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.name == f"{name}_total")
    return 0.0


def bucket_bound(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The smallest bucket edge holding a share q of the observations: a batch-size quantile read as
    "at most this many windows" (interpolating inside a bucket would give fractional windows)."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    edge = next(edge for edge, count in buckets if count >= q * total)
    return edge if math.isfinite(edge) else None  # past the largest bucket: unknown


def codec_figures(batch: Histogram, seconds: Histogram) -> dict:
    """A level's codec calls: how many, windows per call (mean; p50/p90 as bucket edges: "at most")
    and ms per call (mean; p90 interpolated inside the buckets, as Prometheus does)."""
    ms = [(edge * 1000.0, count) for edge, count in seconds.buckets]
    return {"calls": int(batch.count), "batch_mean": round(batch.mean, 2) if batch.mean else None,
            "batch_p50_at_most": bucket_bound(batch.buckets, 0.5), "batch_p90_at_most": bucket_bound(batch.buckets, 0.9),
            "decode_ms_mean": round(seconds.mean * 1000.0, 2) if seconds.mean else None,
            "decode_ms_p90": _round(quantile(ms, 0.9))}


def _round(value: float | None, digits: int = 2) -> float | None:
    return round(value, digits) if value is not None else None


def summarise_level(results: Sequence[StreamResult], wall_s: float, buffer_s: float = JITTER_BUFFER_S) -> dict:
    """A level's stream figures (codec and adapter figures are added from the worker's metrics)."""
    ok = [r for r in results if r.error is None]
    plays = [playout(r.arrivals, r.durations, buffer_s) for r in ok]
    rates = [r.tokens_per_s for r in ok if r.tokens_per_s is not None]
    ttfb = [r.ttfb_ms for r in ok if r.ttfb_ms is not None]
    realtime = sum(p.realtime for p in plays)
    return {
        "streams": len(results), "lora_streams": sum(r.lora for r in results),
        "base_streams": sum(not r.lora for r in results), "distinct_voices": len({r.voice for r in results}),
        "completed": len(ok), "errors": dict(Counter(r.error for r in results if r.error is not None)),
        "ttfb_ms": {"p50": _pct(ttfb, 50), "p90": _pct(ttfb, 90), "p99": _pct(ttfb, 99),
                    "max": round(max(ttfb), 1) if ttfb else None},
        "tokens_per_s_per_stream": {"mean": round(statistics.fmean(rates), 2) if rates else None,
                                    "p10": _pct(rates, 10), "min": round(min(rates), 2) if rates else None},
        "tokens_per_s_total": round(sum(r.tokens for r in ok) / wall_s, 1) if wall_s > 0 else None,
        "underrun_free_fraction": round(realtime / len(results), 4) if results else None,
        "underruns": sum(p.underruns for p in plays),
        "stall_ms_max": round(max((p.stall_s for p in plays), default=0.0) * 1000.0, 1),
        "audio_s_mean": round(statistics.fmean(p.audio_s for p in plays), 3) if plays else None,
        "tokens_mean": round(statistics.fmean(r.tokens for r in ok), 1) if ok else None,
        "invalid_tokens": sum(r.invalid_tokens for r in ok),
        "wall_s": round(wall_s, 2),
    }


def level_is_realtime(level: dict) -> bool:
    return not level["errors"] and (level["underrun_free_fraction"] or 0.0) >= REALTIME_SHARE


def overall(levels: Sequence[dict]) -> dict:
    """The ramp's headline figures."""
    realtime = [lv["streams"] for lv in levels if level_is_realtime(lv)]
    at_64 = next((lv for lv in levels if lv["streams"] == 64), None)
    return {"max_realtime_streams": max(realtime, default=0),
            "ttfb_ms_p50_at_64": at_64["ttfb_ms"]["p50"] if at_64 else None,
            "invalid_tokens": sum(lv["invalid_tokens"] for lv in levels)}


# -- the run ----------------------------------------------------------------------------------------

def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


async def _scrape(worker) -> dict:
    text = await asyncio.to_thread(_get, f"{worker.http}/metrics")
    return {"batch": parse_histogram(text, CODEC_BATCH), "seconds": parse_histogram(text, CODEC_SECONDS),
            "loads": counter_value(text, ADAPTER_LOADS)}


async def _stream(client, voice: str, lora: bool, options, delay_s: float, timeout_s: float) -> StreamResult:
    from gpu_worker.client.connection import WorkerConnectionLost, WorkerRequestError

    result = StreamResult(voice, lora)
    await asyncio.sleep(delay_s)
    try:
        async with asyncio.timeout(timeout_s):
            stream = await client.start(voice, TEXT, options=options)
            await stream.end()
            async for pcm in stream.audio():
                result.arrivals.append(time.perf_counter())
                result.durations.append(chunk_seconds(len(pcm)))
    except WorkerRequestError as exc:
        result.error = exc.error.code
        return result
    except (WorkerConnectionLost, OSError):
        result.error = "connection_lost"
        return result
    except TimeoutError:
        result.error = "timeout"
        return result
    stats = stream.done.stats
    result.ttfb_ms = (stream.first_audio_at - stream.started_at) * 1000.0 if stream.first_audio_at else None
    result.tokens, result.invalid_tokens, result.wall_s = stats.tokens, stats.invalid_tokens, stats.wall_s
    return result


async def _streams(worker, plan: Sequence[tuple[str, bool]], opts: CapacityOptions, seed: int,
                   stagger_s: float) -> tuple[list[StreamResult], float]:
    """Run one set of streams at once over ceil(n / CONN_STREAMS) fresh connections."""
    from gpu_worker.client.connection import WorkerClient
    from gpu_worker.protocol import ContextOptions

    clients = [await WorkerClient.connect(worker.url) for _ in range(math.ceil(len(plan) / CONN_STREAMS))]
    try:
        began = time.perf_counter()
        results = await asyncio.gather(*(
            _stream(clients[i % len(clients)], voice, lora, ContextOptions(max_tokens=opts.max_tokens, seed=seed + i),
                    stagger_s * i / len(plan), opts.stream_timeout_s)
            for i, (voice, lora) in enumerate(plan)))
        wall = time.perf_counter() - began
    finally:
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
    await worker.wait_idle(timeout=120.0)
    return list(results), wall


async def _level(worker, plan, opts: CapacityOptions, seed: int) -> dict:
    before = await _scrape(worker)
    results, wall = await _streams(worker, plan, opts, seed, opts.stagger_s)
    after = await _scrape(worker)
    figures = summarise_level(results, wall)
    figures["codec"] = codec_figures(after["batch"].since(before["batch"]), after["seconds"].since(before["seconds"]))
    figures["adapter_loads"] = int(after["loads"] - before["loads"])
    return figures


async def _ratio(worker, pool: Sequence[str], opts: CapacityOptions) -> dict:
    """All-LoRA (``max_loras`` voices, each holding a slot) vs all-base streams at ``ratio_batch``,
    back to back, which goes first alternating by round; all start at once."""
    lora_plan = [(pool[i % min(opts.max_loras, len(pool))], True) for i in range(opts.ratio_batch)]
    base_plan = [(BASE_VOICE, False)] * opts.ratio_batch
    rates: dict[str, list[float]] = {"lora": [], "base": []}
    for r in range(opts.ratio_rounds):
        sides = [("lora", lora_plan), ("base", base_plan)]
        for name, plan in (sides if r % 2 == 0 else sides[::-1]):
            results, _ = await _streams(worker, plan, opts, 7000 + 100 * r, 0.0)
            per_stream = [x.tokens_per_s for x in results if x.tokens_per_s is not None]
            if len(per_stream) != len(plan):
                raise RuntimeError(f"ratio phase {name}: {len(plan) - len(per_stream)} of {len(plan)} streams failed: "
                                   f"{[x.error for x in results if x.error]}")
            rates[name].append(statistics.fmean(per_stream))
    ratios = [a / b for a, b in zip(rates["lora"], rates["base"], strict=True)]
    return {"lora_base_ratio_batch_10": round(statistics.median(ratios), 3), "lora_base_ratio_spread": spread(ratios, 3),
            "ratio_tokens_per_s_per_stream": {k: spread(v, 2) for k, v in rates.items()}}


async def _measure(worker, pool: Sequence[str], opts: CapacityOptions) -> dict:
    from gpu_worker.protocol import ContextOptions
    from gpu_worker.client.connection import WorkerClient

    async with await WorkerClient.connect(worker.url) as client:  # warm-up: base model and one adapter
        for voice in (BASE_VOICE, pool[0]):
            await client.say(voice, TEXT, options=ContextOptions(max_tokens=7 * 4 + 1, seed=1))
    levels: list[dict] = []
    for k, streams in enumerate(opts.levels):
        level = await _level(worker, plan_level(streams, pool, opts.base_every, offset=k), opts, seed=1000 * (k + 1))
        levels.append(level)
        if level["errors"] or (level["underrun_free_fraction"] or 0.0) < opts.stop_below:
            break  # the ramp's failure: no higher level is tried
    return {"levels": levels, **await _ratio(worker, pool, opts)}


def _prepare(opts: CapacityOptions, work: Path) -> tuple[str, str, Path, list[str]]:
    """Weights and a voice store whose LoRA voices form the pool (the tiny stand-in by default)."""
    from bench.worker import derive_voice
    from bench.weights import bench_stand_in

    if opts.model:
        if not (opts.codec and opts.voices_dir):
            raise ValueError("--model needs --codec and --voices-dir (a store holding the pool's LoRA voices)")
        store = Path(opts.voices_dir)
        pool = sorted(p.name for p in store.iterdir() if (p / "adapter_config.json").is_file())
        if len(pool) < 1:
            raise ValueError(f"{store} holds no LoRA voices")
        return opts.model, opts.codec, store, pool
    stand_in = bench_stand_in()
    store = work / "voices"
    pool = [f"pool{i:02d}" for i in range(opts.pool)]
    for i, name in enumerate(pool):
        if not (store / name / "adapter_model.safetensors").is_file():
            derive_voice(stand_in.voice(("tara", "leo")[i % 2]), store / name, seed=i, prompt_name=name)
    return str(stand_in.model), str(stand_in.codec), store, pool


def _device() -> tuple[bool, str]:
    import torch

    if torch.cuda.is_available():
        return True, torch.cuda.get_device_name(0)
    return False, f"cpu ({os.cpu_count()} cores)"


def run(out: Path | None = None, work: Path = WORK, **overrides: object) -> dict:
    """Start the worker, ramp, measure the ratio, stop the worker; figures + JSON + plot under ``out``
    (default ``work``/capacity.json). ``work`` holds the derived voice pool and the worker's log."""
    from gpu_worker.process import spawn_worker

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    started = time.perf_counter()
    cuda, device = _device()
    opts = CapacityOptions.for_device(cuda, **overrides)
    model, codec, store, pool = _prepare(opts, work)
    top = max(*opts.levels, opts.ratio_batch)
    work.mkdir(parents=True, exist_ok=True)
    worker = spawn_worker(
        ["--model", model, "--codec", codec, "--voices-dir", str(store), "--quantization", opts.quantization,
         "--max-loras", str(opts.max_loras), "--max-cpu-loras", str(opts.max_cpu_loras), "--max-lora-rank", "32",
         "--max-streams", str(top)],
        work / "worker.log", timeout_s=opts.worker_timeout_s, cwd=REPO,
        env={"VOICERING_WORKER_MAX_NUM_SEQS": str(top), "VOICERING_WORKER_MAX_STREAMS_PER_CONNECTION": str(CONN_STREAMS),
             "VOICERING_WORKER_BASE_VOICES": json.dumps([BASE_VOICE]), "VOICERING_WORKER_LOG_FORMAT": "text"})
    worker_start_s = time.perf_counter() - started
    try:
        measured = asyncio.run(_measure(worker, pool, opts))
    finally:
        worker.stop()
    figures = {
        **overall(measured["levels"]), **measured,
        "device": device, "quantization": opts.quantization,
        "kv_cache_dtype": "fp8" if opts.quantization == "fp8" else "bf16",
        "pool_exceeds_max_loras": len(pool) > opts.max_loras,
        "label": ("GPU" if cuda else f"CPU: {'these weights' if opts.model else 'the tiny stand-in'} on a CPU worker; "
                  "shows the bench works, claims nothing about GPUs (the GPU targets fail here by design)"),
        "config": {**{k: v for k, v in asdict(opts).items() if k not in ("model", "codec", "voices_dir")},
                   "model": model if opts.model else "stand-in (2-layer Llama, Orpheus vocab, bf16)",
                   "pool_voices": len(pool), "base_voice": BASE_VOICE, "jitter_buffer_ms": JITTER_BUFFER_S * 1000,
                   "realtime_share": REALTIME_SHARE, "streams_per_connection": CONN_STREAMS,
                   "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "worker_start_s": round(worker_start_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
        "targets": {k: f"{op} {bound}" for k, (op, bound) in TARGETS.items()},
    }
    figures["targets_met"] = judge(figures, TARGETS)
    target = Path(out) if out is not None else work / "capacity.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    figures["plot"] = str(plot(figures, target.with_suffix(".png")))
    figures["json"] = str(target)
    target.write_text(json.dumps(figures, indent=2, sort_keys=True))
    return figures


def plot(figures: dict, out: Path) -> Path:
    """Streams vs TTFB (p50/p90/p99) and vs tokens/s (per stream, with the real-time line, and total)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpu_worker.orpheus import TOKENS_PER_SECOND_REALTIME

    levels = figures["levels"]
    xs = [lv["streams"] for lv in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for q, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
        left.plot(xs, [lv["ttfb_ms"][q] for lv in levels], style, label=f"TTFB {q}")
    left.set_xlabel("concurrent streams")
    left.set_ylabel("ms to first audio")
    right.plot(xs, [lv["tokens_per_s_per_stream"]["mean"] for lv in levels], "o-", label="per stream (mean)")
    right.plot(xs, [lv["tokens_per_s_per_stream"]["p10"] for lv in levels], "v--", label="per stream (p10)")
    right.axhline(TOKENS_PER_SECOND_REALTIME, color="grey", lw=0.8, ls=":", label="real time (~82 tok/s)")
    right.set_xlabel("concurrent streams")
    right.set_ylabel("tokens/s per stream")
    total = right.twinx()
    total.plot(xs, [lv["tokens_per_s_total"] for lv in levels], "k.-", alpha=0.5, label="total (right axis)")
    total.set_ylabel("tokens/s, all streams")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    handles = right.get_legend_handles_labels()
    extra = total.get_legend_handles_labels()
    right.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=8)
    fig.suptitle(f"Capacity, {figures['device']}, quantization {figures['quantization']} "
                 f"({'GPU' if figures['label'] == 'GPU' else 'CPU stand-in: claims nothing about GPUs'})", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
