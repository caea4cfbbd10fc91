"""What a final job leaves on disk (`lora_training.cleanup`): its checkpoints, clip set, SNAC frames
and staged copies go, another job's stay; and through a real trainer on a real Redis: a job that
can still be retried keeps its checkpoints and caches, and loses them once it is final."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from gpu_worker.adapters.layout import STAGING_DIR
from hashring.ports import free_port
from lora_training.cleanup import clean_job, clip_cache_keys
from lora_training.clips import Clip, ClipSet
from lora_training.consumer import TrainWorker
from lora_training.dataset import FrameCache, clip_digest
from lora_training.pipeline import JobSpec
from lora_training.publish import STAGING_TENANT
from lora_training.settings import TrainSettings

pytestmark = pytest.mark.timeout(600)
CODEC = "stand-in-codec"


def _upload(folder: Path, seed: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "take.wav"
    sf.write(str(path), np.random.default_rng(seed).uniform(-0.1, 0.1, 2400).astype(np.float32), 24000)
    return [path]


def _clip_set(*values: float) -> ClipSet:
    clips = tuple(Clip(f"c{i}", "take.wav", "text", np.full(240, v, dtype=np.float32), 0.0, 0.0)
                  for i, v in enumerate(values))
    return ClipSet(clips, {"files": 1})


def _settings(tmp_path: Path) -> TrainSettings:
    return TrainSettings(work_dir=tmp_path / "work", adapter_store=tmp_path / "store", codec=CODEC)


def _frames(cache: Path, *sets: ClipSet) -> None:
    frames = FrameCache(cache, CODEC)
    frames._frames = {clip_digest(c): [[1, 2, 3, 4, 5, 6, 7]] for s in sets for c in s.clips}
    frames.save()


def _made(settings: TrainSettings, spec: JobSpec, clip_set: ClipSet) -> Path:
    """What the job's run leaves: its clip set, a checkpoint, a crashed attempt's staged copy."""
    cache = settings.work_dir / "cache"
    key = sorted(clip_cache_keys(spec, settings))[0]
    clip_set.save(cache / f"clips-{key}")
    checkpoint = settings.work_dir / "jobs" / spec.job_id / "run-abc" / "checkpoints" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"x")
    staged = settings.adapter_store / STAGING_TENANT / f"{spec.job_id}.attempt-0123abcd"
    staged.mkdir(parents=True)
    (settings.adapter_store / STAGING_DIR).mkdir()
    return cache / f"clips-{key}"


def test_a_final_job_leaves_nothing_and_another_job_keeps_what_it_needs(tmp_path):
    settings = _settings(tmp_path)
    spec = JobSpec(job_id="done", name="v", tenant="acme", audio=_upload(tmp_path / "up-done", 1))
    other = JobSpec(job_id="other", name="w", tenant="acme", audio=_upload(tmp_path / "up-other", 2))
    ours, theirs = _clip_set(0.1, 0.2), _clip_set(0.2, 0.3)  # one clip's audio in both
    entry = _made(settings, spec, ours)
    cache = settings.work_dir / "cache"
    theirs.save(cache / f"clips-{sorted(clip_cache_keys(other, settings))[0]}")
    (settings.work_dir / "jobs" / "other").mkdir(parents=True)
    _frames(cache, ours, theirs)

    done = clean_job(spec, settings, live=[other])
    assert not entry.exists() and not (settings.work_dir / "jobs" / spec.job_id).exists()
    assert not (settings.adapter_store / STAGING_TENANT).exists() and not (settings.adapter_store / STAGING_DIR).exists()
    kept = json.loads(next(cache.glob("frames-*.json")).read_text())
    assert set(kept) == {clip_digest(c) for c in theirs.clips}  # ours went, the shared clip's stayed
    assert done.frames == 1
    assert (settings.work_dir / "jobs" / "other").is_dir()  # another job's folder is never touched

    clean_job(other, settings)  # the last job: the cache and jobs folders go too
    assert not cache.exists() and not (settings.work_dir / "jobs").exists()
    assert settings.work_dir.is_dir() and settings.adapter_store.is_dir()


def test_a_clip_set_a_live_job_shares_is_kept(tmp_path):
    settings = _settings(tmp_path)
    audio = _upload(tmp_path / "up", 3)
    spec = JobSpec(job_id="done", name="v", tenant="acme", audio=audio)
    twin = JobSpec(job_id="twin", name="w", tenant="acme", audio=audio)  # the same files uploaded again
    entry = _made(settings, spec, _clip_set(0.5))
    _frames(settings.work_dir / "cache", _clip_set(0.5))
    done = clean_job(spec, settings, live=[twin])
    assert entry.is_dir() and done.kept == [str(entry)] and done.frames == 0
    assert not (settings.work_dir / "jobs" / spec.job_id).exists()


def test_keys_read_before_the_uploads_went_still_find_the_clip_set(tmp_path):
    settings = _settings(tmp_path)
    spec = JobSpec(job_id="gone", name="v", tenant="acme", audio=_upload(tmp_path / "up", 4))
    keys = clip_cache_keys(spec, settings)
    entry = _made(settings, spec, _clip_set(0.7))
    spec.audio[0].unlink()  # its voice was deleted: its uploads went with it
    assert clip_cache_keys(spec, settings) == frozenset()
    clean_job(spec, settings, keys=keys)
    assert not entry.exists()


# -- through a real trainer ------------------------------------------------------------------------


def _dead_url() -> str:
    return f"ws://127.0.0.1:{free_port()}"  # nobody listens there


def test_a_job_keeps_its_checkpoints_and_caches_while_it_can_be_retried_and_not_after(
        queue, uploads, train_settings, tmp_path):
    """The validation worker is unreachable: a retryable failure. The first attempt keeps everything
    for the retry; the last one, final, leaves nothing behind."""
    settings = train_settings.model_copy(update={
        "queue_prefix": queue.prefix, "block_ms": 100, "consumer": "t", "max_attempts": 2,
        "work_dir": tmp_path / "work", "adapter_store": tmp_path / "store",
        "validate_sample": True, "validate_worker_url": _dead_url()})
    spec = JobSpec(name="kept", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest,
                   data=train_settings.data, params=train_settings.params)
    job = queue.submit(spec).job_id
    work = settings.work_dir
    worker = TrainWorker(settings, queue, console=False)

    first = queue.next("t", block_ms=100, claim_idle_ms=60_000)
    assert first is not None and worker.process(first) is False  # back in the queue, its entry pending
    status = queue.status(job)
    assert status.state == "queued" and status.attempts == 1 and "will retry" in status.message, status
    assert list((work / "jobs" / job).glob("run-*/checkpoints/checkpoint-*")), "the retry's checkpoints"
    assert list((work / "cache").glob("clips-*")) and list((work / "cache").glob("frames-*.json"))

    delivery = queue.next("t", block_ms=100, claim_idle_ms=0)
    assert delivery is not None and worker.process(delivery) is True
    status = queue.status(job)
    assert status.state == "failed" and status.attempts == 2, status
    assert not (work / "jobs").exists() and not (work / "cache").exists()
    assert not (settings.adapter_store / STAGING_TENANT).exists()
