"""Voices and cloning: `POST /v1/voices`, `GET /v1/voices`, `GET /v1/voices/{name}`, `DELETE /v1/voices/{name}`.

`POST /v1/voices` takes `multipart/form-data`:

    name         the voice's name (per tenant; not a base voice's)
    files        one or more recordings (any format lora_training decodes: wav, flac, mp3, ogg/opus,
                 m4a...); a `<stem>.txt` among them is the transcript of `<stem>.<ext>`
    transcripts  optional: a manifest file (.json {"take1.wav": "text"}, .csv/.tsv audio,text, or
                 LJSpeech `name|text` lines), or plain text (the transcript of a single file)
    consent      a tenant whose policy is "statement": the speaker's consent statement, stored with the voice
    consent_audio, consent_id
                 a tenant whose policy is "spoken" (the default): a recording of the speaker reading the
                 `text_to_read` of `POST /v1/voices/consent`, and that phrase's id; at most
                 MAX_CONSENT_AUDIO_S seconds, its bytes within max_upload_bytes like every other file

The body is parsed as it streams in (python-multipart's push parser over `request.stream()`; Starlette's
`request.form()` would spool whole files before anyone could count them), and the tenant's
`max_upload_bytes` is counted on the raw body: a declared `Content-Length` over it is refused before
a byte is read, a chunked body the moment it passes it, with 413 and every partial file removed.
Every other byte is bounded too: a part's headers (MAX_PART_HEADERS, MAX_PART_HEADER_BYTES: 400
headers_too_large), a text field (MAX_FIELD_BYTES), the files (MAX_FILES), and the time the body
takes (`upload_idle_timeout_s` between chunks, `upload_body_timeout_s` in all: 408 request_timeout).
The parser runs in a thread, never on the event loop, and holds one file open at a time. The rest
(checks, registration, the job) is `gateway.cloning`; this module is the HTTP side and maps its
errors to OpenAI-shaped ones (`errors.py`).

`POST /v1/voices/consent` (JSON {"name": ...}, at most CONSENT_BODY_BYTES) issues that phrase
(`gateway.cloning.consent`); it counts once against the tenant's requests_per_minute (the `caller`
dependency counts every route's request; the route adds nothing).

`lifecycle(gateway)` runs the clone watcher (`gateway.cloning.CloneWatcher`) for the app's lifetime.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, BinaryIO, Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, JSONResponse
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from gateway.api.auth import caller, gateway_of
from gateway.api.edge import read_body
from gateway.api.errors import ApiError, from_tenant_error
from gateway.api.speech import TRACE_HEADER, request_trace
from gateway.api.state import Gateway
from gateway.cloning import (TRANSCRIPT_SUFFIXES, SIDECAR_SUFFIX, BadUpload, CloneError, CloneUnavailable, CloneWatcher,
                             Cloning, DecodesBusy, NotDeletable, SampleNotFound, Upload, UploadTimeout, UploadTooLarge,
                             check_name)
from gateway.tenants import Tenant, TenantError

__all__ = ["lifecycle", "router"]

log = logging.getLogger(__name__)

MAX_FIELD_BYTES: Final = 1 << 20  # one text field (a transcripts text can be long; the rest are short)
MAX_FILES: Final = 500
MAX_FILE_NAME_BYTES: Final = 255
MAX_PART_HEADERS: Final = 8  # headers of one part (clients send Content-Disposition and Content-Type)
MAX_PART_HEADER_BYTES: Final = 8 * 1024  # names and values of one part's headers together
FEED_BYTES: Final = 64 * 1024  # the parser takes the body this much at a time, stopping at the first error
TEXT_FIELDS: Final = frozenset({"name", "consent", "consent_id", "transcripts"})
FILE_FIELDS: Final = frozenset({"files", "transcripts", "consent_audio"})
CONSENT_BODY_BYTES: Final = 1024  # POST /v1/voices/consent: {"name": ...} (a name is at most 128 characters)

router = APIRouter()

_UPLOAD_SCHEMA = {
    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["name", "files"],
        "properties": {
            "name": {"type": "string", "description": "the voice's name: letters, digits, '._-'"},
            "files": {"type": "array", "items": {"type": "string", "format": "binary"}, "maxItems": MAX_FILES,
                      "description": "recordings (wav, flac, mp3, ogg/opus, m4a...), about 10 minutes of speech; "
                                     "a <stem>.txt among them is the transcript of <stem>.<ext>"},
            "transcripts": {"type": "string", "format": "binary",
                            "description": "a manifest (.json, .csv, .tsv, LJSpeech .txt), or plain text for one file"},
            "consent": {"type": "string", "description": "tenants with the statement consent policy: the speaker's "
                                                         "consent statement (stored with the voice)"},
            "consent_audio": {"type": "string", "format": "binary",
                              "description": "tenants with the spoken consent policy (the default): the speaker "
                                             "reading the text_to_read of POST /v1/voices/consent"},
            "consent_id": {"type": "string", "description": "the consent_id of that phrase"},
        }}}}},
}


@router.post("/v1/voices", status_code=202, openapi_extra=_UPLOAD_SCHEMA,
              responses={202: {"description": "the voice is queued for training"}})
async def create_voice(request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> JSONResponse:
    """Upload recordings and queue a clone; poll `GET /v1/voices/{name}` until it is `ready`."""
    gateway = gateway_of(request)
    cloning = Cloning(gateway)
    try:
        upload = await receive_upload(request, tenant, cloning)
        view = await cloning.create(tenant, upload)
    except (CloneError, TenantError) as exc:
        error = _api_error(exc)
        if isinstance(exc, CloneError) and exc.detail:  # the decoder's words name server paths: the log keeps them
            trace = request_trace(request.headers.getlist(TRACE_HEADER))
            log.warning("upload of tenant %s refused (trace %s): %s [%s]", tenant.id, trace.trace_id, exc.message,
                        exc.detail)
            error.trace_id = trace.trace_id
        raise error from None
    return JSONResponse(view.to_json(), status_code=202)


@router.post("/v1/voices/consent", openapi_extra={"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "description": "the name the voice will be uploaded under"}}}}}}})
async def issue_consent(request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """A one-time phrase for the spoken consent of voice `name`: record the speaker reading
    `text_to_read` and send it as `consent_audio` with `consent_id` before `expires_at`."""
    gateway = gateway_of(request)  # counted once against requests_per_minute, by `caller`, as every route is
    body = await read_body(request, CONSENT_BODY_BYTES, timeout_s=gateway.settings.body_timeout_s)
    try:
        name = json.loads(body).get("name")
    except (ValueError, AttributeError, RecursionError):
        raise ApiError(400, 'send a JSON object {"name": "<the voice\'s name>"}', code="invalid_json") from None
    if not isinstance(name, str):
        raise ApiError(400, 'send the voice\'s name as a string: {"name": "nova"}', param="name",
                       code="missing_field")
    try:
        phrase = await Cloning(gateway).issue_consent(tenant, name)
    except (CloneError, TenantError) as exc:
        raise _api_error(exc) from None
    return phrase.to_json()


@router.get("/v1/voices")
async def list_voices(request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """The base voices and the tenant's clones, with their state."""
    try:
        views = await Cloning(gateway_of(request)).list(tenant)
    except (CloneError, TenantError) as exc:
        raise _api_error(exc) from None
    return {"object": "list", "data": [v.to_json() for v in views]}


@router.get("/v1/voices/{name}")
async def get_voice(name: str, request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """One voice: state, progress %, ETA and, for a failed clone, the reason."""
    try:
        view = await Cloning(gateway_of(request)).describe(tenant, name)
    except (CloneError, TenantError) as exc:
        raise _api_error(exc) from None
    return view.to_json()


@router.get("/v1/voices/{name}/samples/{file}", response_class=FileResponse,
            responses={200: {"content": {"audio/wav": {}}, "description": "a clone report sample (24 kHz PCM16 wav)"}})
async def get_sample(name: str, file: str, request: Request,
                     tenant: Annotated[Tenant, Depends(caller)]) -> FileResponse:
    """One clone report sample's audio (its `report.samples[].audio_url`), for the creator to hear."""
    try:
        path = await Cloning(gateway_of(request)).sample_audio(tenant, name, file)
    except (CloneError, TenantError) as exc:
        raise _api_error(exc) from None
    return FileResponse(path, media_type="audio/wav", headers={"Cache-Control": "private, max-age=3600"})


@router.delete("/v1/voices/{name}")
async def delete_voice(name: str, request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """Delete a clone: its training stops, its adapter and uploads are removed; it can no longer speak."""
    try:
        await Cloning(gateway_of(request)).delete(tenant, name)
    except (CloneError, TenantError) as exc:
        raise _api_error(exc) from None
    return {"id": name, "object": "voice.deleted", "deleted": True}


@asynccontextmanager
async def lifecycle(gateway: Gateway) -> AsyncIterator[None]:
    """The clone watcher, for as long as the app serves."""
    async with CloneWatcher(gateway):
        yield


def _api_error(exc: CloneError | TenantError) -> ApiError:
    if isinstance(exc, UploadTooLarge):
        return ApiError(413, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, (BadUpload, NotDeletable)):
        findings = getattr(exc, "findings", None)  # upload_checks: every block, with file and time
        return ApiError(400, exc.message, param=exc.param, code=exc.code,
                        details={"findings": findings} if findings else None)
    if isinstance(exc, SampleNotFound):
        return ApiError(404, exc.message, type="not_found_error", param=exc.param, code=exc.code)
    if isinstance(exc, CloneUnavailable):
        return ApiError(503, exc.message, type="service_unavailable", code=exc.code)
    if isinstance(exc, UploadTimeout):
        return ApiError(408, exc.message, param=exc.param, code=exc.code, retryable=False)
    if isinstance(exc, DecodesBusy):
        if exc.scope == "tenant":
            return ApiError(429, exc.message, type="rate_limit_error", param=exc.param, code=exc.code,
                            retry_after_s=exc.retry_after_s)
        return ApiError(503, exc.message, type="service_unavailable", param=exc.param, code=exc.code,
                        retry_after_s=exc.retry_after_s)
    if isinstance(exc, CloneError):
        return ApiError(500, exc.message, type="server_error", code=exc.code)
    return from_tenant_error(exc, param="name")


# -- the streamed multipart body --------------------------------------------------------------------


async def receive_upload(request: Request, tenant: Tenant, cloning: Cloning) -> Upload:
    """Stream the multipart body into a fresh incoming folder, within the tenant's byte limit and the
    gateway's body timeouts. On any error the folder is removed and the error raised (BadUpload,
    UploadTooLarge, UploadTimeout, a disconnect)."""
    limit = tenant.limits.max_upload_bytes
    settings = cloning.settings
    content_type = request.headers.get("content-type", "")
    kind, options = parse_options_header(content_type)
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        raise BadUpload("send the upload as multipart/form-data (fields name, files, consent_audio and "
                        "consent_id or consent, and optionally transcripts)", code="invalid_content_type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise UploadTooLarge(limit)
    upload = await asyncio.to_thread(cloning.uploads.incoming)
    form = _Form(upload, options, lambda name: check_name(tenant, name, cloning.base_voices))
    body = _Body(request, idle_s=settings.upload_idle_timeout_s, total_s=settings.upload_body_timeout_s)
    try:
        received = 0
        while (chunk := await body.next_chunk()) is not None:
            received += len(chunk)
            if received > limit:
                raise UploadTooLarge(limit)
            await asyncio.to_thread(form.feed, chunk)
        await asyncio.to_thread(form.finish)
    except BaseException:
        await asyncio.to_thread(form.close)  # waits for a feed still running in its thread
        await asyncio.to_thread(cloning.uploads.discard, upload)
        raise
    await asyncio.to_thread(form.close)
    return upload


class _Body:
    """The request body's chunks, each within `idle_s` of the one before and all within `total_s`:
    a stalled or crawling body is cut (UploadTimeout), never held open."""

    def __init__(self, request: Request, *, idle_s: float, total_s: float) -> None:
        self._chunks = request.stream().__aiter__()
        self._idle_s, self._total_s = idle_s, total_s
        self._deadline = asyncio.get_running_loop().time() + total_s

    async def next_chunk(self) -> bytes | None:
        """The next non-empty chunk, or None once the body has ended."""
        while True:
            left = self._deadline - asyncio.get_running_loop().time()
            try:
                async with asyncio.timeout(max(0.0, min(self._idle_s, left))):
                    chunk = await anext(self._chunks)
            except StopAsyncIteration:
                return None
            except TimeoutError:
                if left <= self._idle_s:
                    raise UploadTimeout(f"the upload took longer than {self._total_s:g} s to arrive; send fewer "
                                        "or smaller files per request", param="files") from None
                raise UploadTimeout(f"the upload stalled: nothing arrived for {self._idle_s:g} s; send the body "
                                    "without pauses", param="files") from None
            if chunk:
                return chunk


class _Form:
    """python-multipart callbacks -> the Upload: text fields kept (bounded), file parts written to
    the upload's folder, one file open at a time (closed when its part ends). Part headers are
    bounded (MAX_PART_HEADERS, MAX_PART_HEADER_BYTES). `feed` parses and writes, blocking: call it
    in a thread, never on the event loop; it parses FEED_BYTES at a time and stops at the first
    error. `check_name` runs as soon as the name field is complete, so a bad name is refused before
    the files are read."""

    def __init__(self, upload: Upload, options: dict[bytes, bytes], check_name) -> None:
        charset = options.get(b"charset", b"utf-8").decode("latin-1")
        try:
            self._charset = codecs.lookup(charset).name
        except LookupError:
            self._charset = "utf-8"
        self.upload = upload
        self._check_name = check_name
        self._parser = MultipartParser(options[b"boundary"], {
            "on_part_begin": self._part_begin, "on_part_data": self._part_data, "on_part_end": self._part_end,
            "on_header_field": self._header_field, "on_header_value": self._header_value,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_finished, "on_end": self._end,
        })
        self._lock = threading.Lock()  # feed (a thread) vs close (cleanup after an error or a cancel)
        self._closed = False
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._header_bytes = 0  # of this part's headers
        self._headers = 0
        self._disposition = b""
        self._field: str | None = None
        self._text: bytearray | None = None  # a text part being read
        self._file: BinaryIO | None = None  # the file part being written
        self._names: set[str] = set()
        self._error: BaseException | None = None
        self._ended = False

    # -- driving (blocking: in a thread) ---------------------------------------------------------------

    def feed(self, chunk: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            view = memoryview(chunk)
            for at in range(0, len(view), FEED_BYTES):
                try:
                    self._parser.write(bytes(view[at:at + FEED_BYTES]))
                except FormParserError:
                    raise BadUpload("the multipart body is malformed; send it as multipart/form-data (curl -F "
                                    "does)", code="invalid_multipart") from None
                if self._error is not None:
                    raise self._error

    def finish(self) -> None:
        with self._lock:
            self._parser.finalize()
            if self._error is not None:
                raise self._error
            if not self._ended:
                raise BadUpload("the multipart body ended before its closing boundary; send the whole form",
                                code="invalid_multipart")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- callbacks (errors are kept and raised by feed, so the parser never sees them) ---------------

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    def _part_begin(self) -> None:
        self._disposition, self._field, self._text = b"", None, None
        self._header_bytes = self._headers = 0

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_part(self._header_name, data, start, end)

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_part(self._header_value, data, start, end)

    def _header_part(self, into: bytearray, data: bytes, start: int, end: int) -> None:
        if self._error is not None:
            return
        self._header_bytes += end - start
        if self._header_bytes > MAX_PART_HEADER_BYTES:
            self._fail(BadUpload(f"a part of the form has over {MAX_PART_HEADER_BYTES} bytes of headers; a part "
                                 "needs only Content-Disposition and Content-Type", code="headers_too_large"))
            return
        into += data[start:end]

    def _header_end(self) -> None:
        if self._error is not None:
            return
        self._headers += 1
        if self._headers > MAX_PART_HEADERS:
            self._fail(BadUpload(f"a part of the form has over {MAX_PART_HEADERS} headers; a part needs only "
                                 "Content-Disposition and Content-Type", code="headers_too_large"))
            return
        if self._header_name.lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        if self._error is not None:
            return
        _, options = parse_options_header(self._disposition)
        field = options.get(b"name")
        if field is None:
            self._fail(BadUpload("a part of the form has no name (Content-Disposition: form-data; name=...)",
                                 code="invalid_multipart"))
            return
        name = field.decode(self._charset, errors="replace")
        self._field = name
        filename = options.get(b"filename")
        if filename is None:
            if name not in TEXT_FIELDS:
                self._fail(_unknown_or_misplaced(name, file=False))
                return
            self._text = bytearray()
            return
        if name not in FILE_FIELDS:
            self._fail(_unknown_or_misplaced(name, file=True))
            return
        try:
            path = self._place(name, filename.decode(self._charset, errors="replace"))
        except BadUpload as exc:
            self._fail(exc)
            return
        self._file = open(path, "wb")  # noqa: SIM115 (closed at the part's end, or by close())

    def _place(self, field: str, filename: str) -> Path:
        """Where a file part goes in the upload folder (and which list it joins)."""
        upload = self.upload
        if field == "transcripts":
            suffix = Path(filename).suffix.lower()
            if suffix not in TRANSCRIPT_SUFFIXES:
                raise BadUpload(f"transcripts file {filename!r}: use .json, .csv, .tsv or .txt",
                                code="transcripts", param="transcripts")
            if upload.transcripts is not None:
                raise BadUpload("send one transcripts manifest", code="transcripts", param="transcripts")
            upload.transcripts = upload.folder / f"transcripts{suffix}"
            return upload.transcripts
        if field == "consent_audio":
            if upload.consent_audio is not None:
                raise BadUpload("send one consent recording", code="invalid_value", param="consent_audio")
            suffix = Path(_file_name(filename)).suffix.lower()
            safe = suffix if 1 < len(suffix) <= 8 and suffix[1:].isalnum() else ".audio"
            upload.consent_audio = upload.folder / f"consent-audio{safe}"  # beside audio/: never trained on
            return upload.consent_audio
        name = _file_name(filename)
        if name in self._names:
            raise BadUpload(f"two files are named {name!r}; transcripts are matched by file name, so rename one",
                            param="files", code="duplicate_file_name")
        if len(self._names) >= MAX_FILES:
            raise BadUpload(f"more than {MAX_FILES} files; join recordings into longer files", param="files",
                            code="too_many_files")
        self._names.add(name)
        path = upload.audio_dir / name
        (upload.sidecars if path.suffix.lower() == SIDECAR_SUFFIX else upload.audio).append(path)
        return path

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._error is not None:
            return
        if self._file is not None:
            self._file.write(data[start:end])
        elif self._text is not None:
            if len(self._text) + end - start > MAX_FIELD_BYTES:
                self._fail(BadUpload(f"form field {self._field!r} is over {MAX_FIELD_BYTES} bytes; send long "
                                     "transcripts as a file", param=self._field, code="field_too_long"))
                return
            self._text += data[start:end]

    def _part_end(self) -> None:
        self._close_file()
        if self._error is not None or self._text is None:
            return
        text = self._text.decode(self._charset, errors="replace")
        upload = self.upload
        if self._field == "name":
            try:
                upload.name = self._check_name(text)
            except BadUpload as exc:
                self._fail(exc)
        elif self._field == "consent":
            upload.consent = text
        elif self._field == "consent_id":
            upload.consent_id = text.strip()
        elif self._field == "transcripts":
            if upload.transcripts is not None:
                self._fail(BadUpload("send one transcripts manifest", code="transcripts", param="transcripts"))
                return
            upload.transcripts = upload.folder / "transcripts.txt"
            upload.transcripts.write_text(text, encoding="utf-8")

    def _end(self) -> None:
        self._ended = True


def _file_name(filename: str) -> str:
    """The upload's own file name (no folders), if it can be stored and matched as it is."""
    name = filename.replace("\\", "/").rsplit("/", 1)[-1].strip()
    if (not name or name.startswith(".") or len(name.encode()) > MAX_FILE_NAME_BYTES
            or any(ord(c) < 32 or c == "\x7f" for c in name)):
        raise BadUpload(f"file name {filename[:80]!r} cannot be stored: use a plain name such as take1.wav "
                        "(not starting with '.', no control characters)", param="files", code="invalid_file_name")
    return name


def _unknown_or_misplaced(field: str, *, file: bool) -> BadUpload:
    if field in TEXT_FIELDS | FILE_FIELDS:
        what = "a file" if field in FILE_FIELDS else "text"
        return BadUpload(f"form field {field!r} must be {what}", param=field, code="invalid_value")
    return BadUpload(f"Unrecognized request argument supplied: {field[:64]} (the fields are name, files, "
                     "transcripts, consent_audio, consent_id and consent)", param=field[:64], code="unknown_parameter")
