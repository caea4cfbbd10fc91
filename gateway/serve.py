"""`voicering gateway`: the public API under uvicorn, one process, one settings object.

uvicorn runs the app with the `websockets` implementation (the text-in stream), a 1 MiB cap on
websocket messages, and a graceful shutdown that lets streams finish for `--grace` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

__all__ = ["command", "run"]

log = logging.getLogger(__name__)

WS_MAX_MESSAGE_BYTES = 1 << 20


async def run(settings, *, grace_s: float = 10.0) -> None:
    import uvicorn

    from gateway.api.app import create_app

    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, ws="websockets",
                            ws_max_size=WS_MAX_MESSAGE_BYTES, timeout_graceful_shutdown=grace_s, log_level="info",
                            access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    await server.serve()


def command(
    host: str = typer.Option(None, "--host", help="Address to bind [default: 127.0.0.1]."),
    port: int = typer.Option(None, "--port", help="HTTP port [default: 8000]."),
    redis_url: str = typer.Option(None, "--redis", metavar="URL", help="Redis of tenants, ring and training queue."),
    workers: list[str] = typer.Option(None, "--worker", metavar="URL",
                                      help="A worker websocket URL (repeatable): fixed routing, no ring."),
    ring_prefix: str = typer.Option(None, "--ring-prefix", help="The workers' ring prefix in Redis."),
    voices_dir: Path = typer.Option(None, "--voices-dir", help="The adapter store (shared with trainers, workers)."),
    uploads_dir: Path = typer.Option(None, "--uploads-dir", help="Where uploaded audio is kept."),
    grace: float = typer.Option(10.0, "--grace", help="Seconds streams may finish on shutdown."),
) -> None:
    """Serve the public API: OpenAI-compatible speech, streaming TTS, voice cloning, the web page."""
    from gateway.settings import GatewaySettings

    given = {"host": host, "port": port, "redis_url": redis_url, "workers": tuple(workers) if workers else None,
             "ring_prefix": ring_prefix, "voices_dir": voices_dir, "uploads_dir": uploads_dir}
    settings = GatewaySettings(**{k: v for k, v in given.items() if v is not None})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run(settings, grace_s=grace))
