"""`voicering tiny-model | worker | say`: the worker's commands (heavy imports inside each)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import typer


def tiny_model(
    directory: Path = typer.Argument(..., help="Where to write the stand-in models."),
    voices: int = typer.Option(2, "--voices", min=0, help="Random LoRA voices to create."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if a complete copy exists."),
    shape: str = typer.Option("tiny", "--shape", help="tiny (2 layers, for CPU tests) or orpheus-3b (Llama-3.2-3B's "
                                                      "exact shape, ~6.6 GB of bf16 shards, rank-32 voices)."),
    codec: str | None = typer.Option(None, "--codec", help="small (narrow SNAC, the tiny shape's default) or "
                                                           "snac-24khz (the published SNAC shape, orpheus-3b's default)."),
) -> None:
    """Write stand-in weights offline: Orpheus-vocab Llama (tiny or full-size), tokenizer, random SNAC, LoRA voices."""
    from gpu_worker.stand_in import build_stand_in, stand_in_codec

    try:
        codec = stand_in_codec(shape, codec)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    paths = build_stand_in(directory, voices=voices, force=force, shape=shape, codec=codec)  # type: ignore[arg-type]
    typer.echo(json.dumps({"model": str(paths.model), "codec": str(paths.codec), "voices_dir": str(paths.voices),
                           "voices": sorted(p.name for p in paths.voices.iterdir()) if paths.voices.exists() else []}))


def worker(
    model: str | None = typer.Option(None, help="Orpheus weights: local path or hub id."),
    codec: str | None = typer.Option(None, help="SNAC 24 kHz weights: local path or hub id."),
    voices_dir: Path | None = typer.Option(None, help="Adapter store: <dir>/<voice id>/."),
    host: str | None = typer.Option(None),
    port: int | None = typer.Option(None),
    worker_id: str | None = typer.Option(None),
    quantization: str | None = typer.Option(None, help="auto (fp8 on CUDA), fp8, none."),
    max_loras: int | None = typer.Option(None, help="Adapters resident in the engine at once."),
    max_streams: int | None = typer.Option(None, help="Concurrent contexts before 'busy'."),
    constraint: str | None = typer.Option(None, help="Slot-constrained sampling: fused, mask, off."),
    max_cpu_loras: int | None = typer.Option(None, help="Adapters kept in the engine's CPU cache (LRU)."),
    max_lora_rank: int | None = typer.Option(None, help="Largest adapter rank this worker accepts."),
    codec_policy: str | None = typer.Option(None, help="Codec decode policy: auto, batched, sequential."),
    first_audio_frames: int | None = typer.Option(None, help="Frames (7 tokens each) before a stream's first audio: "
                                                  "1 to 3 (1: sooner, its first 85 ms less faithful)."),
    prewarm: list[str] | None = typer.Option(None, "--prewarm", help="Voice to load before serving (repeatable)."),
    trim_silence: bool | None = typer.Option(None, "--trim-silence/--no-trim-silence", help="Drop head silence at serving time."),
    redis: str | None = typer.Option(None, "--redis", help="Join the hash ring in this Redis (redis://...)."),
    log_level: str = typer.Option("INFO"),
) -> None:
    """Run a GPU worker (vLLM engine + SNAC) serving voices over websockets.

    Options left out come from VOICERING_WORKER_* environment variables, then WorkerSettings defaults.
    """
    from pydantic import ValidationError

    from gpu_worker.settings import WorkerSettings
    from gpu_worker.trace_context import TRACE_FORMAT, OtlpHopHandler, OtlpUnavailable, install_log_filter
    from gpu_worker.worker import run_worker

    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s %(message)s{TRACE_FORMAT}")
    install_log_filter()  # every record made for a request carries its trace id
    given = dict(model=model, codec=codec, voices_dir=voices_dir, host=host, port=port, worker_id=worker_id,
                 quantization=quantization, max_loras=max_loras, max_streams=max_streams, constraint=constraint,
                 max_cpu_loras=max_cpu_loras, max_lora_rank=max_lora_rank, codec_policy=codec_policy,
                 first_audio_frames=first_audio_frames,
                 prewarm_voices=tuple(prewarm) if prewarm else None, trim_silence=trim_silence, redis_url=redis)
    try:
        settings = WorkerSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"error: invalid worker settings:\n{exc}", err=True)
        raise typer.Exit(2) from None
    if settings.otlp_endpoint:
        try:
            logging.getLogger().addHandler(OtlpHopHandler(settings.otlp_endpoint, "voicering-worker",
                                                          instance=settings.worker_id))
        except OtlpUnavailable as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    from gpu_worker.errors import EngineError
    from gpu_worker.open_cluster import OpenCluster

    try:
        asyncio.run(run_worker(settings))
    except OpenCluster as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    except EngineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def say(
    text: str = typer.Argument(..., help="What to say."),
    voice: str = typer.Option(..., "--voice", help="Voice id."),
    worker_url: str = typer.Option("ws://127.0.0.1:8765", "--worker", help="Worker websocket URL."),
    out: Path = typer.Option(Path("out.wav"), "-o", "--out", help="WAV file to write (24 kHz mono 16-bit)."),
    seed: int | None = typer.Option(None, help="Sampling seed, for reproducible output."),
) -> None:
    """Stream one context from a worker into a WAV file; print TTFB and real-time factor."""
    from gpu_worker.client.connection import WorkerClient, WorkerConnectionLost, WorkerRequestError
    from gpu_worker.protocol import ContextOptions
    from gpu_worker.wav import write_wav

    async def run() -> None:
        async with await WorkerClient.connect(worker_url) as client:
            speech = await client.say(voice, text, options=ContextOptions(seed=seed))
        write_wav(out, speech.pcm)
        s = speech.done.stats
        typer.echo(f"{out}: {s.audio_s:.2f} s audio, TTFB {speech.client_ttfb_ms:.0f} ms (worker {s.ttfb_ms} ms), "
                   f"RTF {s.rtf}, {s.tokens} tokens, {s.frames} frames")

    try:
        asyncio.run(run())
    except WorkerRequestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (OSError, WorkerConnectionLost) as exc:
        typer.echo(f"error: cannot reach worker at {worker_url}: {exc}", err=True)
        raise typer.Exit(3) from None


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root CLI."""
    app.command("tiny-model")(tiny_model)
    app.command("worker")(worker)
    app.command("say")(say)
