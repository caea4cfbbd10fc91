"""Reading one sample: the fleet and the training queue from Redis, and every live worker's
`/health` and `/metrics`, concurrently, each answer within `--probe-timeout` seconds.

    fleet     = hashring.fleet_view.read_fleet        workers, ring epoch, hottest voices, replicas
    queue     = lora_training.queue_view.read_queue   queued / running / failed in the window
    probes    = GET /health and /metrics on each live worker, concurrently, each within --probe-timeout
    rates     = refusals and relays per second: the /metrics counter totals of two samples (--watch)

redis, the ring's store and the queue are imported when a reader opens, not with this module.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

from voicering.status.report import Probe, StatusReport, StatusSettings, problems_of, rates_between

if TYPE_CHECKING:
    from hashring.fleet_view import WorkerRow
    from hashring.store import RingStore
    from lora_training.jobs import JobQueue
    from lora_training.queue_view import QueueView

__all__ = ["MAX_BODY", "MAX_PROBE_THREADS", "REFUSAL_REASONS", "StatusReader", "counter_totals"]

MAX_BODY: Final = 4 << 20  # bytes read from one /health or /metrics answer
# Threads start on demand, two per live worker: a probe waiting for a thread would eat its own timeout.
MAX_PROBE_THREADS: Final = 512
REFUSAL_REASONS: Final = frozenset({"busy", "share", "connection_limit"})  # voicering_worker_rejected, not cuts


class StatusReader:
    """The Redis connections, and the threads for the HTTP probes, of one run (kept across a
    --watch). `async with StatusReader(settings) as reader: report = await reader.read()`"""

    def __init__(self, settings: StatusSettings) -> None:
        self.settings = settings
        self._store: RingStore | None = None
        self._queue: JobQueue | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._probes: dict[str, Probe] = {}  # the previous sample, for the rates

    async def __aenter__(self) -> StatusReader:
        from hashring.redis_client import sync_client
        from hashring.store import RingStore
        from lora_training.jobs import JobQueue

        s = self.settings
        self._store = RingStore(s.ring)
        timeout = s.ring.redis_timeout_s  # JobQueue.connect's 30 s would hang a status on a stuck Redis
        client = sync_client(s.queue_url, decode_responses=True, socket_timeout=timeout,
                             socket_connect_timeout=timeout)
        self._queue = JobQueue(client, s.queue_prefix)
        self._threads = ThreadPoolExecutor(MAX_PROBE_THREADS, thread_name_prefix="status-probe")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._queue is not None:
            self._queue.close()
        if self._store is not None:
            await self._store.aclose()

    async def read(self) -> StatusReport:
        """One sample. Raises RingError when the ring cannot be read; a queue that cannot be read
        is the report's `queue_error`, a worker that does not answer its probe's `error`."""
        from hashring.fleet_view import read_fleet
        from hashring.presence import read_presence
        from hashring.redis_client import redact_url

        s = self.settings
        assert self._store is not None, "use `async with StatusReader(...)`"
        fleet = await read_fleet(self._store, voices=s.voices, top=s.top)
        presence = tuple(await read_presence(self._store))
        live = [w for w in fleet.workers if w.state != "dead"] if s.probe_timeout_s > 0 else []
        (queue, queue_error), *answers = await asyncio.gather(self._read_queue(), *(self._probe(w) for w in live))
        probes = {w.id: p for w, p in zip(live, answers)}
        rates = {wid: rates_between(self._probes.get(wid), p) for wid, p in probes.items()}
        self._probes = probes
        return StatusReport(redact_url(s.ring.redis_url), redact_url(s.queue_url), time.time(), fleet, queue,
                            queue_error, probes, rates, problems_of(fleet, queue, s), s, presence)

    async def _read_queue(self) -> tuple[QueueView | None, str | None]:
        from lora_training.errors import TrainingError
        from lora_training.queue_view import read_queue

        s = self.settings
        try:
            return await asyncio.to_thread(read_queue, self._queue, limit=s.job_limit,
                                           failed_window_s=s.failed_window_s), None
        except TrainingError as exc:
            return None, exc.message

    async def _probe(self, worker: WorkerRow) -> Probe:
        base = _http_base(worker.proxy_url)
        health_answer, metrics_answer = await asyncio.gather(
            self._fetch(f"{base}/health", None), self._fetch(f"{base}/metrics", self.settings.token))
        if isinstance(health_answer, str) and health_answer == metrics_answer:  # one cause: say it once
            return Probe(time.monotonic(), None, None, None, f"{base} did not answer: {health_answer}")
        errors: list[str] = []
        health = _health(f"{base}/health", health_answer, errors)
        refusals, relays = _counters(f"{base}/metrics", metrics_answer, errors)
        return Probe(time.monotonic(), health, refusals, relays, "; ".join(errors) or None)

    async def _fetch(self, url: str, token: str | None) -> tuple[int, bytes] | str:
        """(status, body), or why there is none (the same words for the same cause)."""
        timeout = self.settings.probe_timeout_s
        call = asyncio.get_running_loop().run_in_executor(self._threads, _get, url, token, timeout)
        try:
            async with asyncio.timeout(2 * timeout):  # urllib's timeout bounds each socket operation, not the whole
                return await call
        except (OSError, TimeoutError, http.client.HTTPException, ValueError) as exc:
            call.cancel()
            return _why(exc)


def counter_totals(text: str) -> tuple[float, float]:
    """(refusals, relays) since the worker started, from its Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    refusals = relays = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "voicering_worker_rejected_total" and sample.labels.get("reason") in REFUSAL_REASONS:
                refusals += sample.value
            elif sample.name == "voicering_worker_proxied_total":
                relays += sample.value
    return refusals, relays


def _health(url: str, answer: tuple[int, bytes] | str, errors: list[str]) -> Mapping[str, Any] | None:
    if isinstance(answer, str):
        errors.append(f"{url} did not answer: {answer}")
        return None
    code, body = answer
    if code not in (200, 503):  # 503: the worker's engine is dead, and the body says so
        errors.append(f"{url} answered {code}")
        return None
    try:
        return json.loads(body)
    except ValueError:
        errors.append(f"{url} is not JSON")
        return None


def _counters(url: str, answer: tuple[int, bytes] | str, errors: list[str]) -> tuple[float | None, float | None]:
    if isinstance(answer, str):
        errors.append(f"{url} did not answer: {answer}")
        return None, None
    code, body = answer
    if code == 401:
        errors.append(f"{url} needs the cluster token (--token or VOICERING_WORKER_CLUSTER_TOKEN)")
    elif code != 200:
        errors.append(f"{url} answered {code}")
    else:
        try:
            return counter_totals(body.decode("utf-8", "replace"))
        except ValueError as exc:
            errors.append(f"{url} is not Prometheus text ({exc})")
    return None, None


def _get(url: str, token: str | None, timeout: float) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as answer:
            return answer.status, answer.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(MAX_BODY)


def _http_base(address: str) -> str:
    """The worker's HTTP origin: /health and /metrics share its websocket port."""
    from urllib.parse import urlsplit

    parts = urlsplit(address)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme or "http")
    return f"{scheme}://{parts.netloc}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return "timed out" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
