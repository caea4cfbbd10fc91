"""The gateway's Prometheus metrics, in a registry of its own (one per app, no global state), and
the internal server's app that serves them.

The metrics name every tenant (labels), so they are never on the public port: `metrics_app` is
served by a second, internal server of the gateway process (`gateway.serve`), bound to
`metrics_host:metrics_port`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["METRICS_PATH", "GatewayMetrics", "metrics_app"]

METRICS_PATH = "/metrics"
_TTFB_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
_MEDIA_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("voicering_gateway_requests", "HTTP requests and websocket sessions answered",
                                ["route", "status"], registry=self.registry)
        self.ttfb = Histogram("voicering_gateway_ttfb_seconds", "request received -> first audio byte sent",
                              ["route", "format"], buckets=_TTFB_BUCKETS, registry=self.registry)
        self.active_streams = Gauge("voicering_gateway_active_streams", "speech streams open now, per tenant",
                                    ["tenant"], registry=self.registry)
        self.audio_seconds = Counter("voicering_gateway_audio_seconds", "audio generated for callers (billed), "
                                     "per tenant", ["tenant"], registry=self.registry)
        self.training_minutes = Counter("voicering_gateway_training_minutes", "training time of finished clones, "
                                        "per tenant", ["tenant"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def metrics_app(metrics: Callable[[], GatewayMetrics | None]) -> ASGIApp:
    """A plain ASGI app: `GET /metrics` renders `metrics()` (503 until the gateway has opened it);
    anything else is 404. It reads no request body."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        current = metrics()
        if scope["path"] != METRICS_PATH or scope["method"] not in ("GET", "HEAD"):
            status, body, media_type = 404, b"not found: the metrics are at GET /metrics\n", b"text/plain"
        elif current is None:
            status, body, media_type = 503, b"the gateway is starting\n", b"text/plain"
        else:
            status, body, media_type = 200, current.render(), _MEDIA_TYPE
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", media_type), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    return app
