"""Prewarm as a background operation: loading voices can take longer than any HTTP probe or
websocket handshake should wait, so ``GET /prewarm?voice=...`` answers at once with an operation
id and ``GET /prewarm/<id>`` reports each voice as it becomes ``ready`` (or why it failed).

The worker's `Prewarms` owns every operation task; a bounded number run at once and a bounded
number of finished ones are kept for their status.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

log = logging.getLogger(__name__)

MAX_RUNNING = 4
MAX_KEPT = 32

PrewarmOne = Callable[[Iterable[str]], Awaitable[dict[str, str]]]  # AdapterCache.prewarm


@dataclass(slots=True)
class PrewarmOperation:
    id: str
    voices: dict[str, str]  # voice -> "pending" | "ready" | error message
    state: Literal["running", "done", "failed"] = "running"
    task: asyncio.Task | None = field(default=None, repr=False)

    def report(self) -> dict:
        return {"id": self.id, "state": self.state, "voices": dict(self.voices)}


class PrewarmBusy(Exception):
    """Too many prewarm operations are running; try again shortly."""


class Prewarms:
    def __init__(self, prewarm: PrewarmOne) -> None:
        self._prewarm = prewarm
        self._operations: OrderedDict[str, PrewarmOperation] = OrderedDict()

    def start(self, voices: list[str]) -> PrewarmOperation:
        running = sum(op.state == "running" for op in self._operations.values())
        if running >= MAX_RUNNING:
            raise PrewarmBusy(f"{running} prewarm operations are running; try again when one is done")
        op = PrewarmOperation(uuid.uuid4().hex[:12], dict.fromkeys(voices, "pending"))
        op.task = asyncio.create_task(self._run(op), name=f"prewarm-{op.id}")
        self._operations[op.id] = op
        while len(self._operations) > MAX_KEPT:
            oldest = next((k for k, o in self._operations.items() if o.state != "running"), None)
            if oldest is None:
                break
            del self._operations[oldest]
        return op

    def get(self, op_id: str) -> PrewarmOperation | None:
        return self._operations.get(op_id)

    async def _run(self, op: PrewarmOperation) -> None:
        try:
            for voice in op.voices:
                op.voices.update(await self._prewarm([voice]))
            op.state = "done"
            log.info("prewarm %s done: %s", op.id, op.voices, extra={"prewarm": op.voices})
        except asyncio.CancelledError:
            op.state = "failed"
            raise
        except Exception as exc:  # an engine failure: reported, never lost
            op.state = "failed"
            for voice, state in op.voices.items():
                if state == "pending":
                    op.voices[voice] = f"prewarm failed: {type(exc).__name__}: {exc}"
            log.exception("prewarm %s failed", op.id)

    async def aclose(self) -> None:
        tasks = [op.task for op in self._operations.values() if op.task is not None and not op.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
