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
from gpu_worker.protocol import Error, Rejected, encode, parse_client, parse_server

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
