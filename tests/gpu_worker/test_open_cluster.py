"""Fail closed on cluster tokens (gpu_worker.open_cluster): the rule itself, then the real
`voicering worker`, `gateway` and `agent` commands refusing to start exposed without a token,
and a gateway on loopback without one still starting (the suite and `voicering up` rely on it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from gateway.livekit.settings import AgentSettings
from gateway.settings import GatewaySettings
from gpu_worker.open_cluster import MIN_TOKEN_CHARS, OpenCluster, is_loopback, require_cluster_token
from hashring.ports import free_port
from gpu_worker.settings import WorkerSettings

OWN_WORKERS = 1  # `voicering worker` runs that refuse to start (tests/fixtures/fleet.py)

GOOD = "k" * MIN_TOKEN_CHARS
SHORT = "s3cr3t-but-short"[: MIN_TOKEN_CHARS - 1]


def refuse(host: str, token: str | None, allow: bool = False) -> str | None:
    try:
        require_cluster_token(host, token, allow_open=allow, env_prefix="VOICERING_WORKER_", role="worker")
    except OpenCluster as exc:
        return exc.message
    return None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_token(host):
    assert is_loopback(host)
    assert refuse(host, None) is None and refuse(host, "") is None and refuse(host, "x") is None


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.0.0.5", "worker-0.voicering-worker.voicering.svc"])
def test_beyond_loopback_an_empty_or_short_token_is_refused(host):
    assert not is_loopback(host)
    for token in (None, "", SHORT):
        message = refuse(host, token)
        assert message and "VOICERING_WORKER_CLUSTER_TOKEN" in message
        assert "VOICERING_WORKER_ALLOW_OPEN_CLUSTER" in message
    assert SHORT not in refuse(host, SHORT), "the message never carries the token"
    assert f"{len(SHORT)} characters" in refuse(host, SHORT)
    assert refuse(host, GOOD) is None
    assert refuse(host, None, allow=True) is None


def test_each_process_reads_its_own_allow_setting(monkeypatch):
    for name in ("VOICERING_WORKER_ALLOW_OPEN_CLUSTER", "VOICERING_GATEWAY_ALLOW_OPEN_CLUSTER",
                 "VOICERING_AGENT_ALLOW_OPEN_CLUSTER"):
        monkeypatch.setenv(name, "true")
    assert WorkerSettings(model="m").allow_open_cluster
    assert GatewaySettings().allow_open_cluster
    assert AgentSettings(voice="tara").allow_open_cluster
    for cls in (WorkerSettings, GatewaySettings, AgentSettings):
        assert cls.model_fields["allow_open_cluster"].default is False


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any voicering/LiveKit setting (a developer's shell may hold some)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICERING_", "LIVEKIT_"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voicering", *args], capture_output=True, text=True, env=env,
                          timeout=180)


def test_gateway_bound_beyond_loopback_without_a_token_refuses_to_start():
    port = free_port()
    done = run_cli(["gateway", "--host", "0.0.0.0", "--port", str(port)], clean_env())
    assert done.returncode == 2, done.stderr[-2000:]
    assert "VOICERING_GATEWAY_CLUSTER_TOKEN" in done.stderr and "beyond loopback" in done.stderr
    short = run_cli(["gateway", "--host", "0.0.0.0", "--port", str(port)],
                    clean_env(VOICERING_GATEWAY_CLUSTER_TOKEN=SHORT))
    assert short.returncode == 2 and SHORT not in short.stderr and "VOICERING_GATEWAY_CLUSTER_TOKEN" in short.stderr


def test_agent_bound_beyond_loopback_without_a_token_refuses_to_start():
    env = clean_env(VOICERING_AGENT_VOICE="tara", VOICERING_AGENT_HTTP_HOST="0.0.0.0",
                    VOICERING_REDIS_URL="redis://127.0.0.1:1/0")  # refused before Redis is dialled
    done = run_cli(["agent"], env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "VOICERING_AGENT_CLUSTER_TOKEN" in done.stderr and "agent server" in done.stderr


def test_worker_bound_beyond_loopback_without_a_token_refuses_before_loading_anything():
    # a hub id that does not exist: had the worker gone on to load it, it would fail differently
    env = clean_env(HF_HUB_OFFLINE="1")
    done = run_cli(["worker", "--host", "0.0.0.0", "--port", str(free_port()), "--model", "voicering-tests/absent"],
                   env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "VOICERING_WORKER_CLUSTER_TOKEN" in done.stderr and "absent" not in done.stderr


def test_gateway_on_loopback_without_a_token_still_starts(tmp_path):
    port, metrics = free_port(), free_port()
    env = clean_env(VOICERING_GATEWAY_UPLOADS_DIR=str(tmp_path / "uploads"),
                    VOICERING_GATEWAY_VOICES_DIR=str(tmp_path / "voices"))
    proc = subprocess.Popen([sys.executable, "-m", "voicering", "gateway", "--host", "127.0.0.1", "--port", str(port),
                             "--metrics-port", str(metrics)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "the gateway never answered /health"
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
