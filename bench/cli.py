"""`voicering bench ...`: each command runs one benchmark module and prints its JSON figures.

The benchmarks register here, above the packages they measure, so no package imports `bench`.
"""

from __future__ import annotations

import json

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
def worker(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """The real vLLM engine with stand-in weights: TTFB, tokens/s per stream, LoRA and constraint ratios."""
    from bench.worker import run

    _emit(run(), as_json)


@app.command("train")
def train(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Training pipeline on espeak-ng speech: preprocessing speed, encode speed, train steps/s, head silence."""
    from bench.train import run

    _emit(run(), as_json)


@app.command("silence")
def silence(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    seconds: float = typer.Option(60.0, help="Seconds of espeak-ng speech to measure speed on."),
) -> None:
    """Energy vs VAD: ms of CPU per second of audio, streaming cost per 2048-sample chunk, accuracy."""
    from bench.silence import run

    _emit(run(seconds=seconds), as_json)


@app.command("ring")
def ring(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Lookup speed against uhashring, spread, movement, and routing under stale loads for 64 workers."""
    from bench.ring import run

    _emit(run(), as_json)


@app.command("proxy")
def proxy(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(10, help="Direct and proxied utterances, one of each per round."),
) -> None:
    """Two real workers in one ring: TTFB direct vs relayed, time a chunk spends in the relay, warm
    dials, and failover after SIGKILL of the owner."""
    from bench.proxy import run

    _emit(run(rounds=rounds), as_json)


@app.command("gateway")
def gateway(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(8, help="Rounds of direct, http pcm/mp3/opus and websocket utterances."),
    concurrent: int = typer.Option(32, help="Streaming speech requests at once."),
) -> None:
    """A real gateway in front of a real worker: TTFB it adds per format and over the websocket,
    warm dials to the worker, concurrent requests, authentication time."""
    from bench.gateway import run

    _emit(run(rounds=rounds, concurrent=concurrent), as_json)


@app.command("livekit")
def livekit(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    rounds: int = typer.Option(10, help="Plugin and direct utterances, one of each per round."),
) -> None:
    """The LiveKit TTS plugin on the real framework against a real worker: TTFB added over a direct
    client, first audio under streaming LLM text, interruption to silence, sockets after 100 turns."""
    from bench.livekit import run

    _emit(run(rounds=rounds), as_json)
