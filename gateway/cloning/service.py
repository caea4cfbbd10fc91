"""`Cloning`: what the voice routes call (create, describe, list, delete), over the tenant layer,
the training queue, the upload area and the adapter store."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cloning.checks import (check_consent, check_consent_audio, check_name, check_spoken_consent,
                                    check_uploads)
from gateway.cloning.consent import ConsentPhrase, ConsentStore
from gateway.cloning.errors import BadUpload, CloneUnavailable, NotDeletable, SampleNotFound
from gateway.cloning.records import CloneIndex, CloneRecord, training_minutes
from gateway.cloning.uploads import Upload, UploadArea, remove_adapter
from gateway.cloning.views import VoiceView, base_view, clone_view, report_sample_files, voice_published
from gateway.tenants import Tenant, TenantError, TenantVoice, VoiceNotFound
from hashring.errors import RingError
from lora_training.errors import InfrastructureError, TrainingError
from lora_training.jobs import JobStatus
from lora_training.pipeline import JobSpec
from lora_training.quality.checks import record as checks_record

if TYPE_CHECKING:
    from gateway.api.state import Gateway

log = logging.getLogger(__name__)

__all__ = ["Cloning"]


class Cloning:
    """Voices and cloning over one gateway's parts (tenants, quotas, queue, stores). Light: make one
    per request. The queue client is sync, so its calls run in threads."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.settings = gateway.settings
        self.uploads = UploadArea(gateway.settings.uploads_dir)
        self.index = CloneIndex(gateway.jobs.redis, f"{gateway.settings.tenant_prefix}:clones")
        self.consents = ConsentStore(gateway.jobs.redis, gateway.settings.tenant_prefix)

    @property
    def base_voices(self) -> tuple[str, ...]:
        return self.gateway.catalog.base_voices

    async def _queue(self, call: Callable[..., object], *args):
        try:
            return await asyncio.to_thread(call, *args)
        except InfrastructureError as err:
            raise CloneUnavailable(f"the training queue is unreachable ({err.message}); try again shortly") from None

    async def issue_consent(self, tenant: Tenant, name: str) -> ConsentPhrase:
        """A one-time consent phrase for the tenant's voice `name` (a tenant of the spoken policy)."""
        name = check_name(tenant, name, self.base_voices)
        if tenant.policy.consent != "spoken":
            raise BadUpload("your account's consent policy is statement: send the speaker's consent as the form field "
                            "'consent' with the upload; no phrase is needed", code="consent_policy", param="name")
        return await asyncio.to_thread(self.consents.issue, tenant, name)  # Redis away: the tenant layer's 503

    async def _consent(self, tenant: Tenant, upload: Upload, name: str) -> tuple[str, str | None]:
        """What the voice record keeps as its consent, and the spoken phrase's id (None: a typed
        statement). Spoken: the phrase must be this tenant's, for this voice, unexpired and unused
        (checked here; taken as the last step before the job is queued, and given back if that fails)."""
        if tenant.policy.consent != "spoken":
            if upload.consent_audio is not None or upload.consent_id is not None:
                raise BadUpload("your account's consent policy is statement: send the typed 'consent' field, not "
                                "'consent_audio' or 'consent_id'", code="consent_policy", param="consent_audio")
            return check_consent(upload.consent), None
        consent_id = check_spoken_consent(upload)
        phrase = await asyncio.to_thread(self.consents.check, tenant, consent_id, name)
        return (f"spoken consent {consent_id}: the speaker read \"{phrase.text_to_read}\" (kept with the uploads "
                "as consent-audio; checked against the voice by the training job)"), consent_id

    async def create(self, tenant: Tenant, upload: Upload) -> VoiceView:
        """Check a received upload, register the voice and queue its training job, cheapest step first:
        name and consent; the voice registered (its name free and within max_voices, one atomic step);
        a free training slot (max_training_jobs, checked); only then the files decoded, on the
        gateway's bounded DecodePool; then the slot taken (atomically: a racing upload that took the
        last one meanwhile is refused here), the files kept, the consent phrase taken and the job
        queued. On any error the upload and every step before it are undone (a taken phrase given
        back)."""
        gw = self.gateway
        job_id = f"clone-{secrets.token_hex(6)}"
        undo: list[Callable[[], Awaitable[object]]] = []
        try:
            name = check_name(tenant, upload.name, self.base_voices)
            consent, consent_id = await self._consent(tenant, upload, name)
            # undone even if registering raises: a call whose answer timed out may have written it, and a
            # record left behind would refuse the client's retry as voice_exists (only this job's is removed)
            undo.append(lambda: self._unregister(tenant, name, job_id))
            voice = await gw.tenants.register_voice(tenant, name, consent=consent, job_id=job_id, state="training",
                                                    note="queued for training")
            await gw.quotas.check_training_slot(tenant)
            data, asr = self.settings.clone_data, self.settings.clone_asr
            checked, _ = await gw.decodes.run(tenant.id, lambda check: (
                check_uploads(upload, data, asr=asr, check=check), check_consent_audio(upload, data, check)))
            await self._still_registered(tenant, name, job_id)
            # taken only now: a gateway that dies while the files decode leaves no slot held
            await gw.quotas.acquire_training_slot(tenant, job_id)
            undo.append(lambda: gw.quotas.release_training_slot(tenant, job_id))
            kept = await asyncio.to_thread(self.uploads.keep, upload, tenant.id, name, job_id)
            undo.append(lambda: asyncio.to_thread(shutil.rmtree, kept.folder, True))
            # an adapter left at this voice id by a voice deleted mid-publish would fail the job: it is an orphan
            await asyncio.to_thread(remove_adapter, self.settings.voices_dir, voice.voice_id)
            record = CloneRecord(job_id, tenant.id, name, voice.voice_id, time.time())
            await self._queue(self.index.put, record)
            undo.append(lambda: asyncio.to_thread(self.index.drop, job_id))
            phrase = None
            if consent_id is not None:  # taken last, and given back if the queue then refuses the job (a 503 to
                # retry must not turn into consent_used): of two uploads racing with one phrase, one gets here
                phrase = await asyncio.to_thread(self.consents.take, tenant, consent_id, name, job_id)
                undo.append(lambda: asyncio.to_thread(self.consents.give_back, tenant, consent_id, job_id))
            spec = JobSpec(job_id=job_id, name=name, tenant=tenant.id, audio=kept.audio,
                           transcripts=kept.transcripts, data=data, params=self.settings.clone_params,
                           upload_checks=checked.to_dicts(), report_gate=tenant.policy.report_gate,
                           base_voices=self.base_voices,
                           consent_audio=kept.consent_audio, consent_phrase=phrase.phrase if phrase else None)
            if spec.voice_id != voice.voice_id:  # the trainer publishes spec.voice_id; workers are asked for this one
                raise RuntimeError(f"job voice id {spec.voice_id!r} != tenant voice id {voice.voice_id!r}")
            # undone if the submit raises: a submit whose answer was lost may have queued the job, and
            # a trainer would run it for an upload that was refused (only this upload's job id is taken back)
            undo.append(lambda: asyncio.to_thread(gw.jobs.withdraw, job_id))
            status = await self._queue(gw.jobs.submit, spec)
        except BaseException:
            await asyncio.to_thread(self.uploads.discard, upload)
            for step in reversed(undo):
                try:
                    await step()
                except Exception as exc:  # keep undoing; the watcher or a DELETE cleans up what is left
                    log.warning("undoing a refused clone of tenant %s (%s): %r", tenant.id, upload.name, exc)
            raise
        log.info("clone %s of tenant %s queued as job %s", name, tenant.id, job_id)
        return dataclasses.replace(clone_view(voice, status, record), checks=checks_record(checked.to_dicts()))

    async def _still_registered(self, tenant: Tenant, name: str, job_id: str) -> None:
        """After the checks: the voice is still this upload's, not deleted (or deleted and made again)
        while its files were decoded."""
        try:
            voice = await self.gateway.tenants.voice(tenant, name)
        except VoiceNotFound:
            voice = None
        if voice is None or voice.job_id != job_id:
            raise BadUpload(f"voice {name!r} was deleted while its uploads were being checked; upload again to "
                            "make it", code="voice_deleted", param="name")

    async def _unregister(self, tenant: Tenant, name: str, job_id: str) -> None:
        """Undo this upload's registration, and only this upload's: a DELETE and a new upload of the same
        name may have come while its files were decoded."""
        try:
            voice = await self.gateway.tenants.voice(tenant, name)
        except VoiceNotFound:
            return
        if voice.job_id == job_id:
            await self.gateway.tenants.delete_voice(tenant, name)

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
        checks, report = await asyncio.to_thread(voice_published, self.settings.voices_dir, voice, self.gateway.jobs)
        return dataclasses.replace(clone_view(voice, job, record), checks=checks, report=report)

    async def sample_audio(self, tenant: Tenant, name: str, file: str) -> Path:
        """The wav of one of the published clone report's samples (the names its `samples[].audio`
        gives; nothing else under the voice's folder is served)."""
        from gpu_worker.adapters.layout import REPORT_AUDIO, REPORT_AUDIO_FILE

        voice = await self.gateway.tenants.voice(tenant, name)  # VoiceNotFound: another tenant's is not found either
        _, report = await asyncio.to_thread(voice_published, self.settings.voices_dir, voice, self.gateway.jobs)
        path = Path(self.settings.voices_dir) / voice.voice_id / REPORT_AUDIO / file
        if (not REPORT_AUDIO_FILE.fullmatch(file) or file not in report_sample_files(report)
                or not await asyncio.to_thread(path.is_file)):
            raise SampleNotFound(f"voice {name!r} has no report sample {file!r}: the samples are listed in its "
                                 "`report` (GET /v1/voices/{name}) once the clone is published", param="file")
        return path

    async def delete(self, tenant: Tenant, name: str) -> None:
        """Delete the tenant's voice: its job cancelled (a running one stops at its next step), its
        adapter out of the store, its placement reset, its job's uploads gone. Its training slot is
        freed here only if the job has stopped: a running job keeps it until the clone watcher sees
        it end (so delete + upload again cannot run more than max_training_jobs at once)."""
        gw = self.gateway
        try:
            voice = await gw.tenants.voice(tenant, name)
        except VoiceNotFound:
            if name in self.base_voices:
                raise NotDeletable(f"{name!r} is a base voice of the platform; only your own clones can be "
                                   "deleted", param="name") from None
            raise
        if voice.job_id:
            await self._stop_job(tenant, voice)
        await gw.tenants.delete_voice(tenant, name)
        await asyncio.to_thread(remove_adapter, self.settings.voices_dir, voice.voice_id)
        await self._reset_placement(voice.voice_id)
        if voice.job_id:  # that job's folder only: an upload of a new voice of this name keeps its own
            await asyncio.to_thread(self.uploads.remove_job, tenant.id, name, voice.job_id)
        log.info("voice %s of tenant %s deleted (job %s)", name, tenant.id, voice.job_id)

    async def finish(self, tenant: Tenant, record: CloneRecord, status: JobStatus | None) -> bool:
        """A clone's last step, once, by a delete or any gateway's watcher: its training slot freed and
        its record dropped (one HDEL: of several callers one wins), and by that one its training
        minutes metered and, a deleted voice's, its job's records deleted (metered from them
        first). True for the caller that finished it."""
        gw = self.gateway
        await gw.quotas.release_training_slot(tenant, record.job_id)
        if not await asyncio.to_thread(self.index.drop, record.job_id):
            return False  # finished by another caller
        minutes = training_minutes(record, status)
        if minutes > 0:
            gw.metrics.training_minutes.labels(tenant.name).inc(minutes)
            try:
                await gw.meter.add_usage(tenant, training_minutes=minutes)
            except TenantError as exc:
                log.warning("training minutes of tenant %s not recorded (%.2f min of job %s): %s", tenant.id,
                            minutes, record.job_id, exc.message)
        if record.deleted:
            await self.forget_job(record.job_id)
        return True

    async def forget_job(self, job_id: str) -> None:
        """Delete a deleted voice's job records (its spec names the files and holds the consent
        phrase). Best effort: a job left (Redis away, or not final yet) goes with the trainers'
        trim of final jobs (`job_record_keep_s`)."""
        try:
            gone = await asyncio.to_thread(self.gateway.jobs.delete, job_id)
        except TrainingError as exc:
            log.warning("job %s of a deleted voice not deleted now (%s): the trainers' trim deletes it", job_id,
                        exc.message)
            return
        if not gone:
            log.warning("job %s of a deleted voice is not final: its records stay until the trainers' trim", job_id)

    async def _stop_job(self, tenant: Tenant, voice: TenantVoice) -> None:
        """Cancel the deleted voice's job and mark its clone record deleted. A job that has stopped (or
        never was and never will be) is finished here: its training slot freed, its minutes metered
        and its records deleted (`finish`); a running one keeps its slot and records until the
        clone watcher sees it end (so delete + upload again cannot run more than
        max_training_jobs at once, and its minutes are metered)."""
        gw, job_id = self.gateway, voice.job_id
        assert job_id is not None
        record = await asyncio.to_thread(self.index.get, job_id)
        if record is not None and not record.deleted:
            record = dataclasses.replace(record, deleted=True)
            await asyncio.to_thread(self.index.update, record)
        status = await self._queue(gw.jobs.status, job_id)
        if status is not None and not status.terminal:
            status = await self._queue(gw.jobs.cancel, job_id)  # a queued job nobody holds ends right here
        if status is not None and not status.terminal:
            if record is None:  # lost or unreadable: the watcher needs one to see the job end
                await asyncio.to_thread(self.index.put, CloneRecord(job_id, tenant.id, voice.name, voice.voice_id,
                                                                    voice.created_at, deleted=True))
            return
        if status is None and record is not None:
            return  # not submitted yet (an upload racing this delete): the watcher ends it
        if record is not None:
            await self.finish(tenant, record, status)
            return
        await gw.quotas.release_training_slot(tenant, job_id)
        await self.forget_job(job_id)

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
            log.warning("placement of deleted voice %s not reset (%s); `voicering ring scale %s --reset` does it",
                        voice_id, exc, voice_id)
