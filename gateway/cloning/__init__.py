"""Cloning a voice from uploads: the gateway's side of lora_training.

    POST /v1/voices ─> Uploads: streamed to disk (gateway.api.voices), under uploads_dir/.incoming/
                   ─> name and consent checked
                   ─> the TenantVoice registered ("training"; max_voices), a free training slot
                      checked (max_training_jobs, nothing taken): cheap refusals before any decode
                   ─> check_uploads on the DecodePool (bounded per gateway and per tenant, refused
                      past it, never queued): transcripts, at most max_audio_s seconds of audio,
                      lora_training's ingest checks, each file streamed block by block
                   ─> the training slot taken (atomically: none is held while files decode)
                   ─> the files moved to uploads_dir/<tenant id>/<name>/<job id>/
                   ─> a lora_training job (JobSpec: tenant = tenant id, so the voice id it publishes
                      is the TenantVoice's `voice_id`, f"{tenant.id}/{name}")
    CloneWatcher (one task per gateway process, owned by `gateway.api.voices.lifecycle`):
        job ready ─> voice "warming" ─> prewarmed on every owner (the worker's GET /prewarm) ─> "ready"
                     (past clone_warming_deadline_s: "ready" anyway if its adapter passes the
                     serving checks, else "failed")
        job failed or cancelled ─> voice "failed", with a reason written for the tenant
        job orphaned (no outcome, nobody holds or owes it) ─> ended by JobQueue.reconcile
        then: the training slot released, the training minutes metered.

In-flight clones are listed in one Redis hash, `<tenant prefix>:clones` (job id -> `CloneRecord`),
so every gateway process's watcher finds them without walking every tenant. Several gateways may
watch at once: each step is idempotent, and the last one (dropping the record) is claimed by one
HDEL, so a clone is metered once. A voice deleted while its job runs stays in the hash, marked
`deleted`, and its job keeps its training slot until it has stopped; then the watcher frees the
slot, and removes the adapter if the trainer published it before it saw the cancel.

Errors (`CloneError`, each with the `code` and `param` the API answers with):

    CloneError
    ├── BadUpload         the upload cannot make a voice; the message says what to fix (HTTP 400)
    ├── UploadTooLarge    more bytes than the tenant's max_upload_bytes (HTTP 413)
    ├── UploadTimeout     the body stalled or took too long (HTTP 408)
    ├── DecodesBusy       no upload decode free: the gateway's (HTTP 503) or the tenant's (HTTP 429)
    ├── NotDeletable      a base voice (HTTP 400)
    ├── SampleNotFound    no clone report sample of that name (HTTP 404)
    └── CloneUnavailable  the training queue (Redis) is unreachable (HTTP 503, retryable)

Tenant-layer errors (VoiceNotFound, VoiceExists, QuotaExceeded, Unavailable...) pass through as
they are. Nothing here imports torch or vLLM: lora_training's ingest checks need numpy, soundfile,
soxr and PyAV only.

The package, one idea per module:

| module | idea |
|---|---|
| `errors.py` | the `CloneError` tree (code, param, HTTP status) |
| `uploads.py` | upload folders on disk (`UploadArea`), removing a published adapter |
| `checks.py` | the quick checks of an upload (name, consent, lora_training's ingest checks) |
| `consent.py` | spoken consent's one-time phrases (`ConsentStore`: issued, checked, taken once, given back on undo) |
| `phrase_words.py` | the words phrases are drawn from (calibrated on the job's ASR) |
| `decoding.py` | `DecodePool`: the bounded threads those checks decode on (per gateway, per tenant) |
| `records.py` | the record of a clone in flight and the Redis index of them (`CloneIndex`) |
| `views.py` | what the API shows of a voice (`VoiceView`, job state -> API state) |
| `service.py` | `Cloning`: create, describe, list, delete (the job's records too), a report sample's audio (what the routes call) |
| `watcher.py` | `CloneWatcher` and its `Prewarmer`: job done -> prewarmed on the owners -> ready; state kept only for clones in flight |
| `retention.py` | the tenant's retention period over its voices' recordings (`Retention`) |
"""

from __future__ import annotations

from gateway.cloning.checks import SIDECAR_SUFFIX, TRANSCRIPT_SUFFIXES, check_name, check_uploads
from gateway.cloning.decoding import DecodePool
from gateway.cloning.errors import (BadUpload, CloneError, CloneUnavailable, DecodesBusy, NotDeletable, SampleNotFound,
                                    UploadTimeout, UploadTooLarge)
from gateway.cloning.records import CloneRecord
from gateway.cloning.service import Cloning
from gateway.cloning.uploads import Upload, UploadArea
from gateway.cloning.views import ApiState, VoiceView
from gateway.cloning.watcher import CloneWatcher

__all__ = [
    "ApiState",
    "BadUpload",
    "CloneError",
    "CloneRecord",
    "CloneUnavailable",
    "CloneWatcher",
    "Cloning",
    "DecodePool",
    "DecodesBusy",
    "NotDeletable",
    "SampleNotFound",
    "SIDECAR_SUFFIX",
    "TRANSCRIPT_SUFFIXES",
    "Upload",
    "UploadArea",
    "UploadTimeout",
    "UploadTooLarge",
    "VoiceView",
    "check_name",
    "check_uploads",
]
