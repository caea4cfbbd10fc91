"""The worker's websocket protocol: typed messages, JSON for control, binary frames for audio.

One connection multiplexes many utterances, each named by a client-chosen ``context_id``.
Schema and examples: docs/protocol.md. This module is pure (no I/O) so clients (the gateway,
the CLI) share it with the server.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from gpu_worker.errors import BadRequest

PROTOCOL_VERSION = 1
AUDIO_KIND = 0x01
MAX_CONTEXT_ID_BYTES = 64
_SEQ = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class UtteranceOptions:
    """Per-utterance knobs a client may set; None means the worker's default."""

    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    trim_silence: bool | None = None
    constraint: Literal["fused", "mask", "off"] | None = None  # slot-constrained sampling mode


@dataclass(frozen=True, slots=True)
class Start:
    context_id: str
    voice: str
    text: str = ""
    options: UtteranceOptions = field(default_factory=UtteranceOptions)
    type: Literal["start"] = "start"


@dataclass(frozen=True, slots=True)
class PushText:
    context_id: str
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class Flush:
    """Speak the text pushed so far as one segment."""

    context_id: str
    type: Literal["flush"] = "flush"


@dataclass(frozen=True, slots=True)
class End:
    """No more text: speak what is left, then send `done`."""

    context_id: str
    type: Literal["end"] = "end"


@dataclass(frozen=True, slots=True)
class Cancel:
    context_id: str
    type: Literal["cancel"] = "cancel"


ClientMessage = Start | PushText | Flush | End | Cancel


@dataclass(frozen=True, slots=True)
class UtteranceStats:
    ttfb_ms: float | None = None  # first text segment queued -> first audio frame handed to the socket
    audio_s: float = 0.0
    tokens: int = 0
    frames: int = 0
    invalid_tokens: int = 0
    segments: int = 0
    wall_s: float = 0.0
    rtf: float | None = None  # wall seconds per audio second (< 1 is faster than real time)
    head_silence_dropped_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Done:
    context_id: str
    stats: UtteranceStats
    reason: Literal["completed", "cancelled"] = "completed"
    type: Literal["done"] = "done"


@dataclass(frozen=True, slots=True)
class Error:
    code: str
    message: str
    retryable: bool
    context_id: str | None = None
    type: Literal["error"] = "error"


ServerMessage = Done | Error


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """24 kHz mono PCM16 little-endian, tagged with its context and a per-context sequence number."""

    context_id: str
    seq: int
    pcm: bytes

    def encode(self) -> bytes:
        ctx = self.context_id.encode()
        return bytes((AUDIO_KIND, len(ctx))) + ctx + _SEQ.pack(self.seq) + self.pcm

    @classmethod
    def decode(cls, data: bytes) -> AudioChunk:
        if len(data) < 2 or data[0] != AUDIO_KIND:
            raise BadRequest("not an audio frame")
        n = data[1]
        ctx_end = 2 + n
        if len(data) < ctx_end + _SEQ.size:
            raise BadRequest("truncated audio frame")
        (seq,) = _SEQ.unpack_from(data, ctx_end)
        return cls(data[2:ctx_end].decode(), seq, bytes(data[ctx_end + _SEQ.size:]))


_CLIENT_TYPES: dict[str, type] = {"start": Start, "text": PushText, "flush": Flush, "end": End, "cancel": Cancel}
_SERVER_TYPES: dict[str, type] = {"done": Done, "error": Error}


def encode(message: ClientMessage | ServerMessage) -> str:
    return json.dumps(asdict(message), separators=(",", ":"))


def _context_id(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value.encode()) > MAX_CONTEXT_ID_BYTES:
        raise BadRequest(f"context_id must be a non-empty string of at most {MAX_CONTEXT_ID_BYTES} bytes")
    return value


def _build(cls: type, payload: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = set(payload) - names
    if unknown:
        raise BadRequest(f"unknown field(s) for '{payload.get('type')}': {', '.join(sorted(unknown))}")
    try:
        return cls(**payload)
    except TypeError as exc:
        raise BadRequest(f"malformed '{payload.get('type')}' message: {exc}") from None


def _validate_options(o: UtteranceOptions) -> UtteranceOptions:
    def number(name: str, value: Any, lo: float, hi: float) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi):
            raise BadRequest(f"option '{name}' must be a number in [{lo}, {hi}], got {value!r}")

    number("temperature", o.temperature, 0.0, 2.0)
    number("top_p", o.top_p, 0.01, 1.0)
    number("repetition_penalty", o.repetition_penalty, 0.5, 2.0)
    number("max_tokens", o.max_tokens, 7, 8192)
    if o.max_tokens is not None and not isinstance(o.max_tokens, int):
        raise BadRequest("option 'max_tokens' must be an integer")
    if o.seed is not None and (isinstance(o.seed, bool) or not isinstance(o.seed, int) or not 0 <= o.seed < 2**32):
        raise BadRequest("option 'seed' must be an integer in [0, 2**32)")
    if o.constraint not in (None, "fused", "mask", "off"):
        raise BadRequest(f"option 'constraint' must be fused, mask or off, got {o.constraint!r}")
    if o.trim_silence is not None and not isinstance(o.trim_silence, bool):
        raise BadRequest("option 'trim_silence' must be true or false")
    return o


def parse_client(raw: str | bytes) -> ClientMessage:
    """Validate one client message; raises BadRequest with a message the client can act on."""
    if isinstance(raw, bytes):
        raise BadRequest("binary messages are not accepted from clients; send JSON text")
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"message is not valid JSON: {exc.msg}") from None
    if not isinstance(payload, dict):
        raise BadRequest("message must be a JSON object")
    kind = payload.get("type")
    cls = _CLIENT_TYPES.get(kind)
    if cls is None:
        raise BadRequest(f"unknown message type {kind!r}; expected one of {', '.join(_CLIENT_TYPES)}")
    payload["context_id"] = _context_id(payload.get("context_id"))
    if cls is Start:
        if not isinstance(payload.get("voice"), str) or not payload["voice"]:
            raise BadRequest("start needs a non-empty 'voice'")
        options = payload.get("options") or {}
        if not isinstance(options, dict):
            raise BadRequest("'options' must be an object")
        payload["options"] = _validate_options(_build(UtteranceOptions, options))
    if "text" in payload and not isinstance(payload["text"], str):
        raise BadRequest("'text' must be a string")
    return _build(cls, payload)


def parse_server(raw: str) -> ServerMessage:
    payload = json.loads(raw)
    cls = _SERVER_TYPES[payload["type"]]
    if cls is Done:
        payload["stats"] = UtteranceStats(**payload["stats"])
    return cls(**payload)
