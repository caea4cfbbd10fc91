"""Upload folders on disk: received under `.incoming/`, moved under the tenant's voice and job
when the job is submitted, deleted with the voice (each job's folder apart, so deleting a voice
never touches the uploads of a new voice of the same name); and reading or removing a published
adapter in the store."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gpu_worker.adapters.layout import METADATA, STAGING_DIR

__all__ = ["INCOMING", "STALE_INCOMING_S", "Upload", "UploadArea", "published_adapter", "remove_adapter"]


INCOMING: Final = ".incoming"  # uploads being received: never a tenant id (those start with "t_")
STALE_INCOMING_S: Final = 24 * 3600.0  # an upload folder this old was left by a gateway that stopped


@dataclass
class Upload:
    """One POST /v1/voices as received: its fields, and its files in `folder`."""

    folder: Path  # uploads_dir/.incoming/<random>/: audio/ and the transcripts file
    name: str | None = None
    consent: str | None = None
    audio: list[Path] = field(default_factory=list)  # folder/audio/<file name>, in upload order
    sidecars: list[Path] = field(default_factory=list)  # folder/audio/<stem>.txt, next to their audio
    transcripts: Path | None = None  # folder/transcripts.<json|csv|tsv|txt>
    consent_audio: Path | None = None  # folder/consent-audio.<ext>: the creator reading the consent phrase
    consent_id: str | None = None  # the phrase it reads (POST /v1/voices/consent)

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
        for attempt in range(_KEEP_ATTEMPTS):  # a concurrent delete may remove the empty parents meanwhile
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(upload.folder, target)
                break
            except FileNotFoundError:
                if attempt == _KEEP_ATTEMPTS - 1 or not upload.folder.is_dir():
                    raise

        def moved(path: Path) -> Path:
            return target / path.relative_to(upload.folder)

        return Upload(target, upload.name, upload.consent, [moved(p) for p in upload.audio],
                      [moved(p) for p in upload.sidecars], moved(upload.transcripts) if upload.transcripts else None,
                      moved(upload.consent_audio) if upload.consent_audio else None, upload.consent_id)

    def discard(self, upload: Upload) -> None:
        shutil.rmtree(upload.folder, ignore_errors=True)

    def job_dir(self, tenant_id: str, name: str, job_id: str) -> Path:
        return self.voice_dir(tenant_id, name) / job_id

    def remove_job(self, tenant_id: str, name: str, job_id: str) -> bool:
        """Delete the uploads job `job_id` of the tenant's voice `name` trained from, and the voice's
        and tenant's folders once empty. Only that job's folder: a new voice of the same name (an
        upload racing the delete) keeps its own. True if there was a folder."""
        folder = self.job_dir(tenant_id, name, job_id)
        existed = folder.exists()
        if existed:
            shutil.rmtree(folder, ignore_errors=True)
        for parent in (folder.parent, folder.parent.parent):
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
        return existed

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


_KEEP_ATTEMPTS: Final = 3
_ANY_RANK: Final = 1 << 20  # structure only: the trainer checked the rank against the workers' max_lora_rank


def published_adapter(store: Path, voice_id: str, job_id: str) -> bool:
    """Whether `<store>/<voice id>` is an adapter job `job_id` published (its voicering.json says so)
    that still passes the serving stack's file checks (config, safetensors header, targets), so a
    worker can load it on demand. Reads a few KB, no weights."""
    from gpu_worker.adapters.validation import validate_adapter
    from gpu_worker.errors import AdapterError

    path = Path(store) / voice_id
    try:
        if json.loads((path / METADATA).read_text()).get("job_id") != job_id:
            return False
        validate_adapter(path, voice_id=voice_id, max_rank=_ANY_RANK)
    except (OSError, ValueError, AttributeError, AdapterError):
        return False
    return True


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
