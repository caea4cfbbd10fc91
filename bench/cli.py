"""`voicering bench ...`: each command runs one benchmark module and prints its JSON figures.

The benchmarks register here, above the packages they measure, so no package imports `bench`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


def _emit(figures: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(figures, indent=2, sort_keys=True))
    else:
        for key in sorted(figures):
            typer.echo(f"{key:40s} {figures[key]}")


@app.command("codec")
def codec(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    seconds: float = typer.Option(10.0, help="Seconds of audio to stream through the decoder."),
) -> None:
    """Streaming SNAC decoder vs the reference Orpheus decode strategy, same model, same run."""
    from bench.codec import run

    _emit(run(seconds=seconds), as_json)


@app.command("worker")
def worker(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="One round of short streams, one TTFB round, one round of the "
                                                      "codec and sampler micro benches, no warm-ups: a smoke run (the "
                                                      "suite's), figures not comparable."),
) -> None:
    """The real vLLM engine with stand-in weights: TTFB, tokens/s per stream, LoRA and constraint ratios."""
    from bench.worker import run

    _emit(run(rounds=1, max_tokens=15, ttfb_rounds=1, micro_rounds=1, warm=False) if quick else run(), as_json)


@app.command("train")
def train(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="20 sentences, 15 s encoded, 3 steps: a smoke run (every "
                               "stage, figures not comparable)."),
) -> None:
    """Training pipeline on espeak-ng speech: preprocessing speed, encode speed, train steps/s, head silence."""
    from bench.train import run

    _emit(run(sentences=20, encode_seconds=15.0, steps=3) if quick else run(), as_json)


@app.command("silence")
def silence(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    seconds: float = typer.Option(60.0, help="Seconds of espeak-ng speech to measure speed on."),
) -> None:
    """Energy vs VAD: ms of CPU per second of audio, streaming cost per 2048-sample chunk, accuracy."""
    from bench.silence import run

    _emit(run(seconds=seconds), as_json)


@app.command("clone")
def clone(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="Two base files instead of six (the test's corpus)."),
) -> None:
    """Upload checks on espeak-ng speech with known faults: detection, false blocks, SNR error, cost;
    the ASR's cost and the consent-voice match."""
    from bench.clone import run

    _emit(run(quick=quick), as_json)


@app.command("text")
def text(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(20, min=1, help="Timed rounds over the case set (peers run a tenth of them)."),
) -> None:
    """The text normalizer on the case set (tests/data/normalize_cases.jsonl): accuracy per category,
    ms per sentence on the serving path; num2words, inflect and nemo-text-processing beside it."""
    from bench.text import run

    _emit(run(rounds=rounds), as_json)


@app.command("alignment")
def alignment(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    limit: int = typer.Option(0, min=0, help="Only the first N cases (0: all 144)."),
    rounds: int = typer.Option(3, min=1, help="Times the CPU cost is measured over the cases."),
) -> None:
    """Word timings (gpu_worker.alignment) on espeak-ng speech with known word starts, six voices,
    three rates and uneven pacing; livekit-agents' speaking-rate estimate beside it."""
    from bench.alignment import run

    _emit(run(limit=limit or None, rounds=rounds), as_json)


@app.command("continuity")
def continuity(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(6, min=1, help="Conversations per side (with and without the window)."),
    sentences: int = typer.Option(5, min=2, max=5, help="Sentences (engine requests) per conversation."),
    frames: int = typer.Option(24, min=1, help="Frames each sentence is spoken for (7 tokens each)."),
    block_size: int = typer.Option(0, min=0, help="Tokens per KV block (0: the engine's default, 32 on CPU, "
                                                 "where vLLM's CPU attention takes multiples of 32 only)."),
    quick: bool = typer.Option(False, "--quick", help="One round of three sentences of 12 frames, no warm-up "
                                                      "conversations: a smoke run (the suite's), figures not comparable."),
) -> None:
    """A context's prompt window: later segments' time to first token with and without it, and
    how much of it the engine's prefix cache serves (real vLLM engine, bench stand-in)."""
    from bench.continuity import run

    block = block_size or None
    _emit(run(rounds=1, frames=12, sentences=3, block_size=block, warm=False) if quick
          else run(rounds=rounds, frames=frames, sentences=sentences, block_size=block), as_json)


@app.command("chunking")
def chunking(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Where streamed LLM text is cut into segments: the worker's auto chunking beside the LiveKit
    plugin's splitter, on replies full of abbreviations, decimals, times, addresses and tags."""
    from bench.chunking import run

    _emit(run(), as_json)


@app.command("ring")
def ring(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Lookup speed against uhashring, spread, movement, and routing under stale loads for 64 workers."""
    from bench.ring import run

    _emit(run(), as_json)


@app.command("proxy")
def proxy(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(10, help="Direct and proxied contexts, one of each per round."),
    quick: bool = typer.Option(False, "--quick", help="One warm-up pair, one round, no extra relayed contexts, two "
                                                      "requests after the failover: a smoke run (the suite's), figures "
                                                      "not comparable."),
) -> None:
    """Two real workers in one ring: TTFB direct vs relayed, time a chunk spends in the relay, warm
    dials, and failover after SIGKILL of the owner."""
    from bench.proxy import run

    _emit(run(rounds=1, after_requests=2, max_extra_relayed=0, warm_pairs=1) if quick else run(rounds=rounds), as_json)


@app.command("fleet")
def fleet(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    seconds: float = typer.Option(45.0, help="Seconds of measured load (after the warm-up)."),
    streams: int = typer.Option(8, min=1, help="Concurrent streams (closed loop)."),
) -> None:
    """Three real workers and two gateways' pools on one ring: every request's served_by against its
    voice's owners (needless hops, spills), refusals, busiest worker, and a hot voice's replicas growing."""
    from bench.fleet import run

    _emit(run(run_s=seconds, streams=streams), as_json)


@app.command("burst")
def burst(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=7, help="Audio tokens per burst request, 7 "
                                          "per 85 ms frame (default bench.burst.MAX_TOKENS: 43, six frames)."),
    max_streams: int | None = typer.Option(None, "--max-streams", min=1,
                                           help="Each worker's max_streams (default: the workers' own, 32)."),
    second_after: float | None = typer.Option(None, "--second-after", min=0.0, help="Seconds from the 2x burst's "
                                              "end to the 1x burst again (default bench.burst.SECOND_AFTER_S: 10)."),
    kill: bool = typer.Option(True, "--kill/--no-kill", help="End with SIGKILL of a worker under load."),
) -> None:
    """A real `voicering up` (2 workers, 1 gateway): bursts of 0.5x, 1x, 2x its stream capacity for one
    voice and over 8, the 1x burst again 10 s later, then SIGKILL of a worker serving streams and the
    time until its voice is served again."""
    from bench.burst import run

    given = {"max_tokens": max_tokens, "second_after_s": second_after}
    _emit(run(max_streams=max_streams, kill=kill, **{k: v for k, v in given.items() if v is not None}), as_json)


# the gateway, livekit and pipecat benches: a running worker in its ring instead of their own
_WORKER = typer.Option(None, "--worker", help="measure in front of this running worker (ws://host:port) instead of "
                                              "starting a stand-in worker; with --redis and --ring-prefix, its ring")
_REDIS = typer.Option(None, "--redis", help="the Redis URL of the running worker's ring (with --worker)")
_RING_PREFIX = typer.Option(None, "--ring-prefix", help="the ring's key prefix (with --worker)")


def _ring(worker: str | None, redis: str | None, ring_prefix: str | None):
    """`--worker --redis --ring-prefix`: all three (a running worker in its ring) or none (the bench's own)."""
    given = [worker, redis, ring_prefix]
    if not any(given):
        return None
    if not all(given):
        raise typer.BadParameter("--worker, --redis and --ring-prefix go together: the running worker and its ring")
    from bench.workers import RunningRing

    return RunningRing(worker, redis, ring_prefix)


@app.command("gateway")
def gateway(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(8, help="Rounds of direct, http pcm/mp3/opus and websocket contexts."),
    concurrent: int = typer.Option(32, help="Streaming speech requests at once."),
    quick: bool = typer.Option(False, "--quick", help="One warm-up pass, one round, 2 requests at once: a smoke run "
                                                      "(the suite's), figures not comparable."),
    worker: str = _WORKER,
    redis: str = _REDIS,
    ring_prefix: str = _RING_PREFIX,
) -> None:
    """A real gateway in front of a real worker: TTFB it adds per format and over the websocket,
    warm dials to the worker, concurrent requests, authentication time."""
    from bench.gateway import run

    ring = _ring(worker, redis, ring_prefix)
    _emit(run(rounds=1, concurrent=2, warm_passes=1, ring=ring) if quick
          else run(rounds=rounds, concurrent=concurrent, ring=ring), as_json)


@app.command("livekit")
def livekit(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(10, help="Plugin and direct contexts, one of each per round."),
    quick: bool = typer.Option(False, "--quick", help="One warm-up round, one round, one streamed reply (15 tokens "
                                                      "a sentence), one interruption, 10 turns: a smoke run (the "
                                                      "suite's), figures not comparable."),
    worker: str = _WORKER,
    redis: str = _REDIS,
    ring_prefix: str = _RING_PREFIX,
) -> None:
    """The LiveKit TTS plugin on the real framework against a real worker: TTFB added over a direct
    client, first audio under streaming LLM text, interruption to silence, sockets after 100 turns."""
    from bench.livekit import run

    ring = _ring(worker, redis, ring_prefix)
    _emit(run(rounds=1, first_sentence_rounds=1, interrupts=1, turns=10, warm_rounds=1, reply_max_tokens=15, ring=ring)
          if quick else run(rounds=rounds, ring=ring), as_json)


@app.command("pipecat")
def pipecat(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(10, help="Service and raw websocket turns, one of each per round."),
    quick: bool = typer.Option(False, "--quick", help="One warm-up round, one round, one interruption, 10 turns: a "
                                                      "smoke run (the suite's), figures not comparable."),
    worker: str = _WORKER,
    redis: str = _REDIS,
    ring_prefix: str = _RING_PREFIX,
) -> None:
    """The Pipecat TTS service in a real pipeline against a real gateway and worker: TTFB added over a
    raw websocket, interruption to silence, sockets after 30 turns, failed turns."""
    from bench.pipecat import run

    ring = _ring(worker, redis, ring_prefix)
    _emit(run(rounds=1, interrupts=1, turns=10, warm_rounds=1, ring=ring) if quick else run(rounds=rounds, ring=ring),
          as_json)


def _levels(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        levels = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter("levels are comma-separated integers, e.g. 1,8,16,32") from None
    if not levels or min(levels) < 1 or list(levels) != sorted(set(levels)):
        raise typer.BadParameter("levels must be positive and strictly increasing")
    return levels


@app.command("capacity")
def capacity(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    out: Path | None = typer.Option(None, "--out", help="JSON file to write (the plot goes beside it as .png; "
                                                        "default .cache/bench-capacity/capacity.json)."),
    levels: str | None = typer.Option(None, "--levels", help="Concurrent streams per level, e.g. 1,8,16,32,64 "
                                                             "(default: CUDA 1..512, CPU 1,2,4)."),
    weights: Path | None = typer.Option(None, "--weights", help="A stand-in root written by `voicering tiny-model "
                                                                "DIR --shape orpheus-3b` (sets model, codec, voices)."),
    model: str | None = typer.Option(None, "--model", help="Orpheus weights (full-size or real) instead of the tiny stand-in."),
    codec: str | None = typer.Option(None, "--codec", help="SNAC 24 kHz weights (with --model)."),
    voices_dir: str | None = typer.Option(None, "--voices-dir", help="Adapter store whose voices form the LoRA pool (with --model)."),
    quantization: str | None = typer.Option(None, "--quantization", help="auto (fp8 on CUDA), fp8, none."),
    max_loras: int | None = typer.Option(None, "--max-loras", min=1, help="Engine LoRA slots (CUDA 16, CPU 2)."),
    max_cpu_loras: int | None = typer.Option(None, "--max-cpu-loras", min=1, help="Adapters in the engine's CPU cache."),
    pool: int | None = typer.Option(None, "--pool", min=1, help="Stand-in LoRA voices streams draw from (CUDA 24, CPU 4)."),
    base_every: int | None = typer.Option(None, "--base-every", min=0, help="Every n-th stream uses the base model (0: none)."),
    frames: int | None = typer.Option(None, "--frames", min=2, help="Frames (85.3 ms) per context (CUDA 70, CPU 12)."),
    stagger_s: float | None = typer.Option(None, "--stagger-s", min=0.0, help="A level's starts spread over this."),
    ratio_rounds: int | None = typer.Option(None, "--ratio-rounds", min=1, help="Rounds of LoRA vs base at batch 10."),
    stop_below: float | None = typer.Option(None, "--stop-below", min=0.0, max=1.0,
                                            help="End the ramp after a level with a lower real-time share."),
) -> None:
    """Real-time streams per worker: a real worker and websocket clients, concurrency ramped until it
    fails; TTFB, tokens/s, underruns, codec batching per level; LoRA vs base at batch 10."""
    from bench.capacity import run

    if weights is not None:
        model, codec, voices_dir = str(weights / "orpheus"), str(weights / "snac_24khz"), str(weights / "voices")
    if quantization not in (None, "auto", "fp8", "none"):
        raise typer.BadParameter("quantization is auto, fp8 or none")
    _emit(run(out=out, levels=_levels(levels), model=model, codec=codec, voices_dir=voices_dir,
              quantization=quantization, max_loras=max_loras, max_cpu_loras=max_cpu_loras, pool=pool,
              base_every=base_every, frames=frames, stagger_s=stagger_s, ratio_rounds=ratio_rounds,
              stop_below=stop_below), as_json)
