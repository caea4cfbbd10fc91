"""CLI for hashring: `voicering ring status|where|scale|drain|undrain|simulate`.

Commands that talk to Redis take `--redis URL`; without it they use VOICERING_REDIS_URL, read once
when the command starts (RingSettings.from_env). Exit status: 0 done, 1 a request that cannot
succeed as given (unknown worker, bad replica count, bad voice id), 75 a temporary failure such as
Redis being unreachable (retrying may help), 2 a usage error.
"""

import asyncio
import dataclasses
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

import typer

from hashring.errors import RingError
from hashring.settings import RingSettings

app = typer.Typer(no_args_is_help=True)

T = TypeVar("T")
_TEMPFAIL = 75  # sysexits EX_TEMPFAIL

RedisOption = typer.Option(None, "--redis", metavar="URL", help="Redis URL [default: $VOICERING_REDIS_URL].")
JsonOption = typer.Option(False, "--json", help="Print one JSON object.")


@app.callback()
def _root(ctx: typer.Context, prefix: str | None = typer.Option(
        None, "--prefix", envvar="VOICERING_RING_PREFIX",
        help="Key prefix of the ring (the workers' VOICERING_WORKER_RING_PREFIX); default voicering:ring.")) -> None:
    """Operate the consistent hash ring: membership, placement, drain, replicas."""
    ctx.obj = RingSettings.from_env(**({"prefix": prefix} if prefix else {}))


def _settings(ctx: typer.Context, redis_url: str | None) -> RingSettings:
    settings = ctx.obj if isinstance(ctx.obj, RingSettings) else RingSettings.from_env()
    return dataclasses.replace(settings, redis_url=redis_url) if redis_url else settings


def _run(work: Awaitable[T]) -> T:
    try:
        return asyncio.run(work)  # type: ignore[arg-type]
    except RingError as exc:
        typer.secho(f"error: {exc.message}", err=True, fg=typer.colors.RED)
        raise typer.Exit(_TEMPFAIL if exc.retryable else 1) from None


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def _warn(message: str) -> None:
    typer.secho(f"warning: {message}", err=True, fg=typer.colors.YELLOW)


async def _view(settings: RingSettings, store=None):  # imports stay lazy: `--help` loads no Redis client
    from hashring.records import RingView
    from hashring.store import RingStore

    if store is None:
        async with RingStore(settings) as own:
            return RingView.from_snapshot(await own.snapshot(), vnodes=settings.vnodes)
    return RingView.from_snapshot(await store.snapshot(), vnodes=settings.vnodes)


@app.command()
def status(ctx: typer.Context, redis_url: str | None = RedisOption, as_json: bool = JsonOption) -> None:
    """Workers, liveness, load and the ring epoch."""
    from hashring.redis_client import redact_url

    settings = _settings(ctx, redis_url)
    view = _run(_view(settings))
    shares = view.ring.shares()
    rows = [
        {
            "id": wid,
            "status": st.status,
            "heartbeat_age_s": None if st.heartbeat_age_s is None else round(st.heartbeat_age_s, 2),
            "load": st.load,
            "capacity": st.info.capacity,
            "weight": st.info.weight,
            "ring_share": round(shares.get(wid, 0.0), 4),
            "ws_url": st.info.ws_url,
            "proxy_url": st.info.proxy_url,
        }
        for wid, st in view.workers.items()
    ]
    summary = {
        "redis": redact_url(settings.redis_url),
        "epoch": view.epoch,
        "in_ring": len(view.ring),
        "registered": len(view.workers),
        "digest": view.ring.digest(),
        "voices_with_replicas": len(view.replicas),
        "hot_voices": len(view.auto_replicas),
    }
    if as_json:
        _echo_json({**summary, "workers": rows})
        return
    typer.echo(
        f"ring epoch {view.epoch}: {len(view.ring)} of {len(view.workers)} workers in the ring, "
        f"digest {summary['digest']}, redis {summary['redis']}")
    typer.echo(f"voices with an operator replica count: {len(view.replicas)}, hot voices: {len(view.auto_replicas)}")
    if not rows:
        typer.echo("no workers registered")
        return
    typer.echo(f"{'WORKER':24} {'STATUS':9} {'HEARTBEAT':>9} {'LOAD/CAP':>9} {'WEIGHT':>6} {'SHARE':>6}  WEBSOCKET")
    for r in rows:
        age = "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.1f}s"
        typer.echo(
            f"{r['id']:24} {r['status']:9} {age:>9} {str(r['load']) + '/' + str(r['capacity']):>9} "
            f"{r['weight']:>6g} {r['ring_share'] * 100:>5.1f}%  {r['ws_url']}")


@app.command()
def where(
    ctx: typer.Context,
    voice: str = typer.Argument(..., help="Voice id (any text; hashed byte-exact as UTF-8)."),
    redis_url: str | None = RedisOption,
    as_json: bool = JsonOption,
) -> None:
    """Which workers hold VOICE, in preference order, and which one the next request goes to."""
    from hashring.placement import place, requested_replicas, route

    settings = _settings(ctx, redis_url)

    async def work():
        view = await _view(settings)
        return view, place(view, voice, settings), route(view, voice, settings)

    view, placement, target = _run(work())
    if placement.clamped:
        _warn(f"voice {voice!r} asks for {placement.requested} replicas but only {len(view.ring)} workers are "
              f"in the ring; it is placed on {placement.replicas}")
    data = {
        "voice": voice,
        "epoch": placement.epoch,
        "replicas": placement.replicas,
        "requested": requested_replicas(view, voice, settings),
        "operator_replicas": view.replicas.get(voice),
        "auto_replicas": view.auto_replicas.get(voice),
        "owners": list(placement.owners),
        "next_request": target.id,
    }
    if as_json:
        _echo_json(data)
        return
    floor = data["operator_replicas"] or f"default {settings.default_replicas}"
    typer.echo(f"voice {voice!r} at epoch {placement.epoch}: {placement.replicas} replica(s) "
               f"(operator {floor}, automatic {data['auto_replicas'] or 1})")
    for rank, wid in enumerate(placement.owners, 1):
        st = view.workers[wid]
        mark = "  <- next request" if wid == target.id else ""
        typer.echo(f"  {rank}. {wid:24} load {st.load}/{st.info.capacity}  {st.info.ws_url}{mark}")
    if target.id not in placement.owners:
        typer.echo(f"  owners are over the load bound; next request spills to {target.id} ({target.ws_url})")


@app.command()
def scale(
    ctx: typer.Context,
    voice: str = typer.Argument(..., help="Voice id."),
    replicas: int | None = typer.Option(None, "--replicas", "-n", help="Workers that hold the voice (at least)."),
    reset: bool = typer.Option(False, "--reset", help="Forget the operator count (back to the default)."),
    redis_url: str | None = RedisOption,
) -> None:
    """Set how many workers hold VOICE; hot voices may get more automatically."""
    from hashring.placement import ReplicaControl, check_replicas
    from hashring.store import RingStore

    if (replicas is None) == (not reset):
        raise typer.BadParameter("give either --replicas N or --reset")
    settings = _settings(ctx, redis_url)

    async def work():
        if replicas is not None:
            check_replicas(replicas)
        async with RingStore(settings) as store:
            epoch = await ReplicaControl(store).scale(voice, replicas)
            live = len((await _view(settings, store)).ring)
        return epoch, live

    epoch, live = _run(work())
    if replicas is not None and replicas > live:
        _warn(f"only {live} workers are in the ring; voice {voice!r} is placed on {live} until more join")
    what = f"{replicas} replica(s)" if replicas is not None else "the default replica count"
    typer.echo(f"voice {voice!r}: {what}" + (f" (epoch {epoch})" if epoch else " (unchanged)"))


def _set_draining(ctx: typer.Context, worker: str, redis_url: str | None, draining: bool, own: bool = False) -> None:
    from hashring.store import RingStore

    settings = _settings(ctx, redis_url)

    async def work() -> int:
        async with RingStore(settings) as store:
            return await store.set_draining(worker, draining, own=own)

    epoch = _run(work())
    state = "draining: it takes no new voices and finishes its streams" if draining else "taking voices again"
    typer.echo(f"worker {worker} is {state}" + (f" (epoch {epoch})" if epoch else " (it already was)"))


@app.command()
def drain(
    ctx: typer.Context, worker: str = typer.Argument(..., help="Worker id."), redis_url: str | None = RedisOption,
    shutdown: bool = typer.Option(False, "--shutdown", help="A drain for the worker's own shutdown (a preStop "
                                  "hook): undone if it comes back without having left the ring."),
) -> None:
    """Stop placing voices on WORKER; its streams in progress finish. The drain stays across
    restarts until `undrain`, unless --shutdown (then only until the worker registers again)."""
    _set_draining(ctx, worker, redis_url, True, own=shutdown)


@app.command()
def undrain(
    ctx: typer.Context, worker: str = typer.Argument(..., help="Worker id."), redis_url: str | None = RedisOption
) -> None:
    """Place voices on WORKER again."""
    _set_draining(ctx, worker, redis_url, False)


@app.command()
def simulate(
    workers: int = typer.Option(64, "--workers", min=1, help="Equal-weight workers."),
    voices: int = typer.Option(10_000, "--voices", min=1, help="Voices to place."),
    vnodes: int | None = typer.Option(None, "--vnodes", min=1, help="Points per worker [default: the ring's]."),
    trials: int = typer.Option(16, "--trials", min=1, help="Random single removals (and additions) to average."),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = JsonOption,
) -> None:
    """Distribution and movement report for a ring of N workers and M voices (no Redis)."""
    from hashring.ring import DEFAULT_VNODES
    from hashring.simulate import simulate as run_simulation

    report = run_simulation(workers, voices, vnodes=vnodes or DEFAULT_VNODES, trials=trials, seed=seed).as_dict()
    if as_json:
        _echo_json(report)
        return
    typer.echo(f"{workers} workers, {voices} voices, {report['vnodes']} points per worker")
    typer.echo(f"  hash space per worker, max/mean     {report['share_max_over_mean']:.3f}"
               f"   (min/mean {report['share_min_over_mean']:.3f})")
    typer.echo(f"  voices per worker, max/mean         {report['voices_max_over_mean']:.3f}"
               f"   (min/mean {report['voices_min_over_mean']:.3f})")
    typer.echo(f"  voices moved when one worker leaves {report['moved_fraction_on_remove']:.4f}"
               f"   (ideal {report['moved_ideal_on_remove']:.4f}, mean of {trials})")
    typer.echo(f"  voices moved when one worker joins  {report['moved_fraction_on_add']:.4f}"
               f"   (ideal {report['moved_ideal_on_add']:.4f}, mean of {trials})")
    typer.echo(f"  voices moved between other workers  {report['moved_foreign']}")

