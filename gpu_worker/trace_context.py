"""One request followed across hops (gateway -> entry worker -> owner) with W3C trace context.

- `TraceContext`: a trace id, the span id of the hop holding it, its parent's span id and the
  trace flags. `parse` reads a `traceparent` (None for anything that is not one: W3C's rule is
  to start a new trace, never to pass a bad value on); `TraceContext.new()` starts a trace;
  `child()` is the next hop's span; `traceparent` is what the next hop is sent.
- `current`: the request's context for log records made while it is set (each request runs in
  a task of its own, so setting it there touches no other request); `TraceLogFilter` adds its
  ``trace_id`` to every record (JSON logs: a field; text logs: `` trace=<id>`` at the end).
- `Hop`: what one hop did, logged once at its end as one line of ``key=value`` fields
  (`log_hop`), read back by `parse_hop` (`voicering trace`). JSON logs also carry the fields as
  the record's ``hop`` object.
- `OtlpHopHandler`: optional, a logging handler that exports each hop as an OpenTelemetry span
  over OTLP/HTTP (the SDK is imported only when one is made).

Light: standard library only, so the gateway and the CLI import it.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields
from typing import Final, Literal

__all__ = ["HOPS", "TRACE_FORMAT", "Hop", "HopKind", "OtlpHopHandler", "OtlpUnavailable", "TraceContext",
           "TraceLogFilter", "current", "install_log_filter", "log_hop", "parse", "parse_hop", "trace_id_of"]

TRACEPARENT_CHARS: Final = 55  # "00-" + 32 hex + "-" + 16 hex + "-" + 2 hex
MAX_HEADER_CHARS: Final = 512  # a longer header value is not read at all
# ends the text log formats of the gateway and the worker: set by `TraceLogFilter` on every record
TRACE_FORMAT: Final = "%(_trace)s"

_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str  # 32 lowercase hex, not all zero
    span_id: str  # this hop's span: 16 lowercase hex, not all zero
    parent_id: str = ""  # the span that called this hop ("" for a trace's first span)
    flags: str = "01"  # W3C trace flags; 01: sampled

    @classmethod
    def new(cls) -> TraceContext:
        return cls(_random_hex(16), _random_hex(8))

    def child(self) -> TraceContext:
        """The next hop's span: same trace, parented on this span."""
        return TraceContext(self.trace_id, _random_hex(8), self.span_id, self.flags)

    @property
    def traceparent(self) -> str:
        """This span as the ``traceparent`` the next hop is sent (and as a `traceresponse`)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def parse(value: object, *, strict: bool = False) -> TraceContext | None:
    """A `traceparent` as the caller's span (its span id is the next span's parent), or None when it
    is not a valid one: not a string, longer than `MAX_HEADER_CHARS`, not ``version-trace-span-flags``
    in lowercase hex, an all-zero id, version ``ff``, or a version 00 value with anything after it.
    A later version is read by its first four fields (W3C's forward rule); ``strict``: only a
    version 00 value of exactly `TRACEPARENT_CHARS` characters (what voicering's own messages carry)."""
    if not isinstance(value, str) or len(value) > MAX_HEADER_CHARS:
        return None
    value = value.strip(" \t")
    match = _FIELDS.match(value)
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if (version == "00" or strict) and len(value) != TRACEPARENT_CHARS:
        return None
    if strict and version != "00":
        return None
    if len(value) > TRACEPARENT_CHARS and value[TRACEPARENT_CHARS] != "-":
        return None
    return TraceContext(trace_id, span_id, "", flags)


def trace_id_of(value: str) -> str | None:
    """A trace id as a person gives it: 32 hex, or a whole traceparent; None if it is neither."""
    value = value.strip().lower()
    if _TRACE_ID.fullmatch(value) and value != _ZERO_TRACE:
        return value
    ctx = parse(value)
    return ctx.trace_id if ctx is not None else None


def _random_hex(nbytes: int) -> str:
    while (value := secrets.token_hex(nbytes)) == "0" * (2 * nbytes):
        pass
    return value


# -- logs ------------------------------------------------------------------------------------------

current: ContextVar[TraceContext | None] = ContextVar("voicering_trace", default=None)


class TraceLogFilter(logging.Filter):
    """On a handler: gives every record the trace id of the request it was made for (the one in
    `current`, unless the record names one) and ``_trace`` for `TRACE_FORMAT`. Hop lines name
    their trace in their message already and get no ``_trace``."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = current.get()
        if ctx is not None and getattr(record, "trace_id", None) is None:
            record.trace_id = ctx.trace_id
        trace_id = getattr(record, "trace_id", None)
        record._trace = f" trace={trace_id}" if trace_id and not hasattr(record, "hop") else ""
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Put one `TraceLogFilter` on each handler of ``logger`` (the root logger by default)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, TraceLogFilter) for f in handler.filters):
            handler.addFilter(TraceLogFilter())


HopKind = Literal["gateway", "entry", "owner"]
HOPS: Final[tuple[HopKind, ...]] = ("gateway", "entry", "owner")  # the order a request passes them


@dataclass(frozen=True, slots=True)
class Hop:
    """One hop of one request, at its end. ``entry``: a worker that relayed it; ``owner``: the
    worker whose engine spoke it (the voice's owner, or the worker a placed start spilled to)."""

    hop: HopKind
    trace: str
    span: str
    parent: str  # "" when the hop had no caller span
    worker: str  # this hop's worker id ("" for the gateway)
    to: str  # where it sent the request on: the gateway's worker, the entry's owner ("" for none)
    voice: str
    context: str  # the context id on this hop's own connection
    began: float  # unix time the hop received the request
    ttfb_ms: float | None  # received -> its first audio sent on (None: none was)
    total_ms: float  # received -> its end
    outcome: str  # completed, cancelled, an error code; served_here: a relay whose owners all failed

    @classmethod
    def ended(cls, hop: HopKind, trace: TraceContext, *, worker: str, to: str, voice: str, context: str,
              received: float, received_unix: float, first_audio: float | None, outcome: str) -> Hop:
        """The hop ending now: ``received`` and ``first_audio`` are `time.perf_counter()` readings
        (``first_audio`` None when no audio went on), ``received_unix`` the wall clock at receipt."""
        ttfb = None if first_audio is None else round((first_audio - received) * 1000.0, 2)
        return cls(hop, trace.trace_id, trace.span_id, trace.parent_id, worker, to, voice, context,
                   round(received_unix, 3), ttfb, round((time.perf_counter() - received) * 1000.0, 2), outcome)

    def line(self) -> str:
        """``hop=... trace=... ...``: one line, every value a bare token or a JSON string."""
        return " ".join(f"{name}={_token(getattr(self, name))}" for name in _HOP_FIELDS)

    def fields(self) -> dict[str, object]:
        return asdict(self)


_HOP_FIELDS: Final = tuple(f.name for f in fields(Hop))
_BARE = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}")
_PAIR = re.compile(r'(?:^|\s)([a-z_]+)=("(?:[^"\\]|\\.)*"|[^\s"]+)')
_HOP_START = re.compile(r"(?:^|\s)hop=")
MAX_VALUE_CHARS: Final = 256  # a longer value (a hostile voice name) is cut before it is logged


def _token(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    text = str(value)[:MAX_VALUE_CHARS]
    return text if _BARE.fullmatch(text) and text != "-" else json.dumps(text)


def log_hop(logger: logging.Logger, hop: Hop) -> None:
    """Log the one line of a hop (INFO), with its fields as the record's ``hop`` object."""
    logger.info("%s", hop.line(), extra={"hop": hop.fields(), "trace_id": hop.trace})


def parse_hop(text: str) -> Hop | None:
    """The hop a log line's message describes, or None when it holds none (or a malformed one)."""
    start = _HOP_START.search(text)
    if start is None:
        return None
    values: dict[str, str] = {}
    for name, raw in _PAIR.findall(text, start.start()):
        if name in values:
            continue
        if raw.startswith('"'):
            try:
                values[name] = json.loads(raw)
            except ValueError:
                return None
        else:
            values[name] = "" if raw == "-" else raw
    return hop_from(values)


def hop_from(values: dict[str, object]) -> Hop | None:
    """A `Hop` from its fields (strings as in a line, or the typed values of a JSON ``hop``)."""
    try:
        kind = values["hop"]
        trace, span, parent = values["trace"], values["span"], values.get("parent") or ""
        if kind not in HOPS or not _TRACE_ID.fullmatch(str(trace)) or not _SPAN_ID.fullmatch(str(span)):
            return None
        if parent and not _SPAN_ID.fullmatch(str(parent)):
            return None
        ttfb = values.get("ttfb_ms")
        return Hop(kind, str(trace), str(span), str(parent), str(values.get("worker") or ""),
                   str(values.get("to") or ""), str(values.get("voice") or ""), str(values.get("context") or ""),
                   float(values.get("began") or 0.0), None if ttfb in (None, "") else float(ttfb),
                   float(values.get("total_ms") or 0.0), str(values.get("outcome") or ""))
    except (KeyError, TypeError, ValueError):
        return None


# -- OpenTelemetry (optional) ----------------------------------------------------------------------

class OtlpUnavailable(RuntimeError):
    """An OTLP endpoint is set but the OpenTelemetry SDK or its OTLP/HTTP exporter is not installed."""


class OtlpHopHandler(logging.Handler):
    """Exports every hop record as one span (kind server, the hop's own ids and times) to an
    OTLP/HTTP endpoint, batched off the serving path by the SDK's `BatchSpanProcessor`. Other
    records are ignored. ``close`` (at exit, by `logging.shutdown`) sends what is left."""

    def __init__(self, endpoint: str, service: str, *, instance: str = "") -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise OtlpUnavailable(f"an OTLP endpoint ({endpoint}) is set but OpenTelemetry is not installed "
                                  f"({exc.name} is missing): pip install opentelemetry-sdk "
                                  "opentelemetry-exporter-otlp-proto-http, or unset the endpoint") from None
        super().__init__(logging.INFO)
        attributes = {"service.name": service, **({"service.instance.id": instance} if instance else {})}
        self._resource = Resource.create(attributes)
        self._processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))

    def emit(self, record: logging.LogRecord) -> None:
        values = getattr(record, "hop", None)
        hop = hop_from(values) if isinstance(values, dict) else None
        if hop is None:
            return
        try:
            self._processor.on_end(self._span(hop))
        except Exception:  # an exporter's bug must not cost the request its log line
            self.handleError(record)

    def _span(self, hop: Hop):  # noqa: ANN202 - an SDK ReadableSpan
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(int(hop.trace, 16), int(hop.span, 16), is_remote=False, trace_flags=flags)
        parent = SpanContext(int(hop.trace, 16), int(hop.parent, 16), is_remote=True, trace_flags=flags) \
            if hop.parent else None
        start = int(hop.began * 1e9)
        attributes = {"voicering.hop": hop.hop, "voicering.worker": hop.worker, "voicering.to": hop.to,
                      "voicering.voice": hop.voice, "voicering.context_id": hop.context,
                      "voicering.outcome": hop.outcome}
        if hop.ttfb_ms is not None:
            attributes["voicering.ttfb_ms"] = hop.ttfb_ms
        ok = hop.outcome in ("completed", "cancelled")
        return ReadableSpan(name=f"voicering {hop.hop}", context=context, parent=parent, resource=self._resource,
                            attributes=attributes, kind=SpanKind.SERVER, start_time=start,
                            end_time=start + int(hop.total_ms * 1e6),
                            status=Status(StatusCode.OK if ok else StatusCode.ERROR))

    def flush(self) -> None:
        self._processor.force_flush()

    def close(self) -> None:
        self._processor.shutdown()
        super().close()
