"""One supervised child process of `voicering up`: what it runs, its log, its health, its stop.

Each child is a `python -m voicering ...` command in a session of its own (a Ctrl-C at the terminal
reaches only `up`, which stops the children in order) that also gets SIGTERM if `up` itself dies
(no orphans). Its output is appended to `<logs>/<name>.log`, one header line per start, so a
restarted child's earlier lives stay readable. A stop sends SIGTERM to the child's main process
only: a worker drains and then stops its own vLLM engine processes, which a signal to the whole
group would abort mid-stream (systemd's KillMode=mixed, tini without -g). Whatever of the group
is left after the grace is killed. A child started again (a restart) first loses whatever its dead
predecessor left in its group: a worker's engine processes, which would otherwise hold the memory
(on a GPU, the GPU's) that the new worker needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gpu_worker.process import keep_niceness
from hashring.embedded import die_with_parent

__all__ = ["Child", "ChildFailed", "ChildSpec", "StartInterrupted"]


class ChildFailed(RuntimeError):
    """A child exited or never became healthy; the message ends with its log tail."""

    def __init__(self, name: str, why: str, tail: str) -> None:
        super().__init__(f"{name} {why}\n--- last lines of its log ---\n{tail}")
        self.name = name


class StartInterrupted(Exception):
    """`up` was asked to stop while a child was starting."""


@dataclass(frozen=True, slots=True)
class ChildSpec:
    name: str  # worker-0, gateway, trainer, agent
    args: tuple[str, ...]  # after `python -m voicering`
    env: Mapping[str, str] = field(default_factory=dict)  # on top of up's own environment
    health_url: str | None = None  # answers 200 once serving; None: alive for `settle_s` is enough
    ports: tuple[int, ...] = ()  # what it binds (checked free before anything starts)
    start_timeout_s: float = 600.0
    stop_timeout_s: float = 40.0  # SIGTERM grace before SIGKILL (a worker drains its streams first)
    settle_s: float = 3.0
    launcher: tuple[str, ...] = (sys.executable, "-m", "voicering")  # what runs `args`: this interpreter's CLI


class Child:
    def __init__(self, spec: ChildSpec, logs: Path) -> None:
        self.spec = spec
        self.log_path = logs / f"{spec.name}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def start(self) -> None:
        if self.proc is not None:  # a restart, just after the supervisor reaped the dead one
            _end_group(self.proc)
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"--- voicering up: start {self.starts} of {self.name} at {time.strftime('%H:%M:%S')} ---\n")
            log.flush()
            self.proc = subprocess.Popen(
                [*self.spec.launcher, *self.spec.args], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **self.spec.env},
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
            keep_niceness(self.proc.pid)

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def wait_ready(self, stopping: asyncio.Event) -> None:
        """Until the health URL answers 200 (or the child has stayed up `settle_s`). Raises
        `ChildFailed` if it exits or times out, `StartInterrupted` once `stopping` is set."""
        began = time.monotonic()
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                if stopping.is_set():
                    raise StartInterrupted(self.name)
                if not self.running:
                    raise ChildFailed(self.name, f"exited with code {self.returncode} while starting", self.log_tail())
                waited = time.monotonic() - began
                if self.spec.health_url is None:
                    if waited >= self.spec.settle_s:
                        return
                else:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(self.spec.health_url)).status_code == 200:
                            return
                if waited > self.spec.start_timeout_s:
                    raise ChildFailed(self.name, f"was not healthy after {self.spec.start_timeout_s:.0f} s",
                                      self.log_tail())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await stopping.wait()

    async def stop(self) -> None:
        """SIGTERM the main process (it stops its own children), wait out the grace, then SIGKILL
        whatever is left of its process group."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.spec.stop_timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if proc.poll() is None:  # stuck: its threads' stacks go to the log first (workers dump on SIGUSR1)
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGUSR1)
                await asyncio.sleep(1.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # engine processes that outlived their parent
        await asyncio.to_thread(proc.wait)


def _end_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group a dead child led (its session's: nothing of anyone else's) and
    reap it. At once after its main process is reaped: later, the id may be another group's."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
