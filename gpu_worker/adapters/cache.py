"""Which adapters sit in the engine's CPU cache: an LRU mirror of vLLM's, loading on miss and
reconciled with what the engine reports, so load and eviction counts follow the engine."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from gpu_worker.adapters.store import AdapterStore
from gpu_worker.adapters.validation import adapter_error
from gpu_worker.errors import AdapterError, UnknownVoice

if TYPE_CHECKING:
    from gpu_worker.engine import Voice
    from gpu_worker.metrics import WorkerMetrics

__all__ = ["DEFAULT_RECONCILE_S", "AdapterCache", "Listing", "Loader"]

log = logging.getLogger(__name__)

Loader = Callable[["Voice"], Awaitable[None]]
Listing = Callable[[], Awaitable[set[int]]]
DEFAULT_RECONCILE_S = 2.0


class AdapterCache:
    """Loads a voice's adapter into the engine on first use and mirrors the engine's CPU cache.

    ``capacity`` is the engine's ``max_cpu_loras``. On a miss the adapter is loaded explicitly
    (``loader``, i.e. `SpeechEngine.load_adapter`), timed and counted; inserting past capacity
    counts an eviction (vLLM evicts its least recently used adapter at the same moment).

    vLLM also refreshes recency every engine step, and reloads on its own an adapter a request
    carries, so the mirror alone drifts. With ``listing`` (`SpeechEngine.loaded_adapters`: the
    LoRA ids the engine holds), a hit is checked against the engine at most every ``reconcile_s``:
    mirror entries the engine dropped are counted as evictions, and a hit whose adapter the engine
    no longer holds is loaded again explicitly (counted in ``loads`` and ``reloads``). Correctness
    never depends on the mirror: every request carries its adapter path.
    """

    def __init__(self, store: AdapterStore, loader: Loader | None, capacity: int,
                 metrics: WorkerMetrics | None = None, *, listing: Listing | None = None,
                 reconcile_s: float = DEFAULT_RECONCILE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._loader = loader
        self.capacity = max(1, capacity)
        self._metrics = metrics
        self._listing = listing
        self.reconcile_s = reconcile_s
        self._clock = clock
        self._reconciled_at = float("-inf")
        self._resident: OrderedDict[int, str] = OrderedDict()  # lora id -> voice id, oldest first
        self._loading: dict[int, asyncio.Future] = {}
        self.loads = 0
        self.evictions = 0
        self.reloads = 0  # loads of adapters the mirror believed resident but the engine had dropped

    @property
    def resident(self) -> list[str]:
        return list(self._resident.values())

    async def acquire(self, voice_id: str) -> Voice:
        """Resolve (in a thread: the store does file and network I/O) and make sure the adapter is in
        the engine; errors are for this voice only."""
        try:
            voice = await asyncio.to_thread(self.store.resolve, voice_id)
        except AdapterError:
            if self._metrics is not None:
                self._metrics.adapter_errors.inc()
            raise
        if voice.adapter_path is None:
            return voice
        reload = False
        while not reload:
            while (pending := self._loading.get(voice.lora_id)) is not None:
                try:
                    await asyncio.shield(pending)  # one load per voice; its error is every waiter's error
                except asyncio.CancelledError:
                    if not pending.cancelled():
                        raise  # this waiter was cancelled
            if voice.lora_id not in self._resident:
                break
            reload = await self._engine_dropped(voice.lora_id)
            if not reload and voice.lora_id in self._resident:  # (the listing may have awaited meanwhile)
                self._resident.move_to_end(voice.lora_id)
                return voice
        future = asyncio.get_running_loop().create_future()
        self._loading[voice.lora_id] = future
        try:
            await self._load(voice, reload=reload)
            future.set_result(None)
        except asyncio.CancelledError:
            future.cancel()  # waiters try again themselves
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            del self._loading[voice.lora_id]
        return voice

    def release(self, voice: Voice) -> None:
        """The voice's request finished: it was in the engine's last batch, so it is most recent."""
        if voice.lora_id in self._resident:
            self._resident.move_to_end(voice.lora_id)

    async def prewarm(self, voice_ids: Iterable[str]) -> dict[str, str]:
        """Load voices ahead of traffic; returns ``{voice: "ready" | error message}``.

        Only the last ``capacity`` voices can stay resident; earlier ones are still validated (and
        copied to local disk for a remote store), so their first request skips that work.
        """
        report: dict[str, str] = {}
        for voice_id in voice_ids:
            try:
                await self.acquire(voice_id)
                report[voice_id] = "ready"
            except (AdapterError, UnknownVoice) as exc:
                report[voice_id] = exc.message
        return report

    async def _engine_dropped(self, lora_id: int) -> bool:
        """Reconcile with the engine when due; True when it no longer holds ``lora_id``."""
        if self._listing is None or self._clock() - self._reconciled_at < self.reconcile_s:
            return False
        self._reconciled_at = self._clock()  # concurrent hits skip: one engine round trip at a time
        believed = set(self._resident)
        try:
            held = await self._listing()
        except Exception as exc:  # the mirror is advisory: keep serving, try again next period
            log.warning("could not list the engine's adapters (%s); adapter mirror left as is", exc)
            return False
        dropped = [i for i in believed - set(held) if i in self._resident and i not in self._loading]
        for gone in dropped:
            del self._resident[gone]
        self._count_evictions(len(dropped))
        if dropped:
            log.info("engine dropped %d adapter(s) the mirror held", len(dropped), extra={"evicted_ids": dropped})
        return lora_id in dropped

    async def _load(self, voice: Voice, *, reload: bool) -> None:
        started = time.perf_counter()
        if self._loader is not None:
            try:
                await self._loader(voice)
            except AdapterError:
                raise
            except Exception as exc:  # the engine refused it: still this voice's problem only
                if self._metrics is not None:
                    self._metrics.adapter_errors.inc()
                raise adapter_error(voice.name, f"the engine could not load the adapter ({exc})") from None
        seconds = time.perf_counter() - started
        self._resident[voice.lora_id] = voice.name
        self.loads += 1
        self.reloads += reload
        evicted = []
        while len(self._resident) > self.capacity:
            evicted.append(self._resident.popitem(last=False)[1])
        self._count_evictions(len(evicted))
        if self._metrics is not None:
            self._metrics.adapter_loads.inc()
            if reload:
                self._metrics.adapter_reloads.inc()
            self._metrics.adapter_load_seconds.observe(seconds)
        log.info("adapter for voice %s %s in %.3f s (lora id %d)%s", voice.name, "reloaded" if reload else "loaded",
                 seconds, voice.lora_id, f"; evicted {', '.join(evicted)}" if evicted else "",
                 extra={"voice": voice.name, "load_s": round(seconds, 4), "evicted": evicted, "reload": reload})

    def _count_evictions(self, count: int) -> None:
        self.evictions += count
        if self._metrics is not None and count:
            self._metrics.adapter_evictions.inc(count)
