"""`voicering up` and `voicering demo`: the platform on one machine (heavy imports inside each)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

__all__ = ["register"]


def _up_settings(**given: object):
    from pydantic import ValidationError

    from voicering.stack.settings import UpSettings

    try:
        return UpSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"error: invalid settings (options or VOICERING_UP_*):\n{exc}", err=True)
        raise typer.Exit(2) from None


def up(
    folder: Path = typer.Option(None, "--folder", help="Logs, Redis data, adapter store, uploads, the key (default var/up)."),
    workers: int = typer.Option(None, "--workers", help="GPU workers to run (default 2)."),
    redis: str = typer.Option(None, "--redis", metavar="URL", help="Use this Redis instead of an embedded one."),
    model: str = typer.Option(None, "--model", help="Orpheus weights (path or hub id) instead of stand-ins."),
    codec: str = typer.Option(None, "--codec", help="SNAC 24 kHz weights, with --model."),
    host: str = typer.Option(None, "--host", help="Address every process binds (default 127.0.0.1)."),
    gateway_port: int = typer.Option(None, "--gateway-port", help="The gateway's HTTP port (default 8000)."),
    worker_port: int = typer.Option(None, "--worker-port", help="Worker i listens on this + i (default 8765)."),
    agent_port: int = typer.Option(None, "--agent-port", help="The LiveKit agent server's health port (default 8081)."),
    worker_id_prefix: str = typer.Option(None, "--worker-id-prefix", help="Worker i joins the ring as "
                                         "PREFIX-i (default up-worker)."),
    tenant: str = typer.Option(None, "--tenant", help="The local tenant created or reused (default local)."),
    trainer: bool = typer.Option(None, "--trainer/--no-trainer", help="Run a training worker (default yes)."),
) -> None:
    """Run the whole platform here (Redis, workers, gateway, trainer, LiveKit agent) until Ctrl-C.

    Options left out come from VOICERING_UP_* variables; each process keeps its own (VOICERING_WORKER_*,
    VOICERING_GATEWAY_*, VOICERING_TRAIN_*; LIVEKIT_URL/API_KEY/API_SECRET turn the agent server on).
    """
    from voicering.stack.up import run_up

    settings = _up_settings(folder=folder, workers=workers, redis_url=redis, model=model, codec=codec, host=host,
                            gateway_port=gateway_port, worker_port=worker_port, agent_port=agent_port,
                            worker_id_prefix=worker_id_prefix, tenant=tenant, trainer=trainer)
    raise typer.Exit(asyncio.run(run_up(settings)))


def demo(
    out_dir: Path = typer.Option(Path("out"), "--out", help="Where the WAVs and the report go."),
    folder: Path = typer.Option(Path("var/demo"), "--folder", help="The demo's `voicering up` folder (wiped first)."),
    model: str = typer.Option(None, "--model", help="Real Orpheus weights (a GPU machine) instead of stand-ins."),
    codec: str = typer.Option(None, "--codec", help="SNAC 24 kHz weights, with --model."),
    gateway_port: int = typer.Option(None, "--gateway-port", help="The platform gateway's port (default 8000)."),
    worker_port: int = typer.Option(None, "--worker-port", help="First worker port (default 8765)."),
) -> None:
    """A creator's and an app's day end to end: up, clone a voice from uploaded speech, speak it
    with the openai client through both workers, the LiveKit plugin, scale it to 2 replicas, stop."""
    from voicering.stack.demo import run_demo

    settings = _up_settings(folder=folder, workers=2, model=model, codec=codec, gateway_port=gateway_port,
                            worker_port=worker_port)
    raise typer.Exit(run_demo(settings, out_dir))


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root CLI."""
    app.command("up")(up)
    app.command("demo")(demo)
