"""Which gateways and agent servers are running: processes that use the ring but are not in it.

Each announces itself every `PRESENCE_INTERVAL_S` (`Announcer`, a task beside its ring watcher):
its kind, an id (host and port or pid), and a few facts an operator wants beside it (its address,
its pid, when it started). `voicering status` reads them back (`read_presence`); one that missed
`PRESENCE_SILENT_AFTER_S` of beats is shown as silent, and one silent for `PRESENCE_FORGET_S` is
dropped by the next beat of any process. Times are Redis server time, as heartbeats are.

Presence is best effort: a beat that fails (Redis down) is logged once and retried on the next
interval, and nothing routes by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Final, Literal

from hashring.errors import RingError
from hashring.store import RingStore

__all__ = ["PRESENCE_FORGET_S", "PRESENCE_INTERVAL_S", "PRESENCE_SILENT_AFTER_S", "Announcer", "Presence",
           "ProcessKind", "default_id", "read_presence"]

log = logging.getLogger(__name__)

ProcessKind = Literal["gateway", "agent"]
KINDS: Final = ("gateway", "agent")
PRESENCE_INTERVAL_S: Final = 5.0
PRESENCE_SILENT_AFTER_S: Final = 3 * PRESENCE_INTERVAL_S
PRESENCE_FORGET_S: Final = 3600.0
MAX_INFO_BYTES: Final = 2048  # what one process may say about itself
STOP_WAIT_S: Final = 2.0  # the most a stop waits on a beat in flight


@dataclass(frozen=True, slots=True)
class Presence:
    kind: str
    id: str
    seen_age_s: float  # since its last beat
    silent: bool  # missed PRESENCE_SILENT_AFTER_S of beats
    info: dict  # what it said: address, pid, started_at (unix)


def default_id(port: int | None = None) -> str:
    """host:port (a gateway), else host:pid: unique on a machine, and the pod name on Kubernetes."""
    return f"{socket.gethostname()}:{port if port is not None else os.getpid()}"


class Announcer:
    """Announce one process every `interval_s` until closed (`async with`)."""

    def __init__(self, store: RingStore, kind: ProcessKind, process_id: str, *, address: str = "",
                 interval_s: float = PRESENCE_INTERVAL_S) -> None:
        if kind not in KINDS:
            raise ValueError(f"presence kind must be one of {KINDS}, got {kind!r}")
        info = json.dumps({"address": address, "pid": os.getpid(), "started_at": round(time.time(), 3)})
        if len(info.encode()) > MAX_INFO_BYTES:
            raise ValueError(f"presence info of {process_id!r} is over {MAX_INFO_BYTES} bytes")
        self._store, self._member, self._info, self._interval = store, f"{kind}/{process_id}", info, interval_s
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._failing = False

    async def __aenter__(self) -> Announcer:
        self._task = asyncio.create_task(self._run(), name=f"presence-{self._member}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop beating: at once between beats; a beat in flight (its store call may be retrying
        against a Redis that is down) is cancelled, and never waited on for long."""
        self._stop.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=STOP_WAIT_S)

    async def beat(self) -> None:
        await self._store.announce(self._member, self._info, PRESENCE_FORGET_S)

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.beat()
                if self._failing:
                    log.info("presence of %s is announced again", self._member)
                self._failing = False
            except RingError as exc:
                if not self._failing:
                    log.warning("presence of %s not announced (%s); retrying every %.0f s", self._member,
                                exc, self._interval)
                self._failing = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._stop.wait()


async def read_presence(store: RingStore) -> list[Presence]:
    """Every announced gateway and agent server, most recently seen first. Raises RingError when
    Redis cannot be read."""
    now, rows = await store.present()
    out = []
    for member, seen, raw in rows:
        kind, _, process_id = member.partition("/")
        try:
            info = json.loads(raw) if raw else {}
        except ValueError:
            info = {}
        age = max(0.0, now - seen)
        out.append(Presence(kind, process_id, round(age, 1), age > PRESENCE_SILENT_AFTER_S,
                            info if isinstance(info, dict) else {}))
    return sorted(out, key=lambda p: p.seen_age_s)
