"""The `voicering status` command: its options, the settings they resolve to (once per run), and
the run: one sample printed, or `--watch` redrawing every `--interval` seconds until Ctrl-C.

Exit status: 0 no problems, 1 problems (listed first), 75 Redis unreachable (trying again may
help), 2 a usage error, 130 Ctrl-C before the first sample. `--watch` exits with the last
sample's status: Ctrl-C (or SIGTERM) ends it between samples, never by cancelling one half read
(a sample's Redis and queue reads run in threads that a cancel would leave racing the close).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import time
from typing import TYPE_CHECKING, Final

import typer

from voicering.status.probes import StatusReader
from voicering.status.report import StatusSettings, report_json
from voicering.status.terminal import render

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["EXIT_INTERRUPTED", "EXIT_PROBLEMS", "EXIT_TEMPFAIL", "command"]

EXIT_PROBLEMS: Final = 1
EXIT_TEMPFAIL: Final = 75  # sysexits EX_TEMPFAIL, as `voicering ring`
EXIT_INTERRUPTED: Final = 130  # Ctrl-C before the first sample was read


def command(
    redis_url: str | None = typer.Option(None, "--redis", metavar="URL", help=(
        "Redis of the ring and the training queue (default: $VOICERING_REDIS_URL; for the queue "
        "$VOICERING_TRAIN_REDIS_URL first).")),
    prefix: str | None = typer.Option(None, "--prefix", envvar="VOICERING_RING_PREFIX",
                                      help="Key prefix of the ring; default voicering:ring."),
    queue_prefix: str | None = typer.Option(None, "--queue-prefix", help=(
        "Key prefix of the training queue (default: $VOICERING_TRAIN_QUEUE_PREFIX or voicering:train).")),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (with --watch: one per line)."),
    watch: bool = typer.Option(False, "--watch", help="Redraw every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(2.0, "--interval", min=0.1, help="Seconds between samples with --watch."),
    queue_age_limit: float = typer.Option(10.0, "--queue-age-limit", min=0.0, metavar="MINUTES",
                                          help="A training job queued longer than this is a problem."),
    top: int = typer.Option(10, "--top", min=0, help="Hottest voices shown."),
    voices: list[str] = typer.Option([], "--voice", help="Also show this voice (repeat the option for more)."),
    token: str | None = typer.Option(None, "--token", envvar="VOICERING_WORKER_CLUSTER_TOKEN", show_envvar=False,
                                     help="The workers' cluster token, for their /metrics "
                                          "(default: $VOICERING_WORKER_CLUSTER_TOKEN)."),
    probe_timeout: float = typer.Option(1.0, "--probe-timeout", min=0.0, metavar="SECONDS",
                                        help="Per answer of a worker's /health and /metrics; 0: do not probe."),
) -> None:
    """Workers, ring epoch, hottest voices and training queue at a glance; problems first.

    Exit status: 0 no problems, 1 problems, 75 Redis unreachable, 2 usage error."""
    settings = _settings(redis_url, prefix, queue_prefix, token, probe_timeout, queue_age_limit, top, voices)
    outcome = _Outcome()
    try:
        asyncio.run(_run(settings, as_json=as_json, watch=watch, interval=interval, outcome=outcome))
    except KeyboardInterrupt:
        pass
    raise typer.Exit(EXIT_INTERRUPTED if outcome.code is None else outcome.code)


class _Outcome:
    """The exit status of the latest sample (kept outside the loop that Ctrl-C ends); None before the first."""

    code: int | None = None


def _settings(redis_url: str | None, prefix: str | None, queue_prefix: str | None, token: str | None,
              probe_timeout: float, queue_age_limit: float, top: int, voices: list[str]) -> StatusSettings:
    from pydantic import ValidationError

    from hashring.errors import InvalidVoiceId
    from hashring.records import check_voice_id
    from hashring.settings import RingSettings
    from lora_training.settings import TrainSettings

    try:
        ring = RingSettings.from_env(**({"prefix": prefix} if prefix else {}))
        train = TrainSettings()
    except (ValueError, ValidationError) as exc:
        typer.echo(f"error: invalid settings: {exc}", err=True)
        raise typer.Exit(2) from None
    for voice in voices:
        try:
            check_voice_id(voice)
        except InvalidVoiceId as exc:
            raise typer.BadParameter(exc.message, param_hint="--voice") from None
    if redis_url:
        ring = dataclasses.replace(ring, redis_url=redis_url)
    return StatusSettings(ring, redis_url or train.redis_url, queue_prefix or train.queue_prefix, token or None,
                          probe_timeout, queue_age_limit * 60.0, top, tuple(voices))


async def _run(settings: StatusSettings, *, as_json: bool, watch: bool, interval: float, outcome: _Outcome) -> None:
    from rich.console import Console

    from hashring.errors import RingError

    console = Console(highlight=False)
    async with StatusReader(settings) as reader:
        if not watch:
            try:
                report = await reader.read()
            except RingError as exc:
                typer.secho(f"error: {exc.message}", err=True, fg=typer.colors.RED)
                outcome.code = EXIT_TEMPFAIL if exc.retryable else EXIT_PROBLEMS
                return
            outcome.code = EXIT_PROBLEMS if report.problems else 0
            if as_json:
                typer.echo(json.dumps(report_json(report), indent=2, sort_keys=True))
            else:
                console.print(render(report))
            return
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await _watch(reader, console, as_json=as_json, interval=interval, outcome=outcome, stop=stop)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


async def _watch(reader: StatusReader, console: Console, *, as_json: bool, interval: float, outcome: _Outcome,
                 stop: asyncio.Event) -> None:
    from rich.live import Live
    from rich.text import Text

    from hashring.errors import RingError

    live = None if as_json else Live(console=console, auto_refresh=False)
    try:
        if live is not None:
            live.start()
        while not stop.is_set():
            try:
                report = await reader.read()
            except RingError as exc:  # Redis away: say so and keep trying
                outcome.code = EXIT_TEMPFAIL if exc.retryable else EXIT_PROBLEMS
                if live is None:
                    typer.echo(json.dumps({"error": exc.message, "read_at": round(time.time(), 3)}), nl=True)
                else:
                    live.update(Text(f"error: {exc.message} (retrying every {interval:g} s)", style="bold red"),
                                refresh=True)
            else:
                outcome.code = EXIT_PROBLEMS if report.problems else 0
                if live is None:
                    typer.echo(json.dumps(report_json(report), sort_keys=True))
                else:
                    live.update(render(report), refresh=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await stop.wait()
    finally:
        if live is not None:
            live.stop()
