"""The `voicering` command line.

Each subcommand lives in the package that owns its domain; this module only wires them together.
Sub-CLIs import nothing heavy (torch, vllm) at module level, so `voicering --help` stays fast.
"""

from __future__ import annotations

import typer

from voicering import __version__

app = typer.Typer(no_args_is_help=True, add_completion=False, help="voicering: real-time cloned voices.")


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """voicering: serve cloned Orpheus voices in real time."""


def _wire() -> None:
    from bench.cli import app as bench_app
    from gateway.cli import app as tenant_app
    from gateway.livekit.cli import register as register_agent
    from gateway.serve import command as gateway_command
    from voicering.stack.cli import register as register_stack
    from gpu_worker.cli import register as register_worker
    from voicering.normalize import command as normalize_command
    from hashring.cli import app as ring_app
    from lora_training.cli import register as register_training
    from silence_trim.cli import app as trim_app
    from voicering.redis_acl import command as redis_acl_command
    from voicering.status import command as status_command
    from voicering.trace import command as trace_command

    register_worker(app)
    register_training(app)
    register_agent(app)
    register_stack(app)
    app.add_typer(ring_app, name="ring", help="Operate the consistent hash ring (membership, placement).")
    app.add_typer(trim_app, name="trim", help="Measure and trim head/tail silence.")
    app.add_typer(bench_app, name="bench", help="Benchmarks (print JSON figures).")
    app.add_typer(tenant_app, name="tenant", help="Tenants, their API keys and limits (in Redis).")
    app.command("gateway")(gateway_command)
    app.command("status")(status_command)
    app.command("normalize")(normalize_command)
    app.command("trace")(trace_command)
    app.command("redis-acl")(redis_acl_command)


_wire()


def main() -> None:
    app()
