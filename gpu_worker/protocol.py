"""The worker's websocket protocol: typed messages, JSON for control, binary frames for audio.

One connection multiplexes many contexts, each named by a client-chosen ``context_id``.
Schema and examples: docs/protocol.md. This module is pure (no I/O) so clients (the gateway,
the CLI) share it with the server.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Final, Literal

from gpu_worker.errors import BadMessage, BadRequest, BusyLimit
from gpu_worker.orpheus import SAMPLE_RATE  # the audio on the wire: PCM16 mono at SNAC's 24 kHz
from gpu_worker.trace_context import TRACEPARENT_CHARS
from gpu_worker.trace_context import parse as parse_traceparent
from hashring.records import MAX_VOICE_ID_BYTES  # the ring's bound; the store's grammar is checked when the voice resolves

# Version negotiation (either side may be upgraded first): a client that speaks this version sends
# `PROTOCOL_HEADER: 2` on the websocket handshake and a worker of this version answers with the same
# header. Version 2 adds `opened`, the `load` on `done`/`error` and `Start.insist`; a worker sends them
# only on connections whose handshake asked for >= 2, so version-1 clients get exactly the old messages.
PROTOCOL_VERSION: Final = 2
PROTOCOL_HEADER: Final = "x-voicering-protocol"
# A worker also answers every handshake with the contexts one connection may hold at once, so a
# client knows a connection's limit instead of learning it from refusals (`connection_streams`).
CONNECTION_STREAMS_HEADER: Final = "x-voicering-connection-streams"
AUDIO_KIND = 0x01
MAX_CONTEXT_ID_BYTES = 64
# A worker accepts no websocket message larger than this (it closes the connection with 1009): the
# server's `max_size`, and the most a pool may send on a shared link (`PoolSettings.peer_max_message_bytes`).
MAX_MESSAGE_BYTES = 1 << 20
# The worker's default text limits per context (WorkerSettings' defaults; the gateway holds callers to them).
MAX_TEXT_CHARS = 4096  # buffered before a flush (one segment)
MAX_CONTEXT_BACKLOG_CHARS = 16384  # buffered + flushed, not yet being spoken
DEFAULT_MAX_BUFFER_DELAY_MS = 1000  # chunking "auto": an LLM at 30+ tokens/s ends a 20-word sentence within it
MAX_BUFFER_DELAY_MS = 5000
# `options.first_audio_frames`' bound: the first chunk's right context is at most what later chunks carry
FIRST_AUDIO_FRAMES_MAX: Final = 3
_SEQ = struct.Struct(">I")
# Pronunciation dictionaries (gpu_worker.text.dictionary) one context may name: the gateway holds a
# tenant's `start.pronunciations` (names) to it and resolves them into `options.pronunciations`.
MAX_PRONUNCIATIONS: Final = 3
PRONUNCIATIONS_KEY_SUFFIX: Final = ":pronunciations"  # the only Redis keys a reference may name
_MAX_REF_KEY_BYTES: Final = 256
_REF_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # gpu_worker.text.dictionary.DICTIONARY_NAME
_REF_VERSION: Final = re.compile(r"[0-9a-f]{1,64}")


@dataclass(frozen=True, slots=True)
class PronunciationRef:
    """A tenant's pronunciation dictionary as the gateway resolved it for one context: the Redis hash
    holding the tenant's dictionaries (named by the gateway's tenant layer, never by a caller), the
    dictionary's name, and its version then (a hash of its rules: the worker's cache key)."""

    key: str
    name: str
    version: str


@dataclass(frozen=True, slots=True)
class ContextOptions:
    """Per-context knobs a client may set; None means the worker's default."""

    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    trim_silence: bool | None = None
    constraint: Literal["fused", "mask", "off"] | None = None  # slot-constrained sampling mode
    # the text front end (gpu_worker.text): False speaks the text as written, for callers who
    # normalize it themselves; None: normalized (left off the wire, so older workers accept the start)
    normalize: bool | None = None
    # resolved pronunciation dictionaries, applied in order before normalization (the first named wins
    # where two rewrite the same word); set by the gateway. None: none (left off the wire)
    pronunciations: tuple[PronunciationRef, ...] | None = None
    # (v2) "word": send `alignment` messages, when each word of the text is spoken (docs/alignment.md);
    # a version-1 connection asking for them is refused. None: no timings (left off the wire)
    alignment: Literal["word"] | None = None
    # continuity across the context's segments (gpu_worker.prompt_window): False prompts every segment
    # afresh. None: the worker's default (on unless its operator turned it off; left off the wire)
    continuity: bool | None = None
    # "auto": the worker cuts the streamed text into segments itself, at sentence ends the text front
    # end reads as such, and past `max_buffer_delay_ms` at a clause or word break (gpu_worker.chunking);
    # flush and end still work. None: only the caller's flush/end cut (left off the wire)
    chunking: Literal["auto"] | None = None
    max_buffer_delay_ms: int | None = None  # with chunking "auto": [0, 5000], default 1000
    # frames generated before each segment's first audio, 1 to FIRST_AUDIO_FRAMES_MAX: 1 speaks ~70 ms
    # sooner, its first frame decoded with no right context. None: the worker's `first_audio_frames`
    # (left off the wire)
    first_audio_frames: int | None = None


@dataclass(frozen=True, slots=True)
class Start:
    context_id: str
    voice: str
    text: str = ""
    options: ContextOptions = field(default_factory=ContextOptions)
    proxied_by: str | None = None  # hop marker: the entry worker that forwarded it (an owner never forwards again)
    placed: bool = False  # a ring-aware pool chose this worker: it serves the start itself, never relays it
    insist: bool = False  # (v2) the router's last try after refusals: the worker skips its fleet-share rule
    traceparent: str | None = None  # W3C trace context of the caller's span; the worker's span is its child
    # names of the tenant's pronunciation dictionaries, on the gateway's /v1/tts/stream only: the
    # gateway resolves them into options.pronunciations, and a worker refuses a start that has names.
    # None: the voice's default dictionaries; () none at all
    pronunciations: tuple[str, ...] | None = None
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
class ContextStats:
    ttfb_ms: float | None = None  # first text segment queued -> first audio frame handed to the socket
    audio_s: float = 0.0
    tokens: int = 0
    frames: int = 0
    invalid_tokens: int = 0
    segments: int = 0
    wall_s: float = 0.0
    rtf: float | None = None  # wall seconds per audio second (< 1 is faster than real time)
    head_silence_dropped_ms: float = 0.0
    engine_requests: int = 0  # a long segment is spoken as several engine requests, in order
    finish_reason: Literal["end_of_speech", "length", ""] = ""  # "length": some request hit its token cap (audio cut)
    served_by: str = ""  # the worker whose engine spoke it
    proxied: bool = False  # it reached that worker through another worker (wrong-worker proxy)
    trace_id: str = ""  # the request's W3C trace id (`voicering trace`), the same on every hop
    span_id: str = ""  # the span of the worker whose engine spoke it
    window_tokens: int = 0  # tokens of earlier segments put before this context's prompts (continuity)
    window_cached_tokens: int = 0  # of those, served by the engine's prefix cache (no prefill)


@dataclass(frozen=True, slots=True)
class Opened:
    """(v2) A start was admitted, before any model work: the context is this worker's now (or its
    relay's). ``load``: the streams this worker's engine speaks, this one included."""

    context_id: str
    load: int
    type: Literal["opened"] = "opened"


@dataclass(frozen=True, slots=True)
class Done:
    context_id: str
    stats: ContextStats
    reason: Literal["completed", "cancelled"] = "completed"
    load: int | None = None  # (v2) the streams this worker's engine speaks right after this one ended
    type: Literal["done"] = "done"


@dataclass(frozen=True, slots=True)
class Error:
    code: str
    message: str
    retryable: bool
    context_id: str | None = None
    load: int | None = None  # (v2) the streams this worker's engine speaks right after this answer
    limit: BusyLimit | None = None  # (v2) on `busy`: which of the worker's limits refused the start
    type: Literal["error"] = "error"


@dataclass(frozen=True, slots=True)
class Rejected:
    """One client message was refused and had no effect: no context ended because of it.

    ``context_id``/``message_type`` name the refused message as far as it could be read (a context
    it names, if live, carries on). Contrast `Error` with a ``context_id``: that context is over.
    """

    code: str
    message: str
    retryable: bool = False
    context_id: str | None = None
    message_type: str | None = None
    type: Literal["rejected"] = "rejected"


@dataclass(frozen=True, slots=True)
class AlignedWord:
    """One word of the caller's text as written ("$5", not "five dollars") and when it is spoken:
    seconds from the context's first audio sample."""

    text: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class Alignment:
    """(v2) Words of the context's text, in order, each timed once and never revised, sent after the
    audio they describe (docs/alignment.md). ``estimated``: the audio did not sound like speech (the
    stand-in model's noise), so these are a reference reading's times stretched to its length."""

    context_id: str
    words: tuple[AlignedWord, ...]
    estimated: bool = False
    type: Literal["alignment"] = "alignment"


ServerMessage = Opened | Done | Error | Rejected | Alignment


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
_SERVER_TYPES: dict[str, type] = {"opened": Opened, "done": Done, "error": Error, "rejected": Rejected,
                                  "alignment": Alignment}
# Version-2 fields, left out of a message while they hold these values: a version-1 peer gets (and a
# version-1 worker accepts) exactly the version-1 bytes. An untraced start leaves out `traceparent` too.
_V2_ABSENT: Final[Mapping[str, object]] = {"insist": False, "load": None, "limit": None, "traceparent": None,
                                            "pronunciations": None, "estimated": False}
# Likewise the trace ids of `done.stats` when there are none (a cancelled context's empty stats).
_STATS_ABSENT: Final[Mapping[str, object]] = {"trace_id": "", "span_id": "", "window_tokens": 0, "window_cached_tokens": 0}
# Fields nested in a message, left out while they hold these values: `start.options.normalize` and
# `.pronunciations` (and the conversation options) unset (older workers refuse an option they do
# not know), `done.stats`'s trace ids and window counts when there are none.
_NESTED_ABSENT: Final[Mapping[str, Mapping[str, object]]] = {
    "options": {"normalize": None, "pronunciations": None, "alignment": None, "continuity": None, "chunking": None,
                "max_buffer_delay_ms": None, "first_audio_frames": None},
    "stats": _STATS_ABSENT}


def encode(message: ClientMessage | ServerMessage) -> str:
    """Compact JSON, non-ASCII characters as themselves: the UTF-8 bytes on the link are what a
    sender counted (ASCII escapes would turn 2 bytes of 'é' into 6 and 4 bytes of an emoji into 12).
    Version-2 fields at their absent value are left out (`_V2_ABSENT`, `_NESTED_ABSENT`)."""
    payload = asdict(message)
    for name, absent in _V2_ABSENT.items():
        if name in payload and payload[name] is absent:
            del payload[name]
    for field_name, absents in _NESTED_ABSENT.items():
        nested = payload.get(field_name)
        for name, absent in absents.items() if isinstance(nested, dict) else ():
            if name in nested and nested[name] == absent:
                del nested[name]
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def protocol_version(header: str | None) -> int:
    """The version a peer asked for (or answered) in `PROTOCOL_HEADER`, capped at ours; a missing or
    unreadable header is version 1 (a peer from before negotiation)."""
    try:
        asked = int(header) if header is not None else 1
    except ValueError:
        return 1
    return max(1, min(asked, PROTOCOL_VERSION))


def connection_streams(header: str | None) -> int | None:
    """The per-connection stream limit a worker answered in `CONNECTION_STREAMS_HEADER`; None when
    it said none (a worker from before the header) or nothing usable."""
    try:
        limit = int(header) if header is not None else None
    except ValueError:
        return None
    return limit if limit is not None and limit >= 1 else None


def _valid_unicode(value: str) -> bool:
    """False for strings holding lone surrogates (JSON's "\\ud800" escapes decode to them)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _context_id(value: Any) -> str | None:
    """The value as a context id, or None when it is not one."""
    if isinstance(value, str) and value and _valid_unicode(value) and len(value.encode()) <= MAX_CONTEXT_ID_BYTES:
        return value
    return None


def _build(cls: type, payload: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = set(payload) - names
    what = "options" if cls is ContextOptions else f"'{payload.get('type')}'"
    if unknown:
        listed = ", ".join(sorted(_shown(name) for name in unknown))
        raise BadRequest(f"unknown field(s) for {what}: {listed[:200]}")
    try:
        return cls(**payload)
    except TypeError as exc:
        raise BadRequest(f"malformed {what} message: {exc}") from None


def _shown(value: Any, limit: int = 40) -> str:
    """A client's value in an error message, cut short: a hostile value is never echoed whole."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _validate_options(o: ContextOptions) -> ContextOptions:
    def number(name: str, value: Any, lo: float, hi: float) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi):
            raise BadRequest(f"option '{name}' must be a number in [{lo}, {hi}], got {_shown(value)}")

    number("temperature", o.temperature, 0.0, 2.0)
    number("top_p", o.top_p, 0.01, 1.0)
    number("repetition_penalty", o.repetition_penalty, 0.5, 2.0)
    number("max_tokens", o.max_tokens, 7, 8192)
    if o.max_tokens is not None and not isinstance(o.max_tokens, int):
        raise BadRequest("option 'max_tokens' must be an integer")
    if o.seed is not None and (isinstance(o.seed, bool) or not isinstance(o.seed, int) or not 0 <= o.seed < 2**32):
        raise BadRequest("option 'seed' must be an integer in [0, 2**32)")
    if o.constraint not in (None, "fused", "mask", "off"):
        raise BadRequest(f"option 'constraint' must be fused, mask or off, got {_shown(o.constraint)}")
    if o.trim_silence is not None and not isinstance(o.trim_silence, bool):
        raise BadRequest("option 'trim_silence' must be true or false")
    if o.normalize is not None and not isinstance(o.normalize, bool):
        raise BadRequest("option 'normalize' must be true or false")
    if o.continuity is not None and not isinstance(o.continuity, bool):
        raise BadRequest("option 'continuity' must be true or false")
    if o.chunking not in (None, "auto"):
        raise BadRequest(f"option 'chunking' must be \"auto\" (or left out), got {_shown(o.chunking)}")
    if o.max_buffer_delay_ms is not None:
        if isinstance(o.max_buffer_delay_ms, bool) or not isinstance(o.max_buffer_delay_ms, int) \
                or not 0 <= o.max_buffer_delay_ms <= MAX_BUFFER_DELAY_MS:
            raise BadRequest(f"option 'max_buffer_delay_ms' must be an integer in [0, {MAX_BUFFER_DELAY_MS}], "
                             f"got {_shown(o.max_buffer_delay_ms)}")
        if o.chunking != "auto":
            raise BadRequest("option 'max_buffer_delay_ms' applies to chunking \"auto\" only: set both, or neither")
    if o.first_audio_frames is not None and (isinstance(o.first_audio_frames, bool)
                                             or not isinstance(o.first_audio_frames, int)
                                             or not 1 <= o.first_audio_frames <= FIRST_AUDIO_FRAMES_MAX):
        raise BadRequest(f"option 'first_audio_frames' must be an integer in [1, {FIRST_AUDIO_FRAMES_MAX}], "
                         f"got {_shown(o.first_audio_frames)}")
    if o.alignment not in (None, "word"):
        raise BadRequest(f"option 'alignment' must be \"word\" (or left out), got {_shown(o.alignment)}")
    if o.pronunciations is not None:
        o = replace(o, pronunciations=_refs(o.pronunciations))
    return o


def _refs(value: Any) -> tuple[PronunciationRef, ...]:
    """options.pronunciations as references, each checked (a hostile list is refused, never read far)."""
    if not isinstance(value, list | tuple) or len(value) > MAX_PRONUNCIATIONS:
        raise BadRequest(f"option 'pronunciations' must be a list of at most {MAX_PRONUNCIATIONS} references")
    refs = []
    for item in value:
        if isinstance(item, PronunciationRef):
            item = asdict(item)
        if not isinstance(item, dict) or set(item) != {"key", "name", "version"}:
            raise BadRequest("a pronunciation reference is {\"key\", \"name\", \"version\"}")
        key, name, version = item["key"], item["name"], item["version"]
        if (not isinstance(key, str) or not _valid_unicode(key) or len(key.encode()) > _MAX_REF_KEY_BYTES
                or not key.endswith(PRONUNCIATIONS_KEY_SUFFIX)):
            raise BadRequest(f"a pronunciation reference's key must be a Redis key ending in "
                             f"'{PRONUNCIATIONS_KEY_SUFFIX}' of at most {_MAX_REF_KEY_BYTES} bytes")
        if not isinstance(name, str) or not _REF_NAME.fullmatch(name):
            raise BadRequest(f"pronunciation dictionary name {_shown(name)} is not a dictionary name")
        if not isinstance(version, str) or not _REF_VERSION.fullmatch(version):
            raise BadRequest(f"pronunciation dictionary version {_shown(version)} is not a version")
        refs.append(PronunciationRef(key, name, version))
    return tuple(refs)


def _names(value: Any) -> tuple[str, ...]:
    """start.pronunciations as dictionary names (the gateway's websocket), each checked."""
    if not isinstance(value, list | tuple) or len(value) > MAX_PRONUNCIATIONS:
        raise BadRequest(f"'pronunciations' must be a list of at most {MAX_PRONUNCIATIONS} dictionary names")
    for name in value:
        if not isinstance(name, str) or not _REF_NAME.fullmatch(name):
            raise BadRequest(f"'pronunciations' holds {_shown(name)}: a dictionary name is 1-64 letters, digits, "
                             "'_', '.', '-'")
    if len(set(value)) != len(value):
        raise BadRequest("'pronunciations' names a dictionary twice")
    return tuple(value)


def parse_client(raw: str | bytes) -> ClientMessage:
    """Validate one client message. Never raises anything but `BadMessage`, whatever the input (deep
    nesting, huge integers, lone surrogates, wrong types): one bad message must not cost the
    connection. The error carries the message's type and context id when they could be read."""
    if isinstance(raw, bytes):
        raise BadMessage("binary messages are not accepted from clients; send JSON text")
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadMessage(f"message is not valid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # int-string limit, nesting too deep
        reason = "nested too deeply" if isinstance(exc, RecursionError) else "holds a number too large to read"
        raise BadMessage(f"message is not acceptable JSON: it {reason}") from None
    if not isinstance(payload, dict):
        raise BadMessage("message must be a JSON object")
    kind = payload.get("type")
    kind = kind if isinstance(kind, str) and kind in _CLIENT_TYPES else None
    context_id = _context_id(payload.get("context_id"))
    try:
        return _parse_payload(payload, kind, context_id)
    except BadRequest as exc:
        raise BadMessage(exc.message, message_type=kind, context_id=context_id) from None


def _parse_payload(payload: dict[str, Any], kind: str | None, context_id: str | None) -> ClientMessage:
    if kind is None:
        shown = payload.get("type")
        shown = _shown(shown) if isinstance(shown, str | int | float | bool | None) else f"of JSON type {type(shown).__name__}"
        raise BadRequest(f"unknown message type {shown}; expected one of {', '.join(_CLIENT_TYPES)}")
    if context_id is None:
        raise BadRequest(f"context_id must be a non-empty string of at most {MAX_CONTEXT_ID_BYTES} UTF-8 bytes")
    cls = _CLIENT_TYPES[kind]
    payload["context_id"] = context_id
    if cls is Start:
        voice = payload.get("voice")
        if not isinstance(voice, str) or not voice:
            raise BadRequest("start needs a non-empty 'voice'")
        if not _valid_unicode(voice) or len(voice.encode()) > MAX_VOICE_ID_BYTES:
            raise BadRequest(f"'voice' must be valid Unicode of at most {MAX_VOICE_ID_BYTES} bytes")
        if not isinstance(payload.get("placed", False), bool):
            raise BadRequest("'placed' must be true or false")
        if not isinstance(payload.get("insist", False), bool):
            raise BadRequest("'insist' must be true or false")
        trace = payload.get("traceparent")
        if trace is not None and parse_traceparent(trace, strict=True) is None:  # never logged or passed on
            raise BadRequest(f"'traceparent' must be a W3C traceparent of {TRACEPARENT_CHARS} characters, "
                             "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, lowercase, ids not all zero "
                             "(or leave it out: the worker starts a trace)")
        hop = payload.get("proxied_by")
        if hop is not None and _context_id(hop) is None:  # a worker id: same shape as a context id
            raise BadRequest(f"'proxied_by' must be a worker id of at most {MAX_CONTEXT_ID_BYTES} bytes")
        options = payload.get("options") or {}
        if not isinstance(options, dict):
            raise BadRequest("'options' must be an object")
        payload["options"] = _validate_options(_build(ContextOptions, options))
        if "pronunciations" in payload:
            payload["pronunciations"] = _names(payload["pronunciations"])
    if "text" in payload:
        text = payload["text"]
        if not isinstance(text, str):
            raise BadRequest("'text' must be a string")
        if not _valid_unicode(text):
            raise BadRequest("'text' is not valid Unicode (it holds a lone surrogate); send UTF-8 text")
    return _build(cls, payload)


def parse_server(raw: str) -> ServerMessage:
    """A worker's message. Fields this version does not know are ignored (a newer worker may add
    some), so clients stay forward compatible."""
    payload = json.loads(raw)
    cls = _SERVER_TYPES[payload["type"]]  # a worker speaks this protocol: a KeyError here is a bug, not input
    known = _known(cls, payload)
    if cls is Done:
        known["stats"] = ContextStats(**_known(ContextStats, payload["stats"]))
    if cls is Alignment:
        known["words"] = tuple(AlignedWord(**_known(AlignedWord, w)) for w in payload["words"])
    return cls(**known)


def _known(cls: type, payload: dict[str, Any]) -> dict[str, Any]:
    names = _SERVER_FIELDS[cls]
    return {k: v for k, v in payload.items() if k in names}


_SERVER_FIELDS: Final[Mapping[type, frozenset[str]]] = {
    cls: frozenset(f.name for f in fields(cls)) for cls in (*_SERVER_TYPES.values(), ContextStats, AlignedWord)}
