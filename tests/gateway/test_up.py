"""`voicering up` as a real process tree: the plan it runs, the local tenant it keeps, and its
faults: a port in use, a worker that cannot start, Ctrl-C during start-up, a second `up` in the
same folder, a child killed while serving (restarted), and SIGTERM (everything stops, nothing is
left in the process table or in the ring).

The running stack here has one worker and no trainer (the demo test runs the full two-worker day
with the trainer); with the session worker that is two workers alive at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
import redis

from hashring.ports import free_ports
from voicering.stack.folder import AlreadyRunning, StackFolder
from voicering.stack.local_tenant import ensure_local_tenant
from voicering.stack.plan import QUICK_CLONE_PARAMS, ExposedWithoutToken, Models, PortInUse, check_ports, plan_stack
from voicering.stack.settings import UpSettings
from hashring.embedded import EmbeddedRedis
from tests.fixtures.models import REPO, STAND_IN_CACHE

OWN_WORKERS = 2  # its stacks' worker, and the one `up` restarts while the dead one is reaped (tests/fixtures/fleet.py)


def up_command(folder: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "voicering", "up", "--folder", str(folder), *extra]


UP_ENV = {"VOICERING_UP_STAND_IN_CACHE": str(STAND_IN_CACHE), "HF_HUB_OFFLINE": "1"}


def start_up(folder: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{folder.name}-up.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(up_command(folder, *extra), stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, **UP_ENV}, start_new_session=True)
    return proc, log


def wait_for(predicate, timeout: float, what: str, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def processes_of(folder: Path) -> list[psutil.Process]:
    """Processes whose command line names the folder (every child of that `up` does)."""
    mark = str(folder.resolve())
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(mark in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


# -- the plan and the tenant (no processes) -----------------------------------------------------------


def test_real_weights_plan_builds_no_stand_in_and_keeps_the_trainer_s_own_defaults(tmp_path):
    settings = UpSettings(folder=tmp_path / "f", workers=2, model="/models/orpheus-3b", gateway_port=9000,
                          worker_port=9100)
    plan = plan_stack(settings, "redis://10.0.0.5:6379/0", Models("/models/orpheus-3b", "snac", stand_in=False), env={})
    workers, front = plan.stages
    assert [w.name for w in workers] == ["worker-0", "worker-1"] and [c.name for c in front] == ["gateway", "trainer"]
    args = dict(zip(workers[1].args[1::2], workers[1].args[2::2], strict=True))
    assert args["--model"] == "/models/orpheus-3b" and args["--port"] == "9101" and args["--worker-id"] == "up-worker-1"
    assert args["--voices-dir"] == str((tmp_path / "f" / "voices").resolve())
    assert json.loads(workers[0].env["VOICERING_WORKER_BASE_VOICES"]) == ["tara", "leo"]
    # the Redis URL (it may hold a password) goes by environment, never on a command line (ps shows those)
    url = "redis://10.0.0.5:6379/0"
    assert workers[1].env["VOICERING_WORKER_REDIS_URL"] == url
    # no quick clones, no forced CPU training
    assert front[0].env == {"VOICERING_GATEWAY_REDIS_URL": url} and front[1].env == {"VOICERING_TRAIN_REDIS_URL": url}
    assert not any(url in arg for spec in plan.specs for arg in spec.args)
    assert plan.worker_urls == ("ws://127.0.0.1:9100", "ws://127.0.0.1:9101") and not plan.agent
    assert "--worker-url" in front[1].args and front[1].args[front[1].args.index("--worker-url") + 1] == plan.worker_urls[0]


def test_stand_in_plan_trains_quick_clones_on_cpu_and_livekit_settings_add_the_agent(tmp_path):
    env = {"LIVEKIT_URL": "ws://lk:7880", "LIVEKIT_API_KEY": "k", "LIVEKIT_API_SECRET": "s"}
    plan = plan_stack(UpSettings(folder=tmp_path, workers=1), "redis://x:1/0", Models("m", "c", stand_in=True), env=env)
    gateway, trainer, agent = plan.stages[1]
    assert json.loads(gateway.env["VOICERING_GATEWAY_CLONE_PARAMS"]) == QUICK_CLONE_PARAMS
    assert trainer.env["VOICERING_TRAIN_DEVICE"] == "cpu"
    assert agent.name == "agent" and agent.health_url == "http://127.0.0.1:8081/" and plan.agent
    # what the operator set in the environment wins over up's choices
    mine = {**env, "VOICERING_GATEWAY_CLONE_PARAMS": "{}", "VOICERING_WORKER_BASE_VOICES": '["zoe"]'}
    plan = plan_stack(UpSettings(folder=tmp_path, workers=1), "redis://x:1/0", Models("m", "c", True), env=mine)
    assert "VOICERING_GATEWAY_CLONE_PARAMS" not in plan.stages[1][0].env
    assert "VOICERING_WORKER_BASE_VOICES" not in plan.stages[0][0].env


def test_beyond_loopback_every_child_that_speaks_to_workers_gets_one_cluster_token(tmp_path):
    settings = UpSettings(folder=tmp_path, workers=2, host="0.0.0.0", trainer=False)
    env = {"LIVEKIT_URL": "ws://lk:7880", "LIVEKIT_API_KEY": "k", "LIVEKIT_API_SECRET": "s"}
    token = StackFolder(tmp_path).cluster_token()
    assert (tmp_path / "cluster-token").stat().st_mode & 0o777 == 0o600
    assert StackFolder(tmp_path).cluster_token() == token  # kept for the next start, like the key
    plan = plan_stack(settings, "redis://x:1/0", Models("m", "c", True), env=env, cluster_token=token)
    (w0, w1), (gateway, agent) = plan.stages
    assert w0.env["VOICERING_WORKER_CLUSTER_TOKEN"] == w1.env["VOICERING_WORKER_CLUSTER_TOKEN"] == token
    assert gateway.env["VOICERING_GATEWAY_CLUSTER_TOKEN"] == token
    assert agent.env["VOICERING_AGENT_CLUSTER_TOKEN"] == token
    # its health server binds where `up` checks it; bound there, the token is what lets it start
    assert agent.env["VOICERING_AGENT_HTTP_HOST"] == "0.0.0.0" and agent.health_url.startswith("http://0.0.0.0:")
    # the gateway's metrics stay on loopback whatever the host
    args = dict(zip(gateway.args[1::2], gateway.args[2::2], strict=False))
    assert args["--metrics-host"] == "127.0.0.1" and plan.metrics_url.startswith("http://127.0.0.1:")
    # without a token, or with one the children would refuse as too short, such a plan is refused
    with pytest.raises(ExposedWithoutToken, match="cluster token"):
        plan_stack(settings, "redis://x:1/0", Models("m", "c", True), env={})
    with pytest.raises(ExposedWithoutToken, match="at least 16 characters"):
        plan_stack(settings, "redis://x:1/0", Models("m", "c", True), env={"VOICERING_WORKER_CLUSTER_TOKEN": "short"})
    # the trainer sends it too, with its validation sample to the first worker
    with_trainer = plan_stack(UpSettings(folder=tmp_path, host="0.0.0.0"), "redis://x:1/0", Models("m", "c", True),
                              env={}, cluster_token=token)
    trainer = next(spec for spec in with_trainer.specs if spec.name == "trainer")
    assert trainer.env["VOICERING_TRAIN_CLUSTER_TOKEN"] == token
    # on loopback nothing changes: no token anywhere
    local = plan_stack(UpSettings(folder=tmp_path), "redis://x:1/0", Models("m", "c", True), env={})
    assert not any("CLUSTER_TOKEN" in name for spec in local.specs for name in spec.env)


def test_a_port_in_use_is_named_with_the_child_that_needs_it(tmp_path):
    first = free_ports(2)
    plan = plan_stack(UpSettings(folder=tmp_path, workers=2, worker_port=first, gateway_port=free_ports(2)),
                      "redis://x:1/0", Models("m", "c", True), env={})
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first + 1))
        holder.listen()
        with pytest.raises(PortInUse) as err:
            check_ports(plan, "127.0.0.1")
    assert err.value.port == first + 1 and err.value.owner == "worker-1" and str(first + 1) in str(err.value)
    check_ports(plan, "127.0.0.1")  # free again


async def test_the_local_tenant_is_created_then_reused_and_a_lost_key_is_replaced(redis_server, tmp_path):
    folder = StackFolder(tmp_path)
    name = f"local-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    key, created = await ensure_local_tenant(redis_server.url, name, folder)
    assert created and key.api_key.startswith("vr_") and (tmp_path / "tenant.json").stat().st_mode & 0o777 == 0o600
    again, created = await ensure_local_tenant(redis_server.url, name, folder)
    assert again == key and not created
    (tmp_path / "tenant.json").unlink()  # the key file is lost: same tenant, a new key
    replaced, created = await ensure_local_tenant(redis_server.url, name, folder)
    assert not created and replaced.tenant_id == key.tenant_id and replaced.api_key != key.api_key


def test_a_folder_is_held_by_one_up_at_a_time(tmp_path):
    holder, second = StackFolder(tmp_path), StackFolder(tmp_path)
    holder.acquire()
    try:
        with pytest.raises(AlreadyRunning):
            second.acquire()
    finally:
        holder.release()
    second.acquire()  # released: free again
    second.release()


# -- faults of a real `voicering up` ---------------------------------------------------------------------


def test_up_refuses_a_port_in_use_before_starting_anything(tmp_path):
    port = free_ports(1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        done = subprocess.run(up_command(tmp_path / "f", "--gateway-port", str(port), "--worker-port",
                                         str(free_ports(2))), capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, **UP_ENV}, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"port {port} on 127.0.0.1 is in use, and gateway needs it" in done.stdout
    assert not (tmp_path / "f" / "logs").exists() and not (tmp_path / "f" / "redis").exists()


async def test_up_on_a_shared_redis_refuses_worker_ids_another_stack_is_using(redis_server, tmp_path):
    from hashring.membership import Heartbeat
    from hashring.records import WorkerInfo
    from hashring.settings import RingSettings
    from hashring.store import RingStore

    prefix = f"shared-{os.getpid()}"
    async with RingStore(RingSettings(redis_url=redis_server.url)) as store, \
            Heartbeat(store, WorkerInfo(f"{prefix}-1", "ws://elsewhere:1", "ws://elsewhere:1")):
        done = await asyncio.to_thread(subprocess.run, up_command(
            tmp_path / "f", "--redis", redis_server.url, "--worker-id-prefix", prefix, "--gateway-port",
            str(free_ports(2)), "--worker-port", str(free_ports(2))), capture_output=True, text=True, cwd=REPO,
            env={**os.environ, **UP_ENV}, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"worker id(s) {prefix}-1 are alive in the ring at {redis_server.url}" in done.stdout
    assert "--worker-id-prefix" in done.stdout and not (tmp_path / "f" / "logs").exists()


def test_up_on_an_unreachable_redis_says_so(tmp_path):
    dead = f"redis://127.0.0.1:{free_ports(1)}/0"
    done = subprocess.run(up_command(tmp_path / "f", "--redis", dead, "--gateway-port", str(free_ports(2)),
                                     "--worker-port", str(free_ports(1))),
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, **UP_ENV}, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: cannot use the Redis at {dead}" in done.stdout and not (tmp_path / "f" / "logs").exists()


def test_a_worker_that_cannot_start_shows_its_log_and_stops_the_rest(tmp_path):
    folder = tmp_path / "f"
    done = subprocess.run(up_command(folder, "--model", str(tmp_path / "no-such-model"), "--workers", "1",
                                     "--gateway-port", str(free_ports(2)), "--worker-port", str(free_ports(1))),
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, **UP_ENV}, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: worker-0 exited with code 2 while starting" in done.stdout
    assert "--- last lines of its log ---" in done.stdout
    assert "no-such-model is written as a local path but no such folder exists" in done.stdout
    assert "[up] stopped" in done.stdout and not (folder / "logs" / "gateway.log").exists()  # never started
    assert not processes_of(folder) and not (folder / "up.json").exists()


def test_ctrl_c_during_start_up_stops_what_was_started(tmp_path, stand_in):
    folder = tmp_path / "f"
    proc, log = start_up(folder, "--workers", "1", "--no-trainer", "--gateway-port", str(free_ports(2)),
                         "--worker-port", str(free_ports(1)))
    try:
        wait_for(lambda: (folder / "logs" / "worker-0.log").exists() and processes_of(folder), 120,
                 "the worker to be starting", log)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert "interrupted during start-up" in out and "[up] stopped" in out and "voicering is up" not in out
    assert not processes_of(folder) and not (folder / "up.json").exists()


# -- a running stack ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(stand_in, tmp_path_factory):
    folder = tmp_path_factory.mktemp("up") / "stack"
    gateway_port, worker_port = free_ports(2), free_ports(1)
    proc, log = start_up(folder, "--workers", "1", "--no-trainer", "--gateway-port", str(gateway_port),
                         "--worker-port", str(worker_port))
    state = folder / "up.json"
    wait_for(lambda: state.exists() and json.loads(state.read_text())["state"] == "ready" or proc.poll() is not None,
             300, "up to be ready", log)
    assert proc.poll() is None, log.read_text()
    yield {"proc": proc, "log": log, "folder": folder, "state": json.loads(state.read_text()),
           "key": json.loads((folder / "tenant.json").read_text())["api_key"]}
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        for child in processes_of(folder):
            child.kill()


def test_up_prints_its_urls_and_a_key_that_works(stack):
    out, state = stack["log"].read_text(), stack["state"]
    assert f"web page      {state['gateway_url']}/" in out and f"API key       {stack['key']}" in out
    worker_http = state["worker_urls"][0].replace("ws://", "http://")
    assert f"metrics {worker_http}/metrics" in out
    # the gateway's metrics: on its internal server, not on the public port
    gateway_metrics = re.search(r"metrics       (http://127\.0\.0\.1:\d+/metrics)", out).group(1)
    assert "voicering_gateway_requests_total" in httpx.get(gateway_metrics, timeout=10).text
    assert httpx.get(f"{state['gateway_url']}/metrics", timeout=10).status_code == 404
    assert httpx.get(f"{state['gateway_url']}/", timeout=10).status_code == 200
    voices = httpx.get(f"{state['gateway_url']}/v1/voices", headers={"Authorization": f"Bearer {stack['key']}"},
                       timeout=10)
    assert voices.status_code == 200 and {v["id"] for v in voices.json()["data"]} >= {"tara", "leo"}
    spoken = httpx.post(f"{state['gateway_url']}/v1/audio/speech", headers={"Authorization": f"Bearer {stack['key']}"},
                        json={"model": "tts-1", "voice": "tara", "input": "Up and running.", "response_format": "pcm",
                              "max_tokens": 14}, timeout=120)
    assert spoken.status_code == 200 and len(spoken.content) == 2 * 2048 * 2
    assert httpx.get(f"{worker_http}/health", timeout=10).json()["worker_id"] == state["worker_ids"][0]


def test_the_embedded_redis_wants_the_folder_s_password_and_no_command_line_shows_it(stack):
    folder, url = stack["folder"], stack["state"]["redis_url"]
    password = (folder / "redis-password").read_text().strip()
    assert len(password) >= 32 and urlsplit(url).password == password
    for private in ("redis-password", "up.json", "tenant.json"):
        assert (folder / private).stat().st_mode & 0o777 == 0o600, private
    anonymous = redis.Redis(port=urlsplit(url).port, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):  # another local user reaches 127.0.0.1 too
        anonymous.ping()
    anonymous.close()
    signed_in = redis.Redis.from_url(url, socket_timeout=5)
    assert signed_in.ping()
    signed_in.close()
    assert any("worker" in p.cmdline() for p in processes_of(folder))
    shown = []  # ps shows every user every command line: none of this machine's holds the password
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            shown.append(" ".join(proc.info["cmdline"] or ()))
    assert not any(password in line for line in shown)
    assert password not in stack["log"].read_text()  # the banner shows the URL redacted


def test_a_second_up_in_the_same_folder_is_refused_and_names_the_first(stack):
    done = subprocess.run(up_command(stack["folder"], "--gateway-port", str(free_ports(2))), capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, **UP_ENV}, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"voicering up is already running in {stack['folder']} (pid {stack['proc'].pid}, ready" in done.stdout
    assert stack["proc"].poll() is None and json.loads((stack["folder"] / "up.json").read_text())["state"] == "ready"


def test_a_child_killed_while_serving_is_reported_and_restarted(stack):
    gateway = next(p for p in processes_of(stack["folder"]) if "gateway" in p.cmdline())
    gateway.kill()
    wait_for(lambda: "gateway is back" in stack["log"].read_text(), 90, "the gateway to be restarted", stack["log"])
    out = stack["log"].read_text()
    assert re.search(r"gateway exited with code -9; restarting it \(1 of 3 in 300 s\)", out), out
    voices = httpx.get(f"{stack['state']['gateway_url']}/v1/voices",
                       headers={"Authorization": f"Bearer {stack['key']}"}, timeout=10)
    assert voices.status_code == 200  # same Redis, same tenant: the key still works


def engine_core_of(worker: psutil.Process) -> psutil.Process:
    for child in worker.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
    raise AssertionError(f"no engine core process under worker {worker.pid}: {worker.children(recursive=True)}")


def test_a_worker_whose_engine_core_dies_exits_and_up_restarts_it(stack):
    """The engine core killed under a serving worker: the worker cannot speak any more, so it
    leaves the ring and exits 1 instead of answering /health while failing every request."""
    worker = next(p for p in processes_of(stack["folder"]) if "worker" in p.cmdline() and "up" not in p.cmdline())
    engine_core_of(worker).kill()
    wait_for(lambda: "worker-0 is back" in stack["log"].read_text(), 240, "the worker to be restarted", stack["log"])
    out = stack["log"].read_text()
    assert "worker-0 exited with code 1; restarting it (1 of 3 in 300 s)" in out, out
    log = (stack["folder"] / "logs" / "worker-0.log").read_text()
    assert "the vLLM engine core is dead: stopping this worker" in log and "this worker left the ring" in log
    spoken = httpx.post(f"{stack['state']['gateway_url']}/v1/audio/speech",
                        headers={"Authorization": f"Bearer {stack['key']}"},
                        json={"model": "tts-1", "voice": "leo", "input": "Back again.", "response_format": "pcm",
                              "max_tokens": 14}, timeout=120)
    assert spoken.status_code == 200 and len(spoken.content) == 2 * 2048 * 2


async def test_sigterm_stops_everything_and_leaves_nothing_in_the_ring(stack):
    folder, proc = stack["folder"], stack["proc"]
    pids = [p.pid for p in processes_of(folder)]
    assert len(pids) >= 2  # the worker (and its engine process) and the gateway
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 120) == 0, stack["log"].read_text()
    assert not processes_of(folder) and not any(psutil.pid_exists(pid) for pid in pids)
    assert "[up] stopped" in stack["log"].read_text() and not (folder / "up.json").exists()
    # the embedded Redis kept its data in the folder: the tenant is still there, no worker is
    from gateway.tenants import Tenants, connect_redis
    from hashring.settings import RingSettings
    from hashring.store import RingStore

    async def read(url: str):
        async with RingStore(RingSettings(redis_url=url)) as store:
            workers = (await store.snapshot()).workers
        redis = connect_redis(url, timeout_s=2)
        try:
            tenant = await Tenants(redis).authenticate(stack["key"])
        finally:
            await redis.aclose()
        return workers, tenant

    with EmbeddedRedis(data_dir=folder / "redis") as again:
        workers, tenant = await read(again.url)
    assert workers == {} and tenant.name == "local"
