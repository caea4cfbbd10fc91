"""What `voicering up` runs: the children, their commands, ports and health URLs, in start order.

Stage 1: the workers (ring members in the one Redis, one shared adapter store). Stage 2: the
gateway (ring routing), the training worker (its validation samples come from worker-0, which
proxies to the owner) and, when LiveKit settings are in the environment, the agent server. With
stand-in weights a clone trains a few quick LoRA steps (CPU), unless VOICERING_GATEWAY_CLONE_PARAMS
says otherwise; with real weights the trainer's defaults apply.

Bound beyond loopback (`--host 0.0.0.0`), anyone who reaches a worker could speak any voice and
read its metrics: such a plan needs a cluster token (`up` keeps one in the folder, mode 0600),
given to the workers, the gateway and the agent server. The gateway's metrics server stays on
127.0.0.1 whatever the host.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from voicering.stack.children import ChildSpec
from voicering.stack.settings import UpSettings
from gpu_worker.open_cluster import MIN_TOKEN_CHARS, is_loopback, usable_token

__all__ = ["ExposedWithoutToken", "Models", "PortInUse", "QUICK_CLONE_PARAMS", "StackPlan", "check_ports",
           "is_loopback", "plan_stack"]

BASE_VOICES = ("tara", "leo")  # the gateway's platform voices; the stand-in speaks them without an adapter
# A clone the stand-in trains in about a minute on two CPU cores (the trainer's defaults target a GPU).
QUICK_CLONE_PARAMS = {"rank": 8, "alpha": 16, "max_steps": 24, "save_steps": 24, "batch_size": 1, "grad_accum": 1,
                      "logging_steps": 2, "eval_max_clips": 2}
LIVEKIT_ENV = ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET")


class PortInUse(Exception):
    def __init__(self, port: int, owner: str, host: str) -> None:
        super().__init__(f"port {port} on {host} is in use, and {owner} needs it: stop what holds it "
                         f"(`ss -ltnp 'sport = :{port}'` names it) or choose other ports (voicering up --help)")
        self.port, self.owner = port, owner


class ExposedWithoutToken(Exception):
    """A plan that would open workers beyond loopback without a cluster token (or with a child that
    cannot send one)."""


@dataclass(frozen=True, slots=True)
class Models:
    model: str
    codec: str
    stand_in: bool


@dataclass(frozen=True, slots=True)
class StackPlan:
    stages: tuple[tuple[ChildSpec, ...], ...]
    gateway_url: str
    metrics_url: str  # the gateway's internal metrics server
    worker_urls: tuple[str, ...]  # ws://
    worker_ids: tuple[str, ...]
    agent: bool

    @property
    def specs(self) -> list[ChildSpec]:
        return [spec for stage in self.stages for spec in stage]


def livekit_configured(env: Mapping[str, str]) -> bool:
    return all(env.get(name) or env.get(f"VOICERING_AGENT_{name}") for name in LIVEKIT_ENV)


def plan_stack(settings: UpSettings, redis_url: str, models: Models, env: Mapping[str, str] | None = None, *,
               cluster_token: str | None = None) -> StackPlan:
    """The children and their commands. `cluster_token` (required when `settings.host` is not
    loopback, unless the environment sets VOICERING_WORKER_CLUSTER_TOKEN) goes to every child that
    speaks to the workers (workers, gateway, trainer, agent)."""
    env = os.environ if env is None else env
    host, folder = settings.host, settings.folder.resolve()
    token = env.get("VOICERING_WORKER_CLUSTER_TOKEN") or cluster_token
    if not is_loopback(host):
        if not usable_token(token):  # the children would refuse it (gpu_worker.open_cluster)
            raise ExposedWithoutToken(f"binding {host} opens the workers to the network: they need a cluster token "
                                      f"of at least {MIN_TOKEN_CHARS} characters (voicering up keeps one in its "
                                      "folder) or VOICERING_WORKER_CLUSTER_TOKEN")
    tokens = _token_env(env, token)
    # in each child's environment, not its argv: any local user reads a command line (ps), and the
    # URL may hold a password (the embedded Redis's)
    redis = {child: {name: redis_url} for child, name in REDIS_URL_ENV.items()}
    store, uploads = folder / "voices", folder / "uploads"
    cpu_kv = {} if "VLLM_CPU_KVCACHE_SPACE" in env else {"VLLM_CPU_KVCACHE_SPACE": "1"}
    base_voices = {} if "VOICERING_WORKER_BASE_VOICES" in env else {"VOICERING_WORKER_BASE_VOICES": json.dumps(BASE_VOICES)}
    workers, urls, ids = [], [], []
    for i, port in enumerate(settings.worker_ports()):
        worker_id = f"{settings.worker_id_prefix}-{i}"
        ids.append(worker_id)
        urls.append(f"ws://{host}:{port}")
        workers.append(ChildSpec(
            f"worker-{i}", ("worker", "--model", models.model, "--codec", models.codec, "--voices-dir", str(store),
                            "--worker-id", worker_id, "--host", host, "--port", str(port)),
            env={**cpu_kv, **base_voices, **tokens["worker"], **redis["worker"]},
            health_url=f"http://{host}:{port}/health", ports=(port,), start_timeout_s=settings.start_timeout_s))
    gateway_url = f"http://{host}:{settings.gateway_port}"
    metrics_port = settings.metrics_port()
    clone = {} if "VOICERING_GATEWAY_CLONE_PARAMS" in env or not models.stand_in else {
        "VOICERING_GATEWAY_CLONE_PARAMS": json.dumps(QUICK_CLONE_PARAMS)}
    front = [ChildSpec(
        "gateway", ("gateway", "--host", host, "--port", str(settings.gateway_port),
                    "--voices-dir", str(store), "--uploads-dir", str(uploads), "--metrics-host", "127.0.0.1",
                    "--metrics-port", str(metrics_port)),
        env={**clone, **tokens["gateway"], **redis["gateway"]}, health_url=f"{gateway_url}/health",
        ports=(settings.gateway_port, metrics_port), start_timeout_s=120.0,
        stop_timeout_s=20.0)]
    if settings.trainer:
        device = {"VOICERING_TRAIN_DEVICE": "cpu"} if models.stand_in and "VOICERING_TRAIN_DEVICE" not in env else {}
        front.append(ChildSpec(
            "trainer", ("train-worker", "--model", models.model, "--codec", models.codec,
                        "--store", str(store), "--work-dir", str(folder / "training"), "--worker-url", urls[0],
                        "--consumer", "up-trainer"),
            env={**device, **tokens["trainer"], **redis["trainer"]}, stop_timeout_s=20.0,
            start_timeout_s=settings.start_timeout_s))
    agent = livekit_configured(env)
    if agent:
        front.append(ChildSpec(
            "agent", ("agent", "--voice", settings.agent_voice),
            env={"VOICERING_AGENT_HTTP_HOST": host, "VOICERING_AGENT_HTTP_PORT": str(settings.agent_port),
                 **tokens["agent"], **redis["agent"]},
            health_url=f"http://{host}:{settings.agent_port}/", ports=(settings.agent_port,), stop_timeout_s=20.0,
            start_timeout_s=120.0))
    return StackPlan((tuple(workers), tuple(front)), gateway_url, f"http://127.0.0.1:{metrics_port}/metrics",
                     tuple(urls), tuple(ids), agent)


REDIS_URL_ENV = {"worker": "VOICERING_WORKER_REDIS_URL", "gateway": "VOICERING_GATEWAY_REDIS_URL",
                 "agent": "VOICERING_AGENT_REDIS_URL", "trainer": "VOICERING_TRAIN_REDIS_URL"}


def _token_env(env: Mapping[str, str], token: str | None) -> dict[str, dict[str, str]]:
    """Each child's cluster-token variable, unless the operator's environment sets it already."""
    names = {"worker": "VOICERING_WORKER_CLUSTER_TOKEN", "gateway": "VOICERING_GATEWAY_CLUSTER_TOKEN",
             "agent": "VOICERING_AGENT_CLUSTER_TOKEN", "trainer": "VOICERING_TRAIN_CLUSTER_TOKEN"}
    return {child: {name: token} if token and name not in env else {} for child, name in names.items()}


def check_ports(plan: StackPlan, host: str) -> None:
    """Raise `PortInUse` naming the first port a child needs that something already listens on."""
    for spec in plan.specs:
        for port in spec.ports:
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((host, port))
                except OSError:
                    raise PortInUse(port, spec.name, host) from None
