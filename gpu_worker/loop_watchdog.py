"""A watchdog for the worker's event loop: when the loop stops turning for `stall_s`, a thread
logs where the loop's thread is stuck (its stack), once per stall, and how long it lasted.

A blocked loop is the worst failure a worker can have quietly: heartbeats stop (the ring drops
the worker after its TTL), every stream stalls, and SIGTERM is not handled. The heartbeat only
notices after the loop comes back; this names the culprit while it is still blocking. Also,
`kill -USR1 <worker pid>` dumps every thread's stack to the log (faulthandler), for a worker that
seems stuck anywhere.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
import sys
import threading
import time
import traceback

__all__ = ["LoopWatchdog", "dump_stacks_on_sigusr1"]

log = logging.getLogger(__name__)


def dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` writes every thread's stack to stderr (the worker's log)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


class LoopWatchdog:
    """`async with LoopWatchdog(stall_s=2.0):` while the loop runs."""

    def __init__(self, stall_s: float = 2.0) -> None:
        if stall_s <= 0:
            raise ValueError("stall_s must be > 0")
        self.stall_s = stall_s
        self.stalls = 0  # stalls seen so far
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._loop_thread_id = 0

    async def __aenter__(self) -> LoopWatchdog:
        self._loop_thread_id = threading.get_ident()
        self._beat = time.monotonic()
        self._ticker = asyncio.create_task(self._tick(), name="loop-watchdog-tick")
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    async def _tick(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self.stall_s / 4)

    def _watch(self) -> None:
        stalled_since: float | None = None
        while not self._stop.wait(self.stall_s / 4):
            silent = time.monotonic() - self._beat
            if silent > self.stall_s and stalled_since is None:
                stalled_since = self._beat
                self.stalls += 1
                frame = sys._current_frames().get(self._loop_thread_id)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)"
                log.error("event loop blocked for %.1f s so far; its thread is at:\n%s", silent, stack,
                          extra={"stall_s": round(silent, 2)})
            elif silent <= self.stall_s and stalled_since is not None:
                log.warning("event loop ran again after a %.1f s stall", self._beat - stalled_since,
                            extra={"stall_s": round(self._beat - stalled_since, 2)})
                stalled_since = None
