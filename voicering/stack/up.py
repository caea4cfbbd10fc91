"""`voicering up`: the whole platform on one machine, supervised, until Ctrl-C or SIGTERM.

Order: take the folder (one `up` per folder) -> check every port before anything starts -> the
weights (stand-ins are built once into a cache) -> Redis (embedded, kept in the folder, unless a
URL is given) -> the workers -> the gateway, the trainer and (with LiveKit settings) the agent
server -> the local tenant -> URLs and key printed, `up.json` says `ready`. A signal at any point,
start-up included, stops what was started: the gateway, trainer and agent first (streams in
flight finish), then the workers (each drains and leaves the ring), then Redis. A worker the
ring still lists after its process is gone (it was SIGKILLed) is removed, so nothing stale is
left behind for the next `up` or for the rest of a shared fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from voicering.stack.children import Child, ChildFailed, StartInterrupted
from voicering.stack.folder import AlreadyRunning, StackFolder, UpState
from voicering.stack.local_tenant import ensure_local_tenant
from voicering.stack.plan import ExposedWithoutToken, Models, PortInUse, StackPlan, check_ports, is_loopback, plan_stack
from voicering.stack.settings import UpSettings
from voicering.stack.supervisor import RestartPolicy, Supervisor

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_REFUSED", "run_up"]

EXIT_FAILED, EXIT_REFUSED, EXIT_INTERRUPTED = 1, 2, 130


def say(message: str) -> None:
    print(f"[up] {message}", flush=True)


async def _until(work, interrupt: asyncio.Event):
    """`work` (a coroutine), or StartInterrupted if `interrupt` is set first (then `work` is cancelled)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(interrupt.wait())
    await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise StartInterrupted("start-up")


async def build_stand_in(cache: Path) -> Models:
    """Stand-in weights in `cache` (built once; a child process, so `up` itself never loads torch)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "voicering", "tiny-model", str(cache), "--voices", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await proc.communicate()
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"building stand-in weights failed:\n{err.decode(errors='replace')[-2000:]}")
    paths = json.loads(out.decode().strip().splitlines()[-1])
    return Models(paths["model"], paths["codec"], stand_in=True)


class WorkerIdsInUse(Exception):
    pass


async def check_worker_ids(redis_url: str, worker_ids: tuple[str, ...]) -> None:
    """Refuse to start workers whose ids are alive in this Redis's ring (another stack's): two
    processes heartbeating one id would take turns owning its voices."""
    from hashring.redis_client import redact_url
    from hashring.settings import RingSettings
    from hashring.store import RingStore

    async with RingStore(RingSettings.from_env(redis_url=redis_url)) as store:
        taken = sorted(set(worker_ids) & (await store.snapshot()).live)
    if taken:
        raise WorkerIdsInUse(f"worker id(s) {', '.join(taken)} are alive in the ring at {redact_url(redis_url)} (another "
                             "`voicering up` or fleet uses them): pass --worker-id-prefix, or stop the other one")


async def forget_departed(redis_url: str, worker_ids: tuple[str, ...]) -> list[str]:
    """Remove from the ring the workers of this `up` that are gone but still listed."""
    from hashring.settings import RingSettings
    from hashring.store import RingStore

    async with RingStore(RingSettings.from_env(redis_url=redis_url)) as store:
        listed = (await store.snapshot()).workers
        stale = [wid for wid in worker_ids if wid in listed]
        for wid in stale:
            await store.deregister(wid)
    return stale


def _banner(plan: StackPlan, key, created: bool, redis_url: str, settings: UpSettings, models: Models,
            token: bool = False) -> str:
    lines = [
        "voicering is up" + (" (stand-in weights: audio is noise, not speech)" if models.stand_in else ""),
        f"  web page      {plan.gateway_url}/",
        f"  API           {plan.gateway_url}/v1   (OpenAI-compatible: audio/speech, voices; docs/api.md)",
        f"  API key       {key.api_key}   (tenant '{key.tenant}', {'created' if created else 'reused'}; "
        f"kept in {settings.folder / 'tenant.json'})",
    ]
    lines += [f"  metrics       {plan.metrics_url}   (the gateway's, internal: 127.0.0.1 only)"]
    lines += [f"  worker {i}      {url}   metrics {url.replace('ws://', 'http://')}/metrics"
              for i, url in enumerate(plan.worker_urls)]
    if token:
        lines += [f"  cluster token {settings.folder / 'cluster-token'}   (workers want it as 'Authorization: "
                  "Bearer', /metrics too)"]
    from hashring.redis_client import redact_url

    lines += [f"  Redis         {redact_url(redis_url)}   (the whole URL: redis_url in {settings.folder / 'up.json'})",
              f"  logs          {settings.logs}/",
              "  LiveKit agent " + ("running" if plan.agent else "off (set LIVEKIT_URL, LIVEKIT_API_KEY, "
                                                                  "LIVEKIT_API_SECRET to run it)"),
              "Ctrl-C stops everything."]
    return "\n".join(lines)


async def run_up(settings: UpSettings, *, report: Callable[[str], None] = say) -> int:
    folder = StackFolder(settings.folder)
    try:
        folder.acquire()
    except AlreadyRunning as exc:
        report(f"error: {exc}")
        return EXIT_REFUSED
    interrupt = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt.set)
    try:
        return await _run(settings, folder, interrupt, report)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        folder.release()


async def _run(settings: UpSettings, folder: StackFolder, interrupt: asyncio.Event, report) -> int:
    from hashring.embedded import EmbeddedRedis

    from hashring.redis_client import redact_url

    # the embedded Redis wants a password (kept in the folder): other local users can reach 127.0.0.1
    embedded = None if settings.redis_url else EmbeddedRedis(data_dir=(settings.folder / "redis").resolve(),
                                                             password=folder.redis_password())
    redis_url = settings.redis_url or embedded.url
    shown = redact_url(redis_url)
    # the plan as far as ports and worker ids go (the stand-in's paths are known once it is built)
    named = Models("<stand-in>", "<stand-in>", True) if settings.model is None else \
        Models(settings.model, settings.codec, False)
    token = None if is_loopback(settings.host) else folder.cluster_token()
    try:
        planned = plan_stack(settings, redis_url, named, cluster_token=token)
        check_ports(planned, settings.host)
        if embedded is None:
            await check_worker_ids(redis_url, planned.worker_ids)
    except (PortInUse, WorkerIdsInUse, ExposedWithoutToken) as exc:
        report(f"error: {exc}")
        return EXIT_REFUSED
    except Exception as exc:  # the given Redis cannot be reached
        report(f"error: cannot use the Redis at {shown}: {exc}")
        return EXIT_REFUSED
    supervisor: Supervisor | None = None
    plan: StackPlan | None = None
    try:
        if settings.model is None:
            report(f"stand-in weights (built once into {settings.stand_in_cache})")
            models = await _until(build_stand_in(settings.stand_in_cache), interrupt)
        else:
            models = named
        if embedded is not None:
            embedded.start()
            report(f"embedded Redis on {shown} (data kept in {settings.folder / 'redis'}; its password in "
                   f"{folder.redis_password_file})")
        plan = plan_stack(settings, redis_url, models, cluster_token=token)
        state = UpState(os.getpid(), "starting", plan.gateway_url, list(plan.worker_urls), list(plan.worker_ids),
                        redis_url, settings.tenant, str(folder.key_file), str(settings.logs), plan.agent,
                        models.stand_in)
        folder.write_state(state)
        stages = [[Child(spec, settings.logs) for spec in stage] for stage in plan.stages]
        supervisor = Supervisor(stages, report=report,
                                policy=RestartPolicy(settings.max_restarts, settings.restart_window_s))
        report(f"starting {settings.workers} worker(s), then the gateway"
               + (", the trainer" if settings.trainer else "") + (" and the agent server" if plan.agent else "")
               + f" (logs: {settings.logs}/)")
        await supervisor.start(interrupt)
        key, created = await _until(ensure_local_tenant(redis_url, settings.tenant, folder), interrupt)
        state.state = "ready"
        folder.write_state(state)
        report(_banner(plan, key, created, redis_url, settings, models, token is not None))
        failure = await supervisor.watch(interrupt)
        if failure:
            report(f"stopping everything: {failure.splitlines()[0]}")
            return EXIT_FAILED
        return 0
    except StartInterrupted:
        report("interrupted during start-up")
        return EXIT_INTERRUPTED
    except ChildFailed as exc:
        report(f"error: {exc}")
        return EXIT_FAILED
    except Exception as exc:  # Redis, the tenant layer, the stand-in build: say it, stop what runs
        report(f"error: {exc}")
        return EXIT_FAILED
    finally:
        await _shutdown(supervisor, plan, embedded, redis_url, folder, report)


async def _shutdown(supervisor, plan, embedded, redis_url: str, folder: StackFolder, report) -> None:
    with contextlib.suppress(Exception):
        state = UpState.read(folder.state_file)
        if state is not None:
            state.state = "stopping"
            folder.write_state(state)
    if supervisor is not None:
        report("stopping, last started first: the gateway, trainer and agent, then the workers (they drain and "
               "leave the ring)")
        await supervisor.stop()
    if plan is not None and (embedded is None or embedded.running):
        try:
            stale = await forget_departed(redis_url, plan.worker_ids)
            if stale:
                report(f"removed {', '.join(stale)} from the ring (gone without leaving it)")
        except Exception as exc:
            report(f"could not check the ring for stale workers: {exc}")
    if embedded is not None:
        embedded.stop()
    report("stopped")
