"""How long a voice's recordings are kept: its uploads and its consent recording (biometric data).

They live in the gateway's uploads_dir/<tenant id>/<voice name>/<job id>/ and go with the voice
when it is deleted (`Cloning.delete`). A tenant whose policy sets `retention_days` N has them
deleted sooner: N days after the voice settled (ready, or failed), the voice itself staying and
serving. The clone watcher calls `expire_voice` as a voice settles (N = 0: at once) and `sweep`
every RETENTION_SWEEP_S over every tenant with a retention period, so a period shortened later
applies to voices made before. What was deleted is recorded in the voice record
(`recordings_deleted_at`), which GET /v1/voices/{name} shows.

Safe with several gateways at once: deleting a folder that is gone is a no-op and the record is
written after the files are gone (a gateway stopping between the two leaves a record the next
sweep writes). Only the folder of the job the voice record names is touched, so a new voice of
the same name (a later job) keeps its own. A voice still training is never touched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from gateway.cloning.uploads import UploadArea
from gateway.tenants import Tenant, TenantPolicy, Tenants, TenantVoice, VoiceNotFound

__all__ = ["DAY_S", "RETENTION_SWEEP_S", "Retention", "recordings_expire_at"]

log = logging.getLogger(__name__)

DAY_S: Final = 86_400.0
RETENTION_SWEEP_S: Final = 60.0  # how often each gateway's watcher looks for expired recordings


def recordings_expire_at(voice: TenantVoice, policy: TenantPolicy) -> float | None:
    """When the voice's recordings are due for deletion (unix s), or None: kept while the voice
    exists, not settled yet, or already deleted. A voice settled before `settled_at` existed
    counts from its creation (sooner, never later than the period asks)."""
    if policy.retention_days is None or voice.state not in ("ready", "failed") or voice.job_id is None:
        return None
    if voice.recordings_deleted_at is not None:
        return None
    since = voice.settled_at if voice.settled_at is not None else voice.created_at
    return since + policy.retention_days * DAY_S


class Retention:
    """Deletes recordings whose tenant's retention period has passed, and says so in the voice record."""

    def __init__(self, tenants: Tenants, uploads: UploadArea) -> None:
        self.tenants = tenants
        self.uploads = uploads

    async def expire_voice(self, tenant: Tenant, voice: TenantVoice, *, now: float | None = None) -> bool:
        """Delete the voice's recordings if they are due; True when they were (now)."""
        now = time.time() if now is None else now
        due = recordings_expire_at(voice, tenant.policy)
        if due is None or due > now:
            return False
        assert voice.job_id is not None
        existed = await asyncio.to_thread(self.uploads.remove_job, tenant.id, voice.name, voice.job_id)
        try:
            current = await self.tenants.voice(tenant, voice.name)
            if current.job_id != voice.job_id:  # deleted and made again meanwhile: that one is not ours
                return False
            await self.tenants.update_voice(tenant, voice.name, recordings_deleted_at=now)
        except VoiceNotFound:  # deleted meanwhile: its recordings went with it
            return False
        log.info("deleted the recordings of voice %s of tenant %s (job %s): its tenant keeps them %d days%s",
                 voice.name, tenant.id, voice.job_id, tenant.policy.retention_days,
                 "" if existed else " (the folder was already gone)")
        return True

    async def sweep(self, *, now: float | None = None) -> int:
        """One pass over every tenant with a retention period; returns how many voices' recordings went."""
        now = time.time() if now is None else now
        deleted = 0
        for tenant in await self.tenants.list():
            if tenant.policy.retention_days is None:
                continue
            for voice in await self.tenants.voices(tenant):
                if await self.expire_voice(tenant, voice, now=now):
                    deleted += 1
        return deleted
