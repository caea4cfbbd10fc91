"""What the API shows of a voice: the job's state mapped to the API's, progress and ETA, and why it
failed, in words for the tenant (`failure_reason`): the trainer's own error (exception reprs,
paths, worker names) stays in the job record and the trainer's log, for operators."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from gateway.cloning.records import CloneRecord
from gateway.tenants import TenantVoice
from lora_training.jobs import JobStatus

if TYPE_CHECKING:
    from lora_training.jobs import JobQueue

__all__ = ["ApiState", "CANCELLED_REASON", "JOB_GONE_REASON", "LOAD_FAILED_REASON", "MAX_REASON_CHARS",
           "PLATFORM_REASON", "SUBMIT_GRACE_S", "TENANT_ERROR_CODES", "VoiceView", "base_view", "clone_view",
           "failure_reason", "voice_published"]


ApiState = Literal["queued", "preprocessing", "training", "validating", "ready", "failed"]
SUBMIT_GRACE_S: Final = 60.0  # a voice this young whose job is not there yet is still being submitted
_JOB_STATES: Final[dict[str, ApiState]] = {
    "queued": "queued", "preprocessing": "preprocessing", "training": "training", "validating": "validating",
    "publishing": "validating", "ready": "validating",
}
_RUNNING: Final = frozenset({"preprocessing", "training", "validating"})

# lora_training's InputError codes: their messages are written for the creator (what to fix in the upload)
TENANT_ERROR_CODES: Final = frozenset({"bad_input", "bad_audio", "speech_amount", "audio_too_long", "transcripts",
                                      "consent", "upload_checks", "clone_quality"})
MAX_REASON_CHARS: Final = 400
_SUPPORT = "delete the voice and upload again, and contact support quoting the job id if it happens again"
PLATFORM_REASON: Final = f"training failed on the platform's side, not because of your recordings; {_SUPPORT}"
VALIDATION_REASON: Final = ("the trained voice did not pass the quality checks; upload again with clean recordings "
                            "of one speaker (about 10 minutes), and contact support quoting the job id if it fails "
                            "again")
CANCELLED_REASON: Final = "its training job was cancelled by an operator; delete the voice and upload again"
LOAD_FAILED_REASON: Final = f"the trained voice could not be loaded by the workers that serve it; {_SUPPORT}"
JOB_GONE_REASON: Final = ("its training job is gone (the gateway stopped while queueing it, or the queue lost it); "
                          "delete the voice and upload again")
_PATH = re.compile(r"""(?:[A-Za-z]:)?(?:[/\\][^\s'"/\\]+)+[/\\]([^\s'"/\\]+)""")  # a path: keep its file name


def failure_reason(job: JobStatus | None) -> str:
    """Why a clone failed, for the tenant: the trainer's message when it is about the upload (paths
    cut to their file names), a fixed sentence for anything on the platform's side."""
    if job is None:
        return JOB_GONE_REASON
    if job.state == "cancelled" or job.error_code == "cancelled":
        return CANCELLED_REASON
    if job.error_code in TENANT_ERROR_CODES:
        said = (job.error or job.message)[:4 * MAX_REASON_CHARS]
        said = _PATH.sub(r"\1", said).strip()
        if said:
            return said if len(said) <= MAX_REASON_CHARS else said[:MAX_REASON_CHARS - 3] + "..."
    if job.error_code == "validation":
        return VALIDATION_REASON
    return PLATFORM_REASON


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
    checks: dict | None = None  # what the upload checks found: {"thresholds_version", "findings": [...]}
    recordings_deleted_at: int | None = None  # when the tenant's retention period deleted its uploads and consent
    report: dict | None = None  # the clone report (lora_training.report), once the voice is published

    def to_json(self) -> dict:
        return {"id": self.name, "name": self.name, "object": "voice", "type": self.type, "state": self.state,
                "progress": self.progress, "eta_s": self.eta_s, "message": self.message, "reason": self.reason,
                "created_at": self.created_at, "job_id": self.job_id, "checks": self.checks,
                "recordings_deleted_at": self.recordings_deleted_at, "report": self.report}


def base_view(name: str) -> VoiceView:
    return VoiceView(name, "base", "ready", 100.0, message="a platform voice")


def clone_view(voice: TenantVoice, job: JobStatus | None, record: CloneRecord | None, *,
               now: float | None = None) -> VoiceView:
    """The API's view of a tenant voice: its own state once settled, else its job's."""
    now = time.time() if now is None else now
    created = int(voice.created_at)

    def view(state: ApiState, progress: float, **more) -> VoiceView:
        deleted = None if voice.recordings_deleted_at is None else int(voice.recordings_deleted_at)
        return VoiceView(voice.name, "clone", state, round(progress, 1), created_at=created, job_id=voice.job_id,
                         recordings_deleted_at=deleted, **more)

    if voice.state == "ready":
        return view("ready", 100.0, message="ready to speak")
    if voice.state == "failed":
        return view("failed", job.progress if job else 0.0, reason=voice.note or failure_reason(job))
    if voice.state == "warming":
        return view("validating", 99.0, message=voice.note or "published; warming up on its workers")
    if job is None:
        if now - voice.created_at < SUBMIT_GRACE_S:
            return view("queued", 0.0, message="being queued for training")
        return view("failed", 0.0, reason=JOB_GONE_REASON)
    if job.state in ("failed", "cancelled"):
        return view("failed", job.progress, reason=failure_reason(job))
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
        message = "waiting for a trainer" if not job.error else "waiting to be retried after a failed attempt"
    return view(state, progress, eta_s=eta, message=message)


def sample_url(name: str, file: str) -> str:
    """Where a clone report sample's audio is served (GET, the tenant's key)."""
    return f"/v1/voices/{name}/samples/{file}"


def _audio_of(sample: object) -> str | None:
    """A report sample's audio file name (`samples[].audio`), None where it has none."""
    return sample["audio"] if isinstance(sample, dict) and isinstance(sample.get("audio"), str) else None


def report_sample_files(report: dict | None) -> set[str]:
    """The audio files a published report names (`samples[].audio`)."""
    samples = report.get("samples") if isinstance(report, dict) else None
    return {file for s in samples or () if (file := _audio_of(s))}


def _playable(report: dict, name: str) -> dict:
    """The report as the API shows it: each sample with audio gets its `audio_url`."""
    samples = report.get("samples")
    if not isinstance(samples, list):
        return report
    shown = [{**s, "audio_url": sample_url(name, file)} if (file := _audio_of(s)) else s for s in samples]
    return {**report, "samples": shown}


def voice_published(store: Path, voice: TenantVoice, jobs: JobQueue) -> tuple[dict | None, dict | None]:
    """A clone's `checks` and `report`, the cheapest honest way (blocking: call it in a thread). Published (ready,
    warming): the adapter's voicering.json, which holds the gateway's and the job's findings (a few
    KB, read only when it is this voice's job's). Otherwise: the job spec's `upload_checks` (the
    gateway's findings; the job's own are known once it publishes, and a job they fail says them in
    `reason`). None when neither can be read. With it, the published clone `report` (one read of
    voicering.json for both; None before publishing)."""
    from gpu_worker.adapters.layout import METADATA
    from lora_training.errors import TrainingError
    from lora_training.quality.checks import record

    if voice.state in ("ready", "warming"):
        try:
            meta = json.loads((Path(store) / voice.voice_id / METADATA).read_text())
        except (OSError, ValueError):
            return None, None
        ours = isinstance(meta, dict) and meta.get("job_id") == voice.job_id
        checks, report = (meta.get("checks"), meta.get("report")) if ours else (None, None)
        shown = _playable(report, voice.name) if isinstance(report, dict) else None
        return (checks if isinstance(checks, dict) else None), shown
    if not voice.job_id:
        return None, None
    try:
        spec = jobs.spec(voice.job_id)
    except (TrainingError, ValueError):
        return None, None
    return (record(spec.upload_checks) if spec is not None else None), None
