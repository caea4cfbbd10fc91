"""Worker settings: one object per process, read once at start-up (env prefix VOICERING_WORKER_)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICERING_WORKER_", frozen=True)

    host: str = "127.0.0.1"
    port: int = 8765
    worker_id: str = "worker-0"
    model: str = Field(description="Orpheus weights: local path or hub id")
    codec: str = Field("hubertsiuzdak/snac_24khz", description="SNAC 24 kHz weights: local path or hub id")
    voices_dir: Path = Field(Path("voices"), description="adapter store root: <dir>/<voice id>/")
    base_voices: tuple[str, ...] = ()
    quantization: Literal["auto", "fp8", "none"] = "auto"
    max_loras: int = 4
    max_cpu_loras: int = 16
    max_lora_rank: int = 32
    max_num_seqs: int = 32
    max_model_len: int = 4096
    cpu_kv_cache_gib: int = 2
    max_text_chars: int = 4096
    max_streams: int = 32
    codec_threads: int | None = None
    # sampling defaults (Orpheus reference values)
    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    constraint: Literal["fused", "mask", "off"] = "fused"
    trim_silence: bool = False
    # back-pressure: audio messages queued per connection before a consumer counts as stalled
    send_queue: int = 256
    slow_consumer_s: float = 5.0
