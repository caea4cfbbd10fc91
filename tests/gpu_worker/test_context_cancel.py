"""A context's task stops when the connection cancels it, even when the cancel lands in the same
loop turn as the segment it was waiting for.

Python 3.11's `asyncio.wait_for` returns the awaited result and drops such a cancel (bpo-42130;
3.12 rewrote it). The context then went on to speak every queued segment: a flood that hit the
16-segment bound got its `backlog_full` only after the whole backlog was spoken (a 120 s timeout
in CI). Deterministic here: the segment is flushed and the task cancelled before it runs again.
The engine is a recorder (no generation is needed: a cancelled context must not plan at all).
"""

from __future__ import annotations

import asyncio

from gpu_worker.context import Context, ContextDeps
from gpu_worker.engine import SamplingOptions, Voice
from gpu_worker.protocol import Start


class PlanRecorder:
    def __init__(self) -> None:
        self.planned: list[str] = []
        self.reached = asyncio.Event()

    async def plan(self, voice, text, max_tokens=None, reading=None):  # noqa: ANN001, ANN201
        self.planned.append(text)
        self.reached.set()
        await asyncio.Event().wait()  # never speaks: only whether it got here matters


async def test_a_cancel_in_the_same_turn_as_a_flushed_segment_stops_the_context():
    engine = PlanRecorder()
    sent: list[object] = []

    async def send(message: object) -> None:
        sent.append(message)

    deps = ContextDeps(engine=engine, runner=None, defaults=SamplingOptions())  # type: ignore[arg-type]
    context = Context(Start(context_id="c", voice="tara"), deps, send, voice=Voice("tara", "tara"))
    task = asyncio.create_task(context.run())
    for _ in range(3):
        await asyncio.sleep(0)  # the task now waits for its first segment
    assert not task.done() and engine.planned == []
    context.push_text("Segment one.")
    context.flush()  # the waiting get is answered ...
    task.cancel()  # ... and the connection cancels the context in the same turn
    planning = asyncio.create_task(engine.reached.wait())
    await asyncio.wait([task, planning], return_when=asyncio.FIRST_COMPLETED)  # whichever comes: no clock
    planning.cancel()
    if not task.done():  # the bug: it went on to plan; stop it for the report
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert engine.planned == []  # it never went on to speak the segment
    assert sent == []  # its one answer is the connection's to send
