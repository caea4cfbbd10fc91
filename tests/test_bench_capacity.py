"""bench/capacity.py and bench/playout.py: the underrun accounting on synthetic arrival times, the
level plan and figures, and a short CPU ramp through a real worker process and real websocket
clients that must report every key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.capacity import (
    BASE_VOICE,
    TARGETS,
    CapacityOptions,
    StreamResult,
    bucket_bound,
    overall,
    plan_level,
    summarise_level,
)
from bench.playout import chunk_seconds, playout
from tests.fixtures.fleet import Command, Done

FRAME = 2048 / 24000


# -- playout: synthetic arrivals ------------------------------------------------------------------

def test_a_stream_arriving_at_its_own_pace_never_underruns():
    arrivals = [0.5 + i * FRAME for i in range(40)]  # each chunk exactly one chunk's audio after the last
    assert playout(arrivals, [FRAME] * 40).underruns == 0


def test_a_chunk_later_than_the_audio_before_it_is_an_underrun():
    played = playout([0.0, 0.05, 0.4], [0.1, 0.1, 0.1])  # due at 0.1 + 0.1 + 0.1 = 0.3, arrives at 0.4
    assert (played.underruns, round(played.stall_s, 6)) == (1, 0.1)
    assert not played.realtime


def test_the_jitter_buffer_absorbs_a_late_chunk_up_to_100_ms():
    arrivals, durations = [0.0, FRAME + 0.095], [FRAME, FRAME]
    assert playout(arrivals, durations).underruns == 0  # 95 ms late: inside the buffer
    assert playout(arrivals, durations, buffer_s=0.0).underruns == 1
    assert playout([0.0, FRAME + 0.105], durations).underruns == 1  # 105 ms late: a gap


def test_one_late_chunk_is_one_stall_not_a_cascade():
    played = playout([0.0, 0.5, 0.55, 0.62], [0.1, 0.1, 0.1, 0.1])  # playback resumes at 0.5
    assert played.underruns == 1 and round(played.stall_s, 6) == 0.3


def test_bursts_ahead_of_time_are_fine_and_lengths_must_match():
    assert playout([1.0] * 10, [FRAME] * 10).underruns == 0
    assert playout([], []).chunks == 0
    with pytest.raises(ValueError):
        playout([0.0], [])
    assert chunk_seconds(2048 * 2) == pytest.approx(FRAME)


# -- plan and figures -----------------------------------------------------------------------------

def test_level_plan_mixes_base_streams_into_a_round_robin_pool():
    pool = ["a", "b", "c"]
    plan = plan_level(8, pool, base_every=4, offset=1)
    assert plan == [("b", True), ("c", True), ("a", True), (BASE_VOICE, False),
                    ("b", True), ("c", True), ("a", True), (BASE_VOICE, False)]
    assert all(lora for _, lora in plan_level(5, pool, base_every=0))


def _stream(ttfb: float, late: bool = False, error: str | None = None) -> StreamResult:
    arrivals = [0.0, FRAME + (0.3 if late else 0.0)]
    return StreamResult("v", True, ttfb_ms=ttfb, arrivals=arrivals, durations=[FRAME, FRAME], tokens=50,
                        wall_s=1.0, error=error)


def test_level_figures_count_errors_as_not_real_time():
    level = summarise_level([_stream(100), _stream(200), _stream(300, late=True), _stream(0, error="busy")], 2.0)
    assert level["completed"] == 3 and level["errors"] == {"busy": 1}
    assert level["underrun_free_fraction"] == 0.5  # 2 of 4: the late one and the failed one are not
    assert level["ttfb_ms"]["p50"] == 200.0 and level["ttfb_ms"]["max"] == 300.0
    assert level["tokens_per_s_per_stream"]["mean"] == 50.0 and level["tokens_per_s_total"] == 75.0
    assert level["underruns"] == 1 and level["stall_ms_max"] == pytest.approx(200.0)  # 300 ms late - 100 ms buffer


def test_max_realtime_streams_is_the_largest_level_at_99_percent():
    def level(streams: int, share: float, errors: dict | None = None) -> dict:
        return {"streams": streams, "underrun_free_fraction": share, "errors": errors or {},
                "ttfb_ms": {"p50": float(streams)}, "invalid_tokens": 0}

    levels = [level(1, 1.0), level(8, 1.0), level(16, 0.99), level(32, 0.98), level(64, 1.0, {"busy": 1})]
    figures = overall(levels)
    assert figures["max_realtime_streams"] == 16
    assert figures["ttfb_ms_p50_at_64"] == 64.0
    assert overall([level(1, 0.5)]) == {"max_realtime_streams": 0, "ttfb_ms_p50_at_64": None, "invalid_tokens": 0}


def test_batch_quantiles_are_bucket_edges():
    buckets = [(1.0, 2.0), (2.0, 2.0), (4.0, 9.0), (8.0, 10.0), (float("inf"), 10.0)]
    assert bucket_bound(buckets, 0.5) == 4.0 and bucket_bound(buckets, 0.1) == 1.0
    assert bucket_bound([(1.0, 0.0), (float("inf"), 3.0)], 0.5) is None  # past the largest bucket
    assert bucket_bound([], 0.5) is None


def test_device_defaults():
    gpu, cpu = CapacityOptions.for_device(True), CapacityOptions.for_device(False, quantization="auto")
    assert gpu.quantization == "fp8" and gpu.pool > gpu.max_loras and 256 in gpu.levels
    assert cpu.quantization == "none" and cpu.pool > cpu.max_loras and cpu.levels == (1, 2, 4)


# -- the real thing, short ------------------------------------------------------------------------

# `voicering bench capacity` as `make bench` runs it, short (started ahead of this module by the
# suite's fleet, tests/fixtures/fleet.py, its worker counted)
RAMP = Command("capacity", (sys.executable, "-m", "voicering", "bench", "capacity", "--json", "--out",
                            "{out}/capacity.json", "--levels", "1,4", "--frames", "4", "--ratio-rounds", "1",
                            "--stagger-s", "0.2"), timeout_s=580, workers=1)


@pytest.fixture(scope="module")
def ramp(fleet, request):
    def judged(done: Done) -> tuple[dict, Path]:
        assert done.returncode == 0, f"the capacity bench exited {done.returncode}; its stderr ends:\n{done.stderr[-3000:]}"
        figures = json.loads(done.stdout)
        # every stream of every level completed: a run started ahead and starved may have timed some out
        assert all(lv["completed"] == lv["streams"] and not lv["errors"] for lv in figures["levels"]), figures["levels"]
        return figures, done.out / "capacity.json"

    return fleet.result(request, RAMP, judged)


@pytest.mark.ahead(RAMP)
def test_cpu_ramp_reports_every_key(ramp):
    figures, out = ramp
    for key in ("max_realtime_streams", "ttfb_ms_p50_at_64", "lora_base_ratio_batch_10", "device", "quantization",
                "kv_cache_dtype", "levels", "targets_met", "plot"):
        assert key in figures, key
    assert figures["device"].startswith("cpu") and figures["label"].startswith("CPU")
    assert (figures["quantization"], figures["kv_cache_dtype"]) == ("none", "bf16")
    assert figures["ttfb_ms_p50_at_64"] is None  # no level of 64 on CPU
    assert 0 <= figures["max_realtime_streams"] <= 4
    # measured; its size is the bench's target to judge, not this run's (a loaded 2-core box: 0.28 once)
    assert figures["lora_base_ratio_batch_10"] > 0
    assert set(figures["targets_met"]) == set(TARGETS)
    assert figures["targets_met"]["max_realtime_streams"] is False  # a GPU target: fails on CPU
    assert figures["targets_met"]["invalid_tokens"] and figures["targets_met"]["pool_exceeds_max_loras"]
    assert json.loads(out.read_text())["levels"] == figures["levels"]
    assert Path(figures["plot"]).stat().st_size > 10_000


@pytest.mark.ahead(RAMP)
def test_cpu_ramp_levels_are_sane(ramp):
    figures, _ = ramp
    levels = figures["levels"]
    assert [lv["streams"] for lv in levels] == [1, 4]
    for lv in levels:
        assert lv["completed"] == lv["streams"] and not lv["errors"]
        ttfb = lv["ttfb_ms"]
        assert 0 < ttfb["p50"] <= ttfb["p90"] <= ttfb["p99"] <= ttfb["max"] < 60_000
        assert lv["tokens_per_s_per_stream"]["mean"] > 0 and lv["tokens_per_s_total"] > 0
        assert 14 <= lv["tokens_mean"] <= 29  # at most the cap (4 frames + 1)
        assert 0.0 <= lv["underrun_free_fraction"] <= 1.0
        assert lv["codec"]["calls"] >= lv["streams"] and lv["codec"]["batch_mean"] == 1.0  # CPU: one by one
        assert lv["codec"]["decode_ms_mean"] > 0
    assert levels[1]["base_streams"] == 1 and levels[1]["distinct_voices"] == 4  # 3 pool voices + base
    assert sum(lv["adapter_loads"] for lv in levels) >= 1  # the pool (4) is larger than the 2 slots


def test_cli_passes_the_ramp_and_refuses_bad_levels(monkeypatch, tmp_path):
    import bench.capacity
    from typer.testing import CliRunner

    from voicering.cli import app as root

    seen = {}
    monkeypatch.setattr(bench.capacity, "run", lambda **kwargs: seen.update(kwargs) or {"max_realtime_streams": 0})
    result = CliRunner().invoke(root, ["bench", "capacity", "--json", "--levels", "1,8,16", "--weights", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"max_realtime_streams": 0}
    assert seen["levels"] == (1, 8, 16) and seen["model"] == str(tmp_path / "orpheus")
    assert seen["voices_dir"] == str(tmp_path / "voices") and seen["quantization"] is None  # device default
    for bad in ("8,1", "1,x", "0,4"):
        assert CliRunner().invoke(root, ["bench", "capacity", "--levels", bad]).exit_code != 0, bad
