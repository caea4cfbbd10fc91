"""A `voicering worker` as a child process on a free loopback port: started, waited on until
`/health` answers, and stopped (its whole process group, vLLM's engine processes included). The
worker leads a process group of its own; whatever ends it, dead or stopped, its group is SIGKILLed
right after its main process is reaped, so a worker that died (at start-up too) leaves no engine
behind (its own reaper, `reaper.py`, has normally ended them already).

Used by the demo, the training pipeline's local validation worker and the test fixtures, so each
starts and stops a worker the same way. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hashring.ports import free_port


class WorkerStartError(RuntimeError):
    """The worker process exited or never became healthy; the message ends with its log tail."""


@dataclass
class WorkerProcess:
    url: str  # ws://127.0.0.1:PORT
    http: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen
    log_path: Path

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.http}/health", timeout=5) as resp:
            return json.loads(resp.read())

    async def wait_idle(self, timeout: float = 30.0) -> dict:
        """Poll /health until no stream is active and the engine holds no request."""
        return await self._wait_health(lambda h: h["active_streams"] == 0 and h["engine_requests"] == 0,
                                       timeout, "worker still busy", every_s=0.2)

    async def wait_ring_view(self, workers: int, timeout: float = 60.0) -> dict:
        """Poll /health until this worker's own ring view holds ``workers`` workers: until then it
        may relay a start that placement gives it to an owner it thinks it is not."""
        return await self._wait_health(lambda h: h.get("ring_workers") == workers, timeout,
                                       f"worker's ring view never held {workers} workers", every_s=0.1)

    async def _wait_health(self, done, timeout: float, failure: str, every_s: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            health = await asyncio.to_thread(self.health)
            if done(health):
                return health
            assert time.monotonic() < deadline, f"{failure}: {health}"
            await asyncio.sleep(every_s)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (the worker shuts its engine down; a stuck one gets SIGKILL after `timeout_s`),
        then SIGKILL whatever is left of its process group: a worker that already died is only
        reaped and its group ended. A worker someone else has reaped (`proc.wait()`) is left
        alone: its group id may name another process's group by now."""
        if self.proc.returncode is not None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:  # stuck: leave its threads' stacks in the log first
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
        end_group(self.proc)


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (started with `start_new_session`), then reap `proc`.
    Call it before `proc` is reaped or at once after: later, its group id may be another group's."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def spawn_worker(args: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None,
                 timeout_s: float = 600.0, cwd: Path | None = None) -> WorkerProcess:
    """Run `voicering worker ARGS --port <free>` and return once its /health answers.

    The CPU engine gets a 1 GiB KV cache unless VLLM_CPU_KVCACHE_SPACE is set (in `env` or the
    environment); `env` entries override the environment.
    """
    return wait_healthy(launch_worker(args, log_path, env=env, cwd=cwd), timeout_s)


def launch_worker(args: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None,
                  cwd: Path | None = None, niceness: int | None = None) -> WorkerProcess:
    """`spawn_worker` without the wait: the process is started and returned at once (``niceness``:
    its CPU priority, inherited by its engine processes; 19 lets a start ahead of need yield to
    everything else on the machine; by default the launcher's own: a worker's session is a
    scheduling group of its own, which would otherwise put a worker that a low-priority process
    starts, a bench run in the background, back at normal priority)."""
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "voicering", "worker", *args, "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                env={"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ, **(env or {})})
    worker = WorkerProcess(f"ws://127.0.0.1:{port}", f"http://127.0.0.1:{port}", proc, log_path)
    if niceness is None:
        keep_niceness(proc.pid)
    elif niceness:  # at once: the process has its session (Popen returns after its exec), nothing forked yet
        set_niceness(proc.pid, niceness)
    return worker


def keep_niceness(leader: int) -> None:
    """Give a child that leads a session of its own (``start_new_session``) its launcher's CPU
    priority, its session's scheduling group included. Call it right after Popen returns. Where the
    kernel groups tasks by session (autogroup), a new session's group starts at normal priority
    whatever its processes' niceness, so a stack that a niced process starts (`voicering up` under
    `nice`, the demo run in the background) would otherwise take an equal share of the CPU."""
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness:
        set_niceness(leader, niceness)


def set_niceness(leader: int, niceness: int) -> None:
    """The CPU priority of every process and thread in the session that ``leader`` leads (a worker,
    or any process started with a session of its own; later ones inherit it). Where the kernel
    groups tasks by session (autogroup, on by default) a niceness counts only inside that session's
    group: the group's own is set too, or a niced process would still take an equal share beside
    everything else. Lowering it back needs CAP_SYS_NICE; without it the priority stays."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpriority(os.PRIO_PGRP, leader, niceness)
    with contextlib.suppress(OSError):  # no autogroup (a kernel without it, or the process gone)
        Path(f"/proc/{leader}/autogroup").write_text(str(niceness))


def wait_healthy(worker: WorkerProcess, timeout_s: float = 600.0) -> WorkerProcess:
    """``worker`` once its /health answers; a worker that exits or overruns ``timeout_s`` is ended
    (its whole group) and raised as `WorkerStartError` with its log tail."""
    proc = worker.proc
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            end_group(proc)  # an engine it started before it died
            raise WorkerStartError(f"worker exited with code {proc.returncode}:\n{worker.log_tail()}")
        try:
            worker.health()
            return worker
        except OSError:
            time.sleep(0.2)  # a start takes ~20 s: polling finer costs nothing and finds it sooner
    worker.stop()
    raise WorkerStartError(f"worker not healthy after {timeout_s:.0f} s:\n{worker.log_tail()}")
