"""Keeps `voicering up`'s children alive: started in stages, restarted when they die (bounded),
stopped in reverse order.

A stage is a group of children that start together and must all be healthy before the next stage
starts (workers before the gateway and trainer that call them). A child that dies while serving
is reported with its log tail and started again (`Child.start` first kills what it left in its
process group: a worker's engine processes), at most `max_restarts` times in `window_s`;
past that the supervisor gives up and reports it, because a child that crashes on every start
needs a person, not a loop. Stopping runs the stages backwards, so the gateway finishes its
streams while the workers still serve them, and the workers drain last.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from voicering.stack.children import Child, ChildFailed, StartInterrupted

__all__ = ["RestartPolicy", "Supervisor"]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    max_restarts: int = 3
    window_s: float = 300.0


class Supervisor:
    def __init__(self, stages: Sequence[Sequence[Child]], *, report: Callable[[str], None],
                 policy: RestartPolicy = RestartPolicy()) -> None:
        self.stages = [list(stage) for stage in stages]
        self._report = report
        self._policy = policy
        self._started: list[list[Child]] = []
        self._stopping = asyncio.Event()
        self._failed: asyncio.Future[str] | None = None
        self._keepers: list[asyncio.Task[None]] = []
        self.restarts: dict[str, int] = {}

    @property
    def children(self) -> list[Child]:
        return [child for stage in self.stages for child in stage]

    async def start(self, interrupt: asyncio.Event) -> None:
        """Every stage in turn, each child healthy before the next stage. Raises `ChildFailed`
        (the rest are left for `stop`) or `StartInterrupted` when `interrupt` is set."""
        for stage in self.stages:
            self._started.append(stage)
            for child in stage:
                child.start()
            waits = [asyncio.create_task(child.wait_ready(interrupt), name=f"ready:{child.name}") for child in stage]
            try:
                await asyncio.gather(*waits)
            finally:
                for task in waits:
                    task.cancel()
                await asyncio.gather(*waits, return_exceptions=True)

    async def watch(self, interrupt: asyncio.Event) -> str | None:
        """Keep every child alive until `interrupt` is set (None) or one ran out of restarts (why)."""
        loop = asyncio.get_running_loop()
        self._failed = loop.create_future()
        self._keepers = [asyncio.create_task(self._keep(child), name=f"keep:{child.name}") for child in self.children]
        interrupted = asyncio.create_task(interrupt.wait())
        try:
            await asyncio.wait([interrupted, self._failed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            interrupted.cancel()
            self._stopping.set()
            for task in self._keepers:
                task.cancel()
            await asyncio.gather(*self._keepers, return_exceptions=True)
        return self._failed.result() if self._failed.done() else None

    async def stop(self) -> None:
        """Stop what was started, last stage first; the children of one stage together."""
        self._stopping.set()
        for stage in reversed(self._started):
            await asyncio.gather(*(child.stop() for child in stage))
        self._started.clear()

    async def _keep(self, child: Child) -> None:
        recent: deque[float] = deque()
        while True:
            while child.running:
                await asyncio.sleep(0.5)
            if self._stopping.is_set():
                return
            now = time.monotonic()
            recent.append(now)
            while recent and now - recent[0] > self._policy.window_s:
                recent.popleft()
            why = f"{child.name} exited with code {child.returncode}"
            if len(recent) > self._policy.max_restarts:
                self._give_up(f"{why}, its {len(recent)}th exit in {self._policy.window_s:.0f} s: giving up "
                              f"(log: {child.log_path})\n{child.log_tail()}")
                return
            self.restarts[child.name] = self.restarts.get(child.name, 0) + 1
            self._report(f"{why}; restarting it ({len(recent)} of {self._policy.max_restarts} in "
                         f"{self._policy.window_s:.0f} s). Last lines of {child.log_path}:\n{child.log_tail(12)}")
            child.start()
            try:
                await child.wait_ready(self._stopping)
                self._report(f"{child.name} is back")
            except StartInterrupted:
                return
            except ChildFailed as exc:
                self._report(str(exc).splitlines()[0])  # the loop sees it dead and counts it again

    def _give_up(self, why: str) -> None:
        if self._failed is not None and not self._failed.done():
            self._failed.set_result(why)
        with contextlib.suppress(Exception):
            self._report(why)
