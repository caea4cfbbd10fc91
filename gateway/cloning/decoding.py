"""`DecodePool`: the gateway's bounded pool of upload decodes.

Checking an upload decodes its files (seconds of CPU each; `lora_training.ingest` holds one block
at a time). Those decodes run on the pool's own threads, at most `max_decodes` at once in this
process and at most `max_per_tenant` of them for one tenant. An upload past either is refused at
once (`DecodesBusy`: 503 when the gateway is full, 429 when the tenant is, both with Retry-After),
never queued: a waiting upload would hold its files, its socket and its registered voice, and
asyncio's default executor, which Redis and disk calls share, never sees a decode.

A request cancelled while its decode runs (the client went away, the gateway stops) stops the
decode at its next block; the slot is free again once the thread has really stopped.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final, TypeVar

from gateway.cloning.errors import DecodesBusy

if TYPE_CHECKING:  # the work calls it between blocks; here it raises DecodeStopped once the caller is gone
    from lora_training.ingest import Check

__all__ = ["DECODE_RETRY_AFTER_S", "DecodePool", "DecodeStopped"]

DECODE_RETRY_AFTER_S: Final = 5.0  # what a refused caller is told to wait: a decode takes seconds
T = TypeVar("T")


class DecodeStopped(Exception):
    """The request waiting for this decode was cancelled; nobody reads the result."""


class DecodePool:
    """Decodes of uploads, bounded per process and per tenant. One per gateway process; `close` at exit."""

    def __init__(self, max_decodes: int, max_per_tenant: int) -> None:
        self.max_decodes, self.max_per_tenant = max_decodes, max_per_tenant
        self._threads = ThreadPoolExecutor(max_workers=max_decodes, thread_name_prefix="upload-decode")
        self._lock = threading.Lock()  # the counts change on the loop (admit) and on the threads (release)
        self._running = 0
        self._per_tenant: Counter[str] = Counter()
        self._stops: set[threading.Event] = set()

    def running(self, tenant_id: str | None = None) -> int:
        """Decodes holding a slot now (of one tenant, or in all)."""
        with self._lock:
            return self._running if tenant_id is None else self._per_tenant[tenant_id]

    async def run(self, tenant_id: str, work: Callable[[Check], T]) -> T:
        """`work(check)` on a decode thread, or DecodesBusy at once when no slot is free for the tenant."""
        self._admit(tenant_id)
        stop = threading.Event()

        def check() -> None:
            if stop.is_set():
                raise DecodeStopped()

        with self._lock:
            self._stops.add(stop)
        try:
            future = self._threads.submit(work, check)
        except RuntimeError:  # shut down: the gateway is stopping
            self._release(tenant_id, stop)
            raise DecodesBusy("this gateway is shutting down; retry (another gateway will take the upload)",
                              scope="gateway", retry_after_s=DECODE_RETRY_AFTER_S) from None
        future.add_done_callback(lambda _: self._release(tenant_id, stop))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            stop.set()
            raise

    def close(self) -> None:
        """Stop every decode at its next block and let no new one start."""
        with self._lock:
            for stop in self._stops:
                stop.set()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _admit(self, tenant_id: str) -> None:
        with self._lock:
            if self._per_tenant[tenant_id] >= self.max_per_tenant:
                raise DecodesBusy(f"you already have {self.max_per_tenant} uploads being checked on this gateway, "
                                  f"the most at once; retry in {DECODE_RETRY_AFTER_S:g} s or upload one voice at "
                                  "a time", scope="tenant", retry_after_s=DECODE_RETRY_AFTER_S)
            if self._running >= self.max_decodes:
                raise DecodesBusy(f"this gateway is checking {self.max_decodes} uploads, the most at once; retry "
                                  f"in {DECODE_RETRY_AFTER_S:g} s", scope="gateway",
                                  retry_after_s=DECODE_RETRY_AFTER_S)
            self._running += 1
            self._per_tenant[tenant_id] += 1

    def _release(self, tenant_id: str, stop: threading.Event) -> None:
        with self._lock:
            self._stops.discard(stop)
            self._running -= 1
            self._per_tenant[tenant_id] -= 1
            if self._per_tenant[tenant_id] <= 0:
                del self._per_tenant[tenant_id]
