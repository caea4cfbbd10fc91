"""Fault tests with real processes: a trainer SIGKILLed mid-training leaves its job to be re-claimed,
and the next trainer resumes from the last checkpoint; a cancel stops a running job at a step."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from lora_training.consumer import TrainWorker
from lora_training.jobs import JobQueue
from lora_training.pipeline import JobSpec
from lora_training.trainer import checkpoint_step, last_checkpoint
from tests.fixtures.models import REPO

OWN_WORKERS = 1  # a trainer's validation worker, if a job gets that far (tests/fixtures/fleet.py)

LEASE_MS = 2000
SAMPLE_MAX_TOKENS = 7 * 6 + 1  # the validation sample: 6 frames through the real engine (the default is ~3 s)


def _wait(condition, timeout: float, what: str, proc: subprocess.Popen | None = None, log=None):
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"trainer exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}" + (f":\n{log.read_text()[-3000:]}" if log else ""))
        time.sleep(0.1)


def test_a_killed_trainer_is_reclaimed_and_resumes_from_its_checkpoint(
        queue, redis_url, uploads, train_settings, worker, adapter_store, tmp_path):
    params = train_settings.params.model_copy(update={"max_steps": 9, "save_steps": 3})
    spec = JobSpec(name="bob", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest,
                   data=train_settings.data, params=params)
    job = queue.submit(spec).job_id
    checkpoints = lambda: next(iter((train_settings.work_dir / "jobs" / job).glob("run-*/checkpoints")), None)  # noqa: E731

    log = tmp_path / "trainer-a.log"
    cmd = [sys.executable, "-m", "voicering", "train-worker", "--redis-url", redis_url,
           "--model", train_settings.base_model, "--codec", train_settings.codec, "--store", str(adapter_store),
           "--work-dir", str(train_settings.work_dir), "--consumer", "trainer-a", "--lease-ms", str(LEASE_MS),
           "--claim-idle-ms", str(LEASE_MS), "--max-jobs", "1"]
    env = {**os.environ, "VOICERING_TRAIN_QUEUE_PREFIX": queue.prefix, "VOICERING_TRAIN_DEVICE": "cpu"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    try:
        _wait(lambda: checkpoints() and last_checkpoint(checkpoints()), 300, "a first checkpoint", proc, log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    saved = checkpoint_step(last_checkpoint(checkpoints()))
    status = queue.status(job)
    assert 0 < saved < 9
    assert status.state == "training" and status.attempts == 1 and status.consumer == "trainer-a"
    assert queue.pending() == 1  # never acked: the job is still owed

    settings = train_settings.model_copy(update={
        "queue_prefix": queue.prefix, "consumer": "trainer-b", "lease_ms": LEASE_MS, "claim_idle_ms": LEASE_MS,
        "block_ms": 200, "validate_sample": True, "validate_worker_url": worker.url,
        "sample_max_tokens": SAMPLE_MAX_TOKENS})
    assert TrainWorker(settings, queue, console=False).run(max_jobs=1) == 1
    status = queue.status(job)
    assert status.state == "ready", status
    assert status.resumed_from_step == saved and status.attempts == 2 and status.consumer == "trainer-b"
    assert status.progress == 100.0 and queue.pending() == 0 and queue.holder(job) is None
    assert not (train_settings.work_dir / "jobs" / job).exists()  # final: its checkpoints are gone
    meta = json.loads((adapter_store / "acme" / "bob" / "voicering.json").read_text())
    assert meta["resumed_from_step"] == saved and meta["steps"] == 9 and meta["job_id"] == job
    assert meta["sample"]["frames"] > 0


def test_sigterm_hands_the_running_job_back_to_the_queue_uncounted(queue, redis_url, uploads, train_settings,
                                                                   adapter_store, tmp_path):
    """`voicering up`, Kubernetes and systemd stop a trainer with SIGTERM: it exits 0 at the next
    step, the job is queued again with that attempt not counted and its lock released, and the
    entry stays pending for the next trainer (which resumes from the checkpoints)."""
    params = train_settings.params.model_copy(update={"max_steps": 500, "save_steps": 2})
    spec = JobSpec(name="dora", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest,
                   data=train_settings.data, params=params)
    job = queue.submit(spec).job_id
    log = tmp_path / "trainer-term.log"
    cmd = [sys.executable, "-m", "voicering", "train-worker", "--redis-url", redis_url,
           "--model", train_settings.base_model, "--codec", train_settings.codec, "--store", str(adapter_store),
           "--work-dir", str(train_settings.work_dir), "--consumer", "trainer-t", "--lease-ms", str(LEASE_MS)]
    env = {**os.environ, "VOICERING_TRAIN_QUEUE_PREFIX": queue.prefix, "VOICERING_TRAIN_DEVICE": "cpu"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    try:
        _wait(lambda: (s := queue.status(job)).state == "training" and s.step >= 3, 300, "training steps", proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    status = queue.status(job)
    assert status.state == "queued" and status.attempts == 0, status
    assert "trainer stopped (SIGTERM)" in status.message and 3 <= status.step < 500
    assert queue.holder(job) is None and queue.pending() == 1


def test_cancel_stops_a_running_job_at_a_step_boundary(queue, redis_url, uploads, train_settings, tmp_path):
    """A real `voicering train-worker` process, as a creator's cancel reaches it. A trainer on a thread of
    this process would share the interpreter, and its lease heartbeats, with whatever else the session
    runs here: in the full suite that took minutes where it takes seconds alone."""
    params = train_settings.params.model_copy(update={"max_steps": 500, "save_steps": 500})
    spec = JobSpec(name="carol", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest,
                   data=train_settings.data, params=params)
    job = queue.submit(spec).job_id
    store, log = tmp_path / "store", tmp_path / "trainer-cancel.log"
    cmd = [sys.executable, "-m", "voicering", "train-worker", "--redis-url", redis_url,
           "--model", train_settings.base_model, "--codec", train_settings.codec, "--store", str(store),
           "--work-dir", str(train_settings.work_dir), "--consumer", "t", "--lease-ms", str(LEASE_MS),
           "--claim-idle-ms", str(LEASE_MS), "--max-jobs", "1"]
    env = {**os.environ, "VOICERING_TRAIN_QUEUE_PREFIX": queue.prefix, "VOICERING_TRAIN_DEVICE": "cpu",
           "VOICERING_TRAIN_BLOCK_MS": "200"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    observer = JobQueue.connect(redis_url, prefix=queue.prefix)  # progress as another client sees it
    try:
        running = _wait(lambda: (s := observer.status(job)).state == "training" and s.step >= 2 and s, 300,
                        "training steps", proc, log)
        assert 20.0 < running.progress < 90.0 and running.total_steps == 500
        observer.cancel(job)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]  # --max-jobs 1: the cancelled job was its one
        status = observer.status(job)
    finally:
        observer.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert status.state == "cancelled" and status.step < 500, status
    assert queue.pending() == 0 and not (store / "acme" / "carol").exists()
