"""Placement-driven prewarm: when the ring gives this worker voices it did not own before (a worker
left, an operator ran `voicering ring scale VOICE N`, the autoscaler raised a hot voice's replica
count), load their adapters right away instead of on the first request that lands here.

    change   = the watcher's view differs from the last one handled (epoch, ring members or replica counts)
    new      = [v for v in candidates if me in place(view, v).owners and me not in place(before, v).owners]
    order    = new, hottest first (decayed request rate from the ring's heat counters)
    prewarm  = order[:max_per_change], `concurrency` at a time, each voice checked still owned first

Changes are detected by `RingWatcher.wait_for` (woken on every refresh, pub/sub or periodic), so a
change is seen as soon as this worker's watcher sees it — the same moment gateways start routing by
it, give or take their own refresh: prewarm races the first requests rather than strictly preceding
them, and the cap keeps it short. Nothing here sits on the serving path: one background task, the
candidate listing and the placement diff run in a thread (they walk a directory and place thousands
of voices), and a voice's failure is that voice's entry in the report. No failure ends the task
(Redis down, a listing error, a bug): it is logged once per streak, kept as `last_error`, and the
latest view is tried again `wait_s` later, still diffed from the last view handled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from hashring.errors import EmptyRing, RingError
from hashring.membership import RingWatcher
from hashring.placement import place
from hashring.records import RingView, valid_voice_id
from hashring.settings import RingSettings
from hashring.store import RingStore, rate_of

__all__ = ["Candidates", "OwnershipWarmer", "Prewarm", "Rates", "WarmReport", "heat_rates", "newly_owned"]

log = logging.getLogger(__name__)

Prewarm = Callable[[list[str]], Awaitable[Mapping[str, str]]]  # AdapterCache.prewarm: voice -> "ready" | error
Candidates = Callable[[], Iterable[str]]  # AdapterStore.voices: blocking, called in a thread
Rates = Callable[[list[str]], Awaitable[Mapping[str, float]]]  # voice -> requests/s

READY = "ready"
_HEAT_CHUNK = 500  # voices per Redis script call when reading heat counters


def heat_rates(store: RingStore) -> Rates:
    """Rates from the ring's decayed per-voice request counters (`P:heat:*`, one script call per
    500 voices); raises RingUnavailable when Redis is down."""
    half_life = store.settings.heat_half_life_s

    async def rates(voices: list[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        for i in range(0, len(voices), _HEAT_CHUNK):
            counters = await store.peek_heat(voices[i:i + _HEAT_CHUNK])
            out.update((v, rate_of(c, half_life)) for v, c in counters.items())
        return out

    return rates


def _owns(worker_id: str, view: RingView | None, voice: str, settings: RingSettings) -> bool:
    if view is None or worker_id not in view.ring:
        return False
    try:
        return worker_id in place(view, voice, settings).owners
    except EmptyRing:
        return False


def newly_owned(worker_id: str, before: RingView | None, after: RingView, voices: Iterable[str],
                settings: RingSettings) -> list[str]:
    """The voices (in `voices` order) `worker_id` owns in `after` and did not in `before` (None:
    it owned nothing). Pure; ids outside the adapter grammar are skipped."""
    return [v for v in voices if valid_voice_id(v)
            and _owns(worker_id, after, v, settings) and not _owns(worker_id, before, v, settings)]


def _placement_key(view: RingView) -> tuple:
    # What placement depends on. The epoch alone is not enough: Redis restarted empty counts from 0
    # again and could reach the epoch already seen with different contents.
    return view.epoch, view.ring.nodes, dict(view.replicas), dict(view.auto_replicas)


@dataclass(frozen=True, slots=True)
class WarmReport:
    """What one ring change made this worker prewarm."""

    epoch: int  # the view handled
    previous_epoch: int | None  # the view it was diffed from; None for the first
    owned: int  # candidate voices this worker owns at `epoch`
    new: int  # of those, the ones it did not own before
    results: Mapping[str, str] = field(default_factory=dict)  # voice -> "ready" | error, hottest first
    over_cap: tuple[str, ...] = ()  # newly owned but past max_per_change (coldest), left to first use
    moved_on: tuple[str, ...] = ()  # no longer owned when their turn came (a later change took them)
    seconds: float = 0.0

    @property
    def ready(self) -> list[str]:
        return [v for v, r in self.results.items() if r == READY]

    @property
    def failed(self) -> dict[str, str]:
        return {v: r for v, r in self.results.items() if r != READY}


class OwnershipWarmer:
    """Prewarms the voices this worker newly owns on every ring change. One task; `async with`.

    ``prewarm`` loads voices (the worker's `AdapterCache.prewarm`; called with one voice at a
    time so `concurrency` bounds the loads in flight); ``candidates`` lists the voices that could
    be owned (`AdapterStore.voices`; blocking, run in a thread); ``rates`` orders them hottest
    first (`heat_rates(store)`; without it, or when it fails, candidate order is kept). At most
    ``max_per_change`` voices are prewarmed per change: the engine's CPU cache is an LRU, so
    prewarming more than it holds would evict the voices this worker is serving now.
    """

    def __init__(self, worker_id: str, watcher: RingWatcher, settings: RingSettings, prewarm: Prewarm,
                 candidates: Candidates, *, max_per_change: int, rates: Rates | None = None,
                 concurrency: int = 2, wait_s: float = 1.0) -> None:
        if max_per_change < 0 or concurrency < 1 or wait_s <= 0:
            raise ValueError("max_per_change must be >= 0, concurrency >= 1 and wait_s > 0")
        self.worker_id = worker_id
        self._watcher = watcher
        self._settings = settings
        self._prewarm = prewarm
        self._candidates = candidates
        self._rates = rates
        self.max_per_change = max_per_change
        self.concurrency = concurrency
        self._wait_s = wait_s  # how long one wait for a change lasts before the closing flag is checked
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._reported = asyncio.Condition()
        self._error: Exception | None = None
        self._rates_error: Exception | None = None
        self.last_report: WarmReport | None = None
        self.warming = 0  # prewarms in flight now
        self.changes = 0  # ring changes handled
        self.ready = 0  # voices prewarmed successfully, in total
        self.failed = 0  # voices whose prewarm failed, in total
        self.over_cap = 0  # newly owned voices left to first use by the cap, in total

    @property
    def last_error(self) -> Exception | None:
        """Why the latest change could not be handled (it is retried on the next); None after a success."""
        return self._error

    async def start(self) -> None:
        self._closing = False
        self._task = asyncio.create_task(self._run(), name=f"ownership-warmer:{self.worker_id}")

    async def aclose(self) -> None:
        """Stop; a prewarm in flight is cancelled (the cache lets its waiters retry)."""
        self._closing = True
        task, self._task = self._task, None
        while task is not None and not task.done():
            task.cancel()  # repeated: redis-py may swallow a cancel that lands inside a command
            await asyncio.wait([task], timeout=0.1)

    async def __aenter__(self) -> OwnershipWarmer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def wait_report(self, predicate: Callable[[WarmReport], bool], timeout: float) -> WarmReport:
        """Wait until `last_report` satisfies `predicate`; raises TimeoutError after `timeout` s."""
        async with asyncio.timeout(timeout), self._reported:
            while self.last_report is None or not predicate(self.last_report):
                await self._reported.wait()
            return self.last_report

    # -- the task ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        seen: tuple | None = None  # placement key of the latest view looked at
        base: RingView | None = None  # the latest view whose new voices were handled
        while not self._closing:
            try:
                view = await self._watcher.wait_for(lambda v: _placement_key(v) != seen, self._wait_s)
            except TimeoutError:
                continue
            seen = _placement_key(view)
            try:
                report = await self._handle(base, view)
            except Exception as exc:  # logged and kept; tried again, still diffed from `base`
                self._failed(exc)
                seen = None
                await asyncio.sleep(self._wait_s)
                continue
            base = view
            if self._error is not None:
                log.info("ownership prewarm works again")
                self._error = None
            async with self._reported:
                self.last_report = report
                self._reported.notify_all()

    async def _handle(self, before: RingView | None, view: RingView) -> WarmReport:
        started = time.perf_counter()
        voices = list(await asyncio.to_thread(self._candidates))
        owned, new = await asyncio.to_thread(self._diff, before, view, voices)
        order = await self._hottest_first(new)
        chosen, over = order[:self.max_per_change], tuple(order[self.max_per_change:])
        results, moved_on = await self._prewarm_all(chosen)
        self.changes += 1
        self.over_cap += len(over)
        report = WarmReport(view.epoch, None if before is None else before.epoch, owned, len(new),
                            MappingProxyType(results), over, tuple(moved_on), time.perf_counter() - started)
        if new:
            log.info("ring epoch %d: worker %s newly owns %d voice(s); prewarmed %d, %d failed, %d over the cap",
                     view.epoch, self.worker_id, len(new), len(report.ready), len(report.failed), len(over),
                     extra={"epoch": view.epoch, "prewarm": dict(results), "over_cap": list(over[:20])})
        return report

    def _diff(self, before: RingView | None, view: RingView, voices: list[str]) -> tuple[int, list[str]]:
        owned = [v for v in voices if valid_voice_id(v) and _owns(self.worker_id, view, v, self._settings)]
        return len(owned), [v for v in owned if not _owns(self.worker_id, before, v, self._settings)]

    async def _hottest_first(self, voices: list[str]) -> list[str]:
        if self._rates is None or len(voices) < 2:
            return voices
        try:
            rates = await self._rates(voices)
        except Exception as exc:  # order is a nicety: prewarm in candidate order rather than not at all
            if self._rates_error is None:
                log.warning("could not read voice request rates (%s); prewarming in listing order",
                            exc.message if isinstance(exc, RingError) else exc)
            self._rates_error = exc
            return voices
        self._rates_error = None
        return sorted(voices, key=lambda v: -rates.get(v, 0.0))  # stable: ties keep listing order

    async def _prewarm_all(self, voices: Sequence[str]) -> tuple[dict[str, str], list[str]]:
        results: dict[str, str] = {}
        moved_on: list[str] = []
        queue = deque(voices)

        async def loader() -> None:  # `concurrency` of these take voices in order: hottest start first
            while queue:
                voice = queue.popleft()
                if not _owns(self.worker_id, self._watcher.view, voice, self._settings):
                    moved_on.append(voice)
                    continue
                results[voice] = "pending"
                results[voice] = await self._prewarm_one(voice)

        async with asyncio.TaskGroup() as group:
            for i in range(min(self.concurrency, len(voices))):
                group.create_task(loader(), name=f"ownership-prewarm-{i}")
        return results, moved_on

    async def _prewarm_one(self, voice: str) -> str:
        self.warming += 1
        try:
            outcome = (await self._prewarm([voice])).get(voice, "prewarm returned no result for this voice")
        except Exception as exc:  # this voice's failure only; the others go on
            log.error("prewarm of newly owned voice %r failed", voice, exc_info=exc)
            outcome = f"prewarm failed: {exc}"
        finally:
            self.warming -= 1
        if outcome == READY:
            self.ready += 1
        else:
            self.failed += 1
            log.warning("could not prewarm newly owned voice %r: %s", voice, outcome)
        return outcome

    def _failed(self, exc: Exception) -> None:
        if self._error is None:
            if isinstance(exc, RingError):
                log.warning("ownership prewarm failed, will retry on the next ring change: %s", exc.message)
            else:
                log.error("ownership prewarm failed unexpectedly, will retry on the next ring change", exc_info=exc)
        self._error = exc
