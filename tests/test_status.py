"""`voicering status` against a real Redis: a fleet built through the real hashring and
lora_training APIs (heartbeats, an operator drain, a worker gone silent, a burst of requests the
cool loop answers with replicas, a voice scaled past the fleet, training jobs queued, running and
failed), read by the command as a subprocess; and, under the worker lock, against the session's
real worker (its /health and /metrics probed twice with --watch).

Run the whole file under `flock /tmp/voicering-tests.lock`: the last test starts the session worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_worker.metrics import WorkerMetrics
from hashring.ports import free_port
from hashring.membership import Heartbeat, RingWatcher
from hashring.placement import HeatRecorder, ReplicaControl
from hashring.presence import PRESENCE_SILENT_AFTER_S, Announcer
from hashring.records import WorkerInfo
from hashring.settings import RetryPolicy, RingSettings
from hashring.store import RingStore
from lora_training.jobs import JobQueue, Lease
from lora_training.pipeline import JobSpec
from tests.fixtures.models import CLUSTER_PREFIX
from voicering.status import Probe, counter_totals, rates_between

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[1]
SERVING = ("gpu-1", "gpu-2", "gpu-3")
BURST, WIDE, CALM = "acme/burst", "acme/wide", "acme/calm"
# the voices whose adapters each worker lists in its heartbeats (gpu-4 is drained, still live)
RESIDENT = {"gpu-1": (WIDE, BURST), "gpu-2": (BURST,), "gpu-3": (), "gpu-4": (CALM,)}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICERING_")}
    return {**env, "COLUMNS": "200"}


async def status(*args: str) -> tuple[int, str, str]:
    """Run `voicering status ARGS` as its own process (the loop stays free for the heartbeats)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "voicering", "status", *args, cwd=REPO, env=_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def ring_settings(redis_url: str) -> RingSettings:
    # fast membership so a worker is dead within a second; the heat half-lives stay the defaults,
    # which the command reads with (every process of a fleet must agree on them)
    return RingSettings(redis_url=redis_url, prefix=f"test:status:{uuid.uuid4().hex[:8]}", heartbeat_interval_s=0.1,
                        heartbeat_ttl_s=0.6, refresh_interval_s=0.25, redis_timeout_s=0.5,
                        retry=RetryPolicy(attempts=3, base_delay_s=0.02, max_delay_s=0.1))


@pytest.fixture
def queue(redis_url: str):
    q = JobQueue.connect(redis_url, prefix=f"test:status-train:{uuid.uuid4().hex[:8]}")
    yield q
    q.close()


@dataclass(frozen=True)
class Jobs:
    queued: str
    running: str
    failed: str


def training_jobs(queue: JobQueue, tmp_path: Path) -> Jobs:
    """One job running at 42.5 % (its trainer holds the lease), one failed, one still queued."""
    def submit(name: str) -> str:
        return queue.submit(JobSpec(name=name, tenant="acme", audio=[tmp_path / f"{name}.wav"])).job_id

    running, failed = submit("running"), submit("failed")
    taken = queue.next("trainer-1", block_ms=100, claim_idle_ms=60_000)
    assert taken is not None and taken.job_id == running
    lease = Lease(queue, running, "token-1", 30_000)
    assert lease.acquire()
    lease.update(state="training", progress=42.5, step=3, total_steps=10, consumer="trainer-1")
    ended = queue.next("trainer-2", block_ms=100, claim_idle_ms=60_000)
    assert ended is not None and ended.job_id == failed
    doomed = Lease(queue, failed, "token-2", 30_000)
    assert doomed.acquire()
    doomed.finish(ended, state="failed", error="too little speech: 12 s of the 60 s needed",
                  error_code="speech_amount", consumer="trainer-2")
    return Jobs(submit("waiting"), running, failed)


def info(wid: str, port: int) -> WorkerInfo:
    # nothing listens on `port`: the probes of these workers fail fast (connection refused)
    return WorkerInfo(wid, f"ws://127.0.0.1:{port}/{wid}", f"ws://127.0.0.1:{port}", capacity=8)


@contextlib.asynccontextmanager
async def fleet(settings: RingSettings) -> AsyncIterator[RingStore]:
    """Three serving workers (4 streams each), one drained by an operator, one that registered and
    went silent, each live one listing its resident adapters (`RESIDENT`); a burst of 200 requests
    on BURST answered by the cool loop, 20 of them served past its owners and 50 more tries
    refused; WIDE scaled to 6; CALM requested 3 times, with no replica record."""
    port = free_port()
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(settings))
        for wid in (*SERVING, "gpu-4"):
            await stack.enter_async_context(Heartbeat(store, info(wid, port), load=lambda: 4,
                                                      resident=lambda w=wid: RESIDENT[w]))
        await store.set_draining("gpu-4", True)
        await store.register(info("gpu-dead", port))  # and never heartbeats
        async with RingWatcher(store) as watcher:  # its reads reap the silent one; then only the command reads
            await watcher.wait_for(lambda v: v.workers["gpu-dead"].status == "down", timeout=10)
        control = ReplicaControl(store)
        async with HeatRecorder(control) as heat:
            for _ in range(200):
                heat.record(BURST)
            heat.spilled(BURST, 20)
            heat.refused(BURST, 50)
            heat.record(WIDE, 5)
            heat.record(CALM, 3)
        await control.scale(WIDE, 6)
        assert (await control.cool()).get(BURST) == 3  # the autoscaler's own decision: the 3 serving workers
        # a gateway and an agent server announcing themselves as theirs do, and a gateway gone quiet
        await stack.enter_async_context(Announcer(store, "gateway", "gw-a:8000", address="0.0.0.0:8000"))
        await stack.enter_async_context(Announcer(store, "agent", "agent-a:1", address="wss://lk.example"))
        quiet = Announcer(store, "gateway", "gw-gone:8000")
        await quiet.beat()
        await store._client.zincrby(store.keys.presence, -PRESENCE_SILENT_AFTER_S - 5, "gateway/gw-gone:8000")
        yield store


def by_id(rows: list[dict], key: str) -> dict[str, dict]:
    return {r[key]: r for r in rows}


async def test_json_shows_the_burst_first_and_every_problem(ring_settings, queue, tmp_path):
    jobs = training_jobs(queue, tmp_path)
    async with fleet(ring_settings):
        common = ("--redis", ring_settings.redis_url, "--prefix", ring_settings.prefix,
                  "--queue-prefix", queue.prefix, "--probe-timeout", "0.3", "--json")
        code, out, err = await status(*common, "--queue-age-limit", "0.005")  # 0.3 s; the job waited > 0.6 s
        assert code == 1, err
        report = json.loads(out)

        workers = by_id(report["workers"], "id")
        assert {w: r["state"] for w, r in workers.items()} == {
            "gpu-1": "serving", "gpu-2": "serving", "gpu-3": "serving", "gpu-4": "draining", "gpu-dead": "dead"}
        assert all(workers[w]["streams"] == 4 and workers[w]["capacity"] == 8 for w in SERVING)
        assert workers["gpu-dead"]["heartbeat_age_s"] >= ring_settings.heartbeat_ttl_s
        assert workers["gpu-1"]["heartbeat_age_s"] < workers["gpu-dead"]["heartbeat_age_s"]
        assert "did not answer" in workers["gpu-1"]["probe_error"] and workers["gpu-1"]["health"] is None
        assert workers["gpu-dead"]["probe_error"] is None and workers["gpu-dead"]["health"] is None  # not probed
        assert workers["gpu-1"]["refusals_per_s"] is None and "use --watch" in report["rates_note"]
        assert (report["fleet"]["in_ring"], report["fleet"]["streams"], report["fleet"]["cooling"]) == (3, 12, False)

        first, second, third = report["voices"]  # CALM has no replica record: ranked by the request index
        assert (first["voice"], second["voice"], third["voice"]) == (BURST, WIDE, CALM)
        assert first["rate_per_s"] > 10 * second["rate_per_s"] > 0 and first["share"] > 0.9
        assert (first["replicas_wanted"], first["replicas_placed"], first["auto_replicas"]) == (3, 3, 3)
        assert sorted(first["owners"]) == list(SERVING)
        assert (second["replicas_wanted"], second["replicas_placed"], second["operator_replicas"]) == (6, 3, 6)
        # where each adapter is loaded, from the workers' heartbeats (the drained gpu-4 is live: listed)
        assert [v["adapter_loaded_on"] for v in (first, second, third)] == [["gpu-1", "gpu-2"], ["gpu-1"], ["gpu-4"]]
        assert workers["gpu-1"]["adapters"] == [WIDE, BURST] and workers["gpu-1"]["adapters_resident"] == 2
        assert workers["gpu-3"]["adapters"] == [] and workers["gpu-dead"]["adapters"] is None
        # 20 of BURST's 200 requests spilled; 50 tries were refused, of 250 tries
        assert first["spill_share"] == pytest.approx(0.1, abs=0.01)
        assert first["refusal_share"] == pytest.approx(0.2, abs=0.01)
        assert (second["spill_share"], second["refusal_share"]) == (0.0, 0.0)
        assert set(report["voice_field_notes"]) == {"adapter_loaded_on", "spill_share", "refusal_share"}

        problems = {(p["kind"], p["subject"]) for p in report["problems"]}
        assert problems == {("dead_worker", "gpu-dead"), ("replicas_short", WIDE), ("queue_stale", jobs.queued)}

        training = report["training"]
        assert training["queued"] == 1 and training["queued_jobs"][0]["job_id"] == jobs.queued
        assert training["oldest_queued_age_s"] > 0.3
        (running,) = training["running"]
        assert (running["job_id"], running["state"], running["progress"], running["step"], running["total_steps"],
                running["leased"], running["consumer"]) == (jobs.running, "training", 42.5, 3, 10, True, "trainer-1")
        (failed,) = training["failed_recent"]
        assert failed["job_id"] == jobs.failed and failed["error_code"] == "speech_amount"
        assert training["pending_entries"] == 1 and training["complete"] is True  # the running job's entry
        gateways = by_id(report["gateways"], "id")
        assert set(gateways) == {"gw-a:8000", "gw-gone:8000"}
        assert not gateways["gw-a:8000"]["silent"] and gateways["gw-a:8000"]["address"] == "0.0.0.0:8000"
        assert gateways["gw-gone:8000"]["silent"] and gateways["gw-gone:8000"]["seen_age_s"] > PRESENCE_SILENT_AFTER_S
        (agent,) = report["agents"]
        assert agent["id"] == "agent-a:1" and agent["pid"] == os.getpid() and not agent["silent"]
        assert "announce themselves" in report["presence_note"]

        # a voice never requested is ranked when asked for, with no shares; a patient limit is no problem
        code, out, err = await status(*common, "--queue-age-limit", "60", "--voice", "acme/never")
        assert code == 1, err
        report = json.loads(out)
        assert [v["voice"] for v in report["voices"]] == [BURST, WIDE, CALM, "acme/never"]
        calm, never = report["voices"][2:]
        assert calm["rate_per_s"] > 0 and (calm["replicas_wanted"], calm["replicas_placed"]) == (1, 1)
        assert never["rate_per_s"] == 0 and never["spill_share"] is None and never["adapter_loaded_on"] == []
        assert {p["kind"] for p in report["problems"]} == {"dead_worker", "replicas_short"}


async def test_terminal_view_lists_problems_first_in_words(ring_settings, queue, tmp_path):
    jobs = training_jobs(queue, tmp_path)
    async with fleet(ring_settings):
        code, out, err = await status("--redis", ring_settings.redis_url, "--prefix", ring_settings.prefix,
                                      "--queue-prefix", queue.prefix, "--probe-timeout", "0.3",
                                      "--queue-age-limit", "0.005")
    assert code == 1, err
    problems = [line for line in out.splitlines() if line.startswith("PROBLEM ")]
    assert len(problems) == 3, out
    assert "worker gpu-dead is dead" in problems[0] and "still listed" in problems[0]
    assert f"voice '{WIDE}' wants 6 replicas but 3 are placed" in problems[1]
    assert f"training job {jobs.queued}" in problems[2] and "over the" in problems[2]
    assert out.index("PROBLEM") < out.index("workers") < out.index("hottest voices") < out.index("training queue")
    voices = out[out.index("hottest voices"):out.index("training queue")]
    assert voices.index(BURST) < voices.index(WIDE)  # the burst ranks first
    burst = next(line for line in voices.splitlines() if BURST in line)
    assert "gpu-1, gpu-2" in burst and "10%" in burst and "20%" in burst  # adapter on, spilled, refused
    assert "42.5% step 3/10" in out and "speech_amount" in out
    assert "gateways gw-a:8000 (" in out and "gw-gone:8000 (silent " in out and "agent servers agent-a:1 (" in out


async def test_a_healthy_fleet_exits_0_and_a_missing_redis_75(ring_settings, queue):
    async with RingStore(ring_settings) as store, Heartbeat(store, info("gpu-1", free_port()), load=lambda: 1):
        code, out, err = await status("--redis", ring_settings.redis_url, "--prefix", ring_settings.prefix,
                                      "--queue-prefix", queue.prefix, "--probe-timeout", "0")
    assert code == 0, err
    assert "no problems" in out and "PROBLEM" not in out
    code, _out, err = await status("--redis", f"redis://127.0.0.1:{free_port()}/0", "--json")
    assert code == 75 and "unreachable" in err


def test_status_is_a_command_and_its_modules_stay_light():
    code = ("import sys, voicering.status; "
            "early = [m for m in ('redis', 'rich', 'hashring.store') if m in sys.modules]; "
            "import hashring.fleet_view as f, lora_training.queue_view as q; "
            "assert all(hasattr(f, n) for n in f.__all__) and all(hasattr(q, n) for n in q.__all__); "
            "heavy = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; print(early, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "[] []", out.stdout + out.stderr
    listed = subprocess.run([sys.executable, "-m", "voicering", "--help"], capture_output=True, text=True,
                            timeout=120, cwd=REPO, env=_env())
    assert "status" in listed.stdout and "at a glance" in listed.stdout


def test_counters_are_read_from_a_real_workers_metrics_and_rated_between_samples():
    metrics = WorkerMetrics()
    metrics.rejected.labels("busy").inc(3)
    metrics.rejected.labels("share").inc(2)
    metrics.rejected.labels("slow_consumer").inc(7)  # a cut connection, not a refused start
    metrics.proxied.labels("completed").inc(4)
    metrics.proxied.labels("worker_timeout").inc(1)
    refusals, relays = counter_totals(metrics.render().decode())
    assert (refusals, relays) == (5.0, 5.0)

    before = Probe(100.0, {}, refusals, relays, None)
    metrics.rejected.labels("connection_limit").inc(4)
    metrics.proxied.labels("completed").inc(2)
    after = Probe(102.0, {}, *counter_totals(metrics.render().decode()), None)
    rates = rates_between(before, after)
    assert (rates.refusals_per_s, rates.relays_per_s) == (2.0, 1.0)
    assert rates_between(None, after).refusals_per_s is None
    restarted = Probe(104.0, {}, 0.0, 0.0, None)  # the worker restarted: its counters went back
    assert rates_between(after, restarted).relays_per_s is None
    unanswered = Probe(106.0, None, None, None, "did not answer")
    assert rates_between(after, unanswered).refusals_per_s is None


async def test_watch_probes_the_real_worker_twice_and_rates_its_counters(worker, redis_server):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "voicering", "status", "--redis", redis_server.url, "--prefix", CLUSTER_PREFIX,
        "--json", "--watch", "--interval", "0.5", "--probe-timeout", "5", cwd=REPO, env=_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        samples = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)) for _ in range(2)]
    finally:
        proc.send_signal(signal.SIGINT)  # it ends between samples: within one read's bounded time
        try:
            async with asyncio.timeout(30):
                _out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            _out, err = await proc.communicate()
            pytest.fail(f"voicering status --watch did not end within 30 s of Ctrl-C; its stderr:\n{err.decode()[-3000:]}")
    first, second = (by_id(s["workers"], "id")["worker-a"] for s in samples)
    assert first["state"] == second["state"] == "serving"
    assert first["health"]["status"] == "ok" and first["health"]["worker_id"] == "worker-a"
    assert isinstance(first["adapters_resident"], int) and first["probe_error"] is None, first
    # the real worker lists its resident adapters in its heartbeats (an empty list before any clone spoke)
    assert isinstance(first["adapters"], list) and first["adapters_resident"] == len(first["adapters"])
    assert first["refusals_total"] >= 0 and first["relays_total"] >= 0
    assert first["refusals_per_s"] is None  # one sample so far
    assert second["refusals_per_s"] >= 0 and second["relays_per_s"] >= 0  # two samples: rates
    assert proc.returncode == (1 if samples[-1]["problems"] else 0), err
