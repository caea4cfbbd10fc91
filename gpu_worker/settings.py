"""Worker settings: one object per process, read once at start-up (env prefix VOICERING_WORKER_).

Engine and sampling defaults are not repeated here: they are read off `EngineSettings` and
`SamplingOptions`, the one place each is written."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpu_worker.adapters.cache import DEFAULT_RECONCILE_S
from gpu_worker.adapters.store import DEFAULT_CACHE_MAX_BYTES, DEFAULT_REVALIDATE_S
from gpu_worker.engine import EngineSettings, SamplingOptions
from gpu_worker.prompt_window import WindowLimits
from gpu_worker.pronunciations import DEFAULT_CAPACITY as DEFAULT_PRONUNCIATION_CACHE
from gpu_worker.protocol import FIRST_AUDIO_FRAMES_MAX, MAX_CONTEXT_BACKLOG_CHARS, MAX_TEXT_CHARS
from hashring.settings import RingSettings

RELAY_TIMEOUT_S = 20.0  # below every pool's first_audio_timeout_s (30 s): the relaying hop gives up first

_ENGINE = EngineSettings(model="")
_SAMPLING = SamplingOptions()
_WINDOW = WindowLimits()


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICERING_WORKER_", frozen=True)

    host: str = "127.0.0.1"
    port: int = 8765
    worker_id: str = "worker-0"
    model: str = Field(description="Orpheus weights: local path or hub id")
    model_revision: str | None = Field(None, description="hub commit (or tag) of model: pin it, so that a new "
                                       "pod downloads the weights the fleet was validated with, not the latest")
    codec: str = Field("hubertsiuzdak/snac_24khz", description="SNAC 24 kHz weights: local path or hub id")
    voices_dir: Path = Field(Path("voices"), description="adapter store root: <dir>/<voice id>/")
    voices_url: str | None = Field(None, description="fsspec URL of a remote adapter store (s3://...); overrides voices_dir")
    adapter_cache_dir: Path | None = Field(None, description="local copies of remote adapters (default: private "
                                                             "$XDG_CACHE_HOME/voicering/adapters, mode 0700)")
    adapter_revalidate_s: float = Field(DEFAULT_REVALIDATE_S, gt=0, description="longest a cached remote adapter is served "
                                        "before it is checked again (republish and deletion take effect within it)")
    adapter_cache_max_bytes: int = Field(DEFAULT_CACHE_MAX_BYTES, ge=1 << 20, description="local copies of remote adapters, "
                                         "least recently used evicted past it")
    adapter_reconcile_s: float = Field(DEFAULT_RECONCILE_S, ge=0, description="how often the adapter mirror is checked "
                                       "against what the engine really holds")
    base_model: str | None = Field(None, description="what adapters must declare as their base (default: model)")
    prewarm_voices: tuple[str, ...] = Field((), description="voices loaded into the engine at start-up")
    base_voices: tuple[str, ...] = ()
    quantization: Literal["auto", "fp8", "none"] = "auto"
    max_loras: int = Field(_ENGINE.max_loras, ge=1, description="adapters in engine slots (one batch mixes at most this many)")
    max_cpu_loras: int = Field(_ENGINE.max_cpu_loras, ge=1,
                               description="adapters in the engine's CPU cache (LRU); the rest stay on disk")
    max_lora_rank: int = Field(_ENGINE.max_lora_rank, ge=1)
    max_num_seqs: int = Field(_ENGINE.max_num_seqs, ge=1)
    max_model_len: int = Field(_ENGINE.max_model_len, ge=256, description="tokens per engine request (prompt + audio); "
                                                                          "longer segments are split at sentences")
    gpu_memory_utilization: float = Field(_ENGINE.gpu_memory_utilization, gt=0, le=1,
                                          description="share of GPU memory vLLM may take (lower it beside a trainer)")
    cpu_kv_cache_gib: int = _ENGINE.cpu_kv_cache_gib
    separate_model_process: bool = Field(
        _ENGINE.separate_model_process, description="run vLLM's model worker in its own process (vLLM's default; "
        "on CPU it binds OpenMP threads to cores); false: inside the engine core, one process fewer, a faster start and "
        "~2 GB less (the test suite and small CPU stacks)")
    max_streams: int = Field(32, ge=1, description="concurrent contexts before a retryable 'busy'")
    max_streams_per_connection: int | None = Field(
        None, ge=1, description="contexts one connection may hold at once (default: half of max_streams), "
                                "so one client cannot take every slot")
    max_relayed_streams: int | None = Field(None, ge=1, description="contexts relayed to their owners at once "
                                                                   "(default: 4 x max_streams)")
    relay_timeout_s: float = Field(
        RELAY_TIMEOUT_S, gt=0, description="the longest a relayed context waits on its owner, for first audio and between "
                                "chunks; below the callers' pools (30 s), so this hop answers before the caller's clock fires")
    # per-context and per-connection limits on text (checked before anything is buffered)
    max_text_chars: int = Field(MAX_TEXT_CHARS, ge=1, description="characters buffered before a flush (one segment)")
    max_queued_segments: int = Field(16, ge=1, description="flushed segments waiting to be spoken, per context")
    max_context_backlog_chars: int = Field(MAX_CONTEXT_BACKLOG_CHARS, ge=1, description="characters waiting to be spoken, per context")
    max_connection_backlog_chars: int | None = Field(
        None, ge=1, description="characters waiting to be spoken, per connection (default: its stream limit x "
                                "max_context_backlog_chars, so one context's text never refuses another's on a "
                                "shared link; a lower value lets one context starve its neighbours)")
    idle_timeout_s: float = Field(30.0, gt=0, description="a context with nothing to speak and no new text for this long ends")
    codec_threads: int | None = None
    # cross-stream codec batching: auto = batched on CUDA, sequential on CPU
    codec_policy: Literal["auto", "batched", "sequential"] = "auto"
    codec_tick_ms: float | None = Field(None, gt=0, description="longest a window waits for others to batch with "
                                                                "(default: the scheduler's TICK_S)")
    codec_max_batch: int | None = Field(None, ge=1, description="windows per codec call (default: the scheduler's MAX_BATCH)")
    codec_compile: bool | None = Field(None, description="torch.compile the SNAC decoder (default: on CUDA only)")
    first_audio_frames: int | None = Field(
        None, ge=1, le=FIRST_AUDIO_FRAMES_MAX,
        description="frames generated (7 tokens each) before a stream's first audio is decoded: 1 speaks one "
        "frame (~70 ms on a GPU) sooner, its first 85 ms decoded without right context and so less faithful "
        "(docs/benchmarks.md); 3 gives it the right context later chunks carry (default: the codec's ChunkSchedule); "
        "a start's options.first_audio_frames chooses for its context")
    # sampling defaults (Orpheus reference values, from SamplingOptions)
    temperature: float = _SAMPLING.temperature
    top_p: float = _SAMPLING.top_p
    repetition_penalty: float = _SAMPLING.repetition_penalty
    constraint: Literal["fused", "mask", "off"] = _SAMPLING.constraint
    trim_silence: bool = Field(True, description="drop head silence of each segment (silence_trim's streaming gate)")
    trim_max_drop_ms: float = Field(1500.0, ge=0, description="most head silence the gate may drop per segment")
    alignment: bool = Field(True, description="offer word timings (a start's options.alignment; docs/alignment.md): "
                                              "needs libespeak-ng, without which the worker logs it and refuses them")
    alignment_threads: int = Field(1, ge=1, le=64, description="threads timing words off the event loop (each "
                                   "aligns ~60 streams' audio in real time on one CPU core)")
    continuity: bool = Field(True, description="prompt each segment with the context's earlier segments (text and "
                             "generated audio tokens, gpu_worker.prompt_window) and turn on the engine's prefix cache, "
                             "which serves those tokens without prefill; a start's options.continuity=false opts out")
    continuity_window_tokens: int = Field(_WINDOW.max_tokens, ge=16, le=8192, description="most tokens of earlier "
                                          "segments before a prompt (docs/worker.md: why 1024)")
    continuity_window_s: float = Field(_WINDOW.max_audio_s, gt=0, le=60, description="most seconds of earlier audio "
                                       "before a prompt")
    # hash ring membership: register and heartbeat when a Redis URL is given
    redis_url: str | None = Field(None, description="join the voicering hash ring in this Redis")
    pronunciation_cache_size: int = Field(DEFAULT_PRONUNCIATION_CACHE, ge=1, description="tenants' pronunciation "
                                          "dictionaries held (read from redis_url by version; least recently used "
                                          "dropped first)")
    advertise_url: str | None = Field(None, description="websocket URL clients use (default ws://host:port)")
    internal_url: str | None = Field(None, description="websocket URL other workers' proxies dial (default: advertise_url)")
    ring_prefix: str = Field(RingSettings().prefix, description="Redis key prefix of the ring (every process of a fleet agrees)")
    cluster_token: str | None = Field(None, description="required as 'Authorization: Bearer' on websockets, /metrics "
                                                        "and /prewarm; sent on the proxy's links (/health stays open)")
    allow_open_cluster: bool = Field(False, description="start bound beyond loopback with an empty or short "
                                     "cluster token (refused otherwise: gpu_worker.open_cluster)")
    loop_stall_s: float = Field(2.0, gt=0, description="an event loop blocked this long logs where it is stuck")
    drain_grace_s: float = Field(30.0, ge=0, description="on SIGTERM: how long active streams may finish while draining")
    ring_prewarm_max: int | None = Field(None, ge=0, description="voices newly owned after a placement change that are "
                                         "prewarmed (default: half the adapter cache; 0: off)")
    ring_prewarm_concurrency: int = Field(2, ge=1, description="adapters loaded at once by placement prewarm")
    ring_cool_interval_s: float = Field(5.0, gt=0, description="how often the fleet's one cooling worker lowers "
                                        "automatic replica counts of voices gone quiet")
    ring_heat_flush_s: float = Field(0.5, gt=0, description="how often request counts per voice go to Redis")
    # back-pressure: messages queued per connection; a stream that cannot queue for slow_consumer_s cuts it
    send_queue: int = Field(256, ge=1)
    slow_consumer_s: float = Field(5.0, gt=0, description="longest one message may wait to be queued or written "
                                                           "before the connection is cut as a slow consumer")
    close_timeout_s: float = Field(2.0, gt=0, description="longest a cut connection waits for its close frame")
    keepalive_s: float = Field(20.0, gt=0, description="websocket keepalive: a ping this often, and a connection "
                                                       "whose peer answers none within as long again is closed")
    socket_send_buffer: int | None = Field(
        None, ge=4096, description="SO_SNDBUF per connection (default: kernel autotuning, up to tcp_wmem max); "
                                   "smaller detects a stalled client sooner")
    log_format: Literal["json", "text"] = "json"
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP traces endpoint (http://collector:4318/v1/traces): "
                                      "every request's hop is also exported there as a span; needs opentelemetry-sdk "
                                      "and opentelemetry-exporter-otlp-proto-http (not installed by voicering)")

    def connection_stream_limit(self) -> int:
        return self.max_streams_per_connection or max(1, self.max_streams // 2)

    def connection_backlog_limit(self) -> int:
        """A gateway multiplexes many tenants' contexts on one connection: its budget is the sum of
        what those contexts may each hold, so no context is refused for another's text."""
        return self.max_connection_backlog_chars or self.connection_stream_limit() * self.max_context_backlog_chars

    def relay_stream_limit(self) -> int:
        return self.max_relayed_streams or 4 * self.max_streams

    @field_validator("model_revision")
    @classmethod
    def _blank_revision_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("model", "codec")
    @classmethod
    def _local_path_exists(cls, value: str) -> str:
        """A value written as a path must name a folder that is there; anything else is a hub id.
        (A missing path would otherwise be looked up on the hub and fail pages later, unclearly.)"""
        if value.startswith(("/", "./", "../", "~")) and not Path(value).expanduser().is_dir():
            raise ValueError(f"{value} is written as a local path but no such folder exists")
        return value

