"""Where one more utterance of a voice should go: the pool's routing seam.

`RingRouter` runs `hashring.choice.order` over a `RingWatcher`'s view: two random choices among
the voice's placement owners on (the load each reported in its last heartbeat + this pool's own
opens minus closes there since that heartbeat), then the other owners, then ring successors.
Its starts are *placed* (`Start.placed`): the worker that receives one serves it, never relays it.
`StaticRouter` routes over a fixed list of URLs with a ring of its own (voice affinity without
Redis; bounded loads on this pool's exact counts, the only loads there are); the workers do not
share that ring, so its starts are not placed. Light: hashring only.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from hashring.choice import OwnLoad, order
from hashring.errors import EmptyRing
from hashring.membership import RingWatcher
from hashring.placement import place
from hashring.records import WorkerInfo
from hashring.ring import DEFAULT_BALANCE, Ring
from hashring.settings import RingSettings

__all__ = ["RingRouter", "Router", "StaticRouter"]


class Router(Protocol):
    """Where one more utterance of a voice should go."""

    places: bool  # its choice follows the ring the workers share: the worker serves the start itself

    def pick(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> WorkerInfo:
        """The worker for one more utterance; raises EmptyRing when every worker is excluded."""
        ...

    def owners(self, voice: str) -> tuple[WorkerInfo, ...]:
        """The workers that hold `voice`, in preference order."""
        ...

    def workers(self) -> tuple[WorkerInfo, ...]:
        """Every worker routing may choose now."""
        ...


class RingRouter:
    """Routes over a `RingWatcher`'s current view (the caller owns and starts the watcher).

    `pick` is called with the pool's own open streams per worker; `rng` (seeded in tests) draws
    the two choices and breaks ties."""

    places = True

    def __init__(self, watcher: RingWatcher, settings: RingSettings, *, rng: random.Random | None = None) -> None:
        self._watcher = watcher
        self._settings = settings
        self._rng = rng or random.Random()
        self._own = OwnLoad(horizon_s=max(10.0, 4 * (settings.heartbeat_interval_s + settings.refresh_interval_s)))

    def estimates(self, loads: Mapping[str, int]) -> dict[str, float]:
        """This pool's estimate of every ring worker's streams: its last reported load plus this
        pool's opens minus closes there since that report (`loads`: the pool's streams now)."""
        view = self._watcher.view
        now = time.monotonic()
        self._own.observe(now, loads)
        read_at = now - min(self._watcher.staleness_s, self._own.horizon_s)  # when the view was read
        out: dict[str, float] = {}
        for wid, state in view.workers.items():
            if wid in view.ring:
                reported_at = read_at - (state.heartbeat_age_s or 0.0)
                out[wid] = max(0.0, state.load + self._own.since(wid, reported_at))
        return out

    def pick(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> WorkerInfo:
        view = self._watcher.view
        placement = place(view, voice, self._settings)
        estimate = self.estimates(loads)
        weight = {n.id: n.weight for n in view.ring.nodes}
        capacity = {wid: float(view.workers[wid].info.capacity) for wid in weight}
        live = [w for w in weight if w not in exclude]
        if not live:
            raise EmptyRing(f"every worker that could take voice {voice!r} was tried, is ejected or is full")
        bound = self._settings.balance * (sum(estimate.get(w, 0.0) for w in live) + 1) / sum(weight[w] for w in live)
        for wid in order(placement.owners, lambda: view.ring.owners(voice, len(view.ring)), estimate, weight=weight,
                         capacity=capacity, bound_per_weight=bound, rng=self._rng, exclude=exclude):
            self._own.note(wid, time.monotonic(), loads.get(wid, 0) + 1)  # the stream about to open there
            return view.worker(wid)
        raise EmptyRing(f"every worker that could take voice {voice!r} was tried, is ejected or is full")

    def owners(self, voice: str) -> tuple[WorkerInfo, ...]:
        view = self._watcher.view
        return tuple(view.worker(wid) for wid in place(view, voice, self._settings).owners)

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

    def owners(self, voice: str) -> tuple[WorkerInfo, ...]:
        return (self._infos[self._ring.owner(voice)],)

    def workers(self) -> tuple[WorkerInfo, ...]:
        return tuple(self._infos.values())
