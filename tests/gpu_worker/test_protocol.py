"""The protocol parser under hostile input: whatever a client sends, `parse_client` answers with a
`BadMessage` (never another exception, which would kill a connection's reader), keeps the type and
context id it could read, and never echoes a huge value back."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine import check_vllm_version
from gpu_worker.errors import BadMessage, EngineError
from gpu_worker.protocol import (PROTOCOL_HEADER, PROTOCOL_VERSION, AlignedWord, Alignment, ContextOptions, ContextStats,
                                 Done, Error, Opened, Rejected, Start, encode, parse_client, parse_server, protocol_version)

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["type", "context_id", "voice", "text", "options", "x"]), JSONISH, max_size=5))
def test_any_json_object_parses_or_is_a_bad_message(payload):
    try:
        parse_client(json.dumps(payload))
    except BadMessage as exc:
        assert len(exc.message) < 400


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=50))
def test_any_raw_frame_parses_or_is_a_bad_message(raw):
    try:
        parse_client(raw)
    except BadMessage:
        pass


@pytest.mark.parametrize("raw", [
    '{"type": ["start"], "context_id": "a"}', '{"type": {}, "context_id": "a"}', "[" * 100_000 + "]" * 100_000,
    '{"type": "end", "context_id": "a", "n": ' + "9" * 5000 + "}", '{"type": "end", "context_id": "\\ud800"}',
    '{"type": "start", "context_id": "a", "voice": "' + "v" * 10_000 + '"}',
    '{"type": "start", "context_id": "a", "voice": "tara", "options": {"temperature": "' + "h" * 10_000 + '"}}',
])
def test_the_shapes_that_used_to_kill_a_connection(raw):
    with pytest.raises(BadMessage) as err:
        parse_client(raw)
    assert len(err.value.message) < 300


def test_a_refused_message_keeps_what_could_be_read_of_it():
    with pytest.raises(BadMessage) as err:
        parse_client('{"type": "text", "context_id": "c1", "text": 5}')
    assert (err.value.message_type, err.value.context_id) == ("text", "c1")


def test_rejected_round_trips_and_is_not_an_error():
    message = parse_server(encode(Rejected("bad_request", "no", False, "c", "text")))
    assert isinstance(message, Rejected) and not isinstance(message, Error) and message.message_type == "text"


@pytest.mark.parametrize(("version", "ok"), [("0.32.0", True), ("0.32.3+cpu", True), ("0.33.0", False),
                                              ("0.31.2", False), ("1.0.0", False), ("dev", False)])
def test_only_the_vllm_line_the_engine_is_written_for_starts(version, ok):
    if ok:
        check_vllm_version(version)
    else:
        with pytest.raises(EngineError, match="0.32"):
            check_vllm_version(version)


# -- version 2 (issue #20): opened, load, insist; version-1 bytes unchanged -----------------------------

V1_START = ('{"context_id":"c1","voice":"tara","text":"Hi.","options":{"temperature":null,"top_p":null,'
            '"repetition_penalty":null,"max_tokens":null,"seed":null,"trim_silence":null,"constraint":null},'
            '"proxied_by":null,"placed":true,"type":"start"}')
V1_ERROR = '{"code":"busy","message":"full","retryable":true,"context_id":"c1","type":"error"}'


def test_version_1_messages_are_the_same_bytes_as_before():
    """A version-2 field at its absent value is left out: a version-1 worker accepts what a new pool
    sends it, and a version-1 client reads exactly the old messages."""
    assert encode(Start("c1", "tara", "Hi.", placed=True)) == V1_START
    assert encode(Error("busy", "full", True, "c1")) == V1_ERROR
    done = json.loads(encode(Done("c1", ContextStats(frames=2))))
    assert list(done) == ["context_id", "stats", "reason", "type"]
    assert list(done["stats"]) == ["ttfb_ms", "audio_s", "tokens", "frames", "invalid_tokens", "segments", "wall_s", "rtf",
                                   "head_silence_dropped_ms", "engine_requests", "finish_reason", "served_by", "proxied"]


def test_version_2_fields_travel_when_set():
    assert json.loads(encode(Start("c1", "tara", insist=True)))["insist"] is True
    assert parse_client(encode(Start("c1", "tara", insist=True))).insist is True
    assert parse_client(V1_START).insist is False
    assert parse_server(encode(Error("busy", "full", True, "c1", load=0))).load == 0  # 0 is a load, not absent
    assert parse_server(encode(Done("c1", ContextStats(), load=3))).load == 3
    assert parse_server(V1_ERROR).load is None
    assert parse_server(encode(Opened("c1", 2))) == Opened("c1", 2)


def test_word_timings_round_trip_and_are_asked_for_with_one_word():
    timed = Alignment("c1", (AlignedWord("$5", 0.12, 0.61), AlignedWord("okay", 0.7, 1.0)))
    assert parse_server(encode(timed)) == timed and "estimated" not in json.loads(encode(timed))
    assert parse_server(encode(Alignment("c1", (), estimated=True))).estimated is True
    assert parse_server('{"type": "alignment", "context_id": "c1", "words": [{"text": "a", "start_s": 0, "end_s": 0.1, '
                        '"confidence": 0.9}], "new": 1}') == Alignment("c1", (AlignedWord("a", 0, 0.1),))
    asked = Start("c1", "tara", options=ContextOptions(alignment="word"))
    assert parse_client(encode(asked)).options.alignment == "word"
    assert "alignment" not in json.loads(encode(Start("c1", "tara")))["options"]  # a version-1 worker takes it
    with pytest.raises(BadMessage, match="alignment"):
        parse_client(json.dumps({"type": "start", "context_id": "c1", "voice": "tara",
                                 "options": {"alignment": "character"}}))


@pytest.mark.parametrize(("options", "match"), [
    ({"continuity": 1}, "continuity"), ({"chunking": "sentence"}, "chunking"),
    ({"chunking": "auto", "max_buffer_delay_ms": 5001}, "max_buffer_delay_ms"),
    ({"chunking": "auto", "max_buffer_delay_ms": 1.5}, "max_buffer_delay_ms"),
    ({"max_buffer_delay_ms": 300}, "chunking"),  # a delay without auto chunking would do nothing
])
def test_conversation_options_are_checked(options, match):
    with pytest.raises(BadMessage, match=match):
        parse_client(json.dumps({"type": "start", "context_id": "c1", "voice": "tara", "options": options}))


def test_conversation_options_round_trip_and_stay_off_the_wire_when_unset():
    asked = Start("c1", "tara", options=ContextOptions(continuity=False, chunking="auto", max_buffer_delay_ms=0))
    assert parse_client(encode(asked)).options == asked.options
    sent = json.loads(encode(Start("c1", "tara")))["options"]
    assert not {"continuity", "chunking", "max_buffer_delay_ms"} & set(sent)  # older workers take the start


def test_insist_must_be_a_boolean():
    with pytest.raises(BadMessage, match="insist") as err:
        parse_client(json.dumps({"type": "start", "context_id": "c1", "voice": "tara", "insist": 1}))
    assert (err.value.message_type, err.value.context_id) == ("start", "c1")


def test_server_messages_with_fields_from_a_newer_worker_still_parse():
    raw = json.dumps({"type": "done", "context_id": "c1", "reason": "completed", "load": 1, "shiny": [1],
                      "stats": {"frames": 2, "served_by": "w", "new_stat": 1.5}})
    message = parse_server(raw)
    assert isinstance(message, Done) and message.stats.frames == 2 and message.load == 1
    assert parse_server('{"type": "opened", "context_id": "c1", "load": 0, "queue": 3}') == Opened("c1", 0)
    assert parse_server('{"type": "rejected", "code": "x", "message": "m", "hint": "h"}').code == "x"


@pytest.mark.parametrize(("header", "version"), [(None, 1), ("1", 1), ("2", 2), ("3", PROTOCOL_VERSION), ("two", 1),
                                                 ("", 1), ("0", 1), ("-5", 1)])
def test_the_negotiated_version_is_what_both_sides_speak(header, version):
    assert PROTOCOL_VERSION == 2 and PROTOCOL_HEADER == "x-voicering-protocol"
    assert protocol_version(header) == version
