"""`voicering ring ...` (the hashring Typer app) against a real Redis, plus the bench wiring."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from typer.testing import CliRunner

from hashring.cli import app
from hashring.ports import free_port
from hashring.records import WorkerInfo
from hashring.settings import RingSettings
from hashring.store import RingStore

pytestmark = pytest.mark.timeout(120)
CLI_DB = 7  # the CLI uses the default key prefix, so it gets a database of its own


@pytest.fixture
def cli_url(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + f"/{CLI_DB}"
    redis.Redis.from_url(url).flushdb()
    return url


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env or {"VOICERING_REDIS_URL": ""})


def register(url: str, *ids: str) -> None:
    async def work() -> None:
        async with RingStore(RingSettings(redis_url=url)) as store:
            for wid in ids:
                await store.register(WorkerInfo(wid, f"ws://{wid}.local:8000", f"http://{wid}.local:9000", capacity=8))

    asyncio.run(work())


def test_simulate_needs_no_redis():
    result = invoke("simulate", "--workers", "16", "--voices", "2000", "--trials", "2", "--vnodes", "512", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["workers"] == 16 and report["moved_foreign"] == 0
    assert report["share_max_over_mean"] < 1.2
    text = invoke("simulate", "--workers", "8", "--voices", "500", "--trials", "1", "--vnodes", "64")
    assert text.exit_code == 0 and "voices moved when one worker leaves" in text.stdout


def test_status_where_scale_drain_round_trip(cli_url):
    assert "no workers registered" in invoke("status", "--redis", cli_url).stdout
    register(cli_url, "w1", "w2", "w3")

    status = json.loads(invoke("status", "--redis", cli_url, "--json").stdout)
    assert status["in_ring"] == 3 and status["epoch"] == 3
    assert {w["id"]: w["status"] for w in status["workers"]} == {"w1": "live", "w2": "live", "w3": "live"}
    assert sum(w["ring_share"] for w in status["workers"]) == pytest.approx(1.0, abs=1e-3)
    table = invoke("status", "--redis", cli_url).stdout
    assert "ring epoch 3: 3 of 3 workers" in table and "ws://w2.local:8000" in table

    where = json.loads(invoke("where", "tara", "--redis", cli_url, "--json").stdout)
    assert where["replicas"] == 1 and where["next_request"] == where["owners"][0]

    assert invoke("scale", "tara", "--replicas", "2", "--redis", cli_url).exit_code == 0
    where = json.loads(invoke("where", "tara", "--redis", cli_url, "--json").stdout)
    assert where["replicas"] == 2 and where["operator_replicas"] == 2
    assert "tara" in invoke("where", "tara", "--redis", cli_url).stdout

    owner = where["owners"][0]
    drained = invoke("drain", owner, "--redis", cli_url)
    assert drained.exit_code == 0 and "draining" in drained.stdout
    assert "already" in invoke("drain", owner, "--redis", cli_url).stdout
    status = json.loads(invoke("status", "--redis", cli_url, "--json").stdout)
    assert status["in_ring"] == 2 and owner not in json.loads(
        invoke("where", "tara", "--redis", cli_url, "--json").stdout)["owners"]
    assert invoke("undrain", owner, "--redis", cli_url).exit_code == 0
    assert json.loads(invoke("status", "--redis", cli_url, "--json").stdout)["in_ring"] == 3

    assert invoke("scale", "tara", "--reset", "--redis", cli_url).exit_code == 0
    assert json.loads(invoke("where", "tara", "--redis", cli_url, "--json").stdout)["operator_replicas"] is None

    # a preStop hook's drain is the worker's own: a worker that comes back without having left is in again
    assert invoke("drain", "w3", "--shutdown", "--redis", cli_url).exit_code == 0
    assert json.loads(invoke("status", "--redis", cli_url, "--json").stdout)["in_ring"] == 2
    register(cli_url, "w3")  # it was killed mid-drain and restarted under the same id
    assert json.loads(invoke("status", "--redis", cli_url, "--json").stdout)["in_ring"] == 3
    assert invoke("drain", "w3", "--redis", cli_url).exit_code == 0  # an operator's drain outlives a restart
    register(cli_url, "w3")
    assert json.loads(invoke("status", "--redis", cli_url, "--json").stdout)["in_ring"] == 2


def test_bad_input_gets_clear_errors(cli_url):
    register(cli_url, "w1", "w2")
    unknown = invoke("drain", "nope", "--redis", cli_url)
    assert unknown.exit_code == 1 and "'nope' is not registered (registered: w1, w2)" in unknown.stderr

    bad_id = invoke("drain", "has space", "--redis", cli_url)
    assert bad_id.exit_code == 1 and "not usable" in bad_id.stderr

    for bad in ("0", "-3", "65"):
        result = invoke("scale", "tara", "--replicas", bad, "--redis", cli_url)
        assert result.exit_code == 1 and "replicas must be a whole number from 1 to 64" in result.stderr

    over = invoke("scale", "tara", "--replicas", "5", "--redis", cli_url)
    assert over.exit_code == 0 and "only 2 workers are in the ring" in over.stderr
    where = invoke("where", "tara", "--redis", cli_url, "--json")
    assert json.loads(where.stdout)["replicas"] == 2 and "asks for 5 replicas" in where.stderr

    assert invoke("scale", "tara", "--redis", cli_url).exit_code == 2  # neither --replicas nor --reset

    odd = "名前 {x}*:\t🎤"
    assert invoke("scale", odd, "--replicas", "2", "--redis", cli_url).exit_code == 0
    assert len(json.loads(invoke("where", odd, "--redis", cli_url, "--json").stdout)["owners"]) == 2
    too_long = invoke("where", "x" * 300, "--redis", cli_url)
    assert too_long.exit_code == 1 and "256" in too_long.stderr


def test_redis_url_comes_from_the_environment_and_outages_exit_75(cli_url):
    register(cli_url, "w1")
    via_env = invoke("status", "--json", env={"VOICERING_REDIS_URL": cli_url})
    assert via_env.exit_code == 0 and json.loads(via_env.stdout)["in_ring"] == 1

    closed_port = free_port()  # a port nothing listens on
    dead = f"redis://:hunter2@127.0.0.1:{closed_port}/0"
    result = invoke("status", "--redis", dead)
    assert result.exit_code == 75 and "unreachable" in result.stderr
    assert "hunter2" not in result.output


def test_empty_ring_where_is_a_temporary_error(cli_url):
    result = invoke("where", "tara", "--redis", cli_url)
    assert result.exit_code == 75 and "no worker" in result.stderr


def test_bench_ring_is_wired_above_hashring_and_prints_one_json_object(monkeypatch):
    import bench.ring
    from voicering.cli import app as root

    monkeypatch.setattr(bench.ring, "run", lambda: {"lookup_ns": 1.0, "lookup_speedup": 4.0})
    result = CliRunner().invoke(root, ["bench", "ring", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"lookup_ns": 1.0, "lookup_speedup": 4.0}
    assert "bench" not in {c.name for c in app.registered_commands}  # hashring's own app knows no bench


def test_bench_figures_small():
    from bench.ring import SCENARIOS, run

    figures = run(workers=8, voices=400, requests=4000, trials=2, rounds=1)
    for key in ("lookup_ns", "uhashring_lookup_ns", "lookup_speedup", "share_max_over_mean", "voices_max_over_mean",
                "moved_fraction_on_remove", "moved_fraction_on_add", "moved_foreign"):
        assert key in figures
    assert figures["moved_foreign"] == 0
    for name in SCENARIOS:
        assert 1.0 <= figures[f"route_{name}_peak_over_mean_p50"] <= figures[f"route_{name}_peak_over_mean_max"]
        assert 0.0 <= figures[f"route_{name}_spill_fraction"] <= 1.0
    for name in SCENARIOS:
        assert figures[f"route_{name}_refusals_per_request"] >= 0
        assert 0 <= figures[f"route_{name}_insisted_per_request"] <= figures[f"route_{name}_refusals_per_request"]
        assert figures[f"route_{name}_unplaced_fraction"] == 0  # capacity 32 at a mean of 16: someone takes it
        assert 0 < figures[f"route_{name}_adapter_loads_per_1000"] <= 1000
    # Workers that refuse above their share of the fleet (the built rule) cut the peak the router
    # rule alone leaves (workers refusing only at capacity), at the price of some refusals.
    assert figures["route_reported+own_peak_over_mean_p99"] < figures["route_capacity-only_peak_over_mean_p99"]
    assert figures["route_reported+own_refusals_per_request"] > figures["route_capacity-only_refusals_per_request"]
    # The rule before issue #20 (arg-min on stale loads, replicas capped at 8) herds; two random
    # choices among owners sized by load share do not, and stay on the owners.
    assert figures["route_legacy_peak_over_mean_p99"] > figures["route_reported+own_peak_over_mean_p99"]
    assert figures["route_reported+own_spill_fraction"] < figures["route_legacy_spill_fraction"]

def test_the_modelled_share_is_the_workers_rule():
    from bench.ring import share_limit

    def limit(in_flight, others, workers, *, capacity=32, admit_factor=1.35, insist=False, share_floor=0.0):
        return share_limit(in_flight, others, workers, capacity=capacity, admit_factor=admit_factor, insist=insist,
                           share_floor=share_floor)

    # mean = (others 10 + own 4 + the start being decided 1) / 5 = 3; ceil(1.35 × 3) = 5 (4.05)
    assert limit(4, 10, 5) == 5
    assert limit(0, 0, 1) == 2  # a lone worker admits
    assert limit(1, 1, 2) == 3  # 1.35 × 1.5 = 2.025
    assert limit(0, 2, 2, admit_factor=1.5) == 3  # 1.5 × 1.5 = 2.25: no float drift
    assert limit(9, 0, 4, capacity=8) == 4
    assert limit(9, 0, 4, capacity=8, insist=True) == 8  # insist: only the capacity
    assert limit(30, 3000, 10, capacity=8) == 8
    # the share floor (issue 33): half of 32 is 16, so a stale idle view refuses nothing below it
    assert limit(4, 0, 2, share_floor=0.5) == 16 and limit(15, 0, 2, share_floor=0.5) == 16
    assert limit(16, 0, 2, share_floor=0.5) == 16  # at the floor the share rules again: 17 > 16, refused
    assert limit(20, 40, 2, share_floor=0.5) == 32  # ceil(1.35 × 30.5) = 42 > capacity


def test_the_modelled_share_matches_the_worker_s_own_function():
    """bench/ring.py mirrors gpu_worker.admission.fleet_share on plain numbers (one view per decision
    would make the run far slower); both must agree wherever they are asked."""
    from bench.ring import share_limit
    from gpu_worker.admission import fleet_share
    from hashring.records import RingView, Snapshot, WorkerInfo
    from hashring.share import share_floor_streams

    ids = [f"w{i}" for i in range(4)]
    for reported in ([0, 0, 0, 0], [3, 1, 4, 1], [7, 7, 0, 2], [12, 0, 0, 0]):
        snap = Snapshot(1, 100.0, {w: WorkerInfo(w, f"ws://{w}", f"ws://{w}") for w in ids}, dict.fromkeys(ids, 100.0),
                        frozenset(ids), frozenset(), dict(zip(ids, reported, strict=True)), {}, {})
        view = RingView.from_snapshot(snap, vnodes=16)
        for in_flight in range(10):
            for share_floor in (0.0, 0.5):
                floor = share_floor_streams(8, share_floor)
                share, _mean = fleet_share(view, "w0", in_flight, 1.35, floor)
                assert min(8, share) == share_limit(in_flight, sum(reported[1:]), 4, capacity=8, admit_factor=1.35,
                                                    insist=False, share_floor=share_floor), (reported, in_flight)
