"""The fleet as an operator reads it (`voicering status`): workers, the ring epoch and the hottest
voices, from what Redis already holds. Pure data, no printing.

    workers  = the membership snapshot (reaps silent workers, as every reader's snapshot does)
    voices   = voices requested lately (the store's request index, newest `MAX_INDEXED_VOICES`),
               with a replica record (operator floor or automatic count), or asked for; ranked
               by their short-window request rate (the autoscaler's own decayed counters)
    wanted   = requested_replicas(view, voice); placed = len(place(view, voice).owners)
    spill / refusal share = the voice's decayed spill and refusal counters (short window) over
               its requests, and over its requests plus refusals (a refused try is not a request)
    adapter on = the live workers whose last heartbeat listed the voice's adapter as resident

Several reads, not one transaction: the snapshot (one atomic script), the request index, the
resident lists, then the voices' counters (scripts of `HEAT_CHUNK` voices). A change between them
can pair a rate with the previous epoch's owners; the next read corrects it, which is all a status
view needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from hashring.errors import EmptyRing
from hashring.placement import COOL_LOCK, place, requested_replicas
from hashring.records import RingView, WorkerStatus, check_voice_id
from hashring.settings import RingSettings
from hashring.store import MAX_INDEXED_VOICES, RingStore, rate_of

__all__ = ["HEAT_CHUNK", "FleetView", "VoiceRow", "WorkerRow", "WorkerStateName", "read_fleet"]

HEAT_CHUNK: Final = 500  # voices per counter-reading script call

WorkerStateName = Literal["serving", "draining", "dead"]
_STATE: Final[dict[WorkerStatus, WorkerStateName]] = {"live": "serving", "draining": "draining", "down": "dead"}


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One registered worker: what it registered, what its heartbeats said, and its ring share."""

    id: str
    state: WorkerStateName  # serving: in the ring; draining: live, takes no new voices; dead: silent past the TTL
    streams: int  # reported in its last heartbeat
    capacity: int
    weight: float
    ring_share: float  # fraction of the hash space it owns (0 out of the ring)
    heartbeat_age_s: float | None  # on the ring clock; None if it never heartbeated
    ws_url: str
    proxy_url: str  # the internal address its peers (and /health, /metrics probes) reach
    adapters: tuple[str, ...] | None = None  # voices whose adapters it listed as resident (None: never listed)


@dataclass(frozen=True, slots=True)
class VoiceRow:
    """One voice: its request rate, the replicas it asks for, and where placement puts them."""

    voice: str
    rate: float  # requests/s over the short window (heat_fast_half_life_s): what scale-up reads
    rate_slow: float  # requests/s over the slow window (heat_half_life_s): what scale-down reads
    share: float | None  # of the fleet's short-window rate; None while the fleet has none
    wanted: int  # max(operator floor, or the default; automatic count, or 1)
    operator: int | None  # the operator's floor (`voicering ring scale`)
    automatic: int | None  # the cool loop's count (hot voices only)
    owners: tuple[str, ...]  # preference order; fewer than `wanted` when the ring is too small
    adapter_on: tuple[str, ...] = ()  # live workers that hold its adapter (base voices have none)
    spill_share: float | None = None  # of its requests served past its owners; None without requests
    refusal_share: float | None = None  # of its tries (requests + refusals) a worker refused

    @property
    def placed(self) -> int:
        return len(self.owners)


@dataclass(frozen=True, slots=True)
class FleetView:
    """One read of the fleet."""

    epoch: int
    incarnation: str  # of the Redis data set ('' unknown): a change means Redis lost its data
    workers: tuple[WorkerRow, ...]  # by id
    in_ring: int  # serving workers
    streams: int  # reported by the serving workers
    rate: float  # the fleet's requests/s, short window
    rate_slow: float  # the fleet's requests/s, slow window
    voices: tuple[VoiceRow, ...]  # hottest first, at most `top`
    voices_ranked: int  # voices requested lately, with a replica record or asked for (before the cut to `top`)
    short: tuple[VoiceRow, ...]  # every ranked voice with fewer owners than it wants, hottest first
    cooling: bool  # a cool loop holds the autoscaler's lease (automatic counts are being decided)


async def read_fleet(store: RingStore, *, voices: Iterable[str] = (), top: int = 20,
                     indexed: int = MAX_INDEXED_VOICES) -> FleetView:
    """Read the fleet once. ``voices``: voices to rank whatever their traffic (raises
    InvalidVoiceId for an unusable id); ``top``: how many of the hottest to keep; ``indexed``: how
    many of the most recently requested voices to rank. Raises RingUnavailable when Redis is down."""
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    asked = [check_voice_id(v) for v in voices]
    settings = store.settings
    snap = await store.snapshot()
    view = RingView.from_snapshot(snap, vnodes=settings.vnodes)
    recent = await store.recent_voices(indexed)
    resident = await store.resident()
    candidates = sorted(set(view.replicas) | set(view.auto_replicas) | set(asked) | set(recent))
    fleet, counters, outcomes = (0.0, 0.0), {}, {}
    for i in range(0, max(1, len(candidates)), HEAT_CHUNK):
        fleet, chunk = await store.peek_counters(candidates[i:i + HEAT_CHUNK])
        counters.update(chunk)
        outcomes.update(await store.peek_outcomes(candidates[i:i + HEAT_CHUNK]))
    holders: dict[str, list[str]] = {}
    for wid in sorted(resident):
        if wid in view.workers and view.workers[wid].status != "down":
            for voice in resident[wid]:
                holders.setdefault(voice, []).append(wid)
    cooling = await store.lock_holder(COOL_LOCK) is not None
    fast_h, slow_h = settings.heat_fast_half_life_s, settings.heat_half_life_s
    fleet_rate = rate_of(fleet[1], fast_h)
    rows = []
    for voice in candidates:
        slow, fast = counters[voice]
        spills, refusals = outcomes[voice]
        rate = rate_of(fast, fast_h)
        rows.append(VoiceRow(voice, rate, rate_of(slow, slow_h), rate / fleet_rate if fleet_rate > 0 else None,
                             requested_replicas(view, voice, settings), view.replicas.get(voice),
                             view.auto_replicas.get(voice), _owners(view, voice, settings),
                             tuple(holders.get(voice, ())), _share(spills, fast), _share(refusals, fast + refusals)))
    rows.sort(key=lambda r: (-r.rate, -r.rate_slow, r.voice))
    shares = view.ring.shares()
    workers = tuple(
        WorkerRow(wid, _STATE[st.status], st.load, st.info.capacity, st.info.weight, shares.get(wid, 0.0),
                  st.heartbeat_age_s, st.info.ws_url, st.info.proxy_url, resident.get(wid))
        for wid, st in view.workers.items())
    return FleetView(view.epoch, snap.incarnation, workers, len(view.ring), sum(view.loads.values()), fleet_rate,
                     rate_of(fleet[0], slow_h), tuple(rows[:top]), len(rows),
                     tuple(r for r in rows if r.placed < r.wanted), cooling)


def _share(part: float, whole: float) -> float | None:
    """part / whole, at most 1 (the counters are flushed at different moments); None below one
    request's worth of counter left (2**-10: the voice went quiet ten half-lives ago)."""
    return None if whole < 2 ** -10 else min(1.0, part / whole)


def _owners(view: RingView, voice: str, settings: RingSettings) -> tuple[str, ...]:
    try:
        return place(view, voice, settings).owners
    except EmptyRing:
        return ()
