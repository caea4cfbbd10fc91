"""`voicering agent`: run the LiveKit agent server (gateway/livekit/agent.py).

Settings come from the environment (`AgentSettings`: VOICERING_AGENT_*, LIVEKIT_URL,
LIVEKIT_API_KEY, LIVEKIT_API_SECRET, VOICERING_REDIS_URL); the options here override them.
Imports stay lazy: `voicering --help` loads no livekit.
"""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("agent")
    def agent(
        voice: str | None = typer.Option(None, "--voice", help="Voice id to speak with (else $VOICERING_AGENT_VOICE)."),
        redis_url: str | None = typer.Option(None, "--redis", metavar="URL",
                                             help="Redis of the workers' ring (else $VOICERING_REDIS_URL)."),
        dev: bool = typer.Option(False, "--dev", help="livekit-agents development mode (no idle processes)."),
        log_level: str = typer.Option("INFO", "--log-level"),
    ) -> None:
        """Join LiveKit rooms on dispatch and speak with a voicering voice (see docs/livekit.md)."""
        import asyncio
        import logging

        from pydantic import ValidationError

        from gateway.livekit.agent import serve
        from gateway.livekit.settings import AgentSettings
        from gpu_worker.open_cluster import OpenCluster
        from hashring.errors import RingError

        overrides = {k: v for k, v in {"voice": voice, "redis_url": redis_url}.items() if v is not None}
        try:
            settings = AgentSettings(**overrides)
        except ValidationError as exc:
            typer.secho(f"error: bad agent setting (VOICERING_AGENT_*, LIVEKIT_*): {exc}", err=True, fg=typer.colors.RED)
            raise typer.Exit(1) from None
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            asyncio.run(serve(settings, devmode=dev))
        except OpenCluster as exc:
            typer.secho(f"error: {exc.message}", err=True, fg=typer.colors.RED)
            raise typer.Exit(2) from None
        except RingError as exc:
            typer.secho(f"error: {exc.message}", err=True, fg=typer.colors.RED)
            raise typer.Exit(1) from None
        except ValueError as exc:  # livekit: no URL / key / secret
            typer.secho(f"error: {exc} (or VOICERING_AGENT_LIVEKIT_*; see docs/livekit.md)", err=True,
                        fg=typer.colors.RED)
            raise typer.Exit(1) from None
