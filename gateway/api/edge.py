"""Where an HTTP request enters the app: its arrival clock, its count and its body, as plain ASGI.

Starlette's `@app.middleware("http")` (BaseHTTPMiddleware) runs the app in a task of its own and
relays every body chunk through a memory stream: a cost on every streamed audio chunk of a speech
response. This wrapper only watches `http.response.start` go by. It stamps the arrival time in the
request's state (`received`, perf_counter seconds) before authentication and body parsing, so the
speech route can say in `Server-Timing` how long the gateway held a request before the worker's
audio, separately from the worker's own time to first audio.

Bodies: no route lets FastAPI parse a body for it (FastAPI reads the whole body before any
dependency runs, so a stranger could make the gateway buffer gigabytes before its 401). Routes
authenticate first, then read their body with `read_body`, which refuses a declared length over
the route's limit before reading a byte and counts a chunked body as it streams (413), within
`body_timeout_s` (408). A request answered before its declared body was read (401, 413, 404...)
leaves with `Connection: close`, so the server reads none of the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import ApiError

__all__ = ["RequestEdge", "read_body", "received_at"]


def received_at(request: Request) -> float:
    """When the request reached the app (perf_counter seconds); now, if it came another way."""
    return request.scope.get("state", {}).get("received", time.perf_counter())


def _declares_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


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
        body_unread = _declares_body(scope)

        async def watched_receive() -> Message:
            nonlocal body_unread
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_unread = False
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self._count(scope, message["status"])
                if body_unread:  # answered before its body: read none of the rest
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, watched_receive, watched)
        except Exception:
            if not started:  # the server answers 500 for it
                self._count(scope, 500)
            raise


async def read_body(request: Request, limit: int, *, timeout_s: float) -> bytes:
    """The request's whole body, at most `limit` bytes (ApiError 413 beyond, 408 when it takes longer
    than `timeout_s`). Call it after authentication: nothing is read before."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise ApiError(400, "Content-Length is not a number", code="invalid_content_length")
        if int(declared) > limit:
            raise _too_large(int(declared), limit)
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(size, limit, counted=True)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s; send it at once",
                       code="request_timeout", retryable=False) from None
    except ClientDisconnect:
        raise ApiError(400, "the client went away before its body was read", code="client_disconnected") from None
    return b"".join(chunks)


def _too_large(size: int, limit: int, *, counted: bool = False) -> ApiError:
    what = f"more than {limit}" if counted else str(size)
    return ApiError(413, f"the request body is {what} bytes; the most this route takes is {limit}: "
                    "send less (split the text into several requests)", code="request_too_large",
                    retryable=False)
