"""Validating a trained adapter with the serving stack and publishing it atomically.

Order of events for voice ``tenant/name``:

1. **stage**: the adapter (safetensors, adapter_config.json, voicering.json) is written to a
   temporary directory and renamed to ``<store>/voicering-staging/<job id>.attempt-<random>``:
   a reserved tenant name that no job may use, under which a worker can already resolve the
   adapter (a voice id the worker accepts, unlisted anywhere a creator looks).
2. **validate**: `gpu_worker.adapters.validate_adapter` (the worker's own checks: rank, targets,
   no modules_to_save/DoRA/bias, safetensors only, base model match), then a short sample generated
   by a real worker through the real engine for the staged id; its head silence is measured with
   silence_trim.
3. **publish**: the sample figures are added to voicering.json and
   `gpu_worker.adapters.publish_adapter` makes the voice ``<store>/tenant/name`` visible in one
   ``rename(2)`` (validated again, never over an existing voice); the staged copy is removed.
   A queued job's trainer passes a `fence` that checks its lease token in Redis just before.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from gpu_worker.errors import AdapterError
from gpu_worker.orpheus import SAMPLE_RATE
from gpu_worker.process import WorkerProcess, WorkerStartError, spawn_worker
from lora_training.errors import InfrastructureError, InputError, ValidationError, VoiceExistsError
from silence_trim.detect import measure

STAGING_TENANT = "voicering-staging"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
METADATA_FILE = "voicering.json"  # read by the workers (gpu_worker.adapters.METADATA)
WORKER_GPU_MEMORY_ENV = "VOICERING_WORKER_GPU_MEMORY_UTILIZATION"  # gpu_worker.settings, env prefix VOICERING_WORKER_


def voice_id(tenant: str | None, name: str) -> str:
    """``tenant/name`` (or ``name``), checked against the worker's voice id rules."""
    from gpu_worker.adapters import VOICE_ID  # gpu_worker.adapters is imported where used: keeps the CLI light

    vid = f"{tenant}/{name}" if tenant else name
    if not VOICE_ID.match(vid):
        raise InputError(f"voice id '{vid}' is invalid: use letters, digits and '._-' (tenant and name)")
    if (tenant or name) == STAGING_TENANT:
        raise InputError(f"'{STAGING_TENANT}' is reserved for adapters under validation: choose another name")
    return vid


def check_free(store: Path, vid: str) -> None:
    if (store / vid).exists():
        raise VoiceExistsError(f"voice '{vid}' already exists: choose another name, or delete the voice first")


@dataclass(frozen=True)
class Sample:
    """What the real engine produced for the staged adapter."""

    audio_s: float
    head_silence_ms: float
    has_speech: bool
    frames: int
    invalid_tokens: int
    wall_s: float

    def to_dict(self) -> dict:
        return asdict(self)


class Sampler(Protocol):
    def sample(self, voice: str, text: str, *, max_tokens: int) -> Sample: ...


class WorkerSampler:
    """Generates through a running worker (websocket protocol, same path as production traffic)."""

    def __init__(self, url: str, *, timeout_s: float = 300.0, token: str | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._token = token  # the fleet's cluster token, when its workers require one

    def sample(self, voice: str, text: str, *, max_tokens: int) -> Sample:
        started = time.perf_counter()
        speech = say_on_worker(self.url, voice, text, max_tokens=max_tokens, token=self._token,
                               timeout_s=self.timeout_s, what="validation worker",
                               refused="the worker refused the trained adapter")
        pcm = np.frombuffer(speech.pcm, dtype="<i2")
        if pcm.size == 0:
            raise ValidationError("the trained voice produced no audio for the validation sample")
        report = measure(pcm, SAMPLE_RATE, "energy")
        stats = speech.done.stats
        return Sample(round(pcm.size / SAMPLE_RATE, 3), report.leading_silence_ms, report.has_speech, stats.frames,
                      stats.invalid_tokens, round(time.perf_counter() - started, 3))


def say_on_worker(url: str, voice: str, text: str, *, max_tokens: int, token: str | None, timeout_s: float,
                  what: str, refused: str):
    """One context through a worker (the production websocket path, seed 0, untrimmed), with the
    worker's faults mapped: busy, lost or timed out -> InfrastructureError (retryable), the voice
    refused -> ValidationError. `what` names the worker and `refused` the refusal in messages."""
    async def say():
        from gpu_worker.client.connection import WorkerClient, WorkerConnectionLost, WorkerRequestError
        from gpu_worker.protocol import ContextOptions

        client = await WorkerClient.connect(url, token=token)
        try:
            return await client.say(voice, text, options=ContextOptions(max_tokens=max_tokens, seed=0,
                                                                         trim_silence=False))
        except WorkerRequestError as err:
            if err.retryable:
                raise InfrastructureError(f"{what} is busy or failed: {err}") from None
            raise ValidationError(f"{refused}: {err}") from None
        except WorkerConnectionLost as err:
            raise InfrastructureError(f"{what} connection lost: {err}") from None
        finally:
            await client.aclose()

    try:
        return asyncio.run(asyncio.wait_for(say(), timeout_s))
    except (OSError, TimeoutError, asyncio.TimeoutError) as err:
        raise InfrastructureError(f"{what} at {url} failed: {err!r}") from None


class LocalWorker:
    """A `voicering worker` subprocess serving the store, for a trainer with no worker URL.

    `gpu_memory_utilization` reaches the worker's engine as VOICERING_WORKER_GPU_MEMORY_UTILIZATION:
    on a GPU the trainer's process still holds its CUDA context beside the worker.
    """

    def __init__(self, model: str, codec: str, store: Path, *, max_lora_rank: int, log: Path,
                 gpu_memory_utilization: float, start_timeout_s: float = 600.0) -> None:
        self._args = ["--model", model, "--codec", codec, "--voices-dir", str(store), "--max-loras", "1",
                      "--max-lora-rank", str(max_lora_rank)]
        self.env = {WORKER_GPU_MEMORY_ENV: str(gpu_memory_utilization)}
        self._log = log
        self._timeout = start_timeout_s
        self._worker: WorkerProcess | None = None
        self.url = ""

    def __enter__(self) -> LocalWorker:
        try:
            self._worker = spawn_worker(self._args, self._log, env=self.env, timeout_s=self._timeout)
        except WorkerStartError as exc:
            raise InfrastructureError(f"local validation worker did not start (log: {self._log}): {exc}") from None
        self.url = self._worker.url
        return self

    def __exit__(self, *exc: object) -> None:
        if self._worker is not None:
            self._worker.stop()

    @property
    def process(self) -> WorkerProcess | None:
        """The running worker (None outside the `with` block)."""
        return self._worker


def stage(adapter_dir: Path, store: Path, job_id: str, metadata: dict) -> Path:
    """Copy the adapter into ``<store>/voicering-staging/<job id>.attempt-<random>`` (renamed into place whole).

    Each attempt stages under its own name, so a trainer that lost its lease and discards its copy
    never deletes the copy of the trainer that took the job over; copies left by earlier attempts
    of the job (which no longer hold its lease) are removed.
    """
    for name in ADAPTER_FILES:
        if not (adapter_dir / name).is_file():
            raise ValidationError(f"trained adapter lacks {name}")
    staging = store / STAGING_TENANT
    staging.mkdir(parents=True, exist_ok=True)
    attempt = re.compile(re.escape(job_id) + r"(\.attempt-[0-9a-f]{8})?")
    for earlier in staging.iterdir():
        if attempt.fullmatch(earlier.name):
            shutil.rmtree(earlier, ignore_errors=True)
    target = staging / f"{job_id}.attempt-{uuid.uuid4().hex[:8]}"
    tmp = staging / f".{target.name}"
    tmp.mkdir()
    try:
        for name in ADAPTER_FILES:
            shutil.copy2(adapter_dir / name, tmp / name)
        _write_json(tmp / METADATA_FILE, metadata)
        _fsync_dir(tmp)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def validate(staged: Path, *, max_rank: int, base_model: str | None = None) -> None:
    """The worker's own adapter validation, mapped to a job error."""
    from gpu_worker.adapters import validate_adapter

    try:
        validate_adapter(staged, voice_id=staged_id(staged), max_rank=max_rank, base_model=base_model)
    except AdapterError as err:
        raise ValidationError(f"trained adapter failed the serving checks: {err.message}") from None


def add_metadata(staged: Path, extra: dict) -> None:
    meta = json.loads((staged / METADATA_FILE).read_text())
    meta.update(extra)
    _write_json(staged / METADATA_FILE, meta)


def publish(staged: Path, store: Path, vid: str, *, max_rank: int, base_model: str | None = None,
            fence: Callable[[], None] | None = None) -> Path:
    """Make the staged adapter voice ``vid`` (the serving stack's atomic publish), then drop the staged copy.

    `fence` runs last before the publish and raises (LeaseLost) when this trainer no longer owns
    the job, so a trainer that lost its lease never publishes beside the one that took over.
    """
    from gpu_worker.adapters import publish_adapter

    check_free(store, vid)
    if fence is not None:
        fence()
    try:
        publish_adapter(staged, store, vid, max_rank=max_rank, base_model=base_model)
    except FileExistsError:
        raise VoiceExistsError(f"voice '{vid}' already exists: choose another name") from None
    except AdapterError as err:
        raise ValidationError(f"trained adapter failed the serving checks: {err.message}") from None
    except ValueError as err:
        raise InputError(str(err)) from None
    except OSError as err:
        raise InfrastructureError(f"cannot publish voice '{vid}': {err}") from None
    discard(staged)
    return store / vid


def discard(staged: Path) -> None:
    shutil.rmtree(staged, ignore_errors=True)


def staged_id(staged: Path) -> str:
    return f"{STAGING_TENANT}/{staged.name}"


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["STAGING_TENANT", "LocalWorker", "Sample", "Sampler", "WorkerSampler", "add_metadata",
           "check_free", "discard", "publish", "stage", "staged_id", "validate", "voice_id"]
