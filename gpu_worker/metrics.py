"""What a worker reports: Prometheus metrics (served at ``GET /metrics`` on the websocket port) and
structured JSON log lines.

Every `WorkerMetrics` owns its own `CollectorRegistry`, so two workers (or a worker and a test) in
one process never share counters, and nothing touches prometheus_client's global registry. Gauges
that mirror live state (active streams, queue depths, resident adapters) read it when scraped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "voicering_worker"
_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_RTF_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 4.0, 8.0, 16.0)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 40, 60, 83, 100, 150, 200, 400)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
_LOAD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_RELAY_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05,
                  0.1, 0.25)  # 1 ms and 5 ms are edges: the relay bench's targets are read exactly


class WorkerMetrics:
    """All of a worker's metrics; components receive it and update what they own."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttfb_seconds = Histogram(f"{PREFIX}_ttfb_seconds", "First text segment queued -> first audio handed to the socket",
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram(f"{PREFIX}_real_time_factor", "Wall seconds per audio second per context (< 1 is faster than real time)",
                             buckets=_RTF_BUCKETS, registry=r)
        self.stream_tokens_per_second = Histogram(f"{PREFIX}_stream_tokens_per_second",
                                                  "Generated tokens per second per context (real time needs ~83)",
                                                  buckets=_RATE_BUCKETS, registry=r)
        self.tokens = Counter(f"{PREFIX}_tokens", "Tokens generated", registry=r)
        self.invalid_tokens = Counter(f"{PREFIX}_invalid_tokens", "Generated ids that were not a valid code for their slot",
                                      registry=r)
        self.audio_seconds = Counter(f"{PREFIX}_audio_seconds", "Audio seconds streamed", registry=r)
        self.window_tokens = Counter(f"{PREFIX}_window_tokens", "Tokens of a context's earlier segments put before its "
                                     "next prompt (continuity)", registry=r)
        self.window_cached_tokens = Counter(f"{PREFIX}_window_cached_tokens", "Window tokens the engine's prefix cache "
                                            "served (the rest were prefilled again)", registry=r)
        self.contexts = Counter(f"{PREFIX}_contexts", "Contexts by outcome (completed, cancelled or an error code)",
                                  ["outcome"], registry=r)
        self.rejected = Counter(f"{PREFIX}_rejected", "Streams refused or cut: busy (at capacity: max_streams or the relay "
                                "limit), share (over this worker's share of the fleet's load), connection_limit, "
                                "slow_consumer",
                                ["reason"], registry=r)
        self.refused_messages = Counter(f"{PREFIX}_refused_messages", "Client messages refused without ending a context, by code",
                                        ["code"], registry=r)
        self.relay_seconds = Histogram(f"{PREFIX}_relay_seconds", "Per relayed audio chunk: the pool's reader took it off "
                                       "the owner's link -> re-tagged and queued to the caller's connection outbox "
                                       "(the outbox wait and the socket write are not in it)",
                                       buckets=_RELAY_BUCKETS, registry=r)
        self.proxied = Counter(f"{PREFIX}_proxied", "Contexts relayed to the voice's owner, by outcome (completed, "
                               "cancelled or the error code)", ["outcome"], registry=r)
        self.engine_requests = Counter(f"{PREFIX}_engine_requests", "Engine requests by how they ended: end_of_speech, "
                                       "length (the token cap cut the audio short) or aborted", ["finish"], registry=r)
        self.active_streams = Gauge(f"{PREFIX}_active_streams", "Contexts in progress", registry=r)
        self.engine_queue_depth = Gauge(f"{PREFIX}_engine_queue_depth",
                                        "Engine requests submitted that have not produced a token yet", registry=r)
        self.codec_queue_depth = Gauge(f"{PREFIX}_codec_queue_depth", "Windows waiting for the codec", registry=r)
        self.codec_batch_size = Histogram(f"{PREFIX}_codec_batch_size", "Windows decoded per codec call",
                                          buckets=_BATCH_BUCKETS, registry=r)
        self.codec_seconds = Histogram(f"{PREFIX}_codec_decode_seconds", "Seconds per codec call",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.adapter_loads = Counter(f"{PREFIX}_adapter_loads", "Adapters loaded into the engine (first use or after eviction)",
                                     registry=r)
        self.adapter_reloads = Counter(f"{PREFIX}_adapter_reloads", "Adapters loaded again after the engine dropped them "
                                       "behind the mirror's back (found by reconciling with the engine)", registry=r)
        self.adapter_evictions = Counter(f"{PREFIX}_adapter_evictions", "Adapters evicted from the engine's CPU cache",
                                         registry=r)
        self.adapter_load_seconds = Histogram(f"{PREFIX}_adapter_load_seconds", "Seconds to load one adapter into the engine",
                                              buckets=_LOAD_BUCKETS, registry=r)
        self.adapter_errors = Counter(f"{PREFIX}_adapter_errors", "Adapters refused (validation or engine load)", registry=r)
        self.adapters_resident = Gauge(f"{PREFIX}_adapters_resident", "Adapters in the engine's CPU cache", registry=r)
        self.pronunciation_lookups = Counter(f"{PREFIX}_pronunciation_lookups", "Pronunciation dictionaries asked of the "
                                             "cache, by result (hit, or miss: read from Redis)", ["result"], registry=r)
        self.pronunciations_held = Gauge(f"{PREFIX}_pronunciations_held", "Pronunciation dictionaries in the cache",
                                         registry=r)

    def bind(self, *, active_streams: Callable[[], float] | None = None, engine_queue: Callable[[], float] | None = None,
             codec_queue: Callable[[], float] | None = None, adapters_resident: Callable[[], float] | None = None) -> None:
        """Point the live-state gauges at their owners (read at scrape time)."""
        for gauge, read in ((self.active_streams, active_streams), (self.engine_queue_depth, engine_queue),
                            (self.codec_queue_depth, codec_queue), (self.adapters_resident, adapters_resident)):
            if read is not None:
                gauge.set_function(read)

    def observe_context(self, *, outcome: str, ttfb_s: float | None, rtf: float | None, tokens: int,
                          invalid_tokens: int, audio_s: float, generation_s: float, requests: int = 0,
                          cut_by_length: int = 0, spoke_to_end: int = 0, window_tokens: int = 0,
                          window_cached_tokens: int = 0) -> None:
        self.contexts.labels(outcome).inc()
        self.window_tokens.inc(window_tokens)
        self.window_cached_tokens.inc(window_cached_tokens)
        for finish, count in (("end_of_speech", spoke_to_end), ("length", cut_by_length),
                              ("aborted", requests - spoke_to_end - cut_by_length)):
            if count:
                self.engine_requests.labels(finish).inc(count)
        self.tokens.inc(tokens)
        self.invalid_tokens.inc(invalid_tokens)
        self.audio_seconds.inc(audio_s)
        if ttfb_s is not None:
            self.ttfb_seconds.observe(ttfb_s)
        if rtf is not None:
            self.rtf.observe(rtf)
        if tokens > 1 and generation_s > 0:
            self.stream_tokens_per_second.observe(tokens / generation_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra=`` field
    (``context_id``, ``voice``, ...), so logs of one context can be joined on its context id."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        entry.update({k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and not k.startswith("_")})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def use_json_logs() -> None:
    """Switch every root handler (set up by the CLI) to JSON lines."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO)
    for handler in root.handlers:
        handler.setFormatter(JsonLogFormatter())
