"""The loop watchdog names what blocks the event loop, while it blocks, once per stall."""

from __future__ import annotations

import asyncio
import logging
import time

from gpu_worker.loop_watchdog import LoopWatchdog


def a_blocking_call_in_the_loop() -> None:
    time.sleep(0.8)


async def test_a_blocked_loop_is_reported_with_the_blocking_stack(caplog):
    caplog.set_level(logging.WARNING, logger="gpu_worker.loop_watchdog")
    async with LoopWatchdog(stall_s=0.2) as dog:
        await asyncio.sleep(0.3)
        assert dog.stalls == 0  # an idle loop that keeps turning is no stall
        a_blocking_call_in_the_loop()
        await asyncio.sleep(0.3)
        a_blocking_call_in_the_loop()
        await asyncio.sleep(0.3)
    assert dog.stalls == 2
    blocked = [r for r in caplog.records if "event loop blocked" in r.getMessage()]
    assert len(blocked) == 2 and all("a_blocking_call_in_the_loop" in r.getMessage() for r in blocked)
    assert sum("ran again after" in r.getMessage() for r in caplog.records) == 2
