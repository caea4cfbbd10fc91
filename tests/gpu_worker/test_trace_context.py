"""W3C trace context (`gpu_worker.trace_context`) and the `start.traceparent` field: what is a
traceparent and what is not, spans of one trace, the log filter, hop lines read back whatever
their values hold, and the optional OTLP export against a real HTTP collector on loopback."""

from __future__ import annotations

import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpu_worker.errors import BadMessage
from gpu_worker.protocol import Start, ContextStats, encode, parse_client, parse_server
from gpu_worker.trace_context import (TRACEPARENT_CHARS, Hop, OtlpHopHandler, OtlpUnavailable, TraceContext,
                                      TraceLogFilter, current, log_hop, parse, parse_hop, trace_id_of)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"


def test_a_valid_traceparent_is_the_caller_s_span_and_its_child_keeps_the_trace():
    caller = parse(VALID)
    assert caller == TraceContext(TRACE, SPAN, "", "01")
    child = caller.child()
    assert (child.trace_id, child.parent_id, child.flags) == (TRACE, SPAN, "01") and child.span_id != SPAN
    assert child.traceparent == f"00-{TRACE}-{child.span_id}-01" and len(child.traceparent) == TRACEPARENT_CHARS
    assert parse(child.traceparent).span_id == child.span_id
    assert parse(f" {VALID}\t") == caller  # optional whitespace around a header value


@pytest.mark.parametrize("value", [
    None, 5, "", "00", VALID.upper(), VALID[:-1], VALID + "0", VALID + "-extra",  # version 00 has nothing after it
    f"ff-{TRACE}-{SPAN}-01", f"00-{'0' * 32}-{SPAN}-01", f"00-{TRACE}-{'0' * 16}-01",
    f"00-{TRACE}-{SPAN}-0g", f"00_{TRACE}_{SPAN}_01", f"0-{TRACE}-{SPAN}-01", "x" * 10_000,
    f"00-{TRACE[:-1]}z-{SPAN}-01", f"01-{TRACE}-{SPAN}-01x",
])
def test_anything_else_is_no_traceparent(value):
    assert parse(value) is None


def test_a_later_version_is_read_by_its_first_fields_but_not_in_voicering_s_own_messages():
    later = f"cc-{TRACE}-{SPAN}-01-what-comes-next"
    assert parse(later) == TraceContext(TRACE, SPAN, "", "01")
    assert parse(later, strict=True) is None and parse(f"cc-{TRACE}-{SPAN}-01", strict=True) is None
    assert parse(VALID, strict=True) is not None


def test_new_traces_differ_and_a_trace_id_is_given_as_hex_or_as_a_traceparent():
    a, b = TraceContext.new(), TraceContext.new()
    assert a.trace_id != b.trace_id and parse(a.traceparent) is not None and a.parent_id == ""
    assert trace_id_of(TRACE.upper()) == TRACE and trace_id_of(VALID) == TRACE
    assert trace_id_of("0" * 32) is None and trace_id_of("not-a-trace") is None


def test_a_start_carries_a_traceparent_and_an_untraced_one_sends_the_old_bytes():
    start = parse_client(json.dumps({"type": "start", "context_id": "c", "voice": "tara", "traceparent": VALID}))
    assert isinstance(start, Start) and start.traceparent == VALID
    assert parse_client(encode(start)) == start
    plain = Start("c", "tara")
    assert "traceparent" not in json.loads(encode(plain)) and parse_client(encode(plain)).traceparent is None


@pytest.mark.parametrize("value", [5, True, [], {}, "", VALID.upper(), VALID + "-x", f"cc-{TRACE}-{SPAN}-01",
                                   f"00-{'0' * 32}-{SPAN}-01", "\n" + "x" * 5000, "00-" + "\ud800" * 52])
def test_a_malformed_traceparent_refuses_the_start_and_is_never_echoed(value):
    raw = json.dumps({"type": "start", "context_id": "c", "voice": "tara", "traceparent": value})
    with pytest.raises(BadMessage) as err:
        parse_client(raw)
    assert (err.value.message_type, err.value.context_id) == ("start", "c")
    assert "traceparent" in err.value.message and len(err.value.message) < 300
    assert not (isinstance(value, str) and len(value) > 3 and value in err.value.message)


def test_done_stats_carry_the_trace_and_a_client_reads_them():
    stats = ContextStats(trace_id=TRACE, span_id=SPAN)
    raw = json.dumps({"type": "done", "context_id": "c", "stats": {"trace_id": TRACE, "span_id": SPAN, "new": 1}})
    assert parse_server(raw).stats == stats
    old = json.dumps({"type": "done", "context_id": "c", "stats": {"frames": 2}})  # a worker from before tracing
    assert parse_server(old).stats.trace_id == ""


def record(message: str = "m", **extra) -> logging.LogRecord:
    rec = logging.LogRecord("t", logging.INFO, __file__, 1, message, (), None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_the_log_filter_marks_records_made_while_a_request_s_trace_is_set():
    flt = TraceLogFilter()
    outside = record()
    assert flt.filter(outside) and outside._trace == "" and not hasattr(outside, "trace_id")
    token = current.set(TraceContext(TRACE, SPAN))
    try:
        inside, named, hop = record(), record(trace_id="1" * 32), record(hop={}, trace_id=TRACE)
        for r in (inside, named, hop):
            flt.filter(r)
    finally:
        current.reset(token)
    assert (inside.trace_id, inside._trace) == (TRACE, f" trace={TRACE}")
    assert named._trace == f" trace={'1' * 32}"  # a record's own trace id wins
    assert hop._trace == ""  # a hop line names its trace in its message
    assert current.get() is None


def hop(**changes) -> Hop:
    fields = dict(hop="entry", trace=TRACE, span=SPAN, parent="1" * 16, worker="worker-a", to="worker-b",
                  voice="clu/v1", context="ctx1", began=1712345678.125, ttfb_ms=12.5, total_ms=80.25,
                  outcome="completed")
    return Hop(**{**fields, **changes})


def test_a_hop_line_reads_back_whatever_its_values_hold():
    for h in (hop(), hop(parent="", to="", ttfb_ms=None, hop="gateway", worker=""),
              hop(voice='a "voice" with spaces\nand a forged hop=owner trace=' + "2" * 32),
              hop(voice="-"), hop(outcome="worker_timeout")):
        line = h.line()
        assert "\n" not in line
        assert parse_hop(f"2024-01-01 10:00:00 INFO gateway.api.speech: {line}") == h
    assert parse_hop(hop(voice="v" * 5000).line()).voice == "v" * 256  # cut before it is logged
    assert parse_hop("no hop here trace=" + TRACE) is None
    assert parse_hop("shop=entry trace=" + TRACE) is None
    assert parse_hop(hop().line().replace(SPAN, "zz")) is None
    assert parse_hop(hop().line().replace("hop=entry", "hop=elsewhere")) is None


def test_log_hop_gives_json_logs_the_fields_and_text_logs_the_line(caplog):
    caplog.set_level(logging.INFO)
    log_hop(logging.getLogger("t"), hop())
    rec = caplog.records[-1]
    assert rec.hop == hop().fields() and rec.trace_id == TRACE and parse_hop(rec.getMessage()) == hop()


class _Collector(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.server.bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_hops_are_exported_as_otlp_spans_with_their_own_ids_and_times():
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    server.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        handler = OtlpHopHandler(f"http://127.0.0.1:{server.server_port}/v1/traces", "voicering-worker",
                                 instance="worker-a")
        handler.handle(record("not a hop"))
        handler.handle(record(hop().line(), hop=hop().fields()))
        handler.close()  # flushes
    finally:
        server.shutdown()
    assert [path for path, _ in server.bodies] == ["/v1/traces"]
    request = ExportTraceServiceRequest.FromString(server.bodies[0][1])
    (resource_spans,) = request.resource_spans
    attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert attrs["service.name"] == "voicering-worker" and attrs["service.instance.id"] == "worker-a"
    (span,) = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert (span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex()) == (TRACE, SPAN, "1" * 16)
    assert span.name == "voicering entry"
    assert span.start_time_unix_nano == int(1712345678.125 * 1e9)
    assert span.end_time_unix_nano - span.start_time_unix_nano == int(80.25 * 1e6)
    span_attrs = {a.key: a.value for a in span.attributes}
    assert span_attrs["voicering.to"].string_value == "worker-b" and span_attrs["voicering.ttfb_ms"].double_value == 12.5


def test_an_endpoint_without_the_sdk_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)  # import fails
    with pytest.raises(OtlpUnavailable, match="pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"):
        OtlpHopHandler("http://127.0.0.1:1/v1/traces", "voicering-gateway")
