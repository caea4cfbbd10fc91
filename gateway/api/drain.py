"""Stopping a gateway without cutting its text-in streams (`/v1/tts/stream`).

uvicorn closes every websocket with 1012 the moment it shuts down, so a rollout or an HPA
scale-down would cut each open context mid-sentence. At the first SIGTERM the gateway drains
instead (gateway/serve.py): it stops accepting connections, refuses new contexts on open sockets
(`error` `going_away`, retryable: the client reconnects and another gateway takes it), lets the
contexts already open finish, closing each socket with 1001 as its last context ends, and at the
grace closes whatever is left with 1001 (those contexts cancelled on the workers). Only then does
uvicorn shut down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import uvicorn

__all__ = ["GOING_AWAY", "DrainingServer", "StreamDrain"]

log = logging.getLogger(__name__)

GOING_AWAY = 1001  # websocket close code: the server is going away
POLL_S = 0.05


class DrainableSession(Protocol):
    contexts: dict

    def go_away(self) -> None:
        """Close now with 1001, cancelling what is still open."""


class StreamDrain:
    """The open stream sockets of one gateway process, and whether it is stopping."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self._sessions: set[DrainableSession] = set()

    def join(self, session: DrainableSession) -> None:
        self._sessions.add(session)

    def leave(self, session: DrainableSession) -> None:
        self._sessions.discard(session)

    @property
    def open_contexts(self) -> int:
        return sum(len(s.contexts) for s in self._sessions)

    @property
    def open_sockets(self) -> int:
        return len(self._sessions)

    async def drain(self, grace_s: float) -> None:
        """Refuse new contexts, wait up to `grace_s` for the open ones to end, then close every
        socket still open with 1001 and wait (briefly) until they have closed."""
        self.stopping.set()
        await self._until(lambda: not self._sessions, grace_s)
        for session in list(self._sessions):
            session.go_away()
        await self._until(lambda: not self._sessions, 5.0)

    @staticmethod
    async def _until(condition, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first SIGTERM/SIGINT drains the stream sockets (`streams()`, None
    before the app has started) for up to `grace_s` before uvicorn shuts down; HTTP requests in
    flight get what is left of the grace. A second signal stops at once, as plain uvicorn would."""

    def __init__(self, config: uvicorn.Config, streams: Callable[[], StreamDrain | None], grace_s: float) -> None:
        super().__init__(config)
        self._streams, self._grace_s = streams, grace_s
        self._asked_at: float | None = None
        self._drain: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame) -> None:
        streams = self._streams()
        if self._asked_at is None and streams is not None:
            self._asked_at = time.monotonic()  # on_tick starts the drain on the loop
            self._captured_signals.append(sig)
            # refuse new contexts from the next loop turn on (a signal handler must not touch the loop's state)
            asyncio.get_running_loop().call_soon_threadsafe(streams.stopping.set)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._asked_at is not None and self._drain is None:
            self._drain = asyncio.create_task(self._drain_streams(), name="gateway-drain")
        if self._drain is not None and self._drain.done():
            return True
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        if self._drain is not None and not self._drain.done():  # a second signal cut the drain short
            self._drain.cancel()
            await asyncio.gather(self._drain, return_exceptions=True)
        await super().shutdown(sockets)

    async def _drain_streams(self) -> None:
        for server in self.servers:
            server.close()  # no new connection lands here; those open stay
        streams = self._streams()
        log.info("stopping: draining %d stream socket(s) with %d open context(s) for up to %.0f s",
                 streams.open_sockets, streams.open_contexts, self._grace_s)
        await streams.drain(self._grace_s)
        self.config.timeout_graceful_shutdown = max(1.0, self._grace_s - (time.monotonic() - self._asked_at))
