"""Where one more utterance of a voice should go: the pool's routing seam.

`RingRouter` asks `hashring.placement.route` (bounded loads over the voice's replicas) over a
`RingWatcher`'s view, with the loads in heartbeats raised to the streams the caller has open
there (heartbeats are up to a few seconds old). `StaticRouter` does the same over a fixed list of
URLs with a ring of its own (voice affinity without Redis). Light: hashring only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from hashring.membership import RingWatcher
from hashring.placement import place, route
from hashring.records import WorkerInfo
from hashring.ring import DEFAULT_BALANCE, Ring
from hashring.settings import RingSettings

__all__ = ["RingRouter", "Router", "StaticRouter"]


class Router(Protocol):
    """Where one more utterance of a voice should go."""

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
    """Routes over a `RingWatcher`'s current view (the caller owns and starts the watcher)."""

    def __init__(self, watcher: RingWatcher, settings: RingSettings) -> None:
        self._watcher = watcher
        self._settings = settings

    def pick(self, voice: str, loads: Mapping[str, int], exclude: Collection[str]) -> WorkerInfo:
        view = self._watcher.view
        merged = {wid: max(load, loads.get(wid, 0)) for wid, load in view.loads.items()}
        return route(view, voice, self._settings, loads=merged, exclude=exclude)

    def owners(self, voice: str) -> tuple[WorkerInfo, ...]:
        view = self._watcher.view
        return tuple(view.worker(wid) for wid in place(view, voice, self._settings).owners)

    def workers(self) -> tuple[WorkerInfo, ...]:
        view = self._watcher.view
        return tuple(view.worker(wid) for wid in sorted(view.loads))


class StaticRouter:
    """A fixed list of worker URLs (no Redis): each URL is its worker's id, placed on a ring of
    its own so a voice keeps going to the same worker; bounded loads over this pool's streams."""

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
