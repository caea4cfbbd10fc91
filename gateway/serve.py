"""`voicering gateway`: the public API under uvicorn, one process, one settings object.

uvicorn runs the app with the `websockets` implementation (the text-in stream), a 64 KiB cap on
websocket messages (`WS_MAX_MESSAGE_BYTES`, above the largest legal message: a bigger one closes
the socket with 1009), and a graceful shutdown that lets streams finish for `--grace` seconds:
the first SIGTERM drains the text-in stream sockets first (gateway/api/drain.py; uvicorn alone
would close them with 1012 at once), then uvicorn stops with what is left of the grace.

The edge against slow or idle strangers: uvicorn itself has no deadline for a request head (its
keep-alive timer only runs between requests), so 300 connections that each send half a request
line hold 300 sockets forever. Both of its HTTP parsers are run here with a head deadline
(`header_timeout_s`): from the moment a connection opens, or a request begins on a kept-alive
one, it has that long to send the whole head, or it is closed. The time bounds a head, not its
bytes, and httptools buffers an unfinished header line without limit (h11 answers 400 past 16 KiB):
100 connections each holding a 4 MiB header line took a gateway from 128 to 539 MB. So a head is
also bounded in bytes (`max_head_bytes`, 60 KiB) and header fields (`max_headers`, 100), counted
as its bytes arrive, before either parser sees them, and answered 431 (OpenAI's error shape,
`request_header_fields_too_large`) and closed past either. `max_connections` bounds what is open
at once (uvicorn answers 503 past it) and `backlog` what the kernel queues.

Metrics (Prometheus text, with tenant labels) are not on the public port: a second, internal
server in the same process serves `GET /metrics` on `metrics_host:metrics_port` (127.0.0.1:8001
by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import typer

__all__ = ["command", "http_protocol", "run"]

log = logging.getLogger(__name__)

WS_MAX_MESSAGE_BYTES = 1 << 16  # > the largest legal stream message: a start of MAX_TEXT_CHARS 12-byte escapes (48 KiB) + ids, options
H11_SLACK_BYTES = 1024  # h11's own bound on a buffered head sits above ours, so ours (431) answers first
REFUSED_LINGER_S = 2.0  # after a 431, what the client still sends is read and dropped this long, then it closes


def http_protocol(kind: str, header_timeout_s: float, max_head_bytes: int, max_headers: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `kind` ("auto", "httptools", "h11") with a request-head deadline
    and a bound on the head's bytes and header fields (431 past either)."""
    if kind == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:
            kind = "h11"
        else:
            kind = "httptools"
    if kind == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
        guard: type = _HttpToolsHead
    elif kind == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
        guard = _H11Head
    else:
        raise ValueError(f"unknown HTTP implementation {kind!r}: use auto, httptools or h11")
    bounds = {"header_timeout_s": header_timeout_s, "max_head_bytes": max_head_bytes, "max_headers": max_headers}
    return type(f"Guarded{base.__name__}", (guard, base), bounds)


def _head_too_large(max_head_bytes: int, max_headers: int) -> bytes:
    """The whole 431 answer to a head over either bound (OpenAI's error shape; the connection closes)."""
    body = json.dumps({"error": {"message": f"the request head is over {max_head_bytes} bytes or "
                                            f"{max_headers} header fields; send fewer and shorter headers",
                                 "type": "invalid_request_error", "param": None,
                                 "code": "request_header_fields_too_large"}}, separators=(",", ":")).encode()
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)) + body


_HEAD_END = re.compile(rb"\n\r?\n")  # the empty line that ends a head (CRLF, or a bare LF as h11 reads it)


class _HeadGuard:
    """Mixed into a uvicorn HTTP protocol: a request head must arrive whole within `header_timeout_s`
    (of the connection opening, or of the request's first byte), and within `max_head_bytes` bytes
    and `max_headers` header fields. The bytes are counted as they arrive, before the parser sees
    them, so a head over a bound is answered 431 and the connection closed with at most
    `max_head_bytes` of it ever held; the body after a head, in the same read, is not counted.

    After a 431 the connection is half-closed and what the client still sends is read and dropped
    for `REFUSED_LINGER_S` (nginx's lingering close): closing with its bytes unread would reset
    the connection, and a reset can destroy the 431 before the client reads it."""

    header_timeout_s: float
    max_head_bytes: int
    max_headers: int
    _head_deadline: asyncio.TimerHandle | None = None
    _head_bytes = 0  # of the head being received
    _head_lines = 0  # its line ends so far
    _head_tail = b""  # its last two bytes: a head's end may straddle two reads
    _refused = False
    _linger: asyncio.TimerHandle | None = None

    def _reading_head(self) -> bool:
        """Whether the next bytes belong to a request head (parser-specific)."""
        raise NotImplementedError

    def _head_ended(self) -> None:
        """The head's last byte was counted: what follows is its body (or the next request)."""
        self._head_bytes, self._head_lines, self._head_tail = 0, 0, b""

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._reading_head() and not self._count_head(data):
            self._refuse_head()
            return
        super().data_received(data)  # type: ignore[misc]

    def _refuse_head(self) -> None:
        self._refused = True  # from now on what arrives is dropped unread
        log.debug("refused a request head over %d bytes or %d header fields (431)", self.max_head_bytes,
                  self.max_headers)
        self._disarm_head_deadline()
        self.transport.write(_head_too_large(self.max_head_bytes, self.max_headers))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger = self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    def _count_head(self, data: bytes) -> bool:
        """Count the head's part of `data`; False once the head is over a bound."""
        joined = self._head_tail + data
        end = _HEAD_END.search(joined)
        part = data if end is None else data[:max(0, end.end() - len(self._head_tail))]
        self._head_bytes += len(part)
        self._head_lines += part.count(b"\n")
        fields = self._head_lines - 1 - (end is not None)  # less the request line and the empty line
        if self._head_bytes > self.max_head_bytes or fields > self.max_headers:
            return False
        if end is None:
            self._head_tail = joined[-2:]
        else:
            self._head_ended()
        return True

    # -- the deadline --------------------------------------------------------------------------------

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is None:
            self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            log.debug("closing a connection whose request head took over %.1f s", self.header_timeout_s)
            self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc) -> None:
        self._disarm_head_deadline()
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)


class _HttpToolsHead(_HeadGuard):
    """httptools: a head is expected when the connection opens and after each request's last byte."""

    _expect_head = True

    def _reading_head(self) -> bool:
        return self._expect_head

    def _head_ended(self) -> None:
        super()._head_ended()
        self._expect_head = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_head_deadline()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_ended()
        self._expect_head = True


class _H11Head(_HeadGuard):
    """h11: its connection state says whether a request is under way past its head."""

    def _reading_head(self) -> bool:
        import h11

        conn = getattr(self, "conn", None)
        return conn is not None and conn.their_state is h11.IDLE

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._reading_head():  # the head of the next request is not whole yet
            self._arm_head_deadline()
        else:
            self._disarm_head_deadline()


def _metrics_of(app):
    """The metrics of the app's gateway, once its lifespan has opened one."""
    gateway = getattr(app.state, "gateway", None)
    return gateway.metrics if gateway is not None else None


def _streams_of(app):
    """The stream sockets of the app's gateway, once its lifespan has opened one."""
    gateway = getattr(app.state, "gateway", None)
    return gateway.streams if gateway is not None else None


@contextlib.contextmanager
def _no_signals() -> Iterator[None]:
    yield


async def run(settings, *, grace_s: float = 10.0) -> None:
    """Serve until SIGTERM/SIGINT. Raises `OpenCluster` (before binding anything) when `host` is
    beyond loopback and the cluster token is empty or short, unless `allow_open_cluster`."""
    import uvicorn

    from gateway.api.app import create_app
    from gateway.api.cuts import QuietCutResponses
    from gateway.api.drain import DrainingServer
    from gateway.api.metrics import metrics_app
    from gpu_worker.open_cluster import require_cluster_token
    from gpu_worker.open_files import raise_open_file_limit

    require_cluster_token(settings.host, settings.cluster_token, allow_open=settings.allow_open_cluster,
                          env_prefix=type(settings).model_config["env_prefix"], role="gateway")
    raise_open_file_limit()  # a websocket per stream, a link per worker
    app = create_app(settings)
    http = http_protocol(settings.http, settings.header_timeout_s, settings.max_head_bytes, settings.max_headers)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, ws="websockets", http=http,
                            h11_max_incomplete_event_size=settings.max_head_bytes + H11_SLACK_BYTES,
                            ws_max_size=WS_MAX_MESSAGE_BYTES, timeout_graceful_shutdown=grace_s, log_level="info",
                            access_log=False, lifespan="on", limit_concurrency=settings.max_connections,
                            backlog=settings.backlog)
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, QuietCutResponses) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(QuietCutResponses())  # the gateway reports its own cuts (gateway.api.cuts)
    server = DrainingServer(config, lambda: _streams_of(app), grace_s)
    if settings.metrics_port is None:
        await server.serve()
        return
    metrics_config = uvicorn.Config(metrics_app(lambda: _metrics_of(app)),
                                    host=settings.metrics_host, port=settings.metrics_port, lifespan="off",
                                    log_level="info", access_log=False,
                                    http=http, h11_max_incomplete_event_size=settings.max_head_bytes + H11_SLACK_BYTES,
                                    limit_concurrency=64, timeout_graceful_shutdown=1)
    metrics = uvicorn.Server(metrics_config)
    metrics.capture_signals = _no_signals  # the public server owns SIGTERM and SIGINT
    serving = asyncio.create_task(metrics.serve(), name="metrics-server")
    try:
        while not metrics.started:
            if serving.done():
                raise RuntimeError(f"the metrics server could not listen on {settings.metrics_host}:"
                                   f"{settings.metrics_port}: free the port or set VOICERING_GATEWAY_METRICS_PORT")
            await asyncio.sleep(0.01)
        bound = metrics.servers[0].sockets[0].getsockname()[1] if metrics.servers else settings.metrics_port
        log.info("metrics on http://%s:%d/metrics (internal; the public port does not serve them)",
                 settings.metrics_host, bound)
        await server.serve()
    finally:
        metrics.should_exit = True
        with contextlib.suppress(BaseException):
            await serving


def command(
    host: str = typer.Option(None, "--host", help="Address to bind [default: 127.0.0.1]."),
    port: int = typer.Option(None, "--port", help="HTTP port [default: 8000]."),
    metrics_port: int = typer.Option(None, "--metrics-port", help="Port of the internal metrics server "
                                     "[default: 8001, on --metrics-host]."),
    metrics_host: str = typer.Option(None, "--metrics-host", help="Address the metrics server binds "
                                     "[default: 127.0.0.1]."),
    redis_url: str = typer.Option(None, "--redis", metavar="URL", help="Redis of tenants, ring and training queue."),
    workers: list[str] = typer.Option(None, "--worker", metavar="URL",
                                      help="A worker websocket URL (repeatable): fixed routing, no ring."),
    ring_prefix: str = typer.Option(None, "--ring-prefix", help="The workers' ring prefix in Redis."),
    voices_dir: Path = typer.Option(None, "--voices-dir", help="The adapter store (shared with trainers, workers)."),
    uploads_dir: Path = typer.Option(None, "--uploads-dir", help="Where uploaded audio is kept."),
    grace: float = typer.Option(10.0, "--grace", help="Seconds streams may finish on shutdown."),
) -> None:
    """Serve the public API: OpenAI-compatible speech, streaming TTS, voice cloning, the web page."""
    from gateway.settings import GatewaySettings

    given = {"host": host, "port": port, "metrics_port": metrics_port, "metrics_host": metrics_host,
             "redis_url": redis_url, "workers": tuple(workers) if workers else None, "ring_prefix": ring_prefix,
             "voices_dir": voices_dir, "uploads_dir": uploads_dir}
    settings = GatewaySettings(**{k: v for k, v in given.items() if v is not None})
    from gpu_worker.trace_context import TRACE_FORMAT, OtlpHopHandler, OtlpUnavailable, install_log_filter

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s %(name)s: %(message)s{TRACE_FORMAT}")
    install_log_filter()  # every record made for a request carries its trace id
    if settings.otlp_endpoint:
        try:
            logging.getLogger().addHandler(OtlpHopHandler(settings.otlp_endpoint, "voicering-gateway"))
        except OtlpUnavailable as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    from gpu_worker.open_cluster import OpenCluster

    try:
        asyncio.run(run(settings, grace_s=grace))
    except OpenCluster as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
