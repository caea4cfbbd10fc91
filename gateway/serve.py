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
one, it has that long to send the whole head, or it is closed. `max_connections` bounds what is
open at once (uvicorn answers 503 past it) and `backlog` what the kernel queues.

Metrics (Prometheus text, with tenant labels) are not on the public port: a second, internal
server in the same process serves `GET /metrics` on `metrics_host:metrics_port` (127.0.0.1:8001
by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import typer

__all__ = ["command", "http_protocol", "run"]

log = logging.getLogger(__name__)

WS_MAX_MESSAGE_BYTES = 1 << 16  # > the largest legal stream message: a start of MAX_TEXT_CHARS 12-byte escapes (48 KiB) + ids, options


def http_protocol(kind: str, header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `kind` ("auto", "httptools", "h11") with a request-head deadline."""
    if kind == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:
            kind = "h11"
        else:
            kind = "httptools"
    if kind == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    elif kind == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    else:
        raise ValueError(f"unknown HTTP implementation {kind!r}: use auto, httptools or h11")
    return type(f"HeadDeadline{base.__name__}", (_HeadDeadline, base), {"header_timeout_s": header_timeout_s})


class _HeadDeadline:
    """Mixed into a uvicorn HTTP protocol: a connection is closed unless each request head arrives
    whole within `header_timeout_s` of the connection opening or of the request's first byte."""

    header_timeout_s: float
    _head_deadline: asyncio.TimerHandle | None = None

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
        super().connection_lost(exc)

    # httptools: a request begins, its head ends
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_head_deadline()
        super().on_headers_complete()

    # h11: the parser says whether a request is under way past its head
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        conn = getattr(self, "conn", None)
        if conn is None or self.transport.is_closing():
            return
        import h11

        if conn.their_state is h11.IDLE:  # the head of the next request is not whole yet
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
    from gateway.api.drain import DrainingServer
    from gateway.api.metrics import metrics_app
    from gpu_worker.open_cluster import require_cluster_token
    from gpu_worker.open_files import raise_open_file_limit

    require_cluster_token(settings.host, settings.cluster_token, allow_open=settings.allow_open_cluster,
                          env_prefix=type(settings).model_config["env_prefix"], role="gateway")
    raise_open_file_limit()  # a websocket per stream, a link per worker
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, ws="websockets",
                            http=http_protocol(settings.http, settings.header_timeout_s),
                            ws_max_size=WS_MAX_MESSAGE_BYTES, timeout_graceful_shutdown=grace_s, log_level="info",
                            access_log=False, lifespan="on", limit_concurrency=settings.max_connections,
                            backlog=settings.backlog)
    server = DrainingServer(config, lambda: _streams_of(app), grace_s)
    if settings.metrics_port is None:
        await server.serve()
        return
    metrics_config = uvicorn.Config(metrics_app(lambda: _metrics_of(app)),
                                    host=settings.metrics_host, port=settings.metrics_port, lifespan="off",
                                    log_level="info", access_log=False,
                                    http=http_protocol(settings.http, settings.header_timeout_s),
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
