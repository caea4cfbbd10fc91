"""`POST /v1/audio/speech` in OpenAI's shape, streamed as the workers speak.

The request is checked (unknown fields refused, as OpenAI does), the key's tenant resolved, the
voice name mapped to its global id, one of the tenant's stream slots taken, and the context
opened through the worker pool. The status line waits for the **first audio** (so an error
before any audio is a real HTTP error: 404, 429, 503 with Retry-After); from then on every chunk
is time-stretched (`speed`), encoded (`response_format`) and sent as it comes (chunked). A client
that goes away cancels the worker's context at once; the audio generated so far is still metered.

`stream_format: "sse"` sends `speech.audio.delta` events (base64 of the encoded bytes) and one
`speech.audio.done` with `usage` (OpenAI's `input_tokens`, `output_tokens`, `total_tokens`, and
voicering's `audio_seconds`, the audio billed), plus voicering's `served_by` (the worker whose
engine spoke it) and `proxied` (whether the worker the gateway chose relayed it to the voice's
owner). `input_tokens` is 0: the workers do not report their prompt tokens (ContextStats has
no such count), and characters are not tokens.

Orpheus has no instruction conditioning: `instructions` is
accepted (so clients that send it work) and not applied; emotion tags in `input` (`<laugh>`,
`<sigh>`...) are how a voice is steered. voicering adds fields of its own: `seed` (the
same seed gives the same audio), `max_tokens` (a cap on generated audio tokens, 7 per 85 ms
frame), `normalize` (false: the text is read as written) and `pronunciations` (up to 3 of the
tenant's pronunciation dictionaries by name, resolved here to the references the worker reads
them by: 404 `pronunciation_not_found` for a name the tenant does not have) and `alignment`
(`"word"`, with `stream_format: "sse"` only, else 400: `speech.alignment` events between the audio
deltas, each word of `input` as written with its `start_s`/`end_s` on the audio's clock, divided by
`speed`; docs/alignment.md). Without it the SSE stream is OpenAI's, byte for byte.

A failure after the first audio cannot change the status any more, so it is made impossible to
miss instead: SSE ends with an `error` event (OpenAI's error object) and no `speech.audio.done`;
raw audio ends without the chunked body's last chunk (the connection is dropped), so every HTTP
client raises on the incomplete body instead of keeping a short file as if it were whole. The
gateway says so once per burst of such cuts (`gateway.api.cuts`: count, worker, cause, traces).

**Tracing.** A valid W3C `traceparent` request header makes the request a span of the caller's
trace (else a new trace begins; an invalid or repeated header is ignored, as W3C says). The
workers are sent the gateway's span; the response carries `traceresponse` (that span, W3C's
response header) and `x-voicering-trace-id`, SSE's `speech.audio.done` the `trace_id`, and the
gateway logs one `hop=gateway` line at the end (`voicering trace ID` joins the hops).

Metering follows what the worker generated (its PCM before `speed` stretches it), once the
context was opened on a worker; anything refused before that is not metered. The body is read
only after the key is checked, at most `body_limit(settings)` bytes (`edge.read_body`).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.api.auth import caller, gateway_of, resolve_speech
from gateway.api.cuts import Cut, mark_cut
from gateway.api.edge import read_body, received_at
from gateway.api.encode import MEDIA_TYPES, ResponseFormat, open_encoder
from gateway.api.errors import ApiError, from_worker_error
from gateway.api.speed import MAX_SPEED, MIN_SPEED, SpeedChanger
from gateway.api.state import Gateway
from gateway.settings import GatewaySettings
from gateway.tenants import Tenant, TenantError
from gpu_worker.client import PoolStream, WorkerRequestError
from gpu_worker.protocol import MAX_PRONUNCIATIONS, AlignedWord, Alignment, ContextOptions
from gpu_worker.trace_context import Hop, TraceContext, current, log_hop, parse

TRACE_HEADER = "traceparent"

__all__ = ["MODELS", "SpeechRequest", "body_limit", "body_schemas", "request_trace", "router"]

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
BYTES_PER_SECOND = SAMPLE_RATE * 2
# The one model voicering serves, and OpenAI's speech model names as aliases of it, so clients
# written for OpenAI work with only the base URL and key changed.
MODELS = ("voicering-orpheus", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
MAX_INSTRUCTIONS_CHARS = 4096
# The most JSON bytes one character of a legal body can take: an astral character written as an
# escaped surrogate pair, "\ud83d\ude00". `body_limit` allows it for every character of `input`
# and `instructions`, plus SPEECH_FIELDS_BYTES for the other fields.
JSON_BYTES_PER_CHAR = 12
SPEECH_FIELDS_BYTES = 4096

router = APIRouter()


class VoiceRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    input: str = Field(min_length=1)
    voice: str | VoiceRef
    response_format: ResponseFormat = "mp3"
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int | None = Field(None, ge=0, lt=2**32)  # voicering: reproducible audio
    max_tokens: int | None = Field(None, ge=7, le=8192)  # voicering: cap on generated audio tokens
    normalize: bool = True  # voicering: false speaks `input` as written (numbers, dates... not read out by us)
    # voicering: the tenant's pronunciation dictionaries to apply, by name, before normalization
    pronunciations: list[str] | None = Field(None, max_length=MAX_PRONUNCIATIONS)
    alignment: Literal["word"] | None = None  # voicering: `speech.alignment` events (SSE only)

    @field_validator("input")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must contain text to speak, not only whitespace")
        return value

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


def body_limit(settings: GatewaySettings) -> int:
    """The most bytes a speech request body may have (413 beyond): 100 KiB with the defaults."""
    return (settings.max_input_chars + MAX_INSTRUCTIONS_CHARS) * JSON_BYTES_PER_CHAR + SPEECH_FIELDS_BYTES


def body_schemas() -> dict[str, dict]:
    """SpeechRequest's JSON schema and the models it refers to, for the app's OpenAPI components."""
    schema = SpeechRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    return {**schema.pop("$defs", {}), "SpeechRequest": schema}


def request_trace(values: list[str]) -> TraceContext:
    """The gateway's span of a request whose ``traceparent`` headers are ``values``: the child of
    a single valid one, else the first span of a new trace (W3C: a repeated or invalid header is
    ignored, never passed on)."""
    caller = parse(values[0]) if len(values) == 1 else None
    return caller.child() if caller is not None else TraceContext.new()


def _parse(raw: bytes) -> SpeechRequest:
    try:
        return SpeechRequest.model_validate_json(raw)
    except ValidationError as exc:  # answered like FastAPI's own body validation (errors.py)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "$ref": "#/components/schemas/SpeechRequest"}}}}}


@router.post("/v1/audio/speech", response_class=StreamingResponse, openapi_extra=_BODY,
             responses={200: {"content": {t: {} for t in MEDIA_TYPES.values()}, "description": "streamed audio"}})
async def create_speech(request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> StreamingResponse:
    gateway = gateway_of(request)
    received = received_at(request)  # before authentication and body parsing
    settings = gateway.settings
    body = _parse(await read_body(request, body_limit(settings), timeout_s=settings.body_timeout_s))
    limit = settings.max_input_chars
    if len(body.input) > limit:
        raise ApiError(400, f"input is {len(body.input)} characters; the most is {limit}: split the text",
                       param="input", code="string_above_max_length")
    if body.alignment is not None and body.stream_format != "sse":
        raise ApiError(400, "alignment is sent as speech.alignment events of the SSE stream: set stream_format "
                            "to \"sse\" (or leave alignment out)", param="alignment", code="invalid_value")
    if body.model not in MODELS:
        raise ApiError(404, f"The model '{body.model}' does not exist; use one of {', '.join(MODELS)}",
                       type="not_found_error", param="model", code="model_not_found")
    trace = request_trace(request.headers.getlist(TRACE_HEADER))
    current.set(trace)  # this request's task: its log records carry the trace id
    voice_id, slot, refs = await resolve_speech(gateway, tenant, body.voice_name, body.pronunciations)
    run = _Run(gateway, tenant, slot, trace, voice_id, received)
    admitted = time.perf_counter()
    try:
        stream = await gateway.pool.start(voice_id, body.input, traceparent=trace.traceparent,
                                          options=ContextOptions(seed=body.seed, max_tokens=body.max_tokens,
                                                                 normalize=None if body.normalize else False,
                                                                 pronunciations=refs or None,
                                                                 alignment=body.alignment))
        run.stream = stream
        await stream.end()
        audio = stream.events()  # word timings (asked for with SSE only) come in order with the audio
        first = await anext(audio, None)
        first_audio = time.perf_counter()
    except WorkerRequestError as exc:
        run.outcome = exc.error.code
        await run.close()
        raise from_worker_error(exc) from None
    except BaseException:
        await run.close()
        raise
    body_iter = _encoded(run, body, first, audio, received)
    if body.stream_format == "sse":
        body_iter, media_type = _sse(run, body_iter), "text/event-stream"
    else:
        media_type = MEDIA_TYPES[body.response_format]
    # what the gateway held the request for (key, limits, voice, slot) and what the worker took to
    # its first audio: a client's TTFB minus `worker` is the gateway's whole share, HTTP included;
    # `place` is the part of `worker` until a worker took the start (routing, refusals, retries)
    timing = f"admit;dur={(admitted - received) * 1000:.2f}, worker;dur={(first_audio - admitted) * 1000:.2f}"
    if stream.opened_at is not None:
        timing += f", place;dur={(stream.opened_at - admitted) * 1000:.2f}"
    headers = {"x-voicering-worker": stream.worker_id or "", "cache-control": "no-store", "server-timing": timing,
               "traceresponse": trace.traceparent, "x-voicering-trace-id": trace.trace_id}
    return _Streamed(body_iter, run.close, media_type=media_type, headers=headers)


class SpeechTruncated(Exception):
    """The worker failed after audio was sent: the response must end as visibly incomplete."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class _Run:
    """One speech request's resources, released once whatever ends it (done, error, disconnect).
    `pcm_bytes` is the audio the worker generated (before `speed`): what is billed."""

    def __init__(self, gateway: Gateway, tenant: Tenant, slot, trace: TraceContext, voice: str,
                 received: float) -> None:
        self.gateway, self.tenant, self.slot = gateway, tenant, slot
        self.trace, self.voice, self.received = trace, voice, received
        self.received_unix = time.time() - (time.perf_counter() - received)
        self.stream: PoolStream | None = None
        self.pcm_bytes = 0
        self.first_sent: float | None = None  # when the first encoded audio was handed to the server
        self.outcome = "cancelled"  # until the body ends whole, or an error ends it
        self._closed = False
        gateway.metrics.active_streams.labels(tenant.name).inc()

    @property
    def audio_seconds(self) -> float:
        return self.pcm_bytes / BYTES_PER_SECOND

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._log_hop()
        metrics = self.gateway.metrics
        metrics.active_streams.labels(self.tenant.name).dec()
        if self.stream is not None and self.stream.done is None:
            try:  # the caller left (or failed) mid-context: stop the worker now
                await self.stream.cancel()
            except Exception as exc:  # the stream's own end already reported it
                log.debug("cancel after the end of a speech request: %r", exc)
        if self.slot is not None:
            await self.slot.__aexit__(None, None, None)
        metrics.audio_seconds.labels(self.tenant.name).inc(self.audio_seconds)
        try:
            await self.gateway.meter.add_usage(self.tenant, audio_seconds=self.audio_seconds, requests=1)
        except TenantError as exc:
            log.warning("usage of tenant %s not recorded (%.2f s of audio): %s", self.tenant.id, self.audio_seconds,
                        exc.message)


    def _log_hop(self) -> None:
        stream = self.stream
        log_hop(log, Hop.ended("gateway", self.trace, worker="", to=(stream.worker_id or "") if stream else "",
                               voice=self.voice, context=stream.context_id if stream else "",
                               received=self.received, received_unix=self.received_unix,
                               first_audio=self.first_sent, outcome=self.outcome))


async def _encoded(run: _Run, body: SpeechRequest, first: bytes | Alignment | None,
                   rest: AsyncIterator[bytes | Alignment], received: float) -> AsyncIterator[bytes | Alignment]:
    """The encoded response body, chunk by chunk as the worker's audio arrives; word timings
    (only when asked for, so only on SSE) pass through on the stretched clock."""
    encoder = open_encoder(body.response_format, SAMPLE_RATE)
    speed = SpeedChanger(body.speed, SAMPLE_RATE)
    ttfb = run.gateway.metrics.ttfb.labels("speech", body.response_format)
    sent_first = False

    try:
        async for pcm in _chain(first, rest):
            if isinstance(pcm, Alignment):
                yield _stretched(pcm, body.speed)
                continue
            run.pcm_bytes += len(pcm)  # billed as generated, whatever `speed` makes of it
            out = encoder.feed(speed.feed(pcm))
            if out:
                if not sent_first:
                    run.first_sent = time.perf_counter()
                    ttfb.observe(run.first_sent - received)
                    sent_first = True
                yield out
        tail = encoder.feed(speed.close()) + encoder.close()
        if tail:
            yield tail
        run.outcome = "completed"
    except WorkerRequestError as exc:
        run.outcome = exc.error.code
        # The 200 is out already: the caller must still see that this audio is not whole. Said once
        # per burst (a lost worker cuts all its streams at once), not per request: gateway.api.cuts
        worker = (run.stream.worker_id if run.stream is not None else None) or ""
        run.gateway.cuts.add(Cut(worker, exc.error.code, exc.error.message, run.trace.trace_id, run.audio_seconds))
        raise SpeechTruncated(from_worker_error(exc)) from exc
    finally:
        encoder.close()
        speed.close()


def _stretched(timed: Alignment, speed: float) -> Alignment:
    """Word times on the audio the caller gets: `speed` plays it faster (or slower)."""
    return replace(timed, words=tuple(AlignedWord(w.text, round(w.start_s / speed, 3), round(w.end_s / speed, 3))
                                      for w in timed.words))


async def _chain(first, rest: AsyncIterator):  # noqa: ANN001, ANN202 - audio and timings alike
    if first is not None:
        yield first
    async for pcm in rest:
        yield pcm


async def _sse(run: _Run, encoded: AsyncIterator[bytes | Alignment]) -> AsyncIterator[bytes]:
    try:
        async for data in encoded:
            if isinstance(data, Alignment):
                words = [{"text": w.text, "start_s": w.start_s, "end_s": w.end_s} for w in data.words]
                extra = {"estimated": True} if data.estimated else {}
                yield _event({"type": "speech.alignment", "words": words, **extra})
                continue
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
    except SpeechTruncated as exc:  # an `error` event instead of `done`: the SDKs raise on it
        yield _event({"type": "error", **exc.error.body()})
        return
    stats = run.stream.done.stats if run.stream is not None and run.stream.done is not None else None
    output_tokens = stats.tokens if stats else 0
    usage = {"input_tokens": 0, "output_tokens": output_tokens, "total_tokens": output_tokens,
             "audio_seconds": round(run.audio_seconds, 3)}
    yield _event({"type": "speech.audio.done", "usage": usage, "trace_id": run.trace.trace_id,
                  "served_by": stats.served_by if stats else "", "proxied": bool(stats.proxied) if stats else False})


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class _Streamed(StreamingResponse):
    """A streaming response that always releases its request's resources when it is over, also
    when the client went away before or during the body (Starlette then stops iterating it), and
    that ends a truncated body without its terminating chunk."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SpeechTruncated:
            # Return with the body unfinished: the server drops the connection without the last
            # (zero-length) chunk, and the client sees an incomplete response. The cut was
            # reported (gateway.api.cuts); uvicorn's own line for it is dropped.
            mark_cut()
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()
