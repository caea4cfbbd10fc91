"""Agent server settings: one object per process, read once at start-up (env prefix VOICERING_AGENT_).

The LiveKit connection also reads livekit's own names (LIVEKIT_URL, LIVEKIT_API_KEY,
LIVEKIT_API_SECRET) and Redis the fleet's VOICERING_REDIS_URL, so one environment file serves
`lk`, the workers and this server. Ring defaults are read off hashring's `RingSettings`, the one
place they are written. The object is pickled into LiveKit's job processes as it is.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hashring.errors import InvalidVoiceId
from hashring.records import check_voice_id
from hashring.settings import REDIS_URL_ENV, RingSettings

__all__ = ["AgentSettings"]

_RING = RingSettings()
PRODUCTION_LOAD_THRESHOLD = 0.7  # livekit-agents' own production default


def _env(name: str, *more: str) -> AliasChoices:
    return AliasChoices(f"VOICERING_AGENT_{name.upper()}", *more)


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICERING_AGENT_", frozen=True, populate_by_name=True)

    # LiveKit (Cloud or self-hosted)
    livekit_url: str | None = Field(None, validation_alias=_env("livekit_url", "LIVEKIT_URL"),
                                    description="wss://<project>.livekit.cloud or ws://host:7880")
    livekit_api_key: str | None = Field(None, validation_alias=_env("livekit_api_key", "LIVEKIT_API_KEY"))
    livekit_api_secret: SecretStr | None = Field(None, validation_alias=_env("livekit_api_secret", "LIVEKIT_API_SECRET"))
    agent_name: str = Field("", description="set for explicit dispatch only (tokens or the dispatch API name it)")
    load_threshold: float = Field(PRODUCTION_LOAD_THRESHOLD, gt=0, le=1, description="fleet load at which this server "
                                  "reports itself full and LiveKit stops dispatching jobs to it")
    http_host: str = Field("127.0.0.1", description="address of the health and metrics servers (livekit's own "
                           "default is every address; the images set 0.0.0.0 for probes and Prometheus)")
    http_port: int | None = Field(None, ge=0, le=65535, description="the agent server's health endpoint (GET / and "
                                  "/worker); None: livekit's default (8081, a random port in --dev)")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="the agent server's GET /metrics (livekit-"
                                     "agents' Prometheus server: its own and voicering_agent_* from every room's job "
                                     "process); None: not served. Deploy configs set 8082")
    metrics_dir: Path | None = Field(None, description="prometheus_client's multiprocess folder the job processes "
                                     "write to (emptied at start); None: a fresh temporary folder per server")
    # the fleet
    redis_url: str = Field(_RING.redis_url, validation_alias=_env("redis_url", REDIS_URL_ENV),
                           description="Redis of the workers' hash ring")
    ring_prefix: str = Field(_RING.prefix, min_length=1, description="the ring's key prefix (as the workers')")
    cluster_token: SecretStr | None = Field(None, description="the workers' VOICERING_WORKER_CLUSTER_TOKEN")
    allow_open_cluster: bool = Field(False, description="start bound beyond loopback with an empty or short "
                                     "cluster token (refused otherwise: gpu_worker.open_cluster)")
    voice: str = Field(..., description="voice id every job speaks with")
    seed: int | None = Field(None, ge=0, lt=2**32, description="fixed sampling seed (None: the worker's)")
    min_sentence_chars: int | None = Field(None, ge=0, description="None: the workers cut the reply into segments "
                                           "(chunking \"auto\"); N: the plugin flushes each sentence of N+ characters")
    # a full voice agent (optional): LiveKit Inference model ids, e.g. "deepgram/nova-3", "openai/gpt-4.1-mini"
    stt: str | None = Field(None, description="speech-to-text model; None: participants' speech is not listened to")
    llm: str | None = Field(None, description="LLM; None: the agent speaks participants' text as sent")
    instructions: str = Field("You are a friendly voice. Answer briefly, in plain spoken sentences.",
                              description="the LLM's system prompt (with llm set)")

    @field_validator("voice")
    @classmethod
    def _usable_voice(cls, value: str) -> str:
        try:
            return check_voice_id(value)
        except InvalidVoiceId as exc:
            raise ValueError(exc.message) from None

    @field_validator("livekit_url", "livekit_api_key", "stt", "llm")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @model_validator(mode="after")
    def _stt_needs_llm(self) -> AgentSettings:
        if self.stt and not self.llm:
            raise ValueError("stt is set but llm is not: what participants say would have no one to answer it; "
                             "set VOICERING_AGENT_LLM too")
        return self

    def ring_settings(self) -> RingSettings:
        return RingSettings(redis_url=self.redis_url, prefix=self.ring_prefix)
