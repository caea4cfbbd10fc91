"""One training job, start to finish: preprocess -> encode -> train -> validate -> publish.

    queued -> preprocessing -> training -> validating -> publishing -> ready
                  (any step) -> failed (with a reason) | cancelled

Every step is resumable: clips and SNAC frames are cached by content under
``<work_dir>/cache``, checkpoints live under ``<work_dir>/jobs/<job id>/run-<data+params>``,
and a job whose voice was already published by an earlier attempt finishes as ready. So the
same `run_job` call serves a first run, a retry and a trainer that re-claims a crashed job.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from lora_training import publish as pub
from lora_training.asr import asr_loader, resolve_model
from lora_training.dataset import FrameCache, HoldOut, build_examples, encode, fingerprint, hold_out, split
from lora_training.errors import ConfigError
from lora_training.preprocess import preprocess
from lora_training.quality.checks import record as checks_record
from lora_training.quality.findings import to_dicts
from lora_training.settings import DataParams, TrainParams, TrainSettings
from lora_training.stop import Stop
from lora_training.trainer import train_lora

JobState = Literal["queued", "preprocessing", "training", "validating", "publishing", "ready", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"ready", "failed", "cancelled"})
# share of the overall progress bar each running state covers: (start %, end %)
PHASES: dict[str, tuple[float, float]] = {
    "preprocessing": (0.0, 20.0), "training": (20.0, 90.0), "validating": (90.0, 98.0), "publishing": (98.0, 100.0)
}


class JobSpec(BaseModel):
    """What a job trains: serialised into the queue, so every trainer runs it the same way."""

    model_config = ConfigDict(frozen=True)

    job_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12], pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    name: str
    tenant: str | None = None
    audio: list[Path]
    transcripts: Path | None = None
    consent_audio: Path | None = None  # spoken consent: the creator reading the phrase (lora_training.consent)
    consent_phrase: str | None = None  # the phrase's words, as the gateway issued them
    data: DataParams = DataParams()
    params: TrainParams = TrainParams()
    created_at: float = Field(default_factory=time.time)
    upload_checks: list[dict] = Field(default_factory=list)  # the gateway's findings (warn, fixed): quality.findings
    # the clone report (lora_training.report): the tenant's gate ("off": no report, no hold-out), and the
    # base voices the workers serve (the impostors; empty: TrainSettings.report_base_voices)
    report_gate: Literal["off", "warn", "block"] = "warn"
    base_voices: tuple[str, ...] = ()

    @property
    def voice_id(self) -> str:
        return pub.voice_id(self.tenant, self.name)


class Reporter(Protocol):
    """Where a job's state and progress go (the console, a Redis hash)."""

    def state(self, state: JobState, message: str = "") -> None: ...

    def progress(self, percent: float, message: str = "", **fields: object) -> None: ...


def phase_percent(state: str, fraction: float) -> float:
    lo, hi = PHASES[state]
    return round(lo + (hi - lo) * min(max(fraction, 0.0), 1.0), 2)


def published_by(store: Path, vid: str, job_id: str) -> dict | None:
    """Metadata of the voice if this very job already published it (a retry after the rename)."""
    try:
        meta = json.loads((store / vid / pub.METADATA_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if meta.get("job_id") == job_id else None


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    return {"p50": round(float(np.percentile(values, 50)), 2), "p90": round(float(np.percentile(values, 90)), 2),
            "max": round(float(max(values)), 2)}


def run_job(
    spec: JobSpec,
    settings: TrainSettings,
    reporter: Reporter,
    *,
    stop: Stop | None = None,
    sampler: pub.Sampler | None = None,
    console: bool = True,
    on_resume: Callable[[int], None] | None = None,
    fence: Callable[[], None] | None = None,
) -> dict:
    """Run (or resume) a job; returns the published voice's metadata. Raises TrainingError.

    `fence` is called right before the voice is published (the queue's lease check: LeaseLost).
    `stop` is checked between files, clips and encode batches, between training steps and
    between the steps after them, so a cancelled job ends within one such step. The final
    `ready` is reported here for the console; a queue trainer records it with the ack instead.
    """
    stop = stop or Stop()
    vid = spec.voice_id
    store = settings.adapter_store
    done = published_by(store, vid, spec.job_id)
    if done is not None:
        reporter.state("ready", f"voice '{vid}' is published")
        return done
    pub.check_free(store, vid)
    if spec.params.rank > settings.max_lora_rank:
        raise ConfigError(f"rank {spec.params.rank} exceeds the workers' max_lora_rank {settings.max_lora_rank}")
    device = settings.resolved_device()
    cache_dir = settings.work_dir / "cache"
    job_dir = settings.work_dir / "jobs" / spec.job_id

    # preprocessing: clips, then SNAC frames; a stop (cancel, lease lost) is seen between files and batches
    reporter.state("preprocessing", "reading and cutting the audio")
    asr_model = resolve_model(settings.asr_model)  # hashed here: the clip cache key names it
    scorers = _Scorers(settings)
    clip_set = preprocess(
        list(spec.audio), spec.transcripts, spec.data, asr=asr_loader(settings, asr_model), asr_model=asr_model,
        cache_dir=cache_dir,
        progress=lambda f, m: reporter.progress(phase_percent("preprocessing", 0.3 * f), m),
        check=stop.check,
    )
    stop.check()
    consent = None
    if spec.consent_audio is not None:  # before the costly steps: a refused consent ends the job here
        from lora_training.consent import check_consent

        reporter.progress(phase_percent("preprocessing", 0.3), "checking the spoken consent")
        consent = check_consent(spec.consent_audio, spec.consent_phrase or "", clip_set.clips, spec.data,
                                asr=scorers.asr(), encoder=scorers.encoder()).to_dict()
        stop.check()
    from transformers import AutoTokenizer

    from gpu_worker.codec import SnacCodec

    holdout = _hold_out(spec, settings, clip_set.clips)
    codec = SnacCodec.load(settings.codec, device=device)
    frames = encode(codec, holdout.train, FrameCache(cache_dir, settings.codec), batch_s=settings.encode_batch_s,
                    progress=lambda f, m: reporter.progress(phase_percent("preprocessing", 0.3 + 0.7 * f), m),
                    check=stop.check)
    del codec
    stop.check()
    tokenizer = AutoTokenizer.from_pretrained(settings.base_model)
    examples = build_examples(tokenizer, spec.name, holdout.train, frames, dedup=spec.data.dedup_frames)
    train, evaluation = split(examples, eval_fraction=spec.params.eval_fraction, eval_max=spec.params.eval_max_clips,
                              seed=spec.params.seed)

    # training (resumes from the newest checkpoint of the same data and parameters)
    run_key = hashlib.sha256(
        (fingerprint(train) + fingerprint(evaluation) + spec.params.model_dump_json() + settings.base_model).encode()
    ).hexdigest()[:16]
    run_dir = job_dir / f"run-{run_key}"
    from lora_training.trainer import checkpoint_step, last_checkpoint

    resumed = checkpoint_step(last_checkpoint(run_dir / "checkpoints"))
    if on_resume is not None:
        on_resume(resumed)
    reporter.state("training", f"{len(train)} clips, {clip_set.speech_s / 60:.1f} min of speech"
                   + (f", resuming at step {resumed}" if resumed else ""))

    def on_step(step: int, total: int, loss: float | None) -> None:
        reporter.progress(phase_percent("training", step / max(total, 1)), "training", step=step, total_steps=total,
                          loss=loss if loss is not None else "")

    result = train_lora(settings.base_model, train, evaluation, spec.params, run_dir, device=device,
                        on_step=on_step, stop=stop, console=console)
    stop.check()

    # validating: the serving stack's checks and a sample through the real engine
    reporter.state("validating", "checking the adapter and generating a sample")
    metadata = {
        "voice": vid, "prompt_name": spec.name, "tenant": spec.tenant, "job_id": spec.job_id,
        "base_model": settings.base_model, "rank": spec.params.rank, "alpha": spec.params.alpha,
        "rslora": spec.params.rslora, "data_minutes": round(clip_set.speech_s / 60.0, 3),
        "audio_minutes": clip_set.report.get("audio_minutes"), "clip_count": len(clip_set.clips),
        "report_holdout": {"clips": len(holdout.held), "seconds": round(holdout.held_s, 2), "reason": holdout.reason},
        "train_clips": result.train_clips, "eval_clips": result.eval_clips, "steps": result.steps,
        "resumed_from_step": result.resumed_from_step, "final_train_loss": result.final_train_loss,
        "final_eval_loss": result.final_eval_loss, "loss": "audio tokens only",
        "trim_margin_ms": spec.data.trim_margin_ms, "dedup_frames": spec.data.dedup_frames,
        "clip_head_silence_before_ms": _percentiles([c.head_silence_before_ms for c in clip_set.clips]),
        "clip_head_silence_after_ms": _percentiles([c.head_silence_after_ms for c in clip_set.clips]),
        "trained_at": time.time(), "consent": consent,  # lora_training.consent's figures (None: typed consent)
        "checks": checks_record(spec.upload_checks, clip_set.report.get("checks", [])),  # lora_training.quality
        "asr": {k: clip_set.report.get(k) for k in ("asr_model", "transcribed_files", "asr_dropped")},
    }
    staged = pub.stage(Path(result.adapter_dir), store, spec.job_id, metadata)
    try:
        pub.validate(staged, max_rank=settings.max_lora_rank, base_model=settings.base_model)
        reporter.progress(phase_percent("validating", 0.2), "adapter checks passed")
        sample, report = None, None
        if settings.validate_sample:
            sample, report = _validate(staged, spec, settings, sampler, job_dir, holdout,
                                       lambda m: reporter.progress(phase_percent("validating", 0.4), m), scorers)
        stop.check()
        from lora_training.report import gate

        flagged = gate(report, spec.report_gate)  # CloneQualityError under a "block" gate
        if flagged:
            metadata["checks"] = checks_record(spec.upload_checks, clip_set.report.get("checks", []), to_dicts(flagged))
        reporter.state("publishing", f"publishing voice '{vid}'")
        metadata["sample"] = sample.to_dict() if sample else None
        metadata["report"] = report
        pub.add_metadata(staged, {"sample": metadata["sample"], "report": report, "checks": metadata["checks"]})
        path = pub.publish(staged, store, vid, max_rank=settings.max_lora_rank, base_model=settings.base_model,
                           fence=fence)
    except BaseException:
        pub.discard(staged)
        raise
    reporter.progress(100.0, f"voice '{vid}' is ready", voice_path=str(path))
    reporter.state("ready", f"voice '{vid}' is ready")
    return metadata


def _report_wanted(spec: JobSpec, settings: TrainSettings) -> bool:
    return settings.validate_sample and spec.report_gate != "off" and bool(settings.report_sentences)


def _hold_out(spec: JobSpec, settings: TrainSettings, clips: list) -> HoldOut:
    """The report's held-out clips (none without a report: then every clip trains)."""
    if not _report_wanted(spec, settings):
        return HoldOut(list(clips), [], "no report: report_gate is off or no sample is made")
    p = spec.params
    return hold_out(clips, fraction=p.report_holdout_fraction, min_s=p.report_holdout_min_s,
                    min_clips=p.report_holdout_min_clips, max_share=p.report_holdout_max_share, seed=p.seed)


class _Scorers:
    """The models a job judges speech with, each loaded at most once per job: the consent check and
    the clone report share them (the ASR: the job's own or the bundled tiny.en; the speaker model)."""

    def __init__(self, settings: TrainSettings) -> None:
        self._settings = settings
        self._asr = self._encoder = None

    @property
    def model(self):
        from lora_training.asr import scoring_model

        return scoring_model(self._settings)

    def asr(self):
        if self._asr is None:
            from lora_training.asr import asr_loader

            load = asr_loader(self._settings, self.model)
            assert load is not None  # a resolved model always has a loader
            self._asr = load()
        return self._asr

    def encoder(self):
        if self._encoder is None:
            from lora_training.quality.speaker import SpeakerEncoder

            self._encoder = SpeakerEncoder.load("cpu")
        return self._encoder


def _validate(staged: Path, spec: JobSpec, settings: TrainSettings, sampler: pub.Sampler | None,
              job_dir: Path, holdout: HoldOut, say: Callable[[str], None],
              scorers: _Scorers) -> tuple[pub.Sample, dict | None]:
    """The validation sample, then (report wanted) the clone report, through the same worker; the
    report's sample audio goes beside the staged adapter, published with it."""
    from gpu_worker.adapters.layout import REPORT_AUDIO
    from lora_training.report import WorkerSpeaker

    staged_voice = pub.staged_id(staged)

    with ExitStack() as stack:
        token = None
        if sampler is None:
            if settings.validate_worker_url:
                token = settings.cluster_token
                sampler = pub.WorkerSampler(settings.validate_worker_url, token=token)
            elif settings.validate_local_worker:
                local = stack.enter_context(pub.LocalWorker(
                    settings.base_model, settings.codec, settings.adapter_store, max_lora_rank=settings.max_lora_rank,
                    log=job_dir / "validation-worker.log",
                    gpu_memory_utilization=settings.validate_gpu_memory_utilization))
                sampler = pub.WorkerSampler(local.url)
            else:
                raise ConfigError("no validation worker: set validate_worker_url, validate_local_worker, "
                                  "or validate_sample=false to publish without a sample")
        elif isinstance(sampler, pub.WorkerSampler):
            token = settings.cluster_token
        sample = sampler.sample(staged_voice, settings.sample_text, max_tokens=settings.sample_max_tokens)
        if not _report_wanted(spec, settings):
            return sample, None
        url = getattr(sampler, "url", None)
        speaker = sampler if hasattr(sampler, "speak") else (WorkerSpeaker(url, token=token) if url else None)
        if speaker is None:  # a sampler that cannot hand back audio: no report, and the metadata says none
            return sample, None
        say("speaking the clone report's sentences")
        return sample, _clone_report(staged_voice, spec, settings, speaker, holdout, scorers, staged / REPORT_AUDIO)


def _clone_report(staged_voice: str, spec: JobSpec, settings: TrainSettings, speaker, holdout: HoldOut,
                  scorers: _Scorers, audio_dir: Path) -> dict:
    from lora_training.quality.speaker import WEIGHTS_SHA256
    from lora_training.report import is_stand_in, make_report

    stand_in = is_stand_in(settings.base_model)
    sentences = settings.report_sentences
    max_tokens = settings.report_max_tokens
    if stand_in:  # noise either way: keep its cost small on CPU
        sentences = sentences[:settings.report_stand_in_sentences]
        max_tokens = min(max_tokens, settings.report_stand_in_max_tokens)
    models = {"speaker": {"name": "resemblyzer 0.1.4 GE2E d-vector (pretrained.pt)", "sha256": WEIGHTS_SHA256},
              "asr": scorers.model.identity()}
    return make_report(clone_voice=staged_voice, base_voices=spec.base_voices or settings.report_base_voices,
                       sentences=sentences, max_tokens=max_tokens, speaker=speaker, encoder=scorers.encoder(),
                       asr=scorers.asr(), held=holdout.held, train=holdout.train, holdout_reason=holdout.reason,
                       models=models, stand_in=stand_in, audio_dir=audio_dir)


__all__ = ["PHASES", "TERMINAL", "JobSpec", "JobState", "Reporter", "phase_percent", "published_by", "run_job"]
