"""A clone's life after its upload, through a real `voicering gateway` process (its own training
queue, tenant prefix, uploads and adapter store; a fixed worker list naming a port nobody serves,
so prewarming never succeeds), real Redis, and for the first test a real `voicering train-worker`:

- a voice deleted while its job preprocesses keeps its training slot until the job has stopped
  (an upload meanwhile is 429 `training_jobs_limit_exceeded`), and the job stops soon;
- a job whose trainer acked it without its outcome is ended by the gateway's watcher: `ready`
  when it published its adapter (then made ready past the warming deadline, though no owner ever
  prewarmed it), `failed` when it did not, `cancelled` with its adapter removed for a deleted voice;
- a failed clone's reason is written for the tenant, never the trainer's exception or paths;
- malformed clone records are skipped, and the watcher carries the other clones on;
- a DELETE that raced a POST of the same name leaves no upload folder behind, and a DELETE never
  removes the uploads of another job of the same name;
- a deeply nested transcripts manifest is a 400, not a 500.

Jobs other than the first test's are driven by hand, as a trainer would leave them (read from the
group, written, acked), on the gateway's own queue."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway.cloning.views import CANCELLED_REASON, PLATFORM_REASON
from gateway.quotas import Quotas
from gateway.tenants import TenantLimits, TenantPolicy, Tenants, connect_redis
from lora_training.jobs import JobQueue
from tests.fixtures.gateway import start_gateway
from tests.fixtures.models import REPO
from tests.fixtures.speech import upload_parts

CONSENT = "I, the speaker in these recordings, agree that this account may train and serve a clone of my voice."
WARMING_DEADLINE_S = 3.0
TRAINER_LEASE_MS = 15_000  # the trainer's heartbeat looks for a cancel every 5 s
STOP_BOUND_S = 60.0  # a cancelled job has stopped this long after its trainer could see the cancel
SETTLE_S = 30.0  # generous: the watcher polls every 0.5 s
NO_RECORDS = {"hash": False, "index": False, "stream": False}
PARAMS = {"rank": 8, "alpha": 16, "max_steps": 4, "save_steps": 4, "batch_size": 1, "grad_accum": 1,
          "logging_steps": 1, "eval_max_clips": 2}


class Clones:
    """One gateway of this module's, with its own queue and tenant prefix, and handles on both."""

    def __init__(self, redis_server, folder: Path) -> None:
        self.train_prefix = f"test-lifecycle-{uuid.uuid4().hex[:8]}"
        self.tenant_prefix = f"test:lifecycle:{uuid.uuid4().hex[:8]}"
        self.voices = folder / "voices"
        self.voices.mkdir(parents=True)
        env = {"VOICERING_GATEWAY_TRAIN_PREFIX": self.train_prefix,
               "VOICERING_GATEWAY_TENANT_PREFIX": self.tenant_prefix,
               "VOICERING_GATEWAY_WORKERS": json.dumps(["ws://127.0.0.1:9"]),
               "VOICERING_GATEWAY_CLONE_WARMING_DEADLINE_S": str(WARMING_DEADLINE_S),
               "VOICERING_GATEWAY_CLONE_PARAMS": json.dumps(PARAMS)}
        self.process = start_gateway(redis_server.url, self.voices, folder / "gateway", env=env)
        self.queue = JobQueue.connect(redis_server.url, self.train_prefix)
        self.redis = connect_redis(redis_server.url, timeout_s=2.0)
        self.tenants = Tenants(self.redis, self.tenant_prefix)
        self.quotas = Quotas(self.redis, self.tenant_prefix)
        self.clones_key = f"{self.tenant_prefix}:clones"

    @property
    def uploads(self) -> Path:
        return self.process.uploads

    async def tenant(self, **limits: int):
        tenant, key = await self.tenants.create(f"t{uuid.uuid4().hex[:12]}",
                                                TenantLimits(requests_per_minute=100_000, **limits),
                                                TenantPolicy(consent="statement"))  # these send typed consent
        return tenant, httpx.Client(base_url=self.process.url, headers={"Authorization": f"Bearer {key}"},
                                    timeout=60)

    def deliver(self, job_id: str):
        """Read the job's entry from the group, as a trainer does."""
        delivery = self.queue.next("hand-trainer", block_ms=1000, claim_idle_ms=3_600_000)
        assert delivery is not None and delivery.job_id == job_id, delivery
        return delivery

    def left_without_outcome(self, job_id: str, state: str, delivery) -> None:
        """What a trainer that lost its outcome write left: a running state, long unchanged, entry acked."""
        self.queue.redis.hset(self.queue.job_key(job_id), mapping={"state": state, "attempts": 1,
                                                                   "updated_at": time.time() - 3600})
        self.queue.ack(delivery)

    def publish(self, stand_in, voice_id: str, job_id: str) -> Path:
        """An adapter published by job `job_id` (a stand-in voice's weights), as the trainer publishes."""
        target = self.voices / voice_id
        shutil.copytree(next(stand_in.voices.iterdir()), target)
        meta_path = target / "voicering.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        meta_path.write_text(json.dumps({**meta, "voice": voice_id, "job_id": job_id}))
        return target

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")

    def job_records(self, job_id: str) -> dict:
        """What the queue holds for a job: its hash, its index entry, its stream entry."""
        redis = self.queue.redis
        return {"hash": redis.exists(self.queue.job_key(job_id)) == 1,
                "index": redis.zscore(self.queue.index, job_id) is not None,
                "stream": any(f.get("job_id") == job_id for _, f in redis.xrange(self.queue.stream))}

    async def aclose(self) -> None:
        self.process.stop()
        self.queue.close()
        await self.redis.aclose()


@pytest.fixture
async def clones(redis_server, tmp_path):
    made = Clones(redis_server, tmp_path)
    yield made
    await made.aclose()


@pytest.fixture(scope="module")
def upload(creator_corpus) -> list:
    """All 32 espeak-ng sentences (~65 s of speech, over the 60 s minimum) and their manifest."""
    return upload_parts(creator_corpus)


def post(api: httpx.Client, name: str, upload: list) -> httpx.Response:
    return api.post("/v1/voices", data={"name": name, "consent": CONSENT}, files=upload)


def accepted(response: httpx.Response) -> str:
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def wait_for(condition, timeout: float, what: str, log=None):
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}" + (f"\n{log()}" if log else ""))
        time.sleep(0.05)


# -- a deleted clone's slot, with a real trainer ----------------------------------------------------


@pytest.fixture
def trainer(stand_in, redis_server, clones, tmp_path):
    """`voicering train-worker` on the gateway's queue, publishing into its adapter store, no sample."""
    log = tmp_path / "trainer.log"
    cmd = [sys.executable, "-m", "voicering", "train-worker", "--redis-url", redis_server.url,
           "--model", str(stand_in.model), "--codec", str(stand_in.codec), "--store", str(clones.voices),
           "--work-dir", str(tmp_path / "train-work"), "--consumer", "lifecycle-trainer",
           "--lease-ms", str(TRAINER_LEASE_MS), "--claim-idle-ms", str(TRAINER_LEASE_MS)]
    env = {**os.environ, "VOICERING_TRAIN_QUEUE_PREFIX": clones.train_prefix, "VOICERING_TRAIN_DEVICE": "cpu",
           "VOICERING_TRAIN_BLOCK_MS": "200", "VOICERING_TRAIN_VALIDATE_SAMPLE": "false",
           "VOICERING_TRAIN_VALIDATE_LOCAL_WORKER": "false"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    proc.log_tail = lambda: log.read_text(errors="replace")[-3000:]  # type: ignore[attr-defined]
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def test_a_voice_deleted_while_preprocessing_holds_its_slot_until_its_job_has_stopped(
        clones, trainer, upload):
    tenant, api = await clones.tenant(max_training_jobs=1)
    first = accepted(post(api, "first", upload))
    status = wait_for(lambda: (s := clones.queue.status(first)).state not in ("", "queued") and s, 240,
                      "the trainer to start the job", trainer.log_tail)
    os.kill(trainer.pid, signal.SIGSTOP)  # the trainer holds the job and cannot see the cancel yet
    frozen_in = status.state
    try:
        assert api.delete("/v1/voices/first").status_code == 200
        status = clones.queue.status(first)
        assert status.cancel_requested and not status.terminal, status
        assert await clones.quotas.training_jobs(tenant) == {first}  # the running job keeps counting

        refused = post(api, "second", upload)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "training_jobs_limit_exceeded"
        assert not clones.queue.status(first).terminal  # refused while the first job had not stopped
        assert not (clones.uploads / tenant.id / "second").exists()
    finally:
        os.kill(trainer.pid, signal.SIGCONT)
    resumed = time.monotonic()

    # A deleted voice's job records are themselves deleted once the job has stopped and been metered
    # (issue 34 item 7): a poll may find them gone, which only a stopped job allows.
    status = wait_for(lambda: (s := clones.queue.status(first)) is None and "gone" or (s.terminal and s),
                      STOP_BOUND_S, "the cancelled job to stop", trainer.log_tail)
    assert time.monotonic() - resumed < STOP_BOUND_S
    if status != "gone":
        assert status.state == "cancelled", status
        if frozen_in == "preprocessing":  # it stopped there, and never trained
            assert status.total_steps == 0 and status.step == 0, status
    wait_for(lambda: not (clones.voices / tenant.id / "first").exists(), 5, "no adapter for the deleted voice")

    async def slot_free() -> bool:
        return not await clones.quotas.training_jobs(tenant)

    deadline = time.monotonic() + SETTLE_S
    while not await slot_free():  # the watcher frees it once it sees the job stopped
        assert time.monotonic() < deadline, "the stopped job's training slot was not freed"
        time.sleep(0.1)
    second = accepted(post(api, "second", upload))
    assert api.delete("/v1/voices/second").status_code == 200
    assert second != first


# -- jobs left without an outcome, and the warming deadline ----------------------------------------


async def test_a_job_acked_without_its_outcome_is_ended_by_the_watcher(clones, upload, stand_in):
    tenant, api = await clones.tenant()
    kept = accepted(post(api, "kept", upload))
    clones.publish(stand_in, f"{tenant.id}/kept", kept)
    clones.left_without_outcome(kept, "validating", clones.deliver(kept))
    lost = accepted(post(api, "lost", upload))
    clones.left_without_outcome(lost, "training", clones.deliver(lost))

    def settled(name: str):
        view = api.get(f"/v1/voices/{name}").json()
        return view if view["state"] in ("ready", "failed") else None

    # published: ended ready, warmed on no owner (nobody answers), made ready past the warming deadline
    voice = wait_for(lambda: settled("kept"), SETTLE_S + WARMING_DEADLINE_S, "kept to settle", clones.process.log_tail)
    assert voice["state"] == "ready", voice
    assert clones.queue.status(kept).state == "ready"
    # not published: failed, with a reason for the tenant
    voice = wait_for(lambda: settled("lost"), SETTLE_S, "lost to settle", clones.process.log_tail)
    assert voice["state"] == "failed" and voice["reason"] == PLATFORM_REASON, voice
    status = clones.queue.status(lost)
    assert (status.state, status.error_code) == ("failed", "orphaned")
    assert await clones.quotas.training_jobs(tenant) == frozenset()
    assert await clones.redis.hlen(clones.clones_key) == 0


async def test_a_deleted_voice_whose_job_stopped_without_an_outcome_loses_its_late_adapter(clones, upload, stand_in):
    tenant, api = await clones.tenant(max_training_jobs=1)
    job = accepted(post(api, "gone", upload))
    delivery = clones.deliver(job)
    assert clones.queue.acquire(job, "hand-trainer:1", 60_000)  # a trainer runs it
    clones.queue.update(job, state="training")
    assert api.delete("/v1/voices/gone").status_code == 200
    assert await clones.quotas.training_jobs(tenant) == {job}  # still running: still counted
    # the trainer publishes before it sees the cancel, then acks without recording anything
    adapter = clones.publish(stand_in, f"{tenant.id}/gone", job)
    clones.left_without_outcome(job, "publishing", delivery)
    clones.queue.release(job, "hand-trainer:1")

    wait_for(lambda: not adapter.exists(), SETTLE_S, "the late adapter to be removed", clones.process.log_tail)

    async def done() -> bool:
        return not await clones.quotas.training_jobs(tenant) and not await clones.redis.hlen(clones.clones_key)

    deadline = time.monotonic() + SETTLE_S
    while not await done():
        assert time.monotonic() < deadline, "the slot or the clone record was left"
        time.sleep(0.1)
    assert not (clones.uploads / tenant.id).exists()
    assert f"job {job} had stopped in state publishing without an outcome; ended as cancelled" in clones.log()
    wait_for(lambda: clones.job_records(job) == NO_RECORDS, SETTLE_S, "the job's records to go with its voice")


async def test_a_settled_voice_s_job_records_go_with_its_delete(clones, upload):
    """The job's hash holds its spec (the uploads' file names, a spoken consent's phrase): it must not
    outlive the voice (issue 34, item 7). Redis runs without eviction: nothing else would remove it."""
    tenant, api = await clones.tenant()
    job = accepted(post(api, "settled", upload))
    delivery = clones.deliver(job)
    assert clones.queue.acquire(job, "hand-trainer:2", 60_000)
    clones.queue.finish(delivery, "hand-trainer:2", state="failed", error_code="bad_audio", error="take.wav: noise")
    clones.queue.release(job, "hand-trainer:2")
    wait_for(lambda: api.get("/v1/voices/settled").json()["state"] == "failed", SETTLE_S, "the clone to settle",
             clones.process.log_tail)
    deadline = time.monotonic() + SETTLE_S
    while await clones.redis.hlen(clones.clones_key):  # settled and dropped: no watcher will see it again
        assert time.monotonic() < deadline, "the watcher did not drop the settled clone's record"
        time.sleep(0.1)
    assert clones.job_records(job) == {"hash": True, "index": True, "stream": True}  # the failed voice shows it

    assert api.delete("/v1/voices/settled").status_code == 200
    assert clones.job_records(job) == NO_RECORDS  # at once, with the voice
    assert clones.queue.spec(job) is None and not (clones.uploads / tenant.id).exists()


async def test_a_deleted_voice_s_job_records_go_once_its_trainer_lets_go(redis_server, tmp_path):
    """A trainer writes a stopped job's last state, cleans up, then releases the job's lock, and the
    job's records cannot be deleted while it holds the lock. A watcher round between the two (30 ms
    apart in a whole run) finished the deleted voice's clone and left the records to the trainers'
    trim (`job_record_keep_s`); now that round waits, and the round after the release deletes them.
    In this process on the session Redis: a gateway's parts, its watcher's rounds run by hand, a
    trainer's queue calls made by hand."""
    from gateway.api.state import open_gateway
    from gateway.cloning import Cloning
    from gateway.cloning.records import CloneIndex, CloneRecord
    from gateway.cloning.watcher import CloneWatcher
    from gateway.settings import GatewaySettings
    from lora_training.pipeline import JobSpec

    tenant_prefix, train_prefix = f"test:letgo:{uuid.uuid4().hex[:8]}", f"test-letgo-{uuid.uuid4().hex[:8]}"
    settings = GatewaySettings(redis_url=redis_server.url, tenant_prefix=tenant_prefix, train_prefix=train_prefix,
                               workers=("ws://127.0.0.1:9",), uploads_dir=tmp_path / "uploads",
                               voices_dir=tmp_path / "voices", metrics_port=None)
    async with open_gateway(settings) as gw:
        tenant, _ = await gw.tenants.create(f"t{uuid.uuid4().hex[:12]}", policy=TenantPolicy(consent="statement"))
        spec = JobSpec(name="letgo", tenant=tenant.id, audio=[tmp_path / "take.wav"])
        await gw.tenants.register_voice(tenant, "letgo", consent=CONSENT, job_id=spec.job_id, state="training")
        gw.jobs.submit(spec)
        CloneIndex(gw.jobs.redis, f"{tenant_prefix}:clones").put(
            CloneRecord(spec.job_id, tenant.id, "letgo", spec.voice_id, time.time()))
        delivery = gw.jobs.next("hand-trainer", block_ms=1000, claim_idle_ms=3_600_000)
        assert delivery is not None and gw.jobs.acquire(spec.job_id, "hand-trainer:1", 60_000)
        gw.jobs.update(spec.job_id, token="hand-trainer:1", state="training", step=1)
        async with CloneWatcher(gw, poll_s=3600.0) as watcher:  # its first round runs now; the rest by hand
            await Cloning(gw).delete(tenant, "letgo")  # the job runs on, asked to stop
            gw.jobs.finish(delivery, "hand-trainer:1", state="cancelled", message="cancelled at step 1")
            for _ in range(2):  # stopped, its lock still held (the trainer is cleaning up): rounds pass
                await watcher.tick()
            assert gw.jobs.status(spec.job_id).state == "cancelled"  # its records are still there ...
            assert watcher.cloning.index.get(spec.job_id) is not None  # ... and so is the clone to finish
            gw.jobs.release(spec.job_id, "hand-trainer:1")
            await watcher.tick()
            assert gw.jobs.status(spec.job_id) is None  # gone with its voice, not left to the trim
            assert watcher.cloning.index.get(spec.job_id) is None


# -- what a watcher keeps of a clone another gateway settles --------------------------------------


async def test_a_clone_settled_by_another_gateway_leaves_no_prewarm_state_in_this_one(worker, redis_server, tmp_path):
    """Two gateway processes' parts (in this process, on the session Redis and worker): A prewarms a
    published clone on the session worker, which cannot load it (no adapter), so A counts a failure
    and keeps warming; B's warming deadline passes first, B settles the clone and drops its record.
    A's next round must forget the voice (issue 34, item 14): its operations, failure count and
    warming detail were kept forever."""
    from gateway.api.state import open_gateway
    from gateway.cloning.records import CloneIndex, CloneRecord
    from gateway.cloning.watcher import CloneWatcher
    from gateway.settings import GatewaySettings
    from lora_training.pipeline import JobSpec

    tenant_prefix, train_prefix = f"test:prewarm:{uuid.uuid4().hex[:8]}", f"test-prewarm-{uuid.uuid4().hex[:8]}"

    def settings(name: str, deadline_s: float) -> GatewaySettings:
        return GatewaySettings(redis_url=redis_server.url, tenant_prefix=tenant_prefix, train_prefix=train_prefix,
                               workers=(worker.url,), uploads_dir=tmp_path / name / "uploads",
                               voices_dir=tmp_path / "voices", clone_warming_deadline_s=deadline_s, metrics_port=None)

    async with open_gateway(settings("a", 3600.0)) as a:
        tenant, _ = await a.tenants.create(f"t{uuid.uuid4().hex[:12]}", policy=TenantPolicy(consent="statement"))
        spec = JobSpec(name="elsewhere", tenant=tenant.id, audio=[tmp_path / "take.wav"])
        await a.tenants.register_voice(tenant, "elsewhere", consent=CONSENT, job_id=spec.job_id, state="training")
        a.jobs.submit(spec)
        a.jobs.redis.hset(a.jobs.job_key(spec.job_id), mapping={"state": "ready", "attempts": 1})  # published
        index = CloneIndex(a.jobs.redis, f"{tenant_prefix}:clones")
        index.put(CloneRecord(spec.job_id, tenant.id, "elsewhere", spec.voice_id, time.time()))

        async with CloneWatcher(a, poll_s=3600.0) as watcher_a:  # its first round runs now; more by hand
            deadline = time.monotonic() + SETTLE_S
            while watcher_a.rounds < 1:
                assert time.monotonic() < deadline, "A's first round did not end"
                await asyncio.sleep(0.05)
            while spec.voice_id not in watcher_a._prewarmer._failures:
                assert time.monotonic() < deadline, (f"A never counted the worker's failure to load the voice: "
                                                     f"{watcher_a._prewarmer._ops} {watcher_a._warm_detail}")
                await asyncio.sleep(0.2)
                await watcher_a.tick()
            assert (await a.tenants.voice(tenant, "elsewhere")).state == "warming"
            assert watcher_a.held_voices == {spec.voice_id} and spec.voice_id in watcher_a._warm_detail

            async with open_gateway(settings("b", 0.1)) as b, CloneWatcher(b, poll_s=0.1):
                deadline = time.monotonic() + SETTLE_S
                while index.get(spec.job_id) is not None:
                    assert time.monotonic() < deadline, "B did not settle the clone past its warming deadline"
                    await asyncio.sleep(0.1)
            assert (await a.tenants.voice(tenant, "elsewhere")).state == "failed"

            await watcher_a.tick()
            assert watcher_a.held_voices == frozenset()
            assert not watcher_a._prewarmer._ops and not watcher_a._prewarmer._failures
            assert not watcher_a._warm_detail


# -- what a tenant is told, and what the watcher lives through -------------------------------------


async def test_a_failed_clone_s_reason_is_for_the_tenant_not_the_trainer_s_internals(clones, upload):
    tenant, api = await clones.tenant()
    internal = accepted(post(api, "internal", upload))
    delivery = clones.deliver(internal)
    clones.queue.update(internal, state="failed", error_code="internal",
                        error="internal error: OSError: [Errno 28] No space left on device: '/srv/train/jobs/x/run-1'")
    clones.queue.ack(delivery)
    bad_file = accepted(post(api, "bad-file", upload))
    delivery = clones.deliver(bad_file)
    clones.queue.update(bad_file, state="failed", error_code="bad_audio",
                        error="take.wav: cannot open the file (Error opening "
                              f"'{clones.uploads}/{tenant.id}/bad-file/{bad_file}/audio/take.wav': Format not recognised.)")
    clones.queue.ack(delivery)

    shown = "take.wav: cannot open the file (Error opening 'take.wav': Format not recognised.)"

    def reasons() -> tuple:
        views = [api.get(f"/v1/voices/{name}").json() for name in ("internal", "bad-file")]
        return tuple((v["state"], v["reason"]) for v in views)

    assert reasons() == (("failed", PLATFORM_REASON), ("failed", shown))  # from the job, before the watcher
    deadline = time.monotonic() + SETTLE_S
    while await clones.redis.hlen(clones.clones_key):
        assert time.monotonic() < deadline, "the watcher did not settle the failed clones"
        time.sleep(0.1)
    assert reasons() == (("failed", PLATFORM_REASON), ("failed", shown))  # from the voice, once settled
    listed = api.get("/v1/voices").json()["data"]
    assert not any("/srv" in json.dumps(v) or "OSError" in json.dumps(v) for v in listed)


async def test_malformed_clone_records_are_skipped_and_the_watcher_goes_on(clones, upload):
    tenant, api = await clones.tenant()
    job = accepted(post(api, "steady", upload))
    await clones.redis.hset(clones.clones_key, mapping={
        "clone-garbage": "{not json", "clone-wrong-types": json.dumps({"job_id": 7, "tenant_id": None}),
        "clone-deep": "[" * 100_000})
    skipped = [f"clone record 'clone-{name}'" for name in ("garbage", "wrong-types", "deep")]
    wait_for(lambda: all(line in clones.process.log_path.read_text() for line in skipped), SETTLE_S,
             "the watcher to skip the malformed records", clones.process.log_tail)  # a round went over them
    clones.queue.cancel(job)  # an operator cancels the good one: the watcher must still settle it (a later round)
    voice = wait_for(lambda: (v := api.get("/v1/voices/steady").json())["state"] == "failed" and v, SETTLE_S,
                     "the watcher to settle the good clone", clones.process.log_tail)
    assert voice["reason"] == CANCELLED_REASON
    log = clones.process.log_path.read_text()
    assert log.count("clone record 'clone-garbage'") == 1 and "clone watcher died" not in log
    assert api.get("/health").status_code == 200


# -- a DELETE racing a POST; transcripts bounds ----------------------------------------------------


async def test_a_delete_racing_an_upload_of_the_same_name_leaves_no_upload_folder(clones, upload):
    tenant, api = await clones.tenant()
    job = accepted(post(api, "race", upload))
    folder = clones.uploads / tenant.id / "race" / job
    assert folder.is_dir()
    # the racing DELETE found the new voice and removed it before the upload had moved its files
    # and written its clone record; the upload then finished, its job queued
    await clones.tenants.delete_voice(tenant, "race")
    wait_for(lambda: not (clones.uploads / tenant.id).exists(), SETTLE_S, "the orphaned upload folder to go",
             clones.process.log_tail)

    async def done() -> bool:
        return not await clones.quotas.training_jobs(tenant) and not await clones.redis.hlen(clones.clones_key)

    deadline = time.monotonic() + SETTLE_S
    while not await done():
        assert time.monotonic() < deadline, "the slot or the clone record was left"
        time.sleep(0.1)
    wait_for(lambda: clones.job_records(job) == NO_RECORDS, SETTLE_S, "the cancelled job's records to go")

    # and the other order: a DELETE of the old voice never removes the files of the new one's job
    old = accepted(post(api, "again", upload))
    newer = clones.uploads / tenant.id / "again" / "clone-newer"
    (newer / "audio").mkdir(parents=True)
    (newer / "audio" / "take.wav").write_bytes(b"RIFF")
    assert api.delete("/v1/voices/again").status_code == 200
    assert not (clones.uploads / tenant.id / "again" / old).exists()
    assert (newer / "audio" / "take.wav").is_file()


async def test_a_deeply_nested_transcripts_manifest_is_a_400(clones, upload):
    tenant, api = await clones.tenant()
    files = [part for part in upload if part[0] == "files"]
    nested = files + [("transcripts", ("transcripts.json", b"[" * 200_000, "application/json"))]
    response = api.post("/v1/voices", data={"name": "deep", "consent": CONSENT}, files=nested)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("transcripts", "transcripts") and "levels deep" in error["message"]
    assert not (clones.uploads / tenant.id).exists()
