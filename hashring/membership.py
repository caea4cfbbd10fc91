"""Membership: workers join, heartbeat, drain and leave; readers watch the ring.

Worker side, `Heartbeat`: registers the worker (id, websocket and proxy addresses, weight,
capacity) and refreshes its heartbeat every `heartbeat_interval_s` with its current load. If Redis
answers that it does not know the worker (Redis restarted empty, or the worker was silent so long
it was forgotten) it registers again.

Reader side, `RingWatcher`: holds the current `RingView`. It re-reads Redis whenever an epoch is
published and at least every `refresh_interval_s` (pub/sub is fire-and-forget, so a lost message
costs at most one interval). A worker whose heartbeat is older than `heartbeat_ttl_s` is reaped by
the first reader that looks, so it is out of every reader's ring within TTL + one refresh; not
within a TTL of a Redis outage ending, though (no heartbeat could be written during it; see
`hashring.store`). When Redis is unreachable the watcher keeps serving the last view and reports
how stale it is. When Redis comes back without its data (its epoch went back, or its incarnation
changed) the watcher keeps its ring until every worker of it has registered again, or for one
heartbeat TTL, whichever comes first: workers re-register one by one, and a reader that took the
first partial ring would move most voices twice.

No failure ends a background task: Redis down, Redis refusing commands (OOM, READONLY after a
failover), unreadable data or a stray message on the channel are logged (once per streak), kept
as `last_error`, and tried again on the next tick; only `aclose()` stops a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from hashring.errors import RingError, RingUnavailable
from hashring.loops import FailureStreak, report_end, stop_task, stray_cancel
from hashring.records import RingView, Snapshot, WorkerInfo
from hashring.store import RingStore, Subscription

__all__ = ["Heartbeat", "RingWatcher"]

log = logging.getLogger(__name__)

# How long a leaving worker tries to deregister (the writer's retries included) before it gives up
# and lets the heartbeat TTL take it out of the ring: shutdown must not hang on a dead Redis.
LEAVE_TIMEOUT_S = 3.0


def _no_load() -> int:
    return 0


class Heartbeat:
    """Keeps one worker registered and alive. `async with Heartbeat(store, info, load=fn):`

    ``resident``: the voices whose adapters the worker holds, oldest first; a beat sends the list
    only when it changed since the last beat Redis took (operators read it in `voicering status`)."""

    def __init__(self, store: RingStore, info: WorkerInfo, *, load: Callable[[], int] = _no_load,
                 resident: Callable[[], Sequence[str]] | None = None) -> None:
        self._store = store
        self._info = info
        self._load = load
        self._resident = resident
        self._listed: tuple[str, ...] | None = None  # what Redis holds for us (None: nothing yet)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._streak = FailureStreak(f"worker {info.id} heartbeat")

    @property
    def info(self) -> WorkerInfo:
        return self._info

    @property
    def last_error(self) -> Exception | None:
        """Why the latest heartbeat failed; None once one succeeds."""
        return self._streak.error

    async def start(self) -> int:
        """Register (retrying with backoff) and start heartbeating; returns the epoch."""
        epoch = await self._store.register(self._info)
        self._listed = None  # a registration clears the list
        self._closing = False
        self._task = asyncio.create_task(self._run(), name=f"ring-heartbeat:{self._info.id}")
        self._task.add_done_callback(report_end(lambda: self._closing))
        return epoch

    async def set_draining(self, draining: bool = True) -> int:
        """Take no new voices (or take them again); streams in progress are not touched. This is
        the worker's own drain: if it dies before leaving, its next registration undoes it."""
        return await self._store.set_draining(self._info.id, draining, own=True)

    async def aclose(self, *, deregister: bool = True) -> None:
        """Stop heartbeating and, by default, leave the ring at once (else the TTL removes it)."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)
        if deregister:
            try:
                async with asyncio.timeout(LEAVE_TIMEOUT_S):
                    await self._store.deregister(self._info.id)
            except RingError as exc:
                log.warning("worker %s could not leave the ring cleanly (the heartbeat TTL takes it out): %s",
                            self._info.id, exc.message)
            except TimeoutError:
                log.warning("worker %s could not leave the ring within %.0f s (Redis unreachable?); the heartbeat "
                            "TTL takes it out", self._info.id, LEAVE_TIMEOUT_S)

    async def __aenter__(self) -> Heartbeat:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> None:
        # A failed beat is retried on the next tick, never later: a worker silent for the TTL
        # leaves every reader's ring, so backing off past it would turn a blip into an outage.
        wid = self._info.id
        interval, ttl = self._store.settings.heartbeat_interval_s, self._store.settings.heartbeat_ttl_s
        while not self._closing:
            due = time.monotonic() + interval
            await asyncio.sleep(interval)
            late = time.monotonic() - due
            if late > max(interval, ttl / 5):  # the event loop was blocked: readers drop a worker silent for the TTL
                log.warning("worker %s heartbeat ran %.1f s late (event loop blocked or starved); a worker "
                            "silent for %.1f s leaves the ring", wid, late, ttl, extra={"late_s": round(late, 2)})
            try:
                resident = None if self._resident is None else tuple(self._resident())
                if await self._store.heartbeat(wid, self._load(), None if resident == self._listed else resident) < 0:
                    log.warning("Redis does not know worker %s (restarted empty?); registering again", wid)
                    self._listed = None
                    await self._store.register(self._info)
                else:
                    self._listed = resident
            except asyncio.CancelledError:
                if self._closing or not stray_cancel():
                    raise
                self._streak.failed(RingUnavailable("a heartbeat was interrupted by a stray cancellation"))
            except Exception as exc:  # kept by the streak and logged: the task must live on
                self._streak.failed(exc)
            else:
                self._streak.ok()


class RingWatcher:
    """A reader's current ring. `async with RingWatcher(store) as watcher: watcher.view`"""

    def __init__(self, store: RingStore) -> None:
        self._store = store
        self._settings = store.settings
        self._view: RingView | None = None
        self._synced_at: float | None = None
        self._error: Exception | None = None
        self._listen = FailureStreak("ring pub/sub listener")
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._incarnation = ""  # of the Redis data set the view came from ('' unknown)
        self._lost_at: float | None = None  # when this reader first saw Redis without the view's data
        self._withheld: frozenset[str] = frozenset()

    # -- what readers use -------------------------------------------------------------------------

    @property
    def view(self) -> RingView:
        """The latest ring view; raises RingUnavailable only if none was ever read."""
        if self._view is None:
            raise RingUnavailable("no ring has been read from Redis yet; is Redis up and VOICERING_REDIS_URL right?")
        return self._view

    @property
    def staleness_s(self) -> float:
        """Seconds since the view was last confirmed against Redis (inf if never)."""
        if self._synced_at is None:
            return float("inf")
        return asyncio.get_running_loop().time() - self._synced_at

    @property
    def stale_after_s(self) -> float:
        """How old the last good read may get before the view counts as stale: two refresh
        intervals (one may be lost to a slow tick) plus the Redis timeout of the read itself."""
        return 2 * self._settings.refresh_interval_s + self._settings.redis_timeout_s

    @property
    def stale(self) -> bool:
        """True when the view may be out of date: the latest read failed, or none has succeeded
        for `stale_after_s`, whatever stopped it (so a stuck refresh cannot pass for a fresh one)."""
        return self._error is not None or self.staleness_s > self.stale_after_s

    @property
    def last_error(self) -> Exception | None:
        """Why the latest read failed (a RingError, or any exception a bug raised); None once one succeeds."""
        return self._error

    @property
    def listen_error(self) -> Exception | None:
        """Why the pub/sub listener last failed; None while it is subscribed. Refreshes go on meanwhile."""
        return self._listen.error

    async def withhold(self, worker_id: str) -> None:
        """Treat `worker_id` as draining in this reader's view from now on, whatever Redis says: a
        worker draining itself while Redis is unreachable stops routing new starts to itself."""
        self._withheld |= {worker_id}
        async with self._lock:
            if self._view is not None and worker_id in self._view.ring:
                self._view = await asyncio.to_thread(self._view.without, worker_id)
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[RingView], bool], timeout: float) -> RingView:
        """Wait until the view satisfies `predicate`; raises TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout), self._changed:
            while self._view is None or not predicate(self._view):
                await self._changed.wait()
            return self._view

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> RingView:
        """Read the ring once (raises RingUnavailable if Redis is down), then keep it fresh."""
        view = await self.refresh()
        self._closing = False
        self._tasks = [
            asyncio.create_task(self._refresh_loop(), name="ring-refresh"),
            asyncio.create_task(self._listen_loop(), name="ring-listen"),
        ]
        for task in self._tasks:
            task.add_done_callback(report_end(lambda: self._closing))
        return view

    async def aclose(self) -> None:
        self._closing = True
        self._wake.set()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await stop_task(task)

    async def __aenter__(self) -> RingWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def refresh(self) -> RingView:
        """Read Redis now and swap in the new view; on failure the view is kept, the error is
        `last_error` and re-raised (RingUnavailable when Redis is down or refusing commands)."""
        async with self._lock:
            try:
                snap = await self._store.snapshot()
                if self._withheld:
                    snap = dataclasses.replace(snap, draining=snap.draining | (self._withheld & snap.live))
                view = await asyncio.to_thread(
                    RingView.from_snapshot, snap, vnodes=self._settings.vnodes, previous=self._view)
            except Exception as exc:
                self._error = exc
                raise
            held = self._hold_back(snap, view)
            if held is not None:
                assert self._view is not None
                self._error = RingUnavailable(held)
                return self._view
            if self._view is not None and view.epoch != self._view.epoch:
                log.info("ring epoch %d -> %d: %d workers in the ring", self._view.epoch, view.epoch, len(view.ring))
            self._view = view
            self._incarnation = snap.incarnation or self._incarnation
            self._synced_at = asyncio.get_running_loop().time()
            self._error = None
        async with self._changed:
            self._changed.notify_all()
        return view

    def _hold_back(self, snap: Snapshot, view: RingView) -> str | None:
        """Why the new view must not replace the cached one yet (None: take it).

        Redis lost its data (restarted without persistence, or flushed) when its epoch went back
        (epochs only grow) or its incarnation token changed. Then an empty ring is never taken
        while the epoch is behind (a legitimately empty ring, every worker gone, comes with a
        higher epoch since each of those changes bumped it), and a partial one only once every
        worker of the cached ring is back in it or a heartbeat TTL has passed since this reader
        first saw the loss (a live worker re-registers within one heartbeat interval)."""
        old = self._view
        epoch_back = old is not None and snap.epoch < old.epoch
        new_data = bool(self._incarnation and snap.incarnation and snap.incarnation != self._incarnation)
        if old is None or len(old.ring) == 0 or not (epoch_back or new_data):
            self._lost_at = None
            return None
        now = asyncio.get_running_loop().time()
        if self._lost_at is None:
            self._lost_at = now
            log.warning("Redis lost the ring's data (epoch %d -> %d, %d workers registered): it probably restarted "
                        "without persistence; keeping the last ring until its workers have registered again",
                        old.epoch, snap.epoch, len(snap.workers))
        if len(view.ring) == 0 and epoch_back:
            return (f"Redis has no ring (epoch {snap.epoch}, {len(snap.workers)} workers): it probably restarted "
                    f"without its data; serving the last ring (epoch {old.epoch}) until workers re-register")
        missing = sorted(n.id for n in old.ring.nodes if n.id not in view.ring)
        waited = now - self._lost_at
        if missing and waited < self._settings.heartbeat_ttl_s:
            return (f"Redis restarted without its data (epoch {old.epoch} -> {snap.epoch}); {len(view.ring)} of the "
                    f"last ring's {len(old.ring)} workers have registered again, waiting up to "
                    f"{self._settings.heartbeat_ttl_s - waited:.1f} s more for {', '.join(missing[:5])}"
                    f"{' ...' if len(missing) > 5 else ''} before taking the new ring")
        if missing:
            log.warning("taking the rebuilt ring without %s: not back within the heartbeat TTL (%.1f s)",
                        ", ".join(missing[:5]), self._settings.heartbeat_ttl_s)
        self._lost_at = None
        return None

    # -- background tasks -------------------------------------------------------------------------

    async def _refresh_loop(self) -> None:
        # Failures back off by themselves: the next try waits for the next interval or epoch message.
        streak = FailureStreak("ring refresh (serving the last ring meanwhile)")
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.refresh_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                await self.refresh()
            except asyncio.CancelledError:
                if self._closing or not stray_cancel():
                    raise
                streak.failed(RingUnavailable("a ring refresh was interrupted by a stray cancellation"))
            except Exception as exc:  # kept as last_error and logged: the task must live on
                streak.failed(exc)
            else:
                streak.ok()

    async def _listen_loop(self) -> None:
        retry, attempt = self._settings.retry, 0
        while not self._closing:
            subscription: Subscription | None = None
            try:
                subscription = await self._store.subscribe()
                self._wake.set()  # catch up on anything published while we were not listening
                while not self._closing:
                    epoch = await subscription.next(timeout=self._settings.refresh_interval_s)
                    self._listen.ok()
                    attempt = 0
                    if epoch is not None and (self._view is None or epoch != self._view.epoch):
                        self._wake.set()
            except Exception as exc:  # kept as listen_error and logged: subscribe again
                self._listen.failed(exc)
            finally:
                if subscription is not None:
                    await subscription.aclose()
            if not self._closing:
                await asyncio.sleep(retry.delay(min(attempt, 16)))
                attempt += 1
