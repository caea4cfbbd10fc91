"""Where one more context of a voice should go: the pool's routing seam.

`RingRouter` runs `hashring.choice.order` over a `RingWatcher`'s view: two random choices among
the voice's placement owners on (the load each reported, in its last heartbeat or, if newer, on
its last answer to this pool, + this pool's own opens minus closes there since), at most
`owner_tries` owners in all, then ring successors, those this pool saw take the voice first (they
likely hold its adapter). Its starts are *placed* (`Start.placed`): the worker that receives one
serves it, never relays it. `StaticRouter` routes over a fixed list of URLs with a ring of its own
(voice affinity without Redis; bounded loads on this pool's exact counts, the only loads there
are); the workers do not share that ring, so its starts are not placed. Light: hashring only.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Protocol

from hashring.choice import OWNER_TRIES, OwnLoad, order
from hashring.errors import EmptyRing
from hashring.membership import RingWatcher
from hashring.placement import place
from hashring.records import WorkerInfo
from hashring.ring import DEFAULT_BALANCE, Ring
from hashring.settings import RingSettings

__all__ = ["HELD_VOICES", "RingRouter", "Router", "StaticRouter"]

HELD_VOICES = 64  # voices remembered per worker as "it took this voice lately" (likely holds the adapter)


class Router(Protocol):
    """Where one more context of a voice should go."""

    places: bool  # its choice follows the ring the workers share: the worker serves the start itself

    def pick(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> WorkerInfo:
        """The worker for one more context; raises EmptyRing when every worker is excluded."""
        ...

    def candidates(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> Iterator[WorkerInfo]:
        """Every worker one more context may try, best first, lazily (`loads`: the pool's own
        streams per worker now); none when no worker is live and undrained (never raises)."""
        ...

    def answered(self, worker_id: str, load: int, own: int) -> None:
        """A worker's own count (`load`) rode on an answer; `own`: the pool's streams there now."""
        ...

    def took(self, worker_id: str, voice: str) -> None:
        """A worker took a context of `voice` (so it likely holds the voice's adapter now)."""
        ...

    def owners(self, voice: str) -> tuple[WorkerInfo, ...]:
        """The workers that hold `voice`, in preference order (none on an empty ring)."""
        ...

    def workers(self) -> tuple[WorkerInfo, ...]:
        """Every worker routing may choose now."""
        ...


class RingRouter:
    """Routes over a `RingWatcher`'s current view (the caller owns and starts the watcher).

    `candidates` is called with the pool's own streams per worker; `rng` (seeded in tests) draws
    the two choices and breaks ties; `owner_tries` owners at most, then ring successors."""

    places = True

    def __init__(self, watcher: RingWatcher, settings: RingSettings, *, rng: random.Random | None = None,
                 owner_tries: int = OWNER_TRIES) -> None:
        if owner_tries < 1:
            raise ValueError("owner_tries must be >= 1")
        self._watcher = watcher
        self._settings = settings
        self._rng = rng or random.Random()
        self._owner_tries = owner_tries
        self._own = OwnLoad(horizon_s=max(10.0, 4 * (settings.heartbeat_interval_s + settings.refresh_interval_s)))
        self._held: dict[str, OrderedDict[str, None]] = {}  # worker -> voices it took lately, newest last

    def estimates(self, loads: Mapping[str, int]) -> dict[str, float]:
        """This pool's estimate of every ring worker's streams: its last reported load (heartbeat or
        answer, the newer) plus this pool's opens minus closes there since (`loads`: the pool's
        streams now)."""
        view = self._watcher.view
        now = time.monotonic()
        self._own.observe(now, loads)
        read_at = now - min(self._watcher.staleness_s, self._own.horizon_s)  # when the view was read
        return {wid: self._own.estimate(wid, read_at - (state.heartbeat_age_s or 0.0), state.load)
                for wid, state in view.workers.items() if wid in view.ring}

    def answered(self, worker_id: str, load: int, own: int) -> None:
        self._own.answered(worker_id, time.monotonic(), load, own)

    def took(self, worker_id: str, voice: str) -> None:
        held = self._held.setdefault(worker_id, OrderedDict())
        held[voice] = None
        held.move_to_end(voice)
        if len(held) > HELD_VOICES:
            held.popitem(last=False)

    def candidates(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> Iterator[WorkerInfo]:
        view = self._watcher.view  # one view for the whole walk
        try:
            placement = place(view, voice, self._settings)
        except EmptyRing:  # no live, undrained worker: no candidate (the pool says so, retryable)
            return
        estimate = self.estimates(loads)
        weight = {n.id: n.weight for n in view.ring.nodes}
        capacity = {wid: float(view.workers[wid].info.capacity) for wid in weight}
        live = [w for w in weight if w not in exclude]
        if not live:
            return
        bound = self._settings.balance * (sum(estimate.get(w, 0.0) for w in live) + 1) / sum(weight[w] for w in live)

        def successors() -> list[str]:  # ring order, those that took the voice lately first
            ring_order = view.ring.owners(voice, len(view.ring))
            return sorted(ring_order, key=lambda w: voice not in self._held.get(w, ()))

        for wid in order(placement.owners, successors, estimate, weight=weight, capacity=capacity,
                         bound_per_weight=bound, rng=self._rng, exclude=exclude, owner_tries=self._owner_tries):
            yield view.worker(wid)

    def pick(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> WorkerInfo:
        for info in self.candidates(voice, loads, exclude):
            self._own.note(info.id, time.monotonic(), loads.get(info.id, 0) + 1)  # the stream about to open there
            return info
        raise EmptyRing(f"every worker that could take voice {voice!r} was tried, is ejected or is full")

    def owners(self, voice: str) -> tuple[WorkerInfo, ...]:
        view = self._watcher.view
        try:
            return tuple(view.worker(wid) for wid in place(view, voice, self._settings).owners)
        except EmptyRing:
            return ()

    def workers(self) -> tuple[WorkerInfo, ...]:
        view = self._watcher.view
        return tuple(view.worker(wid) for wid in sorted(view.loads))


class StaticRouter:
    """A fixed list of worker URLs (no Redis): each URL is its worker's id, placed on a ring of
    its own so a voice keeps going to the same worker; bounded loads over this pool's streams."""

    places = False  # the workers do not share this pool's ring: a worker may still relay its starts

    def __init__(self, urls: Sequence[str], *, vnodes: int = 256, balance: float = DEFAULT_BALANCE) -> None:
        if not urls:
            raise ValueError("a static pool needs at least one worker URL")
        self._infos = {url: WorkerInfo(url, url, url) for url in dict.fromkeys(urls)}
        self._ring = Ring(list(self._infos), vnodes=vnodes)
        self._balance = balance

    def pick(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> WorkerInfo:
        return self._infos[self._ring.choose(voice, loads, c=self._balance, exclude=exclude)]

    def candidates(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> Iterator[WorkerInfo]:
        skip = set(exclude)
        while True:
            try:
                info = self.pick(voice, loads, skip)
            except EmptyRing:
                return
            skip.add(info.id)
            yield info

    def answered(self, worker_id: str, load: int, own: int) -> None:
        """Nothing to do: this pool's exact counts are the only loads a static pool routes on."""

    def took(self, worker_id: str, voice: str) -> None:
        """Nothing to do: a static ring's successors keep their ring order."""

    def owners(self, voice: str) -> tuple[WorkerInfo, ...]:
        return (self._infos[self._ring.owner(voice)],)

    def workers(self) -> tuple[WorkerInfo, ...]:
        return tuple(self._infos.values())
