"""The wrong-worker proxy: a worker that does not own a voice forwards the context to an owner
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
- **Relaying** (`RelayedContext`): the caller's context keeps every local limit (it is an
  `Context`: text limits, backlog, idle timeout); flushed segments go to the owner as they come;
  audio comes back re-tagged with the caller's context id only (no PCM re-encode), and the owner's
  `done` (with ``served_by``/``proxied``) or `error` is relayed as it came. A caller that cancels
  or disconnects cancels the owner's context (its engine request is aborted there). Each relayed
  chunk's time here, from the pool's reader taking it off the owner's link to its queueing on the
  caller's connection outbox, is observed in ``voicering_worker_relay_seconds``.
- **Idle time** is the caller's: a relayed context is idle only while neither text comes in nor
  audio comes back (the clock restarts at every relayed chunk, as a local context's restarts when
  speaking stops), so ``idle_timeout_s`` never ends a context whose owner is still speaking.
- **Failing over**: the pool retries another owner until the first audio reached the caller; if
  no owner can take it before then (all down, ejected, busy), this worker speaks it itself. After
  the first audio a lost owner ends the context with ``worker_lost`` (not retryable).
- **A slow owner is this hop's to give up on**: the caller (a gateway's pool) waits
  ``first_audio_timeout_s`` (30 s) for the first audio, and so would this worker's pool for the
  owner's, so both clocks would fire together and the caller would blame (eject) this worker.
  The relay's own deadline (``Forwarder.first_audio_timeout_s``, `RELAY_TIMEOUT_S`,
  checked below its pool's) fires first: the owner's context is cancelled and the caller gets a
  retryable ``worker_timeout`` answer, which its pool takes as an answer (it tries another
  worker) and not as a failure of this one.
- **Tracing**: the relay is a span of the request's trace (the caller's ``traceparent``'s child);
  the owner is sent this span as its ``traceparent``, so its span is the relay's child. At its
  end the relay logs one hop line, ``hop=entry``, naming the owner it relayed to (``to``) and
  its own timings; a fallback to this worker's engine is a child span of the relay's
  (``hop=owner`` on this worker, ``outcome=served_here`` on the entry line).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from gpu_worker.client import WorkerRequestError
from gpu_worker.errors import WorkerError
from gpu_worker.protocol import Alignment, AudioChunk, Done, Error, Start
from gpu_worker.context import END_OF_SEGMENTS, Backlog, Context, ContextDeps, Send
from gpu_worker.settings import RELAY_TIMEOUT_S
from gpu_worker.trace_context import current, log_hop
from hashring.errors import EmptyRing, InvalidVoiceId
from hashring.placement import place

if TYPE_CHECKING:
    from gpu_worker.client.pool import PoolStream, WorkerPool
    from hashring.membership import RingWatcher
    from hashring.placement import HeatRecorder
    from hashring.settings import RingSettings

log = logging.getLogger(__name__)

CANCEL_TIMEOUT_S = 2.0


class RelayTimeout(WorkerError):
    """The owner sent no audio within the relay's first-audio deadline (retryable: another worker may)."""

    code = "worker_timeout"
    retryable = True


Route = Literal["serve", "relay", "spill"]


class Forwarder:
    """This worker's view of who owns a voice, and the pool that reaches the owners."""

    def __init__(self, worker_id: str, watcher: RingWatcher, ring_settings: RingSettings, pool: WorkerPool,
                 heat: HeatRecorder | None = None, *,
                 first_audio_timeout_s: float | None = RELAY_TIMEOUT_S) -> None:
        """``first_audio_timeout_s``: the longest a relayed context waits for the owner's first audio
        once asked to speak (None: the pool's own clock only); it must stay below the pool's, and
        below the callers' (the gateway's pool), so that this hop answers before theirs fire."""
        outer = pool.settings.first_audio_timeout_s
        if first_audio_timeout_s is not None and (first_audio_timeout_s <= 0
                                                  or (outer is not None and first_audio_timeout_s >= outer)):
            raise ValueError(f"the relay's first_audio_timeout_s ({first_audio_timeout_s}) must be > 0 and below the "
                             f"pool's first_audio_timeout_s ({outer}), or the outer hop's clock fires first")
        self.first_audio_timeout_s = first_audio_timeout_s
        self.worker_id = worker_id
        self.watcher = watcher
        self.ring_settings = ring_settings
        self.pool = pool
        self.heat = heat  # where spills are reported (None: not reported)
        self.spills = 0  # placed starts this worker served for voices it does not own

    def should_forward(self, start: Start) -> bool:
        """Whether this worker relays `start` to an owner (it serves it itself otherwise)."""
        return self.decide(start) == "relay"

    def spilled(self, start: Start) -> None:
        """Count a spill this worker admitted (never one it refused: the pool's next try is elsewhere)."""
        self.spills += 1
        if self.heat is not None:
            self.heat.spilled(start.voice)

    def decide(self, start: Start) -> Route:
        """Serve `start` here, relay it to an owner, or serve it here as a spill (a placed start
        for a voice this worker does not own: counted with `spilled` once admitted)."""
        if start.proxied_by is not None:
            return "serve"  # one hop at most
        view = self.watcher.view
        if not len(view.ring):
            return "serve"
        try:
            owners = place(view, start.voice, self.ring_settings).owners
        except (EmptyRing, InvalidVoiceId):
            return "serve"  # the local path gives the client the clear error
        if self.worker_id in owners:
            return "serve"
        return "spill" if start.placed else "relay"  # placed: the pool decided, serve it (and report the spill)


class RelayedContext(Context):
    """A caller's context served by another worker, relayed through this one."""

    def __init__(self, start: Start, deps: ContextDeps, send: Send, forwarder: Forwarder,
                 backlog: Backlog | None = None, claim_slot: Callable[[], None] | None = None) -> None:
        """``claim_slot``: takes an engine slot on this worker for a local fallback (raises `Busy` when none)."""
        super().__init__(start, deps, send, backlog=backlog)
        self._forwarder = forwarder
        self._claim_slot = claim_slot
        self._start = start
        self._handed: list[object] = []  # segments given to the owner, kept until its first audio
        self._relayed_audio = False
        self._asked = asyncio.Event()  # the owner was handed text to speak
        self._audio_came = asyncio.Event()  # its first audio was relayed
        self._relay_trace = self.trace  # the relay's span (a fallback here speaks in a child of it)
        self._owner = ""  # the worker it relayed to, last
        self._outcome = "cancelled"

    async def run(self) -> None:
        token = current.set(self._relay_trace)
        try:
            await self._run()
        finally:
            log_hop(log, self.hop("entry", self._outcome, trace=self._relay_trace, to=self._owner))
            current.reset(token)

    async def _run(self) -> None:
        try:
            stream = await self._forwarder.pool.start(
                self.voice_id, options=self._start.options, proxied_by=self._forwarder.worker_id,
                exclude={self._forwarder.worker_id}, traceparent=self._relay_trace.traceparent)
        except WorkerRequestError as exc:
            if not exc.retryable:
                await self._end_with(exc.error)
                return
            await self._serve_here(f"no owner could take it ({exc.error.code})")
            return
        self._owner = stream.worker_id or ""
        feeder = asyncio.create_task(self._feed(stream), name=f"proxy-feed-{self.context_id}")
        watch = asyncio.create_task(self._watch_first_audio(stream), name=f"proxy-first-audio-{self.context_id}")
        relay = asyncio.create_task(self._relay(stream), name=f"proxy-relay-{self.context_id}")
        try:
            await _first_failure(relay, (feeder, watch))  # a helper's failure is this context's own limit
        except WorkerRequestError as exc:
            if exc.retryable and not self._relayed_audio:
                await _stop(feeder)
                await _stop(watch)
                await self._serve_here(f"the owners failed before any audio ({exc.error.code})")
                return
            await self._end_with(exc.error)
        except WorkerError as exc:  # idle timeout, or the owner too slow to answer (RelayTimeout)
            if isinstance(exc, RelayTimeout):
                log.warning("context %s (voice %s): %s", self.context_id, self.voice_id, exc.message,
                            extra={"context_id": self.context_id, "voice": self.voice_id})
            await self._end_with(Error(exc.code, exc.message, exc.retryable, self.context_id))
        finally:
            await _stop(feeder)
            await _stop(watch)
            await _stop(relay)
            if stream.done is None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CANCEL_TIMEOUT_S):
                        await asyncio.shield(stream.cancel())

    async def _feed(self, stream: PoolStream) -> None:
        """Hand each flushed segment to the owner as it comes; the idle timeout applies here too."""
        while True:
            item = await self._next_segment()
            self._handed.append(item)
            if item is END_OF_SEGMENTS:
                await stream.end()
                return
            text, chars = item
            self._hold(-chars)  # the owner holds it now
            await stream.push(text)
            await stream.flush()
            self._asked.set()

    async def _watch_first_audio(self, stream: PoolStream) -> None:
        """Raise `RelayTimeout` when the owner, asked to speak, sends no audio in time (the pool's
        retries to other owners included), so this hop answers before the caller's clock fires."""
        limit = self._forwarder.first_audio_timeout_s
        if limit is None:
            return
        await self._asked.wait()
        try:
            async with asyncio.timeout(limit):
                await self._audio_came.wait()
        except TimeoutError:
            raise RelayTimeout(f"the voice's owner (worker {stream.worker_id}) sent no audio within {limit:g} s of "
                               "being asked to speak; retry (another worker may take it)") from None

    async def _relay(self, stream: PoolStream) -> None:
        metrics = self.deps.metrics
        async for pcm in stream.events():
            if isinstance(pcm, Alignment):  # the owner's word timings, in order with its audio
                await self._send(replace(pcm, context_id=self.context_id))
                continue
            self._owner = stream.worker_id or ""
            if not self._relayed_audio:
                self._first_audio_at = time.perf_counter()
                self._relayed_audio = True
                self._audio_came.set()
                self._handed.clear()  # audio reached the caller: no serving it here any more
            self._last_activity = time.monotonic()  # the owner is speaking: this context is not idle
            await self._send(AudioChunk(self.context_id, self._seq, pcm))
            self._seq += 1
            if metrics is not None and stream.last_chunk_received_at is not None:  # off the owner's link -> our outbox
                metrics.relay_seconds.observe(time.perf_counter() - stream.last_chunk_received_at)
        done = stream.done
        self._owner = stream.worker_id or ""
        if done is not None and self.claim_end():
            self._outcome = done.reason
            await self._send(Done(self.context_id, done.stats, done.reason))
            self._record_proxied(done.reason)

    async def _serve_here(self, why: str) -> None:
        """No owner took it before any audio: speak it on this worker (segments handed out come back)."""
        log.warning("context %s (voice %s): %s; serving it here", self.context_id, self.voice_id, why,
                    extra={"context_id": self.context_id, "voice": self.voice_id})
        self._outcome = "served_here"
        self.trace = self._relay_trace.child()  # this engine's span, under the relay's
        if self._claim_slot is not None:
            try:
                self._claim_slot()  # it is this engine's stream now: counted in max_streams and the load (M2)
            except WorkerError as exc:
                await self._end_with(Error(exc.code, exc.message, exc.retryable, self.context_id))
                return
        handed, self._handed = self._handed, []
        for item in handed:
            if item is not END_OF_SEGMENTS:
                self._hold(item[1])  # back in this context's backlog
        queue: asyncio.Queue[object] = asyncio.Queue()
        for item in [*handed, *_drain(self._segments)]:
            queue.put_nowait(item)
        self._segments = queue
        self.proxied = False
        await super().run()

    async def _end_with(self, error: Error) -> None:
        self._outcome = error.code
        if self.claim_end():
            await self._send(Error(error.code, error.message, error.retryable, self.context_id))
            self._record_proxied(error.code)

    def _record_proxied(self, outcome: str) -> None:
        if self.deps.metrics is not None:
            self.deps.metrics.proxied.labels(outcome).inc()


async def _first_failure(main: asyncio.Task, helpers: tuple[asyncio.Task, ...]) -> None:
    """Wait for ``main`` (raising what it raised); a helper that fails first raises its error here
    instead, and a helper that ends well is simply done."""
    pending = {main, *helpers}
    while not main.done():
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not main and not task.cancelled() and task.exception() is not None:
                raise task.exception()
    main.result()


async def _stop(task: asyncio.Task) -> None:
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _drain(queue: asyncio.Queue) -> list[object]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items
