"""Placement: how many workers hold a voice, which ones, and which one serves a request.

    requested = max(operator floor, or default_replicas if none; automatic count, or 1)
    replicas  = min(requested, workers in the ring)           # clamped, see below
    owners    = ring.owners(voice, replicas)                  # the workers that hold the voice
    route     = ring.choose(voice, loads, c=balance, replicas=replicas, exclude=full or failed)

The automatic count follows a decayed per-voice request counter in Redis: it rises to
ceil(rate / hot_rate_per_replica) as soon as the rate crosses a multiple of hot_rate_per_replica,
and falls only once the rate is under cool_factor times the lower level (hysteresis, so a voice
near a threshold does not flap between worker sets).

Replica counts out of range: below 1, or above MAX_REPLICAS, is an error (`InvalidReplicas`).
Above the number of workers in the ring it is accepted and kept, and placement clamps it to the
workers there are (`Placement.clamped`, and a warning from the CLI): the fleet may grow back, and
the operator's intent should survive a worker restart.

The functions here are pure over a `RingView`; `ReplicaControl` is the part that writes Redis.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from hashring.errors import EmptyRing, InvalidReplicas
from hashring.records import RingView, WorkerInfo, check_voice_id
from hashring.settings import RingSettings
from hashring.store import RingStore, rate_of

__all__ = [
    "MAX_REPLICAS",
    "Placement",
    "ReplicaControl",
    "auto_replicas",
    "check_replicas",
    "place",
    "requested_replicas",
    "route",
]

log = logging.getLogger(__name__)

MAX_REPLICAS: Final = 64


def check_replicas(replicas: int) -> int:
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= MAX_REPLICAS:
        raise InvalidReplicas(f"replicas must be a whole number from 1 to {MAX_REPLICAS}, got {replicas!r}")
    return replicas


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a voice lives at one ring epoch."""

    voice: str
    epoch: int
    owners: tuple[str, ...]  # preference order; owners[0] is the voice's home worker
    requested: int  # replicas asked for before clamping to the workers in the ring

    @property
    def replicas(self) -> int:
        return len(self.owners)

    @property
    def clamped(self) -> bool:
        return self.requested > len(self.owners)


def requested_replicas(view: RingView, voice: str, settings: RingSettings) -> int:
    floor = view.replicas.get(voice, settings.default_replicas)
    return max(floor, view.auto_replicas.get(voice, 1))


def place(view: RingView, voice: str, settings: RingSettings) -> Placement:
    """The owners of `voice` in `view`. Raises EmptyRing if no worker is in the ring."""
    check_voice_id(voice)
    if not len(view.ring):
        raise EmptyRing(f"voice {voice!r} has no worker: none is live and undrained (see `voicering ring status`)")
    requested = requested_replicas(view, voice, settings)
    return Placement(voice, view.epoch, view.ring.owners(voice, requested), requested)


def route(
    view: RingView,
    voice: str,
    settings: RingSettings,
    *,
    loads: Mapping[str, float] | None = None,
    exclude: Collection[str] = (),
) -> WorkerInfo:
    """The worker that should serve one more request for `voice`.

    The least-loaded owner within the load bound, else the next worker in preference order within
    it (bounded-load spill). `loads` defaults to the loads workers reported in their heartbeats;
    workers at their capacity and those in `exclude` (say, one that just failed this request) are
    skipped. Raises EmptyRing when no worker can take it.
    """
    check_voice_id(voice)
    if not len(view.ring):
        raise EmptyRing(f"voice {voice!r} has no worker: none is live and undrained (see `voicering ring status`)")
    loads = view.loads if loads is None else loads
    full = {wid for wid, st in view.workers.items() if loads.get(wid, 0) >= st.info.capacity}
    skip = full | set(exclude) if full else exclude
    replicas = min(requested_replicas(view, voice, settings), len(view.ring))
    try:
        wid = view.ring.choose(voice, loads, c=settings.balance, replicas=replicas, exclude=skip)
    except EmptyRing:
        raise EmptyRing(
            f"no worker can take voice {voice!r} now: {len(full)} of {len(view.ring)} are at capacity"
            f" and {len(set(exclude))} excluded; retry shortly or add workers") from None
    return view.worker(wid)


def auto_replicas(rate: float, current: int, settings: RingSettings) -> int:
    """The automatic replica count for a voice taking `rate` requests/s that has `current` now."""
    per = settings.hot_rate_per_replica
    up = min(settings.max_auto_replicas, max(1, math.ceil(rate / per - 1e-9)))
    if up > current:
        return up
    down = min(settings.max_auto_replicas, max(1, math.ceil(rate / (per * settings.cool_factor) - 1e-9)))
    return down if down < current else current


class ReplicaControl:
    """Writes replica counts: the operator's floor (`scale`) and the automatic count, raised by
    `record` as requests arrive and lowered by `cool` once a voice goes quiet."""

    def __init__(self, store: RingStore) -> None:
        self._store = store
        self._settings = store.settings

    async def scale(self, voice: str, replicas: int | None) -> int:
        """Set the operator floor of `voice` (None removes it); returns the new epoch, 0 if unchanged."""
        check_voice_id(voice)
        if replicas is not None:
            check_replicas(replicas)
        return await self._store.set_replicas(voice, replicas)

    async def record(self, voice: str, count: int = 1) -> int:
        """Count `count` requests for `voice`; returns its automatic replica count afterwards."""
        check_voice_id(voice)
        counter, current = await self._store.add_heat(voice, count)
        return await self._settle(voice, rate_of(counter, self._settings.heat_half_life_s), current)

    async def cool(self) -> dict[str, int]:
        """Re-evaluate every hot voice against its decayed rate; returns the counts that changed."""
        current = await self._store.auto_replicas()
        rates = await self._store.peek_heat(current)
        changed: dict[str, int] = {}
        for voice, now in current.items():
            new = await self._settle(voice, rate_of(rates[voice], self._settings.heat_half_life_s), now)
            if new != now:
                changed[voice] = new
        return changed

    async def _settle(self, voice: str, rate: float, current: int | None) -> int:
        want = auto_replicas(rate, current or 1, self._settings)
        if want == (current or 1):
            return want
        if await self._store.swap_auto_replicas(voice, current, None if want == 1 else want):
            log.info("voice %r: %.1f req/s, automatic replicas %d -> %d", voice, rate, current or 1, want)
            return want
        return current or 1  # another process changed it first; its value stands
