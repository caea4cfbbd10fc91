"""One context through the pool (`PoolStream`): its candidates, its tries, its retries.

**Candidates.** At its first try the stream asks the router once for its candidates, best first
(`Router.candidates`: for the ring, up to `owner_tries` owners by two random choices, then ring
successors). Workers this context already tried, ejected workers and workers in reconnect
back-off are skipped; if *every* worker is ejected or backing off, they are tried anyway (Envoy's
panic mode): a lone worker that restarts is found again without waiting out its ejection.

**Refusals.** A `busy` answer moves the context to its next candidate (or, when the link held
other contexts, to another connection to the same worker: the per-connection share). It does
not count against the worker's health, nor as one of `max_attempts` (the failed tries: dials
that fail, connections lost, worker errors, no first audio in time); refusals have their own
bound, `max_refusals`, after which the last `busy` is raised. The last candidate tried after at
least one refusal is sent `insist` (on a version-2 link only): that worker skips its fleet-share
rule (its capacity still holds). A worker that refused only for its fleet share (`busy` with
`limit: share`: a preference, it has room) is tried again, insisting, once every other candidate
has refused or is gone: a request that fits somewhere is never turned away for balance.

**Retry before audio.** Until the first audio chunk has been handed to the caller, a retryable
failure sends the context to its next candidate, replaying what was pushed so far (start text,
pushes, flushes, end). From the first chunk on there is no retry: a lost connection ends the
stream with `WorkerLost` and any worker error is raised as it came, so audio is never duplicated
or spliced from two workers.

**Hung and stalled workers.** A context asked to speak (a flush or its end, with text) that
gets no first audio within `first_audio_timeout_s` is cancelled there, the worker is ejected and
the context retried elsewhere (`worker_timeout` if no other worker takes it). After its first
audio, while the worker owes audio (the context has ended and no `done` came, or text was
flushed after the last chunk), a gap longer than `stall_timeout_s` ends the stream with
`worker_timeout` (retryable by the caller: the context is over, nothing of it is retried here,
since the caller has part of its audio): the context is cancelled on the worker, the failure
counts toward its ejection, and the link stays up for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Collection, Iterator
from dataclasses import replace

from websockets.exceptions import ConnectionClosed

from gpu_worker.client.connection import AudioEvents, WorkerRequestError
from gpu_worker.client.links import DIAL_ERRORS, Attempt, Links, Peer, Received
from gpu_worker.client.types import NoWorkerAvailable, NoWorkerServing, WorkerLost
from gpu_worker.protocol import Alignment, Cancel, ClientMessage, Done, End, Error, Flush, PushText, Rejected, Start
from hashring.records import WorkerInfo

__all__ = ["PoolStream"]

log = logging.getLogger(__name__)

_FAILURE_CODES = frozenset({"engine_error", "internal"})  # worker-side failures that count toward ejection


class PoolStream(AudioEvents):
    """One context through the pool: push/flush/end/cancel, then iterate `audio()` (or `events()`:
    the audio and, in order with it, the `Alignment`s of a start that asked for word timings;
    `audio()` gathers those in `alignments`); `done` holds the worker's stats. `worker_id` is the worker serving it now, `attempts` the tries so far
    (`refusals` of them answered `busy`); `last_chunk_received_at` is when the connection's reader
    took the chunk `audio()` yielded last off the socket (perf_counter), so a relay can time its
    own share of each chunk's trip."""

    def __init__(self, links: Links, voice: str, start: Start, exclude: Collection[str] = ()) -> None:
        self._links = links
        self.voice = voice
        self._start = start
        self._log: list[ClientMessage] | None = [start]  # replayed on a retry; dropped at the first audio
        self._lock = asyncio.Lock()
        self._attempt: Attempt | None = None
        self._exclude = frozenset(exclude)
        self._tried: set[str] = set(exclude)
        self._candidates: Iterator[WorkerInfo] | None = None
        self._ahead: list[WorkerInfo] = []  # candidates drawn to look ahead, not tried yet
        self._skipped: list[WorkerInfo] = []  # candidates skipped as ejected or backing off (panic mode tries them)
        self._again: WorkerInfo | None = None  # a per-connection `busy`: the same worker, on another connection
        self._shy: list[WorkerInfo] = []  # refused it for their fleet share only: tried again, insisting, last
        self._revisit = False  # the try being opened goes back to a worker that refused it for share
        self._owners: frozenset[str] | None = None
        self._cancelled = False
        self._ended_at: float | None = None  # when `end` was sent, monotonic
        self.attempts = 0
        self.refusals = 0
        self.done: Done | None = None
        self.rejected: list[Rejected] = []  # messages of this context a worker refused (no effect)
        self.alignments: list[Alignment] = []  # word timings `audio()` passed over
        self.started_at = time.perf_counter()
        self.first_audio_at: float | None = None
        self.last_chunk_received_at: float | None = None
        self._asked_at: float | None = None  # when the current try was last asked to speak (flush/end), monotonic
        self._heard_at: float | None = None  # when the last chunk was handed to the caller, monotonic
        # text sent since the last flush: only a flush or end with something to say asks the worker to
        # speak (an empty flush has no audio to wait for: the caller, not the worker, would be timed out)
        self._unspoken = bool(start.text.strip())

    @property
    def context_id(self) -> str:
        return self._attempt.context_id if self._attempt else ""

    @property
    def opened_at(self) -> float | None:
        """When a worker took this context (its `opened`, perf_counter): routing's part ends there."""
        return self._attempt.opened_at if self._attempt else None

    @property
    def worker_id(self) -> str | None:
        return self._attempt.link.peer.id if self._attempt else None

    async def push(self, text: str) -> None:
        await self._send(PushText(self.context_id, text))

    async def flush(self) -> None:
        await self._send(Flush(self.context_id))

    async def end(self) -> None:
        await self._send(End(self.context_id))

    async def cancel(self) -> None:
        self._cancelled = True
        await self._send(Cancel(self.context_id))

    async def _items(self, *, words: bool) -> AsyncIterator[bytes | Alignment]:
        while True:
            attempt = self._attempt
            assert attempt is not None
            try:
                item = attempt.queue.get_nowait()  # what has arrived is never timed out
            except asyncio.QueueEmpty:
                try:  # asyncio.timeout, not wait_for: on 3.11 wait_for costs a task and two loop turns per chunk
                    async with asyncio.timeout(self._wait()):
                        item = await attempt.queue.get()
                except TimeoutError:
                    if self._log is None:
                        await self._stalled(attempt)  # raises
                    await self._timed_out(attempt)
                    continue
            if isinstance(item, Received):
                chunk = item.chunk
                if chunk.seq != attempt.next_seq:
                    await self.cancel()
                    raise WorkerRequestError(Error("internal", f"audio chunk {chunk.seq} arrived where {attempt.next_seq}"
                                                               " was due", False, attempt.context_id))
                attempt.next_seq += 1
                if self.first_audio_at is None:
                    self.first_audio_at = time.perf_counter()
                    self._log = None  # audio reached the caller: no retry from here on
                self.last_chunk_received_at = item.at
                self._heard_at = time.monotonic()
                yield chunk.pcm
            elif isinstance(item, Rejected):
                self.rejected.append(item)
            elif isinstance(item, Alignment):  # after audio: never a reason to retry
                if words:
                    yield item
                else:
                    self.alignments.append(item)
            elif isinstance(item, Done):
                self._links.succeeded(attempt.link.peer)
                self.done = item
                return
            elif self._cancelled:
                return  # cancelled: whatever ended it, there is nothing more to say
            elif isinstance(item, Error):
                if item.code in _FAILURE_CODES:
                    self._links.failed(attempt.link.peer, item.code)
                if not item.retryable or self._log is None:
                    raise WorkerRequestError(item)
                if item.code == "busy":
                    self.refusals += 1
                await self._retry(attempt, item)
            else:  # LOST
                if self._log is None:
                    raise WorkerLost(attempt.context_id, attempt.link.peer.id)
                await self._retry(attempt, None)

    # -- clocks -----------------------------------------------------------------------------------

    def _wait(self) -> float | None:
        """How long the next wait may take: before the first audio, bounded while audio is due
        (`first_audio_timeout_s`); after it, while the worker owes audio (`stall_timeout_s`)."""
        settings = self._links.settings
        if self._cancelled:
            return None
        if self._log is not None or self._heard_at is None:
            if self._asked_at is None or settings.first_audio_timeout_s is None:
                return None
            return max(0.0, self._asked_at + settings.first_audio_timeout_s - time.monotonic())
        heard = self._heard_at
        owed = self._ended_at is not None or (self._asked_at is not None and self._asked_at > heard)
        if not owed or settings.stall_timeout_s is None:
            return None  # all that was asked for has come: silence is the caller's, not the worker's
        since = max(t for t in (heard, self._asked_at, self._ended_at) if t is not None)
        return max(0.0, since + settings.stall_timeout_s - time.monotonic())

    async def _cancel_there(self, attempt: Attempt) -> None:
        """Cancel the context on its worker and stop listening to it."""
        if attempt.link.contexts.pop(attempt.context_id, None) is not None:
            with contextlib.suppress(ConnectionClosed):
                await attempt.link.ws.send(self._links.frame(Cancel(attempt.context_id)), text=True)

    async def _timed_out(self, attempt: Attempt) -> None:
        """No first audio in time: give up on this worker (cancel there, eject it) and retry."""
        peer, limit = attempt.link.peer, self._links.settings.first_audio_timeout_s
        await self._cancel_there(attempt)
        self._links.eject(peer, f"no first audio within {limit:.0f} s")
        await self._retry(attempt, Error("worker_timeout", f"worker {peer.id} sent no audio within {limit:.0f} s of "
                                                           "being asked to speak", True, attempt.context_id))

    async def _stalled(self, attempt: Attempt) -> None:
        """Audio stopped while the worker owes more: end this context (never retried: the caller
        has part of it), cancel it there, count a failure; the link carries on for the others."""
        peer, limit = attempt.link.peer, self._links.settings.stall_timeout_s
        await self._cancel_there(attempt)
        self._links.failed(peer, f"a context stalled for {limit:.0f} s")
        log.warning("context %s on worker %s: no audio for %.0f s while more was due; ended", attempt.context_id,
                    peer.id, limit)
        raise WorkerRequestError(Error("worker_timeout", f"worker {peer.id} stopped sending audio mid-context (nothing "
                                                         f"for {limit:.0f} s while more was due); the context was "
                                                         "cancelled there: retry it", True, attempt.context_id))

    # -- sending ----------------------------------------------------------------------------------

    async def _send(self, message: ClientMessage) -> None:
        async with self._lock:
            attempt = self._attempt
            frame = self._links.frame(_for(message, attempt.context_id) if attempt else message)  # refused: no effect
            if isinstance(message, PushText) and message.text.strip():
                self._unspoken = True
            elif isinstance(message, Flush | End) and self._unspoken:
                self._asked_at, self._unspoken = time.monotonic(), False
            if isinstance(message, End):
                self._ended_at = time.monotonic()  # the worker owes the rest of the audio and `done` from now
            if self._log is not None:
                self._log.append(message)
            if attempt is None or attempt.context_id not in attempt.link.contexts:
                return  # the context is over; audio() retries with the log or reports why
            try:
                await attempt.link.ws.send(frame, text=True)
            except ConnectionClosed:
                pass  # the reader queues LOST: audio() retries or ends with worker_lost

    # -- tries ------------------------------------------------------------------------------------

    async def _retry(self, failed: Attempt, error: Error | None) -> None:
        if failed.connection_busy:  # the connection's share, not the worker, was full: another connection there
            self._again = failed.link.peer.info
        else:
            self._tried.add(failed.link.peer.id)
            if error is not None and error.code == "busy" and error.limit == "share" and failed.link.version >= 2:
                self._shy.append(failed.link.peer.info)  # a preference, not a refusal: it has room if it must
        log.info("context %s: %s on worker %s before any audio; retrying", failed.context_id,
                 error.code if error else "connection lost", failed.link.peer.id)
        await self._open(error)

    async def _open(self, last_error: Error | None) -> None:
        """Route, connect and replay the log, until one worker takes it or the tries run out."""
        links, settings = self._links, self._links.settings
        async with self._lock:
            while True:
                if links.closing:
                    raise NoWorkerAvailable("the pool is closed")
                if self.attempts - self.refusals >= settings.max_attempts:
                    self._give_up(last_error, f"{self.attempts - self.refusals} failed tries")
                if self.refusals > settings.max_refusals:
                    self._give_up(last_error, f"{self.refusals} refusals")
                peer = self._next_peer()
                if peer is None and not links.router.workers():
                    raise NoWorkerServing(f"no worker is serving voice {self.voice!r}: the ring has no live, undrained "
                                          "worker (every one is draining, or none has joined yet); retry shortly")
                if peer is None:
                    self._give_up(last_error, f"every worker that could take voice {self.voice!r} was tried, is "
                                              "ejected or is full")
                self.attempts += 1
                peer.opening += 1
                try:
                    link = await links.link(peer)
                except DIAL_ERRORS:
                    self._tried.add(peer.id)
                    continue
                finally:
                    peer.opening -= 1
                if link is None:  # every connection it may have is full: a refusal the pool knew of
                    self._tried.add(peer.id)
                    self.refusals += 1
                    continue
                insist = (self.refusals > 0 and link.version >= 2
                          and (self._revisit or self.refusals >= settings.max_refusals or not self._more()))
                self._revisit = False
                attempt = Attempt(uuid.uuid4().hex[:16], link, self.voice, owner=peer.id in self._owner_ids())
                link.contexts[attempt.context_id] = attempt
                self._attempt = attempt
                links.counts.starts += 1
                links.counts.insisted += insist
                if self._asked_at is not None:  # the replay asks again: the new worker gets the full wait
                    self._asked_at = time.monotonic()
                try:
                    for message in self._log or ():  # each was measured when it was first sent
                        if isinstance(message, Start) and insist:
                            message = replace(message, insist=True)
                        await link.ws.send(links.frame(_for(message, attempt.context_id)), text=True)
                except ConnectionClosed:
                    pass  # the reader queues LOST for it: audio() comes back here
                return

    def _owner_ids(self) -> frozenset[str]:
        if self._owners is None:
            self._owners = frozenset(info.id for info in self._links.router.owners(self.voice))
        return self._owners

    def _next_peer(self) -> Peer | None:
        """The next candidate to try; None when none is left."""
        links = self._links
        if self._again is not None:
            info, self._again = self._again, None
            return links.peer(info)
        if self._candidates is None:
            links.forget_departed()
            self._candidates = links.router.candidates(self.voice, links.loads(), self._exclude)
        info = self._draw()
        if info is not None:
            return links.peer(info)
        if self._shy:  # every other candidate refused or is gone: back to one that only preferred not to
            self._revisit = True
            return links.peer(self._shy.pop(0))
        now = time.monotonic()
        if self._skipped and all(links.unavailable(w.id, now) for w in links.router.workers() if w.id not in self._exclude):
            log.warning("every worker for voice %r is ejected or backing off; trying them anyway (panic)", self.voice)
            return links.peer(self._skipped.pop(0))
        return None

    def _draw(self) -> WorkerInfo | None:
        """The next candidate not tried and available now (looked-ahead ones first)."""
        now = time.monotonic()
        while self._ahead or self._candidates is not None:
            if self._ahead:
                info = self._ahead.pop(0)
            else:
                info = next(self._candidates, None)
                if info is None:
                    return None
            if info.id in self._tried:
                continue
            if self._links.unavailable(info.id, now):
                self._skipped.append(info)
                continue
            return info
        return None

    def _more(self) -> bool:
        """Whether a candidate is left after the one being tried (it draws one ahead to know)."""
        if self._ahead:
            return True
        info = self._draw()
        if info is None:
            return False
        self._ahead.insert(0, info)
        return True

    def _give_up(self, last_error: Error | None, why: str) -> None:
        if last_error is not None:
            raise WorkerRequestError(last_error)
        raise NoWorkerAvailable(f"no worker could take voice {self.voice!r}: {why}")


def _for(message: ClientMessage, context_id: str) -> ClientMessage:
    """`message` addressed to the context of the current try."""
    return message if message.context_id == context_id else replace(message, context_id=context_id)
