"""The wrong-worker proxy: a worker that does not own a voice forwards the utterance to an owner
over the worker pool (one persistent multiplexed link per peer) and relays every message back.

- **Deciding** (`Forwarder.should_forward`): forward when the ring has workers and this worker is
  not among the voice's placement owners (a draining worker is in no placement, so it forwards
  everything new). A start that already carries a hop marker (``proxied_by``) is never forwarded
  again: an owner that disagrees about ownership serves it itself, so no request ever loops. A
  start a ring-aware pool placed (``placed``) is never forwarded either: that pool already chose
  this worker among the owners or, with them full or failed, past them, and a relay back to the
  owner it avoided would only add a hop. Such a start for a voice this worker does not own is a
  spill: it is reported to the cool loop (`HeatRecorder.spilled`), which raises the voice's
  replicas. The relay remains for callers that do not know the ring (no marker).
- **Relaying** (`ProxiedUtterance`): the caller's context keeps every local limit (it is an
  `Utterance`: text limits, backlog, idle timeout); flushed segments go to the owner as they come;
  audio comes back re-tagged with the caller's context id only (no PCM re-encode), and the owner's
  `done` (with ``served_by``/``proxied``) or `error` is relayed as it came. A caller that cancels
  or disconnects cancels the owner's context (its engine request is aborted there). Each relayed
  chunk's time here, from the pool's reader taking it off the owner's link to its queueing on the
  caller's connection outbox, is observed in ``voicering_worker_relay_seconds``.
- **Failing over**: the pool retries another owner until the first audio reached the caller; if
  no owner can take it before then (all down, ejected, busy), this worker speaks it itself. After
  the first audio a lost owner ends the context with ``worker_lost`` (not retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from gpu_worker.client import WorkerRequestError
from gpu_worker.errors import WorkerError
from gpu_worker.protocol import AudioChunk, Done, Error, Start
from gpu_worker.session import _END, Backlog, Send, SessionDeps, Utterance
from hashring.errors import EmptyRing, InvalidVoiceId
from hashring.placement import place

if TYPE_CHECKING:
    from gpu_worker.pool import PoolStream, WorkerPool
    from hashring.membership import RingWatcher
    from hashring.placement import HeatRecorder
    from hashring.settings import RingSettings

log = logging.getLogger(__name__)

CANCEL_TIMEOUT_S = 2.0


class Forwarder:
    """This worker's view of who owns a voice, and the pool that reaches the owners."""

    def __init__(self, worker_id: str, watcher: RingWatcher, ring_settings: RingSettings, pool: WorkerPool,
                 heat: HeatRecorder | None = None) -> None:
        self.worker_id = worker_id
        self.watcher = watcher
        self.ring_settings = ring_settings
        self.pool = pool
        self.heat = heat  # where spills are reported (None: not reported)
        self.spills = 0  # placed starts this worker served for voices it does not own

    def should_forward(self, start: Start) -> bool:
        if start.proxied_by is not None:
            return False  # one hop at most
        view = self.watcher.view
        if not len(view.ring):
            return False
        try:
            owners = place(view, start.voice, self.ring_settings).owners
        except (EmptyRing, InvalidVoiceId):
            return False  # the local path gives the client the clear error
        if self.worker_id in owners:
            return False
        if start.placed:  # the pool decided: serve it, and tell the cool loop the voice spilled
            self.spills += 1
            if self.heat is not None:
                self.heat.spilled(start.voice)
            return False
        return True


class ProxiedUtterance(Utterance):
    """A caller's context served by another worker, relayed through this one."""

    def __init__(self, start: Start, deps: SessionDeps, send: Send, forwarder: Forwarder,
                 backlog: Backlog | None = None) -> None:
        super().__init__(start, deps, send, backlog=backlog)
        self._forwarder = forwarder
        self._start = start
        self._handed: list[object] = []  # segments given to the owner, kept until its first audio
        self._relayed_audio = False

    async def run(self) -> None:
        try:
            stream = await self._forwarder.pool.start(
                self.voice_id, options=self._start.options, proxied_by=self._forwarder.worker_id,
                exclude={self._forwarder.worker_id})
        except WorkerRequestError as exc:
            if not exc.retryable:
                await self._end_with(exc.error)
                return
            await self._serve_here(f"no owner could take it ({exc.error.code})")
            return
        feeder = asyncio.create_task(self._feed(stream), name=f"proxy-feed-{self.context_id}")
        relay = asyncio.create_task(self._relay(stream), name=f"proxy-relay-{self.context_id}")
        try:
            await asyncio.wait({feeder, relay}, return_when=asyncio.FIRST_EXCEPTION)
            if not relay.done():  # the feeder failed: this context's own limit (idle timeout)
                raise feeder.exception()
            await relay
        except WorkerRequestError as exc:
            if exc.retryable and not self._relayed_audio:
                await _stop(feeder)
                await self._serve_here(f"the owners failed before any audio ({exc.error.code})")
                return
            await self._end_with(exc.error)
        except WorkerError as exc:
            await self._end_with(Error(exc.code, exc.message, exc.retryable, self.context_id))
        finally:
            await _stop(feeder)
            await _stop(relay)
            if stream.done is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(stream.cancel()), CANCEL_TIMEOUT_S)

    async def _feed(self, stream: PoolStream) -> None:
        """Hand each flushed segment to the owner as it comes; the idle timeout applies here too."""
        while True:
            item = await self._next_segment()
            self._handed.append(item)
            if item is _END:
                await stream.end()
                return
            text, chars = item
            self._hold(-chars)  # the owner holds it now
            await stream.push(text)
            await stream.flush()

    async def _relay(self, stream: PoolStream) -> None:
        metrics = self.deps.metrics
        async for pcm in stream.audio():
            self._relayed_audio = True
            self._handed.clear()  # audio reached the caller: no serving it here any more
            await self._send(AudioChunk(self.context_id, self._seq, pcm))
            self._seq += 1
            if metrics is not None and stream.last_chunk_received_at is not None:  # off the owner's link -> our outbox
                metrics.relay_seconds.observe(time.perf_counter() - stream.last_chunk_received_at)
        done = stream.done
        if done is not None and self.claim_end():
            await self._send(Done(self.context_id, done.stats, done.reason))
            self._record_proxied(done.reason)

    async def _serve_here(self, why: str) -> None:
        """No owner took it before any audio: speak it on this worker (segments handed out come back)."""
        log.warning("context %s (voice %s): %s; serving it here", self.context_id, self.voice_id, why,
                    extra={"context_id": self.context_id, "voice": self.voice_id})
        handed, self._handed = self._handed, []
        for item in handed:
            if item is not _END:
                self._hold(item[1])  # back in this context's backlog
        queue: asyncio.Queue[object] = asyncio.Queue()
        for item in [*handed, *_drain(self._segments)]:
            queue.put_nowait(item)
        self._segments = queue
        self.proxied = False
        await super().run()

    async def _end_with(self, error: Error) -> None:
        if self.claim_end():
            await self._send(Error(error.code, error.message, error.retryable, self.context_id))
            self._record_proxied(error.code)

    def _record_proxied(self, outcome: str) -> None:
        if self.deps.metrics is not None:
            self.deps.metrics.proxied.labels(outcome).inc()


async def _stop(task: asyncio.Task) -> None:
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _drain(queue: asyncio.Queue) -> list[object]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items
