"""Placement: how many workers hold a voice, which ones, and which one serves a request.

    requested = max(operator floor, or default_replicas if none; automatic count, or 1)
    replicas  = min(requested, workers in the ring)           # clamped, see below
    owners    = ring.owners(voice, replicas)                  # the workers that hold the voice
    route     = ring.choose(voice, loads, c=balance, replicas=replicas, exclude=full or failed)

The automatic count follows the voice's share of the fleet's load (`hashring.sizing`): decayed
per-voice and fleet request counters in Redis (a short and a slow window), the streams the
workers report in their heartbeats, and the spills workers report. Only the cool loop decides
it: it rises on the short window (and by one at once after a spill), and falls on the slow one
with hysteresis, so a voice near a threshold does not flap between worker sets.

Replica counts out of range: below 1, or above MAX_REPLICAS, is an error (`InvalidReplicas`).
Above the number of workers in the ring it is accepted and kept, and placement clamps it to the
workers there are (`Placement.clamped`, and a warning from the CLI): the fleet may grow back, and
the operator's intent should survive a worker restart.

The functions here are pure over a `RingView`; `ReplicaControl` is the part that writes Redis.
Two background helpers drive it from a serving process: `HeatRecorder` counts requests and
spills without a Redis round trip on the request path (flushed in batches), and `CoolLoop` runs
`ReplicaControl.cool()` periodically on exactly one process of the fleet at a time (a Redis lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from hashring.errors import EmptyRing, InvalidReplicas, RingError
from hashring.loops import FailureStreak, stop_task
from hashring.records import RingView, WorkerInfo, check_voice_id
from hashring.settings import RingSettings
from hashring.sizing import FleetLoad, next_replicas, replicas_for, warm_rate
from hashring.store import RingStore, rate_of

__all__ = [
    "COOL_LOCK",
    "MAX_REPLICAS",
    "CoolLoop",
    "HeatRecorder",
    "Placement",
    "ReplicaControl",
    "check_replicas",
    "place",
    "requested_replicas",
    "route",
]

log = logging.getLogger(__name__)

MAX_REPLICAS: Final = 64
COOL_LOCK: Final = "cool"  # the lease name (key P:lock:cool) the cool loops of a fleet share


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


class ReplicaControl:
    """Writes replica counts: the operator's floor (`scale`) and the automatic count, which only
    `cool` changes (run by the fleet's one `CoolLoop`); `record` and `spilled` feed it."""

    def __init__(self, store: RingStore) -> None:
        self._store = store
        self._settings = store.settings
        self.last_fleet: FleetLoad | None = None  # the short-window measurement of the latest cool()

    @property
    def store(self) -> RingStore:
        return self._store

    async def scale(self, voice: str, replicas: int | None) -> int:
        """Set the operator floor of `voice` (None removes it); returns the new epoch, 0 if unchanged."""
        check_voice_id(voice)
        if replicas is not None:
            check_replicas(replicas)
        return await self._store.set_replicas(voice, replicas)

    async def record(self, voice: str, count: int = 1) -> int:
        """Count `count` requests for `voice`; returns its automatic replica count (the cool loop
        changes it, not this call)."""
        check_voice_id(voice)
        _counter, current = await self._store.add_heat(voice, count)
        return current or 1

    async def spilled(self, counts: Mapping[str, int]) -> None:
        """Report requests that landed past their voice's owners; the next `cool` raises those voices."""
        await self.report(counts, spills=counts)

    async def report(self, signals: Mapping[str, int], *, spills: Mapping[str, int] | None = None,
                     refusals: Mapping[str, int] | None = None) -> None:
        """Report what happened to starts: ``signals`` raise those voices at the next `cool` (a
        spill, or an owner's share refusal); ``spills`` (served past the owners) and ``refusals``
        (refused by a worker) are counted per voice for the operators' view."""
        for counts in (signals, spills or {}, refusals or {}):
            for voice in counts:
                check_voice_id(voice)
        await self._store.add_outcomes(signals, spills, refusals)

    async def cool(self) -> dict[str, int]:
        """Re-size every voice that is hot, warming up or spilled, by its share of the fleet's load;
        returns the counts that changed."""
        s = self._settings
        snap = await self._store.snapshot()
        ring = (snap.live - snap.draining) & set(snap.workers)
        streams = sum(snap.loads.get(w, 0) for w in ring)
        warm, spills = await self._store.take_signals()
        current = dict(snap.auto_replicas)
        voices = sorted(set(current) | warm | set(spills))
        (f_slow, f_fast), counters = await self._store.peek_counters(voices)
        short = FleetLoad(len(ring), streams, rate_of(f_fast, s.heat_fast_half_life_s))
        slow = FleetLoad(len(ring), streams, rate_of(f_slow, s.heat_half_life_s))
        self.last_fleet = short
        limit = min(len(ring), s.max_auto_replicas)
        # when each voice was last raised, kept in Redis by the swap (not in this process, which may
        # have held the cool lease for a moment only) and aged on Redis's clock
        raised_ago = await self._store.raised_ages(voices)
        changed: dict[str, int] = {}
        for voice in voices:
            c_slow, c_fast = counters[voice]
            have = current.get(voice, 1)
            want = next_replicas(
                have,
                fast=replicas_for(rate_of(c_fast, s.heat_fast_half_life_s), short, s),
                slow_cooled=replicas_for(rate_of(c_slow, s.heat_half_life_s) / s.cool_factor, slow, s),
                spilled=voice in spills,
                may_lower=raised_ago.get(voice, math.inf) >= s.scale_down_hold_s,
                limit=limit)
            if want != have and await self._swap(voice, current.get(voice), want, short):
                changed[voice] = want
        rate2 = warm_rate(short, s)
        # a voice is flagged warm a little below the rate that gives it a second replica
        await self._store.set_warm_at(1e18 if rate2 is None else 0.9 * rate2 * s.heat_fast_half_life_s / math.log(2))
        return changed

    async def _swap(self, voice: str, current: int | None, want: int, fleet: FleetLoad) -> bool:
        if await self._store.swap_auto_replicas(voice, current, None if want == 1 else want):
            log.info("voice %r: automatic replicas %d -> %d (fleet: %d workers, %.1f streams each, mean stream %s s)",
                     voice, current or 1, want, fleet.workers, fleet.mean_streams_per_worker,
                     "?" if fleet.mean_stream_s is None else f"{fleet.mean_stream_s:.1f}")
            return True
        return False  # another process changed it first; its value stands


class HeatRecorder:
    """Counts requests (and spills) per voice for the autoscaler off the request path.

    `record(voice)`, `spilled(voice)` and `refused(voice)` are synchronous and never touch Redis: they add to
    in-memory counts. One
    task (this object's) flushes the counts every `flush_interval_s` with one
    `ReplicaControl.record(voice, n)` per voice; `aclose()` stops it and flushes what is left.
    At most `max_voices` distinct voices wait between flushes; requests for further voices are
    counted in `dropped` instead (bounded memory when Redis is slow). A flush that fails (Redis
    down) drops its counts: they are a rate signal, and replaying old counts later would inflate
    the current rate. `async with HeatRecorder(control) as heat: heat.record("tara")`
    """

    def __init__(self, control: ReplicaControl, *, flush_interval_s: float = 0.5, max_voices: int = 10_000) -> None:
        if flush_interval_s <= 0 or max_voices < 1:
            raise ValueError("flush_interval_s must be > 0 and max_voices >= 1")
        self._control = control
        self.flush_interval_s = flush_interval_s
        self.max_voices = max_voices
        self._pending: Counter[str] = Counter()
        self._signals: Counter[str] = Counter()  # raise the voice at the next cool
        self._spills: Counter[str] = Counter()  # served past its owners
        self._refusals: Counter[str] = Counter()  # refused by this worker
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._streak = FailureStreak("request-rate flush to Redis (counts of failed flushes are dropped)")
        self.flushed = 0  # requests written to Redis
        self.flushes = 0  # flushes that wrote at least one voice
        self.dropped = 0  # requests not counted: over max_voices, or lost with a failed flush
        self.spills = 0  # spills reported to Redis
        self.refusals = 0  # refusals reported to Redis

    @property
    def pending(self) -> int:
        """Requests counted but not flushed yet."""
        return sum(self._pending.values())

    @property
    def last_error(self) -> Exception | None:
        """Why the latest flush failed; None once one succeeds."""
        return self._streak.error

    def record(self, voice: str, count: int = 1) -> None:
        """Count `count` requests for `voice` (raises InvalidVoiceId for an unusable id)."""
        check_voice_id(voice)
        if voice not in self._pending and len(self._pending) >= self.max_voices:
            self.dropped += count
            return
        self._pending[voice] += count

    def spilled(self, voice: str, count: int = 1) -> None:
        """Note that a request for `voice` landed on a worker outside its owners (flushed with the
        counts; the cool loop raises the voice's replicas on its next tick)."""
        check_voice_id(voice)
        self._add(self._signals, voice, count)
        self._add(self._spills, voice, count)

    def refused(self, voice: str, count: int = 1, *, raise_replicas: bool = False) -> None:
        """Note that this worker refused a start for `voice`; ``raise_replicas``: it was an owner
        refusing for its share of the fleet, so the cool loop raises the voice as for a spill."""
        check_voice_id(voice)
        if raise_replicas:
            self._add(self._signals, voice, count)
        self._add(self._refusals, voice, count)

    def _add(self, counts: Counter[str], voice: str, count: int) -> None:
        if voice in counts or len(counts) < self.max_voices:
            counts[voice] += count

    async def start(self) -> None:
        self._closing = False
        self._task = asyncio.create_task(self._run(), name="ring-heat-flush")

    async def flush(self) -> None:
        """Write the pending counts now (one attempt per voice; the rest is dropped on a failure)."""
        batch, self._pending = self._pending, Counter()
        signals, spills, refusals = self._signals, self._spills, self._refusals
        self._signals, self._spills, self._refusals = Counter(), Counter(), Counter()
        written = 0
        try:
            if signals or spills or refusals:
                await self._control.report(signals, spills=spills, refusals=refusals)
                self.spills += sum(spills.values())
                self.refusals += sum(refusals.values())
            for voice, count in batch.items():
                await self._control.record(voice, count)
                written += count
        except Exception as exc:  # kept by the streak and logged: the flushing task must live on
            self.dropped += sum(batch.values()) - written
            self._streak.failed(exc)
        else:
            if batch:
                self._streak.ok()
        finally:
            self.flushed += written
            self.flushes += written > 0

    async def aclose(self) -> None:
        """Stop the flushing task, then flush what was counted since its last turn."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)
        await self.flush()

    async def __aenter__(self) -> HeatRecorder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()  # never raises


class CoolLoop:
    """Runs `ReplicaControl.cool()` (the fleet's only replica-count decision) every `interval_s`
    on one process of the fleet at a time.

    Every process that runs a CoolLoop competes for one Redis lease (`COOL_LOCK`, SET NX PX with
    a random token). The holder renews it on each tick (compare-and-expire) and cools; the others
    just try to take it, so the fleet cools once per interval, not once per process. The lease
    lasts `lease_s` (3 intervals by default, at least one plus two Redis timeouts): a holder that dies silently is replaced within that,
    one that closes releases it (compare-and-delete, so it never deletes a lease someone else took
    after its own expired) and is replaced on the next tick of another. A failed renew or a Redis
    error skips that tick (the next renew tells whether the lease is still ours); nothing ends the
    task but `aclose()`.
    `async with CoolLoop(ReplicaControl(store), interval_s=5):`
    """

    def __init__(self, control: ReplicaControl, *, interval_s: float = 5.0, lease_s: float | None = None) -> None:
        store = control.store
        if lease_s is None:
            lease_s = max(3 * interval_s, interval_s + 2 * store.settings.redis_timeout_s)
        if interval_s <= 0 or lease_s <= interval_s + store.settings.redis_timeout_s:
            raise ValueError("interval_s must be > 0 and lease_s longer than interval_s + redis_timeout_s, "
                             "or the lease lapses between the holder's renewals")
        self._control = control
        self._store = store
        self.interval_s = interval_s
        self.lease_s = lease_s
        self.token = secrets.token_hex(16)
        self._holding = False
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._streak = FailureStreak("replica cooling")
        self.cools = 0  # cool() runs completed by this process
        self.changed: dict[str, int] = {}  # what the latest cool() changed: voice -> new automatic count
        self.lowered = 0  # automatic counts this process changed in total

    @property
    def holding(self) -> bool:
        """True while this process holds the cool lease (as of its latest tick)."""
        return self._holding

    @property
    def last_error(self) -> Exception | None:
        """Why the latest tick failed; None once one succeeds."""
        return self._streak.error

    async def start(self) -> None:
        self._closing = False
        self._task = asyncio.create_task(self._run(), name="ring-cool")

    async def aclose(self) -> None:
        """Stop cooling and hand the lease back, so another process takes over on its next tick."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)
        if self._holding:
            self._holding = False
            with contextlib.suppress(RingError):  # unreachable: the lease simply expires
                await self._store.release_lock(COOL_LOCK, self.token)

    async def __aenter__(self) -> CoolLoop:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def tick(self) -> bool:
        """Take or renew the lease and, holding it, cool once; True if this process cooled."""
        store = self._store
        if self._holding:
            self._holding = await store.renew_lock(COOL_LOCK, self.token, self.lease_s)
            if not self._holding:
                log.info("the cool lease expired or was taken over; another process cools now")
        if not self._holding:
            self._holding = await store.acquire_lock(COOL_LOCK, self.token, self.lease_s)
            if self._holding:
                log.info("this process now cools the fleet's automatic replica counts every %.1f s", self.interval_s)
        if not self._holding:
            return False
        self.changed = await self._control.cool()
        self.cools += 1
        self.lowered += len(self.changed)
        return True

    async def _run(self) -> None:
        while not self._closing:
            try:
                await self.tick()
            except Exception as exc:  # kept by the streak and logged: the task must live on
                self._streak.failed(exc)
            else:
                self._streak.ok()
            await asyncio.sleep(self.interval_s)
