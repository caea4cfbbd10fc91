"""The gateway's Prometheus metrics, in a registry of its own (one per app, no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["GatewayMetrics"]

_TTFB_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("voicering_gateway_requests", "HTTP requests and websocket sessions answered",
                                ["route", "status"], registry=self.registry)
        self.ttfb = Histogram("voicering_gateway_ttfb_seconds", "request received -> first audio byte sent",
                              ["route", "format"], buckets=_TTFB_BUCKETS, registry=self.registry)
        self.active_streams = Gauge("voicering_gateway_active_streams", "speech streams open now, per tenant",
                                    ["tenant"], registry=self.registry)
        self.audio_seconds = Counter("voicering_gateway_audio_seconds", "audio sent to callers, per tenant",
                                     ["tenant"], registry=self.registry)
        self.training_minutes = Counter("voicering_gateway_training_minutes", "training time of finished clones, "
                                        "per tenant", ["tenant"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
