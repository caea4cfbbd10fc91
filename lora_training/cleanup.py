"""What a training job leaves on disk, removed once the job is final (ready, failed or cancelled).

While a job can still run again (a retryable failure with attempts left, a trainer stopped by
SIGTERM, a lease lost, a crash) nothing is removed: the retry resumes from the caches and the last
checkpoint. Once its outcome is recorded no one runs it again (a resubmission of an ended job id
is refused, a creator uploads again as a new job), so its trainer removes:

- ``<work_dir>/jobs/<job id>/``: checkpoints, the trained adapter's run folder, the validation log;
- its clip set ``<work_dir>/cache/clips-<key>/``, the key made of the uploads' content, the
  transcripts, the data parameters and the ASR model (`preprocess.cache_key`, as `pipeline.run_job`
  calls it): kept only while another job that is not final has the same key (the same files
  uploaded twice, the same settings);
- its clips' SNAC frames from ``<work_dir>/cache/frames-<codec>.json``, keyed by each clip's audio:
  a clip whose audio is also in a clip set still in the cache keeps its frames (that job needs them);
- its staged copies ``<store>/voicering-staging/<job id>.attempt-*`` (a crashed attempt's);
- then the folders left empty: ``cache/``, ``jobs/``, ``<store>/voicering-staging/`` and the
  store's ``.staging/`` (rmdir only removes an empty folder, so a folder in use stays).

A trainer sharing the cache with another one may rewrite the frames file from what it read before
this removal: that only puts frames back (kept longer), never loses any a job needs beyond a
re-encode. The uploads and the consent recording are not the trainer's: the gateway keeps them
with the voice, for the tenant's retention period (gateway.cloning.retention).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_worker.adapters.layout import STAGING_DIR
from lora_training.asr import AsrModel, resolve_model
from lora_training.clips import ClipSet
from lora_training.dataset import clip_digest
from lora_training.pipeline import JobSpec
from lora_training.preprocess import cache_key
from lora_training.publish import STAGING_TENANT
from lora_training.settings import TrainSettings

log = logging.getLogger(__name__)

__all__ = ["Cleaned", "asr_models", "clean_job", "clip_cache_keys"]

CLIPS_PREFIX = "clips-"  # preprocess: <cache>/clips-<key>
FRAMES_GLOB = "frames-*.json"  # dataset.FrameCache: <cache>/frames-<codec hash>.json


@dataclass
class Cleaned:
    """What `clean_job` removed (paths relative to nothing: for logs and tests)."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # cache entries another live job needs
    frames: int = 0  # SNAC frame entries dropped


def asr_models(settings: TrainSettings) -> tuple[AsrModel | None, ...]:
    """The ASR models a clip-set key may name: the configured one (as `pipeline.run_job` resolves
    it) and none (ASR off), so a job is found whichever the key was made with."""
    try:
        model = resolve_model(settings.asr_model)
    except Exception:  # noqa: BLE001 unresolvable here now (a hub model unreachable...): only the key without ASR
        return (None,)
    return (model, None) if model is not None else (None,)


def clip_cache_keys(spec: JobSpec, settings: TrainSettings,
                    models: tuple[AsrModel | None, ...] | None = None) -> frozenset[str]:
    """The clip-set keys this job's preprocessing may have used, or none when its uploads cannot be
    read (deleted with its voice)."""
    try:
        return frozenset(cache_key(list(spec.audio), spec.transcripts, spec.data, model)
                         for model in (models if models is not None else asr_models(settings)))
    except OSError:
        return frozenset()


def clean_job(spec: JobSpec, settings: TrainSettings, *, keys: Iterable[str] | None = None,
              live: Iterable[JobSpec] = ()) -> Cleaned:
    """Remove what job `spec` left (see the module doc). `keys`: its clip-set keys, computed while its
    uploads existed (else now); `live`: the jobs that are not final, whose clip sets stay.
    Never raises for a file that is already gone; an OSError on the way is logged and skipped."""
    done = Cleaned()
    work, store = settings.work_dir, settings.adapter_store
    _remove(work / "jobs" / spec.job_id, done)
    cache = work / "cache"
    models = asr_models(settings)
    ours = set(keys) if keys is not None else set(clip_cache_keys(spec, settings, models))
    needed = {key for other in live if other.job_id != spec.job_id
              for key in clip_cache_keys(other, settings, models)}
    digests: set[str] = set()
    for key in sorted(ours):
        entry = cache / f"{CLIPS_PREFIX}{key}"
        if not entry.is_dir():
            continue
        if key in needed:
            done.kept.append(str(entry))
            continue
        clip_set = ClipSet.load(entry)
        if clip_set is not None:
            digests.update(clip_digest(c) for c in clip_set.clips)
        _remove(entry, done)
    if digests:
        digests -= _digests_in_cache(cache)
        done.frames = _drop_frames(cache, digests)
    staging = store / STAGING_TENANT
    if staging.is_dir():
        for staged in staging.iterdir():
            if staged.name == spec.job_id or staged.name.startswith(f"{spec.job_id}.attempt-"):
                _remove(staged, done)
    for folder in (cache, work / "jobs", staging, store / STAGING_DIR):
        _remove_if_empty(folder, done)
    return done


def _digests_in_cache(cache: Path) -> set[str]:
    """The audio digests of every clip set still in the cache (those jobs may need their frames)."""
    found: set[str] = set()
    if not cache.is_dir():
        return found
    for entry in cache.iterdir():
        if entry.name.startswith(CLIPS_PREFIX) and entry.is_dir():
            clip_set = ClipSet.load(entry)
            if clip_set is not None:
                found.update(clip_digest(c) for c in clip_set.clips)
    return found


def _drop_frames(cache: Path, digests: set[str]) -> int:
    """Remove `digests` from every frames file (atomic rewrite; an emptied file is deleted)."""
    dropped = 0
    for path in cache.glob(FRAMES_GLOB):
        try:
            frames = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(frames, dict):
            continue
        gone = digests & frames.keys()
        if not gone:
            continue
        for digest in gone:
            del frames[digest]
        dropped += len(gone)
        try:
            if frames:
                tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
                tmp.write_text(json.dumps(frames))
                os.replace(tmp, path)
            else:
                path.unlink(missing_ok=True)
        except OSError as err:
            log.warning("cannot rewrite %s: %s", path, err)
    return dropped


def _remove(path: Path, done: Cleaned) -> None:
    try:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            return
    except FileNotFoundError:
        return
    except OSError as err:
        log.warning("cannot remove %s: %s", path, err)
        return
    done.removed.append(str(path))


def _remove_if_empty(folder: Path, done: Cleaned) -> None:
    try:
        folder.rmdir()  # refuses a folder that is not empty: one in use by another job stays
    except OSError:
        return
    done.removed.append(str(folder))
