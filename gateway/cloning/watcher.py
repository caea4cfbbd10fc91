"""The `CloneWatcher` task: a published voice is prewarmed on every owner (`Prewarmer`, the workers'
`/prewarm`) before it is `ready`; failed or cancelled jobs fail the voice with a reason for the
tenant; then the training slot is released and the training minutes metered, once.

It also reconciles what the trainers left undone: a job that stopped without an outcome (no
trainer holds it, none owes it: `JobQueue.reconcile`) is ended, `ready` if it published its
adapter, else `failed` (`cancelled` for a deleted voice); a voice still warming
`clone_warming_deadline_s` after its job was ready is made `ready` anyway when its adapter is
published and passes the serving checks (workers load a voice on its first request; prewarming
only saves that request the load), else failed. A deleted voice's job keeps its training slot
until the job has stopped; then its adapter and uploads go, the slot is freed, and once the job
is metered its records in the queue are deleted (`Cloning.forget_job`).

What one process keeps between rounds (each prewarm's operations and failure count, the last
warming detail logged) is kept only for the clones in flight: each round forgets the voices
that left the clones hash, whichever gateway settled them.

And it applies each tenant's retention period to its voices' recordings (`Retention`): as a voice
settles, and in one sweep every `retention_sweep_s`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from typing import Final, Literal, TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import httpx

from gateway.cloning.records import CloneRecord, training_minutes
from gateway.cloning.retention import RETENTION_SWEEP_S, Retention
from gateway.cloning.service import Cloning
from gateway.cloning.uploads import published_adapter, remove_adapter
from gateway.cloning.views import JOB_GONE_REASON, LOAD_FAILED_REASON, SUBMIT_GRACE_S, failure_reason
from gateway.tenants import Tenant, TenantError, TenantNotFound, TenantVoice, VoiceNotFound
from hashring.errors import EmptyRing, RingError
from hashring.records import WorkerInfo
from lora_training.errors import TrainingError
from lora_training.jobs import JobStatus

if TYPE_CHECKING:
    from gateway.api.state import Gateway

log = logging.getLogger(__name__)

__all__ = ["CloneWatcher", "POLL_S", "PREWARM_ATTEMPTS", "PREWARM_TIMEOUT_S", "Prewarmer", "RECONCILE_IDLE_S",
           "WARMING_NOTE", "WarmFailed", "training_minutes"]


POLL_S: Final = 0.5  # how often the watcher looks at the clones in flight
PREWARM_TIMEOUT_S: Final = 5.0  # one HTTP call to a worker's /prewarm
PREWARM_ATTEMPTS: Final = 3  # a worker that reports it cannot load the voice this often: the voice fails
RECONCILE_IDLE_S: Final = 30.0  # a job not updated this long is checked for being an orphan (one script)
WARMING_NOTE: Final = "published; warming up on its workers"


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
        """(True, "") once every owner reports the voice ready; (False, what it waits for) before,
        an owner that cannot be reached or answers garbage counting as not ready yet (the
        watcher's warming deadline bounds the wait). Raises WarmFailed when a worker keeps
        reporting that it cannot load the voice."""
        try:
            owners = self._router.owners(voice_id)
        except EmptyRing:
            return False, "waiting for a worker to join the ring"
        ops = self._ops.setdefault(voice_id, {})
        waiting: list[str] = []
        for info in owners:
            try:
                outcome, detail = await self._owner(voice_id, info, ops)
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:  # down, refusing, or a garbled answer
                outcome, detail = "pending", f"unreachable or refusing: {type(exc).__name__}"
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

    def retain(self, voice_ids: set[str]) -> None:
        """Forget every voice but these (the clones in flight): the watcher calls it each round, so
        what it keeps is bounded by the clones in flight, whichever gateway settles them."""
        for voice_id in [v for v in (*self._ops, *self._failures) if v not in voice_ids]:
            self.forget(voice_id)

    @property
    def voices(self) -> frozenset[str]:
        """The voices it keeps operations or failure counts for."""
        return frozenset(self._ops) | frozenset(self._failures)

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
    Redis blips. An unexpected error of one clone, or a malformed record, is logged and the others
    go on; nothing a round meets ends the task.
    """

    def __init__(self, gateway: Gateway, *, poll_s: float = POLL_S,
                 retention_sweep_s: float = RETENTION_SWEEP_S) -> None:
        self.gateway = gateway
        self.cloning = Cloning(gateway)
        self.retention = Retention(gateway.tenants, self.cloning.uploads)
        self.retention_sweep_s = retention_sweep_s
        self._swept_at = -math.inf  # monotonic time of the last retention sweep: the first round sweeps
        self.poll_s = poll_s
        self.warming_deadline_s = gateway.settings.clone_warming_deadline_s
        self.rounds = 0  # rounds completed (a round that met a failure counts too)
        self._client: httpx.AsyncClient | None = None
        self._prewarmer: Prewarmer | None = None
        self._task: asyncio.Task | None = None
        self._warm_detail: dict[str, str] = {}  # voice id -> what its warming waits for (logged on change)

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
    def held_voices(self) -> frozenset[str]:
        """The voices this process keeps prewarm state or a warming detail for."""
        held = frozenset(self._warm_detail)
        return held | self._prewarmer.voices if self._prewarmer is not None else held

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # tick handles what it expects; anything else must not end the watcher
                log.exception("clone watcher: a round failed unexpectedly; carrying on")
                self.rounds += 1
            await asyncio.sleep(self.poll_s)

    async def tick(self) -> None:
        """One round over the clones in flight."""
        try:
            records = await asyncio.to_thread(self.cloning.index.all)
        except TenantError as exc:
            log.warning("clone watcher: cannot read the clones in flight (%s); retrying", exc.message)
            self.rounds += 1
            return
        self._forget_settled({record.voice_id for record in records})
        for record in records:
            try:
                await self.advance(record)
            except (TenantError, TrainingError, RingError, httpx.HTTPError, OSError) as exc:
                log.warning("clone watcher: voice %s (job %s) not advanced this round: %s", record.voice_id,
                            record.job_id, getattr(exc, "message", None) or repr(exc))
            except Exception:
                log.exception("clone watcher: voice %s (job %s) failed unexpectedly", record.voice_id, record.job_id)
        await self._sweep_retention()
        self.rounds += 1

    def _forget_settled(self, in_flight: set[str]) -> None:
        """Drop what this process keeps about voices no longer in flight: another gateway settled or
        dropped them (or this one did and a round stopped midway), so nothing here ever would."""
        for voice_id in [v for v in self._warm_detail if v not in in_flight]:
            del self._warm_detail[voice_id]
        if self._prewarmer is not None:
            self._prewarmer.retain(in_flight)

    async def _sweep_retention(self) -> None:
        """Every retention_sweep_s: delete the recordings whose tenant's retention period has passed."""
        if time.monotonic() - self._swept_at < self.retention_sweep_s:
            return
        self._swept_at = time.monotonic()
        try:
            deleted = await self.retention.sweep()
        except (TenantError, OSError) as exc:
            log.warning("clone watcher: retention sweep not done this time: %s",
                        getattr(exc, "message", None) or repr(exc))
            return
        if deleted:
            log.info("retention: deleted the recordings of %d voices", deleted)

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
                await self._settle(tenant, record, None, "failed", JOB_GONE_REASON)
            return
        status = await self._reconciled(record, status)
        if status.state == "ready":
            await self._warm(tenant, voice, record, status)
        elif status.state in ("failed", "cancelled"):
            await self._settle(tenant, record, status, "failed", failure_reason(status))

    async def _reconciled(self, record: CloneRecord, status: JobStatus) -> JobStatus:
        """The job's status, after ending it if it is an orphan (stopped without an outcome, nobody
        holding or owing it): `ready` when it published its adapter, else `failed`; `cancelled` for
        a deleted voice. The check is one script that leaves a live job alone, so it is safe at any
        time; a live voice's job updated lately is not even checked (a deleted one's is, each round:
        the delete's cancel itself updates it)."""
        if status.terminal or (not record.deleted and time.time() - status.updated_at < RECONCILE_IDLE_S):
            return status
        gw = self.gateway
        if record.deleted:
            outcome = dict(state="cancelled", message="its voice was deleted; the job had stopped without an outcome")
        elif await asyncio.to_thread(published_adapter, gw.settings.voices_dir, record.voice_id, record.job_id):
            outcome = dict(state="ready", message="published; the trainer stopped before recording it")
        else:
            outcome = dict(state="failed", error_code="orphaned",
                           message="the job stopped without an outcome (no trainer holds or owes it)",
                           error=f"stopped in state {status.state!r} without an outcome; ended by the gateway")
        state = outcome.pop("state")
        after = await asyncio.to_thread(lambda: gw.jobs.reconcile(record.job_id, state, **outcome))
        if after is None:
            return status
        if after.state != status.state:
            log.warning("clone %s: job %s had stopped in state %s without an outcome; ended as %s", record.voice_id,
                        record.job_id, status.state, after.state)
        return after

    async def _warm(self, tenant: Tenant, voice: TenantVoice, record: CloneRecord, status: JobStatus) -> None:
        assert self._prewarmer is not None
        if voice.state == "training":
            await self.gateway.tenants.update_voice(tenant, record.name, state="warming", note=WARMING_NOTE)
        if record.warming_since is None:
            record = dataclasses.replace(record, warming_since=time.time())
            await asyncio.to_thread(self.cloning.index.update, record)
        try:
            done, waiting = await self._prewarmer.warm(record.voice_id)
        except WarmFailed as exc:
            log.warning("clone %s failed: a worker cannot load it: %s", record.voice_id, exc)
            await self._settle(tenant, record, status, "failed", LOAD_FAILED_REASON)
            return
        if done:
            await self._settle(tenant, record, status, "ready", None)
            return
        if self._warm_detail.get(record.voice_id) != waiting:
            self._warm_detail[record.voice_id] = waiting
            log.info("clone %s: published; %s", record.voice_id, waiting)
        warming_s = time.time() - record.warming_since
        if warming_s < self.warming_deadline_s:
            return
        self._prewarmer.forget(record.voice_id)
        if await asyncio.to_thread(published_adapter, self.gateway.settings.voices_dir, record.voice_id,
                                   record.job_id):
            log.warning("clone %s not prewarmed on every owner within %.0f s (%s): ready anyway, its workers load "
                        "it on its first request", record.voice_id, self.warming_deadline_s, waiting)
            await self._settle(tenant, record, status, "ready",
                               f"ready; not prewarmed within {self.warming_deadline_s:.0f} s, its first request "
                               "loads it")
        else:
            log.warning("clone %s failed: still warming after %.0f s and its adapter is missing or unusable in %s",
                        record.voice_id, self.warming_deadline_s, self.gateway.settings.voices_dir)
            await self._settle(tenant, record, status, "failed", LOAD_FAILED_REASON)

    async def _settle(self, tenant: Tenant, record: CloneRecord, status: JobStatus | None,
                      state: Literal["ready", "failed"], note: str | None) -> None:
        """The voice's final state (and when: the tenant's retention counts from it; 0 days deletes its
        recordings now), then its slot freed, then (once, by whoever drops the record) metered."""
        voice = await self.gateway.tenants.update_voice(tenant, record.name, state=state, note=note,
                                                        settled_at=time.time())
        try:
            await self.retention.expire_voice(tenant, voice)
        except (TenantError, OSError) as exc:  # the sweep tries again
            log.warning("clone %s: recordings not expired now: %s", record.voice_id,
                        getattr(exc, "message", None) or repr(exc))
        self._warm_detail.pop(record.voice_id, None)
        if state == "failed":
            log.warning("clone %s (job %s) failed: %s; job error: %s", record.voice_id, record.job_id, note,
                        (status.error or status.message) if status else "no job")
        else:
            log.info("clone %s is ready", record.voice_id)
        await self._finish(tenant, record, status)

    async def _after_delete(self, record: CloneRecord, status: JobStatus | None) -> None:
        """A deleted voice's clone: its job asked to stop; once it has (or is gone past the submit
        grace: a racing upload may still be submitting it), its adapter and uploads removed and its
        training slot freed."""
        gw = self.gateway
        if status is None:
            if time.time() - record.submitted_at <= SUBMIT_GRACE_S:
                return
        elif not status.terminal:
            if not status.cancel_requested:  # a queued job nobody holds ends right here
                status = await asyncio.to_thread(gw.jobs.cancel, record.job_id) or status
            status = await self._reconciled(record, status)
            if not status.terminal:
                return
        if status is not None and await asyncio.to_thread(gw.jobs.holder, record.job_id):
            # stopped, and its trainer still letting go (it writes the last state, cleans up, then
            # releases the lock): the job's records cannot be deleted yet; finished next round
            return
        if await asyncio.to_thread(remove_adapter, gw.settings.voices_dir, record.voice_id, job_id=record.job_id):
            log.info("removed voice %s, published by job %s after its voice was deleted", record.voice_id,
                     record.job_id)
        if await asyncio.to_thread(self.cloning.uploads.remove_job, record.tenant_id, record.name, record.job_id):
            log.info("removed the uploads of job %s (voice %s deleted)", record.job_id, record.voice_id)
        if self._prewarmer is not None:
            self._prewarmer.forget(record.voice_id)
        self._warm_detail.pop(record.voice_id, None)
        try:
            tenant = await gw.tenants.get(record.tenant_id)
        except TenantNotFound:
            if await asyncio.to_thread(self.cloning.index.drop, record.job_id):
                await self.cloning.forget_job(record.job_id)
            return
        await self._finish(tenant, record, status)

    async def _finish(self, tenant: Tenant, record: CloneRecord, status: JobStatus | None) -> None:
        await self.cloning.finish(tenant, record, status)


def _report_death(task: asyncio.Task) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("clone watcher died: voices in training no longer advance until the gateway restarts",
                  exc_info=exc)
    else:
        log.error("clone watcher stopped by itself")
