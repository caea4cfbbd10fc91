"""Where an HTTP request enters the app: its arrival clock and its count, as plain ASGI.

Starlette's `@app.middleware("http")` (BaseHTTPMiddleware) runs the app in a task of its own and
relays every body chunk through a memory stream: a cost on every streamed audio chunk of a speech
response. This wrapper only watches `http.response.start` go by. It stamps the arrival time in the
request's state (`received`, perf_counter seconds) before authentication and body parsing, so the
speech route can say in `Server-Timing` how long the gateway held a request before the worker's
audio, separately from the worker's own time to first audio.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["RequestEdge", "received_at"]


def received_at(request: Request) -> float:
    """When the request reached the app (perf_counter seconds); now, if it came another way."""
    return request.scope.get("state", {}).get("received", time.perf_counter())


class RequestEdge:
    def __init__(self, app: ASGIApp, *, count: Callable[[Scope, int], None]) -> None:
        self.app = app
        self._count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["received"] = time.perf_counter()
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self._count(scope, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            if not started:  # the server answers 500 for it
                self._count(scope, 500)
            raise
