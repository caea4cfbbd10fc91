"""Container health check: `python healthcheck.py worker|gateway|agent|trainer` (exit 0 healthy, 1 not).

The address is read off the process's own settings object (the same environment the server reads),
so the check can never probe a port the server does not listen on.

- worker:  GET /health on the websocket port (open without the cluster token; 200 once the engine,
           codec and adapter cache are up and the websocket server listens).
- gateway: GET /health of the HTTP API.
- agent:   GET / on the agent server's health port (livekit-agents answers 503 when it cannot reach
           LiveKit, 200 otherwise).
- trainer: GET /health on its internal port when VOICERING_TRAIN_HEALTH_PORT is set (503 once the
           queue's Redis has been unreachable past its grace, or the running job stalled); without
           that port, only that the training queue's Redis answers PING (the trainer can work, not
           that its consumer loop is alive).
"""

from __future__ import annotations

import sys
import urllib.request
from typing import Literal

Role = Literal["worker", "gateway", "agent", "trainer"]
LIVEKIT_DEFAULT_HTTP_PORT = 8081  # livekit-agents' own default when AgentSettings.http_port is None
TIMEOUT_S = 4.0


def _loopback(host: str) -> str:
    """The address a check inside the container dials for a server bound to `host`."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def health_url(role: Role) -> str:
    """The health URL of `role`, from its settings (environment variables, then defaults)."""
    if role == "worker":
        from gpu_worker.settings import WorkerSettings

        s = WorkerSettings()
        return f"http://{_loopback(s.host)}:{s.port}/health"
    if role == "gateway":
        from gateway.settings import GatewaySettings

        g = GatewaySettings()
        return f"http://{_loopback(g.host)}:{g.port}/health"
    if role == "agent":
        from gateway.livekit.settings import AgentSettings

        a = AgentSettings()
        return f"http://127.0.0.1:{a.http_port or LIVEKIT_DEFAULT_HTTP_PORT}/"
    if role == "trainer":
        from lora_training.settings import TrainSettings

        t = TrainSettings()
        if t.health_port is None:
            raise ValueError("the trainer serves no /health without VOICERING_TRAIN_HEALTH_PORT")
        return f"http://{_loopback(t.health_host)}:{t.health_port}/health"
    raise ValueError(f"{role} has no health URL")


def trainer_health_port() -> int | None:
    from lora_training.settings import TrainSettings

    return TrainSettings().health_port


def check_trainer() -> None:
    import redis

    from lora_training.settings import TrainSettings

    client = redis.Redis.from_url(TrainSettings().redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
    try:
        client.ping()
    finally:
        client.close()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("worker", "gateway", "agent", "trainer"):
        print("usage: healthcheck.py worker|gateway|agent|trainer", file=sys.stderr)
        return 2
    role: Role = argv[0]  # type: ignore[assignment]
    try:
        if role == "trainer" and trainer_health_port() is None:
            check_trainer()
        else:
            with urllib.request.urlopen(health_url(role), timeout=TIMEOUT_S) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
    except Exception as exc:  # any failure is "unhealthy"; the reason goes to `docker inspect`
        print(f"{role} unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
