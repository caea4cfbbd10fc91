"""Cloning a voice from uploads: the gateway's side of lora_training.

    POST /v1/voices ─> Uploads: streamed to disk (gateway.api.voices), under uploads_dir/.incoming/
                   ─> check_uploads: lora_training's own ingest checks, in a thread (decodable,
                      sample rate, clipping, near-silent, speech found, enough of it, transcripts)
                   ─> the TenantVoice registered ("training"; max_voices), a training slot taken
                      (max_training_jobs), the files moved to uploads_dir/<tenant id>/<name>/<job id>/
                   ─> a lora_training job (JobSpec: tenant = tenant id, so the voice id it publishes
                      is the TenantVoice's `voice_id`, f"{tenant.id}/{name}")
    CloneWatcher (one task per gateway process, owned by `gateway.api.voices.lifecycle`):
        job ready ─> voice "warming" ─> prewarmed on every owner (the worker's GET /prewarm) ─> "ready"
        job failed or cancelled ─> voice "failed", with the reason
        then: the training slot released, the training minutes metered.

In-flight clones are listed in one Redis hash, `<tenant prefix>:clones` (job id -> `CloneRecord`),
so every gateway process's watcher finds them without walking every tenant. Several gateways may
watch at once: each step is idempotent, and the last one (dropping the record) is claimed by one
HDEL, so a clone is metered once. A voice deleted while its job runs stays in the hash, marked
`deleted`, until the job has stopped: if the trainer published the adapter before it saw the
cancel, the watcher removes it then.

Errors (`CloneError`, each with the `code` and `param` the API answers with):

    CloneError
    ├── BadUpload         the upload cannot make a voice; the message says what to fix (HTTP 400)
    ├── UploadTooLarge    more bytes than the tenant's max_upload_bytes (HTTP 413)
    ├── NotDeletable      a base voice (HTTP 400)
    └── CloneUnavailable  the training queue (Redis) is unreachable (HTTP 503, retryable)

Tenant-layer errors (VoiceNotFound, VoiceExists, QuotaExceeded, Unavailable...) pass through as
they are. Nothing here imports torch or vLLM: lora_training's ingest checks need numpy, soundfile,
soxr and PyAV only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import secrets
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from gateway.tenants import Tenant, TenantError, TenantNotFound, TenantVoice, VoiceNotFound, redis_errors
from gpu_worker.adapters.layout import METADATA, STAGING_DIR
from gpu_worker.orpheus import SAMPLE_RATE
from hashring.errors import EmptyRing, RingError
from hashring.records import WorkerInfo, shown_voice_id, valid_voice_id
from lora_training.errors import InfrastructureError, InputError, TranscriptError, TrainingError
from lora_training.jobs import JobStatus
from lora_training.pipeline import JobSpec
from lora_training.settings import DataParams

if TYPE_CHECKING:
    from gateway.api.state import Gateway

__all__ = [
    "ApiState",
    "BadUpload",
    "CloneError",
    "CloneRecord",
    "CloneUnavailable",
    "CloneWatcher",
    "Cloning",
    "NotDeletable",
    "SIDECAR_SUFFIX",
    "TRANSCRIPT_SUFFIXES",
    "Upload",
    "UploadArea",
    "UploadTooLarge",
    "VoiceView",
    "check_name",
    "check_uploads",
]

log = logging.getLogger(__name__)

ApiState = Literal["queued", "preprocessing", "training", "validating", "ready", "failed"]

POLL_S: Final = 0.5  # how often the watcher looks at the clones in flight
PREWARM_TIMEOUT_S: Final = 5.0  # one HTTP call to a worker's /prewarm
PREWARM_ATTEMPTS: Final = 3  # a worker that reports it cannot load the voice this often: the voice fails
INCOMING: Final = ".incoming"  # uploads being received: never a tenant id (those start with "t_")
STALE_INCOMING_S: Final = 24 * 3600.0  # an upload folder this old was left by a gateway that stopped
MAX_CONSENT_CHARS: Final = 4096  # what the tenant layer stores
SUBMIT_GRACE_S: Final = 60.0  # a voice this young whose job is not there yet is still being submitted
TRANSCRIPT_SUFFIXES: Final = (".json", ".csv", ".tsv", ".txt")
SIDECAR_SUFFIX: Final = ".txt"

# job state -> the state the API reports while the voice is still training
_JOB_STATES: Final[dict[str, ApiState]] = {
    "queued": "queued", "preprocessing": "preprocessing", "training": "training", "validating": "validating",
    "publishing": "validating", "ready": "validating",
}
_RUNNING: Final = frozenset({"preprocessing", "training", "validating"})


# -- errors -----------------------------------------------------------------------------------------


class CloneError(Exception):
    """Base of the errors of a clone request; `code` and `param` are what the API answers with."""

    code = "clone_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.code
        self.param = param


class BadUpload(CloneError):
    """The upload cannot make a voice (a field missing, a file unusable); the message says what to fix."""

    code = "invalid_upload"


class UploadTooLarge(CloneError):
    """The upload passed the tenant's `max_upload_bytes`."""

    code = "upload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the upload is larger than your limit of {limit} bytes (the whole request body); "
                         "send fewer or shorter files (about 10 minutes of speech is enough), or compress them "
                         "(flac, mp3, ogg/opus)", param="files")
        self.limit = limit


class NotDeletable(CloneError):
    """Base voices belong to the platform."""

    code = "base_voice"


class CloneUnavailable(CloneError):
    """The training queue cannot be reached; retry shortly."""

    code = "training_queue_unavailable"


# -- uploads on disk --------------------------------------------------------------------------------


@dataclass
class Upload:
    """One POST /v1/voices as received: its fields, and its files in `folder`."""

    folder: Path  # uploads_dir/.incoming/<random>/: audio/ and the transcripts file
    name: str | None = None
    consent: str | None = None
    audio: list[Path] = field(default_factory=list)  # folder/audio/<file name>, in upload order
    sidecars: list[Path] = field(default_factory=list)  # folder/audio/<stem>.txt, next to their audio
    transcripts: Path | None = None  # folder/transcripts.<json|csv|tsv|txt>

    @property
    def audio_dir(self) -> Path:
        return self.folder / "audio"


class UploadArea:
    """Where uploads live: `.incoming/<random>/` while they arrive and are checked, then
    `<tenant id>/<voice name>/<job id>/` until the voice is deleted (the trainers read them there:
    shared storage in a fleet)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def incoming(self) -> Upload:
        folder = self.root / INCOMING / uuid.uuid4().hex
        (folder / "audio").mkdir(parents=True)
        return Upload(folder)

    def voice_dir(self, tenant_id: str, name: str) -> Path:
        return self.root / tenant_id / name

    def keep(self, upload: Upload, tenant_id: str, name: str, job_id: str) -> Upload:
        """Move a checked upload to its voice's folder (one rename); the returned Upload points there."""
        target = self.voice_dir(tenant_id, name) / job_id
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(upload.folder, target)

        def moved(path: Path) -> Path:
            return target / path.relative_to(upload.folder)

        return Upload(target, upload.name, upload.consent, [moved(p) for p in upload.audio],
                      [moved(p) for p in upload.sidecars], moved(upload.transcripts) if upload.transcripts else None)

    def discard(self, upload: Upload) -> None:
        shutil.rmtree(upload.folder, ignore_errors=True)

    def remove_voice(self, tenant_id: str, name: str) -> None:
        """Delete every upload of the tenant's voice `name`."""
        folder = self.voice_dir(tenant_id, name)
        if folder.exists():
            shutil.rmtree(folder)
        with_tenant = self.root / tenant_id
        try:
            with_tenant.rmdir()  # only when empty
        except OSError:
            pass

    def sweep(self, older_than_s: float = STALE_INCOMING_S) -> int:
        """Remove incoming folders left by a gateway that stopped mid-upload; returns how many."""
        incoming = self.root / INCOMING
        if not incoming.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for entry in incoming.iterdir():
            try:
                if entry.stat().st_mtime < cutoff:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed += 1
            except FileNotFoundError:
                continue
        return removed


def remove_adapter(store: Path, voice_id: str, *, job_id: str | None = None) -> bool:
    """Take `<store>/<voice id>` out of the adapter store: one rename into the store's hidden staging
    folder (workers resolve the voice as unknown from then on), then the files are removed. With
    `job_id`, only an adapter that job published (its voicering.json says so). True if one went."""
    path = Path(store) / voice_id
    if not path.is_dir():
        return False
    if job_id is not None:
        try:
            published_by = json.loads((path / METADATA).read_text()).get("job_id")
        except (OSError, ValueError):
            published_by = None
        if published_by != job_id:
            return False
    trash = Path(store) / STAGING_DIR / f"deleted-{uuid.uuid4().hex}"
    trash.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return False
    shutil.rmtree(trash, ignore_errors=True)
    return True


# -- checks -----------------------------------------------------------------------------------------


def check_name(tenant: Tenant, name: str | None, base_voices: Iterable[str]) -> str:
    """`name` if it can name one of the tenant's voices, else BadUpload saying what is allowed."""
    if name is None or not name.strip():
        raise BadUpload("give the voice a name: the form field 'name'", code="missing_field", param="name")
    if "/" in name or not valid_voice_id(f"{tenant.id}/{name}"):
        raise BadUpload(f"voice name {shown_voice_id(name)} is not usable: use 1-128 letters, digits or '._-', "
                        "starting with a letter or digit", code="invalid_name", param="name")
    if name in tuple(base_voices):
        raise BadUpload(f"{name!r} is a base voice of the platform; pick another name for your clone",
                        code="reserved_name", param="name")
    return name


def check_consent(consent: str | None) -> str:
    if consent is None or not consent.strip():
        raise BadUpload("a clone needs the speaker's consent: send the form field 'consent' with their statement "
                        "(or a reference to the signed record)", code="consent_required", param="consent")
    if len(consent) > MAX_CONSENT_CHARS:
        raise BadUpload(f"the consent statement is {len(consent)} characters; the most is {MAX_CONSENT_CHARS}: "
                        "store the full record elsewhere and send a reference to it", code="consent_too_long",
                        param="consent")
    return consent


def check_uploads(upload: Upload, data: DataParams, *, asr: bool) -> float:
    """lora_training's own checks on the files, quickly and before anything is queued: every audio file
    decodes, has a usable sample rate, is not clipped or near-silent and holds speech; the speech in
    all of them is within `data`'s bounds; the transcripts parse and match the files (every file has
    one unless the trainers run ASR). Blocking (decoding): run it in a thread. Returns the seconds
    of speech found; raises BadUpload with lora_training's message."""
    from lora_training import transcripts as transcript_io
    from lora_training.ingest import check_speech_total, ingest
    from lora_training.segment import speech_regions

    if not upload.audio:
        raise BadUpload("no audio was uploaded: send the recordings as form field 'files' (one or more)",
                        code="missing_field", param="files")
    audio_names = {p.stem: p.name for p in upload.audio}
    stray = [p.name for p in upload.sidecars if p.stem not in audio_names]
    if stray:
        raise BadUpload(f"{', '.join(stray)} names no uploaded audio file: a transcript sent among the files is "
                        "named after its audio file (take1.wav -> take1.txt)", code="transcripts",
                        param="files")
    try:
        matched = transcript_io.load(upload.transcripts, upload.audio, allow_missing=True)
        if matched.missing and not asr:
            raise TranscriptError(
                f"audio files without a transcript: {', '.join(matched.missing[:5])}"
                f"{' and more' if len(matched.missing) > 5 else ''}. Send 'transcripts': a JSON manifest "
                '({"take1.wav": "what is said"}), a CSV (audio,text), or send take1.txt beside take1.wav '
                "among the files")
        _check_declared_length(upload.audio, data)
        speech_s = audio_s = 0.0
        for path in upload.audio:
            recording = ingest(path, data)
            audio_s += recording.duration_s
            if audio_s > data.max_speech_s * 1.5:
                raise _too_long(audio_s, data)
            regions = speech_regions(recording.audio, data)
            if not regions:
                raise _no_speech(path.name)
            speech_s += sum(end - start for start, end in regions) / SAMPLE_RATE
        check_speech_total(speech_s, data)
    except InputError as err:
        raise BadUpload(err.message, code=err.code, param="transcripts" if isinstance(err, TranscriptError)
                        else "files") from None
    return speech_s


def _check_declared_length(paths: list[Path], data: DataParams) -> None:
    """Refuse, from the file headers alone, uploads that would decode to far more audio than a voice
    may use (a small compressed file can hold hours of silence; decoding it would fill memory)."""
    import soundfile as sf

    total = 0.0
    for path in paths:
        try:
            total += sf.info(str(path)).duration
        except Exception:  # not a libsndfile format (m4a...) or unreadable: decoding will say
            continue
    if total > data.max_speech_s * 1.5:
        raise _too_long(total, data)


def _too_long(audio_s: float, data: DataParams) -> InputError:
    from lora_training.errors import SpeechAmountError

    return SpeechAmountError(f"the uploads hold over {audio_s / 60:.0f} minutes of audio; the limit is "
                             f"{data.max_speech_s / 60:.0f} minutes of speech: upload fewer files")


def _no_speech(name: str) -> InputError:
    from lora_training.errors import AudioError

    return AudioError(f"{name}: no speech was found in it (only silence or steady noise); upload recordings of "
                      "the speaker talking")


# -- the record of a clone in flight ----------------------------------------------------------------


@dataclass
class CloneRecord:
    """A clone whose job has not been seen to its end yet (one field of the clones hash)."""

    job_id: str
    tenant_id: str
    name: str
    voice_id: str
    submitted_at: float
    started_at: float | None = None  # when a watcher first saw the job running (ETA, training minutes)
    deleted: bool = False  # the voice was deleted: wait for the job to stop, then clean up

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> CloneRecord:
        data = json.loads(raw)
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


# KEYS: the clones hash. ARGV: job id, record. Never brings back a record another process dropped.
_UPDATE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


class CloneIndex:
    """The clones hash, through the training queue's Redis client (sync: call it in a thread)."""

    def __init__(self, redis, key: str) -> None:
        self._redis = redis
        self.key = key
        self._update = redis.register_script(_UPDATE)

    def put(self, record: CloneRecord) -> None:
        """Add a new clone."""
        with redis_errors():
            self._redis.hset(self.key, record.job_id, record.to_json())

    def update(self, record: CloneRecord) -> bool:
        """Replace a clone's record if it is still there (False: it was finished meanwhile)."""
        with redis_errors():
            return bool(self._update(keys=[self.key], args=[record.job_id, record.to_json()]))

    def get(self, job_id: str) -> CloneRecord | None:
        with redis_errors():
            raw = self._redis.hget(self.key, job_id)
        return CloneRecord.from_json(raw) if raw else None

    def all(self) -> list[CloneRecord]:
        with redis_errors():
            raws = self._redis.hvals(self.key)
        return [CloneRecord.from_json(raw) for raw in raws]

    def drop(self, job_id: str) -> bool:
        """Remove the record; True for the one caller that removed it."""
        with redis_errors():
            return bool(self._redis.hdel(self.key, job_id))


# -- what the API shows -----------------------------------------------------------------------------


@dataclass(frozen=True)
class VoiceView:
    """A voice as GET /v1/voices/{name} shows it."""

    name: str
    type: Literal["base", "clone"]
    state: ApiState
    progress: float  # 0-100
    eta_s: float | None = None  # seconds left, from progress over the time it has run (rough)
    message: str | None = None  # what is happening now
    reason: str | None = None  # why it failed
    created_at: int | None = None
    job_id: str | None = None

    def to_json(self) -> dict:
        return {"id": self.name, "name": self.name, "object": "voice", "type": self.type, "state": self.state,
                "progress": self.progress, "eta_s": self.eta_s, "message": self.message, "reason": self.reason,
                "created_at": self.created_at, "job_id": self.job_id}


def base_view(name: str) -> VoiceView:
    return VoiceView(name, "base", "ready", 100.0, message="a platform voice")


def clone_view(voice: TenantVoice, job: JobStatus | None, record: CloneRecord | None, *,
               now: float | None = None) -> VoiceView:
    """The API's view of a tenant voice: its own state once settled, else its job's."""
    now = time.time() if now is None else now
    created = int(voice.created_at)

    def view(state: ApiState, progress: float, **more) -> VoiceView:
        return VoiceView(voice.name, "clone", state, round(progress, 1), created_at=created, job_id=voice.job_id,
                         **more)

    if voice.state == "ready":
        return view("ready", 100.0, message="ready to speak")
    if voice.state == "failed":
        return view("failed", job.progress if job else 0.0, reason=voice.note or "training failed")
    if voice.state == "warming":
        return view("validating", 99.0, message=voice.note or "published; warming up on its workers")
    if job is None:
        if now - voice.created_at < SUBMIT_GRACE_S:
            return view("queued", 0.0, message="being queued for training")
        return view("failed", 0.0, reason="its training job is gone (the gateway stopped while queueing it, or "
                                          "the queue lost it); delete the voice and upload again")
    if job.state == "failed":
        return view("failed", job.progress, reason=job.error or job.message or "training failed")
    if job.state == "cancelled":
        return view("failed", job.progress, reason="its training job was cancelled; delete the voice and upload again")
    state = _JOB_STATES.get(job.state, "queued")
    progress = min(job.progress, 99.0)
    eta = None
    started = record.started_at if record is not None else None
    if state in _RUNNING and started is not None and progress > 0:
        elapsed = max(0.0, now - started)
        eta = round(elapsed * (100.0 - progress) / progress, 1)
    message = job.message or None
    if job.state == "ready":
        message = "published; warming up on its workers"
    elif job.state == "queued":
        message = "waiting for a trainer" if not job.error else f"waiting to be retried: {job.error}"
    return view(state, progress, eta_s=eta, message=message)


# -- the service the routes call --------------------------------------------------------------------


class Cloning:
    """Voices and cloning over one gateway's parts (tenants, quotas, queue, stores). Light: make one
    per request. The queue client is sync, so its calls run in threads."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.settings = gateway.settings
        self.uploads = UploadArea(gateway.settings.uploads_dir)
        self.index = CloneIndex(gateway.jobs.redis, f"{gateway.settings.tenant_prefix}:clones")

    @property
    def base_voices(self) -> tuple[str, ...]:
        return self.gateway.catalog.base_voices

    async def _queue(self, call: Callable[..., object], *args):
        try:
            return await asyncio.to_thread(call, *args)
        except InfrastructureError as err:
            raise CloneUnavailable(f"the training queue is unreachable ({err.message}); try again shortly") from None

    async def create(self, tenant: Tenant, upload: Upload) -> VoiceView:
        """Check a received upload, register the voice and queue its training job. On any error the
        upload and everything registered for it are removed again."""
        gw = self.gateway
        try:
            name = check_name(tenant, upload.name, self.base_voices)
            consent = check_consent(upload.consent)
            await asyncio.to_thread(check_uploads, upload, self.settings.clone_data, asr=self.settings.clone_asr)
            job_id = f"clone-{secrets.token_hex(6)}"
            voice = await gw.tenants.register_voice(tenant, name, consent=consent, job_id=job_id, state="training",
                                                    note="queued for training")
        except BaseException:
            await asyncio.to_thread(self.uploads.discard, upload)
            raise
        undo: list[Callable[[], Awaitable[object]]] = [lambda: gw.tenants.delete_voice(tenant, name)]
        try:
            await gw.quotas.acquire_training_slot(tenant, job_id)
            undo.append(lambda: gw.quotas.release_training_slot(tenant, job_id))
            kept = await asyncio.to_thread(self.uploads.keep, upload, tenant.id, name, job_id)
            undo.append(lambda: asyncio.to_thread(shutil.rmtree, kept.folder, True))
            spec = JobSpec(job_id=job_id, name=name, tenant=tenant.id, audio=kept.audio,
                           transcripts=kept.transcripts, data=self.settings.clone_data,
                           params=self.settings.clone_params)
            if spec.voice_id != voice.voice_id:  # the trainer publishes spec.voice_id; workers are asked for this one
                raise RuntimeError(f"job voice id {spec.voice_id!r} != tenant voice id {voice.voice_id!r}")
            # an adapter left at this voice id by a voice deleted mid-publish would fail the job: it is an orphan
            await asyncio.to_thread(remove_adapter, self.settings.voices_dir, voice.voice_id)
            record = CloneRecord(job_id, tenant.id, name, voice.voice_id, time.time())
            await self._queue(self.index.put, record)
            undo.append(lambda: asyncio.to_thread(self.index.drop, job_id))
            status = await self._queue(gw.jobs.submit, spec)
        except BaseException:
            await asyncio.to_thread(self.uploads.discard, upload)
            for step in reversed(undo):
                try:
                    await step()
                except Exception as exc:  # keep undoing; the watcher or a DELETE cleans up what is left
                    log.warning("undoing a refused clone of tenant %s (%s): %r", tenant.id, name, exc)
            raise
        log.info("clone %s of tenant %s queued as job %s", name, tenant.id, job_id)
        return clone_view(voice, status, record)

    async def describe(self, tenant: Tenant, name: str) -> VoiceView:
        try:
            voice = await self.gateway.tenants.voice(tenant, name)
        except VoiceNotFound:
            if name in self.base_voices:
                return base_view(name)
            raise
        return await self._view(voice)

    async def list(self, tenant: Tenant) -> list[VoiceView]:
        voices = await self.gateway.tenants.voices(tenant)
        clones = await asyncio.gather(*(self._view(v) for v in voices))
        return [base_view(name) for name in self.base_voices] + list(clones)

    async def _view(self, voice: TenantVoice) -> VoiceView:
        job = record = None
        if voice.state in ("training", "failed") and voice.job_id:
            job = await self._queue(self.gateway.jobs.status, voice.job_id)
            if voice.state == "training":
                record = await asyncio.to_thread(self.index.get, voice.job_id)
        return clone_view(voice, job, record)

    async def delete(self, tenant: Tenant, name: str) -> None:
        """Delete the tenant's voice: its job cancelled (a running one stops at its next step), its
        training slot freed, its adapter out of the store, its placement reset, its uploads gone."""
        gw = self.gateway
        try:
            voice = await gw.tenants.voice(tenant, name)
        except VoiceNotFound:
            if name in self.base_voices:
                raise NotDeletable(f"{name!r} is a base voice of the platform; only your own clones can be "
                                   "deleted", param="name") from None
            raise
        if voice.job_id:
            record = await asyncio.to_thread(self.index.get, voice.job_id)
            if record is not None and not record.deleted:
                await asyncio.to_thread(self.index.update, dataclasses.replace(record, deleted=True))
            status = await self._queue(gw.jobs.status, voice.job_id)
            if status is not None and not status.terminal:
                await self._queue(gw.jobs.cancel, voice.job_id)
            await gw.quotas.release_training_slot(tenant, voice.job_id)
        await gw.tenants.delete_voice(tenant, name)
        await asyncio.to_thread(remove_adapter, self.settings.voices_dir, voice.voice_id)
        await self._reset_placement(voice.voice_id)
        await asyncio.to_thread(self.uploads.remove_voice, tenant.id, name)
        log.info("voice %s of tenant %s deleted (job %s)", name, tenant.id, voice.job_id)

    async def _reset_placement(self, voice_id: str) -> None:
        """Forget the voice's replica counts in the ring (operator floor and automatic count)."""
        if self.gateway.watcher is None:  # fixed worker list: no placement in Redis
            return
        from hashring.placement import ReplicaControl
        from hashring.settings import RingSettings
        from hashring.store import RingStore

        settings = RingSettings(redis_url=self.gateway.redis_url, prefix=self.settings.ring_prefix)
        try:
            async with RingStore(settings) as store:
                await ReplicaControl(store).scale(voice_id, None)
                current = (await store.auto_replicas()).get(voice_id)
                if current is not None:
                    await store.swap_auto_replicas(voice_id, current, None)
        except RingError as exc:  # a stale count of a voice nobody can ask for is harmless; say so
            log.warning("placement of deleted voice %s not reset (%s); `voicering ring scale %s --clear` does it",
                        voice_id, exc, voice_id)


# -- the watcher ------------------------------------------------------------------------------------


class WarmFailed(Exception):
    """A worker reported that it cannot load the voice."""


class Prewarmer:
    """Makes a published voice hot on every worker that owns it, through each worker's HTTP
    `GET /prewarm?voice=...` (answered at once with an operation) and `GET /prewarm/<id>`. Keeps the
    operations it started between calls, so one call never waits on a worker."""

    def __init__(self, gateway: Gateway, client: httpx.AsyncClient) -> None:
        self._router = gateway.pool.router
        token = gateway.settings.cluster_token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client
        self._ops: dict[str, dict[str, str]] = {}  # voice id -> worker id -> operation id
        self._failures: dict[str, int] = {}

    async def warm(self, voice_id: str) -> tuple[bool, str]:
        """(True, "") once every owner reports the voice ready; (False, what it waits for) before.
        Raises WarmFailed when a worker keeps reporting that it cannot load the voice."""
        try:
            owners = self._router.owners(voice_id)
        except EmptyRing:
            return False, "waiting for a worker to join the ring"
        ops = self._ops.setdefault(voice_id, {})
        waiting: list[str] = []
        for info in owners:
            outcome, detail = await self._owner(voice_id, info, ops)
            if outcome == "ready":
                continue
            if outcome == "failed":
                ops.pop(info.id, None)
                count = self._failures[voice_id] = self._failures.get(voice_id, 0) + 1
                if count >= PREWARM_ATTEMPTS:
                    self.forget(voice_id)
                    raise WarmFailed(f"worker {info.id} cannot load it: {detail}")
            waiting.append(f"{info.id} ({detail})" if detail else info.id)
        if waiting:
            return False, f"warming up on {', '.join(waiting)}"
        self.forget(voice_id)
        return True, ""

    def forget(self, voice_id: str) -> None:
        self._ops.pop(voice_id, None)
        self._failures.pop(voice_id, None)

    async def _owner(self, voice_id: str, info: WorkerInfo,
                     ops: dict[str, str]) -> tuple[Literal["ready", "pending", "failed"], str]:
        """Where one owner is with the voice, and why it is not ready yet."""
        base = _http_base(info.ws_url)
        op = ops.get(info.id)
        if op is None:
            response = await self._client.get(f"{base}/prewarm", params={"voice": voice_id}, headers=self._headers)
            if response.status_code != 202:
                return "pending", f"prewarm refused: HTTP {response.status_code} {response.text[:200]}"
            op = ops[info.id] = str(response.json()["id"])
        response = await self._client.get(f"{base}/prewarm/{op}", headers=self._headers)
        if response.status_code == 404:  # the worker restarted and forgot the operation: start again
            ops.pop(info.id, None)
            return "pending", "worker restarted"
        response.raise_for_status()
        state = str(response.json().get("voices", {}).get(voice_id, "pending"))
        if state in ("ready", "pending"):
            return state, ""  # type: ignore[return-value]
        return "failed", state


def _http_base(ws_url: str) -> str:
    parts = urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


class CloneWatcher:
    """Carries every clone in flight to its end: one named task, `clone-watcher`, every POLL_S.

    `async with CloneWatcher(gateway):` starts it; leaving cancels and awaits it. Each round reads
    the clones hash and advances each clone one step (`advance`); a failure of Redis, the queue or
    a worker is logged and the round goes on (the next round retries), so the task lives through
    Redis blips. An unexpected error of one clone is logged with its traceback, and the others go on.
    """

    def __init__(self, gateway: Gateway, *, poll_s: float = POLL_S) -> None:
        self.gateway = gateway
        self.cloning = Cloning(gateway)
        self.poll_s = poll_s
        self.rounds = 0  # rounds completed (a round that met a failure counts too)
        self._client: httpx.AsyncClient | None = None
        self._prewarmer: Prewarmer | None = None
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> CloneWatcher:
        self._client = httpx.AsyncClient(timeout=PREWARM_TIMEOUT_S)
        self._prewarmer = Prewarmer(self.gateway, self._client)
        try:
            swept = await asyncio.to_thread(self.cloning.uploads.sweep)
            if swept:
                log.info("removed %d upload folders left by a stopped gateway", swept)
        except OSError as exc:
            log.warning("could not sweep old uploads in %s: %s", self.cloning.uploads.root, exc)
        self._task = asyncio.create_task(self._run(), name="clone-watcher")
        self._task.add_done_callback(_report_death)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        if self._client is not None:
            await self._client.aclose()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.poll_s)

    async def tick(self) -> None:
        """One round over the clones in flight."""
        try:
            records = await asyncio.to_thread(self.cloning.index.all)
        except TenantError as exc:
            log.warning("clone watcher: cannot read the clones in flight (%s); retrying", exc.message)
            self.rounds += 1
            return
        for record in records:
            try:
                await self.advance(record)
            except (TenantError, TrainingError, RingError, httpx.HTTPError, OSError) as exc:
                log.warning("clone watcher: voice %s (job %s) not advanced this round: %s", record.voice_id,
                            record.job_id, getattr(exc, "message", None) or repr(exc))
            except Exception:
                log.exception("clone watcher: voice %s (job %s) failed unexpectedly", record.voice_id, record.job_id)
        self.rounds += 1

    async def advance(self, record: CloneRecord) -> None:
        gw, index = self.gateway, self.cloning.index
        status: JobStatus | None = await asyncio.to_thread(gw.jobs.status, record.job_id)
        if record.deleted:
            await self._after_delete(record, status)
            return
        try:
            tenant = await gw.tenants.get(record.tenant_id)
            voice = await gw.tenants.voice(tenant, record.name)
        except (TenantNotFound, VoiceNotFound):
            voice = None
        if voice is None or voice.job_id != record.job_id:  # deleted (or replaced) without the record knowing
            await asyncio.to_thread(index.update, dataclasses.replace(record, deleted=True))
            return
        if voice.state in ("ready", "failed"):  # settled by a round that stopped before dropping the record
            await self._finish(tenant, record, status)
            return
        if record.started_at is None and status is not None and status.state not in ("", "queued"):
            record = dataclasses.replace(record, started_at=time.time())
            await asyncio.to_thread(index.update, record)
        if status is None:
            if time.time() - record.submitted_at > SUBMIT_GRACE_S:
                await self._settle(tenant, record, None, "failed", "its training job is gone from the queue; "
                                   "delete the voice and upload again")
            return
        if status.state == "ready":
            await self._warm(tenant, voice, record, status)
        elif status.state == "failed":
            await self._settle(tenant, record, status, "failed", status.error or status.message or "training failed")
        elif status.state == "cancelled":
            await self._settle(tenant, record, status, "failed", "its training job was cancelled (by an operator); "
                               "delete the voice and upload again")

    async def _warm(self, tenant: Tenant, voice: TenantVoice, record: CloneRecord, status: JobStatus) -> None:
        assert self._prewarmer is not None
        if voice.state == "training":
            await self.gateway.tenants.update_voice(tenant, record.name, state="warming",
                                                    note="published; warming up on its workers")
        try:
            done, waiting = await self._prewarmer.warm(record.voice_id)
        except WarmFailed as exc:
            await self._settle(tenant, record, status, "failed", f"the trained voice could not be loaded: {exc}")
            return
        if not done:
            note = f"published; {waiting}"
            if voice.note != note:
                log.info("clone %s: %s", record.voice_id, note)
                await self.gateway.tenants.update_voice(tenant, record.name, note=note)
            return
        await self._settle(tenant, record, status, "ready", None)

    async def _settle(self, tenant: Tenant, record: CloneRecord, status: JobStatus | None,
                      state: Literal["ready", "failed"], note: str | None) -> None:
        """The voice's final state, then its slot freed, then (once, by whoever drops the record) metered."""
        await self.gateway.tenants.update_voice(tenant, record.name, state=state, note=note)
        if state == "failed":
            log.warning("clone %s failed: %s", record.voice_id, note)
        else:
            log.info("clone %s is ready", record.voice_id)
        await self._finish(tenant, record, status)

    async def _after_delete(self, record: CloneRecord, status: JobStatus | None) -> None:
        gw = self.gateway
        if status is not None and not status.terminal:
            if not status.cancel_requested:
                await asyncio.to_thread(gw.jobs.cancel, record.job_id)
            return
        if await asyncio.to_thread(remove_adapter, gw.settings.voices_dir, record.voice_id, job_id=record.job_id):
            log.info("removed voice %s, published by job %s after its voice was deleted", record.voice_id,
                     record.job_id)
        if self._prewarmer is not None:
            self._prewarmer.forget(record.voice_id)
        try:
            tenant = await gw.tenants.get(record.tenant_id)
        except TenantNotFound:
            await asyncio.to_thread(self.cloning.index.drop, record.job_id)
            return
        await self._finish(tenant, record, status)

    async def _finish(self, tenant: Tenant, record: CloneRecord, status: JobStatus | None) -> None:
        gw = self.gateway
        await gw.quotas.release_training_slot(tenant, record.job_id)
        if not await asyncio.to_thread(self.cloning.index.drop, record.job_id):
            return  # another gateway finished it first
        minutes = training_minutes(record, status)
        if minutes > 0:
            gw.metrics.training_minutes.labels(tenant.name).inc(minutes)
            try:
                await gw.meter.add_usage(tenant, training_minutes=minutes)
            except TenantError as exc:
                log.warning("training minutes of tenant %s not recorded (%.2f min of job %s): %s", tenant.id,
                            minutes, record.job_id, exc.message)


def training_minutes(record: CloneRecord, status: JobStatus | None) -> float:
    """Wall-clock minutes a job ran on trainers: from when it was first seen running (else its
    submission) to its last update; nothing for a job no trainer ever took."""
    if status is None or status.attempts == 0:
        return 0.0
    started = record.started_at or status.created_at or record.submitted_at
    ended = status.updated_at or time.time()
    minutes = max(0.0, ended - started) / 60.0
    return minutes if math.isfinite(minutes) else 0.0


def _report_death(task: asyncio.Task) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("clone watcher died: voices in training no longer advance until the gateway restarts",
                  exc_info=exc)
    else:
        log.error("clone watcher stopped by itself")
