"""What the ring's background loops share: a streak of failures logged once, a stray cancel told
from a real one, a task that ends while its owner runs reported, and a stop that really stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hashring.errors import RingError

__all__ = ["FailureStreak", "report_end", "stop_task", "stray_cancel"]

log = logging.getLogger(__name__)


class FailureStreak:
    """A background task's last error: logs the first failure of a streak and the recovery, so an
    outage is one warning, not one per tick; unexpected errors (bugs) carry their traceback."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.error: Exception | None = None

    def failed(self, exc: Exception) -> None:
        if self.error is None:
            if isinstance(exc, RingError):
                log.warning("%s failed, will keep trying: %s", self.what, exc.message)
            else:
                log.error("%s failed unexpectedly, will keep trying", self.what, exc_info=exc)
        self.error = exc

    def ok(self) -> None:
        if self.error is not None:
            log.info("%s works again", self.what)
        self.error = None


def stray_cancel() -> bool:
    """True for a CancelledError nobody asked for: no cancel() is pending on this task (redis-py's
    asyncio client can let one escape from a command it timed out). A background loop that takes
    it for its end would vanish silently, so it counts as one failed turn instead."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def report_end(closing: Callable[[], bool]) -> Callable[[asyncio.Task], None]:
    """A done-callback: a background task that ends while its owner is not closing is logged."""
    def ended(task: asyncio.Task) -> None:
        if closing():
            return
        error = None if task.cancelled() else task.exception()
        log.error("%s ended while its owner still runs (%s)", task.get_name(),
                  "cancelled" if task.cancelled() else repr(error), exc_info=error)
    return ended


async def stop_task(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait until it has ended.

    redis-py 8.1's asyncio client sometimes swallows a CancelledError that lands inside a command
    (a known class of redis-py bugs), so one `cancel()` is not always enough: repeat it until the
    task ends. The loops also check their owner's closing flag, so a lost cancel costs one turn.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s ended with an error", task.get_name(), exc_info=task.exception())
