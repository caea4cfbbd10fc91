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
    voices_url: str | None = Field(None, description="fsspec URL of a remote adapter store (s3://...); overrides voices_dir")
    adapter_cache_dir: Path | None = Field(None, description="local copies of remote adapters (default: <tmp>/voicering-adapters)")
    base_model: str | None = Field(None, description="what adapters must declare as their base (default: model)")
    prewarm_voices: tuple[str, ...] = Field((), description="voices loaded into the engine at start-up")
    base_voices: tuple[str, ...] = ()
    quantization: Literal["auto", "fp8", "none"] = "auto"
    max_loras: int = Field(4, ge=1, description="adapters in engine slots (one batch mixes at most this many)")
    max_cpu_loras: int = Field(16, ge=1, description="adapters in the engine's CPU cache (LRU); the rest stay on disk")
    max_lora_rank: int = Field(32, ge=1)
    max_num_seqs: int = 32
    max_model_len: int = 4096
    cpu_kv_cache_gib: int = 2
    max_text_chars: int = 4096
    max_streams: int = Field(32, ge=1, description="concurrent utterances before a retryable 'busy'")
    codec_threads: int | None = None
    # cross-stream codec batching: auto = batched on CUDA, sequential on CPU
    codec_policy: Literal["auto", "batched", "sequential"] = "auto"
    codec_tick_ms: float = Field(15.0, gt=0, description="longest a window waits for others to batch with")
    codec_max_batch: int = Field(64, ge=1)
    codec_compile: bool | None = Field(None, description="torch.compile the SNAC decoder (default: on CUDA only)")
    # sampling defaults (Orpheus reference values)
    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    constraint: Literal["fused", "mask", "off"] = "fused"
    trim_silence: bool = Field(True, description="drop head silence of each segment (silence_trim's streaming gate)")
    trim_max_drop_ms: float = Field(1500.0, ge=0, description="most head silence the gate may drop per segment")
    # hash ring membership: register and heartbeat when a Redis URL is given
    redis_url: str | None = Field(None, description="join the voicering hash ring in this Redis")
    advertise_url: str | None = Field(None, description="websocket URL clients use (default ws://host:port)")
    # back-pressure: messages queued per connection; a stream that cannot queue for slow_consumer_s cuts it
    send_queue: int = Field(256, ge=1)
    slow_consumer_s: float = Field(5.0, gt=0)
    close_timeout_s: float = Field(2.0, gt=0, description="longest a cut connection waits for its close frame")
    socket_send_buffer: int | None = Field(
        None, ge=4096, description="SO_SNDBUF per connection (default: kernel autotuning, up to tcp_wmem max); "
                                   "smaller detects a stalled client sooner")
    log_format: Literal["json", "text"] = "json"
