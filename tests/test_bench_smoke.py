"""Every `make bench` bench runs its real entry point in the suite, small (issue #34 item 8): a bench
that no longer runs fails here, not on the day someone next runs `make bench`.

Each smoke runs the bench's own command (`voicering bench NAME --json ...`, a subprocess as
`make bench` runs it: stdout must be one JSON object) or, where noted, the function that command
calls with every stage, and checks that the figures are all there; the figures themselves are not
judged (small sizes, a loaded 2-core box). Where each bench's smoke lives:

    codec     here                     `voicering bench codec --json --seconds 1`
    ring      tests/hashring/test_ring_cli.py   bench.ring.run, 8 workers; the command's wiring
    silence   here                     `voicering bench silence --json --seconds 3`
    worker    here                     `voicering bench worker --json --quick` (its own engine)
    train     here                     `voicering bench train --json --quick` (20 sentences, 3 steps)
    proxy     here                     `voicering bench proxy --json --quick` (two workers of its own)
    gateway   here                     `voicering bench gateway --json --quick --worker ...` (a gateway of its own)
    livekit   here                     `voicering bench livekit --json --quick --worker ...`
    pipecat   here                     `voicering bench pipecat --json --quick --worker ...` (a gateway of its own)
    capacity  tests/test_bench_capacity.py      `voicering bench capacity --json --levels 1,4 ...` (a worker of its own)
    fleet     tests/gpu_worker/test_cluster.py  bench.fleet.measure on that module's three workers
    burst     tests/test_bench_burst.py         a small burst on the session worker and gateway
    clone     tests/test_bench_clone.py         `voicering bench clone --json --quick`
    text      here                     `voicering bench text --json --rounds 1` (peers absent here are reported so)
    alignment here                     `voicering bench alignment --json --limit 8 --rounds 1`
    continuity here                    `voicering bench continuity --json --quick` (its own engine)
    chunking  here                     `voicering bench chunking --json` (full size: pure text, a second)

The gateway, livekit and pipecat smokes measure the session worker in its ring (`--worker URL
--redis URL --ring-prefix P`, `bench.workers.RunningRing`) instead of starting one each (~25 s a
start); the worker `make bench` starts for them is `bench.workers.start_stand_in_worker`, which the
proxy bench's smoke starts twice. The smokes that need nothing of the session's are marked
`ahead`: the suite's fleet may start their command in the background, at the lowest priority,
while earlier modules run, one at a time and within the suite's three workers (its `workers`:
the proxy bench's two, the worker and continuity benches' engines), and the test judges its output
(`fleet.result`, tests/fixtures/fleet.py). `--quick` is each
bench's smoke size: every stage runs, shorter and with fewer warm-ups; the in-process engines
(worker, continuity) follow VOICERING_WORKER_SEPARATE_MODEL_PROCESS as the workers do (conftest).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.fleet import Command, Done
from tests.fixtures.models import CLUSTER_PREFIX

REPO = Path(__file__).resolve().parents[1]
# bench -> where its smoke is (this module's tests are named test_bench_<name>_runs...)
SMOKED = {
    "codec": "here", "ring": "tests/hashring/test_ring_cli.py", "silence": "here", "worker": "here", "train": "here",
    "proxy": "here", "gateway": "here", "livekit": "here", "pipecat": "here", "capacity": "tests/test_bench_capacity.py",
    "fleet": "tests/gpu_worker/test_cluster.py", "burst": "tests/test_bench_burst.py", "clone": "tests/test_bench_clone.py",
    "text": "here", "alignment": "here", "continuity": "here", "chunking": "here",
}


def command(name: str, *args: str, timeout_s: float, env: dict[str, str] | None = None, workers: int = 0) -> Command:
    """`voicering bench NAME --json ARGS` as `make bench` runs it (``workers``: those it starts)."""
    return Command(name, (sys.executable, "-m", "voicering", "bench", name, "--json", *args), timeout_s, env or {},
                   workers)


def bench(fleet, request, run: Command, whole: Callable[[dict], object] = lambda figures: True) -> dict:
    """``run``'s stdout parsed as one JSON object (the run started ahead of the test if it is marked
    `ahead`, else now; in its own process group, killed whole if it overruns: it may have started
    workers). ``whole``: what a run whose clocks did not run out must show (a run started ahead
    that shows otherwise is run again in the foreground, `Fleet.result`)."""
    def judged(done: Done) -> dict:
        figures = figures_of(run, done)
        assert whole(figures), f"`voicering bench {run.name}` came back incomplete: {json.dumps(figures)[:2000]}"
        return figures

    return fleet.result(request, run, judged)


def figures_of(run: Command, done: Done) -> dict:
    assert done.returncode == 0, f"`voicering bench {run.name}` exited {done.returncode}; its stderr ends:\n{done.stderr[-3000:]}"
    try:
        return json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"`voicering bench {run.name} --json` printed more than one JSON object:\n{done.stdout[:2000]}")


CODEC = command("codec", "--seconds", "1", timeout_s=170)
SILENCE = command("silence", "--seconds", "3", timeout_s=170)
# not docs/: a smoke run must not replace the published plot
WORKER = command("worker", "--quick", timeout_s=580, env={"VOICERING_BENCH_PLOT": "{out}/worker.png"}, workers=1)
TRAIN = command("train", "--quick", timeout_s=580)
PROXY = command("proxy", "--quick", timeout_s=580, workers=2)  # two workers of its own: A relays, B is killed
ALIGNMENT = command("alignment", "--limit", "8", "--rounds", "1", timeout_s=280)
CONTINUITY = command("continuity", "--quick", timeout_s=280, workers=1)
CHUNKING = command("chunking", timeout_s=100)
TEXT = command("text", "--rounds", "1", timeout_s=280)


def session_ring(worker, redis_server) -> list[str]:
    """The options that point a serving bench at the session worker in its ring."""
    return ["--worker", worker.url, "--redis", redis_server.url, "--ring-prefix", CLUSTER_PREFIX]


def has_every(figures: dict, *keys: str) -> None:
    missing = [k for k in keys if k not in figures]
    assert not missing, f"figures missing: {missing}; got {sorted(figures)}"


def test_a_serving_bench_pointed_at_a_worker_needs_its_ring_too():
    from typer.testing import CliRunner

    from bench.cli import app

    for given in (["--worker", "ws://127.0.0.1:9"], ["--worker", "ws://127.0.0.1:9", "--redis", "redis://127.0.0.1:9"]):
        result = CliRunner().invoke(app, ["gateway", "--quick", *given])
        assert result.exit_code == 2 and "go together" in result.output, result.output


def test_every_make_bench_bench_has_a_smoke_run():
    recipe = re.search(r"^bench:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    assert recipe, "the Makefile has no bench target"
    benches = re.findall(r"voicering bench (\S+)", recipe[1])
    assert benches and set(benches) == set(SMOKED), "a bench of `make bench` has no smoke run (list it in SMOKED)"
    for name, where in SMOKED.items():
        if where != "here":
            assert (REPO / where).is_file(), where
        else:
            assert any(n.startswith(f"test_bench_{name}_") for n in globals()), name


@pytest.mark.timeout(180)
@pytest.mark.ahead(CODEC)
def test_bench_codec_runs(fleet, request):
    from bench.codec import TARGETS

    figures = bench(fleet, request, CODEC)
    has_every(figures, *TARGETS, "decode_s_per_audio_s", "reference_decode_s_per_audio_s", "targets_met",
              "first_chunk_snr_db", "first_audio")
    assert set(figures["targets_met"]) == set(TARGETS)
    assert figures["frames_in"] == 12 and figures["frames_out_equals_frames_in"]
    # sanity floors, far below the figures (~19 dB for a frame decoded alone): a broken decode is ~0 dB
    assert figures["first_chunk_snr_db"] > 10
    first_audio = figures["first_audio"]
    rows = {row["first_audio_frames"]: row for row in first_audio["schedules"]}
    assert set(rows) == {1, 2} and first_audio["default_frames"] in rows
    assert first_audio["utterance_frames"][0] == 12  # the bench's own utterance first, then shorter ones
    assert rows[first_audio["default_frames"]]["first_chunk_snr_db"][0] == figures["first_chunk_snr_db"]
    for frames, row in rows.items():
        assert row["tokens_before_first_audio"] == 7 * frames
        assert row["frames_out_equals_frames_in"] and row["later_audio_equals_default"]
        assert len(row["snr_db_vs_offline"]) == len(first_audio["utterance_frames"])
        assert min(row["first_chunk_snr_db"]) > 10 and min(row["snr_db_vs_offline"]) > 15


@pytest.mark.timeout(180)
@pytest.mark.ahead(SILENCE)
def test_bench_silence_runs(fleet, request):
    figures = bench(fleet, request, SILENCE)
    has_every(figures, "energy_clean_ms_per_audio_s", "vad_clean_lead_error_ms_max", "vad_noise45_lead_error_ms_max",
              "stream_energy_push_us_holding_mean", "stream_vad_release_after_speech_ms_mean",
              "peer_silero_timestamps_lead_error_ms_mean")
    assert figures["clips"] >= 1 and figures["audio_seconds"] >= 3


@pytest.mark.timeout(600)
@pytest.mark.ahead(WORKER)
def test_bench_worker_runs(fleet, request):
    from bench.worker import TARGETS

    figures, out = fleet.result(request, WORKER, lambda done: (figures_of(WORKER, done), done.out))
    has_every(figures, *TARGETS, "tokens_per_s_per_stream", "ttfb_ms_p50", "sampler_ms_per_step", "targets_met")
    assert set(figures["targets_met"]) == set(TARGETS) and figures["config"]["rounds"] == 1
    assert figures["invalid_tokens"] == 0 and figures["voices_served"] == TARGETS["voices_served"][1]
    assert figures["plot"] == str(out / "worker.png")


@pytest.mark.timeout(600)
@pytest.mark.ahead(TRAIN)
def test_bench_train_runs(fleet, request):
    figures = bench(fleet, request, TRAIN)
    has_every(figures, "preprocess_s_per_audio_min", "encode_x_realtime", "train_steps_per_s",
              "head_silence_after_ms_p90", "head_silence_after_vad_ms_p90", "targets_met")
    assert figures["uploads"] == 20 and figures["clips"] > 0 and figures["train_steps"] == 3
    assert set(figures["targets_met"]) == {"head_silence_after_ms_p90", "head_silence_after_ms_min",
                                           "every_clip_measured"}


@pytest.mark.timeout(600)
@pytest.mark.ahead(PROXY)
def test_bench_proxy_runs(fleet, request):
    from bench.proxy import TARGETS

    figures = bench(fleet, request, PROXY, lambda f: f.get("served_as_expected") and f.get("failover_s") is not None)
    has_every(figures, *TARGETS, "relay_added_ms_p50", "failover_s", "endings", "targets_met")
    assert set(figures["targets_met"]) == set(TARGETS) and figures["config"]["rounds"] == 1
    assert figures["served_as_expected"] and figures["failover_s"] is not None


@pytest.mark.timeout(600)
def test_bench_gateway_runs(worker, redis_server, fleet, request):
    from bench.gateway import TARGETS

    figures = bench(fleet, request, command("gateway", "--quick", *session_ring(worker, redis_server), timeout_s=580))
    assert figures["config"]["worker"].startswith(f"the running worker at {worker.url}")  # none of its own
    has_every(figures, *TARGETS, "direct_ttfb_ms_p50", "ws_added_ms_p50", "auth_us_p50", "targets_met")
    assert set(figures["targets_met"]) == set(TARGETS) and figures["config"]["rounds"] == 1
    assert figures["concurrent"] == 2 and figures["concurrent_ok"] + figures["concurrent_errors"] == 2


@pytest.mark.timeout(600)
def test_bench_livekit_runs(worker, redis_server, fleet, request):
    from bench.livekit import TARGETS

    figures = bench(fleet, request, command("livekit", "--quick", *session_ring(worker, redis_server), timeout_s=580))
    assert figures["config"]["worker"].startswith(f"the running worker at {worker.url}")  # none of its own
    has_every(figures, *TARGETS, "plugin_ttfb_ms_p50", "direct_ttfb_ms_p50", "targets_met")
    assert set(figures["targets_met"]) == set(TARGETS)
    assert figures["config"]["turns"] == 10 and figures["failed_turns"] == 0


@pytest.mark.timeout(600)
def test_bench_pipecat_runs(worker, redis_server, fleet, request):
    from bench.pipecat import TARGETS

    figures = bench(fleet, request, command("pipecat", "--quick", *session_ring(worker, redis_server), timeout_s=580))
    assert figures["config"]["worker"].startswith(f"the running worker at {worker.url}")  # none of its own
    has_every(figures, *TARGETS, "service_ttfb_ms_p50", "raw_ttfb_ms_p50", "paired_ttfb_diff_ms_p50", "targets_met")
    assert set(figures["targets_met"]) == set(TARGETS)
    assert figures["config"]["turns"] == 10 and figures["failed_turns"] == 0 and figures["sockets_per_service"] == 1


@pytest.mark.timeout(300)
@pytest.mark.ahead(ALIGNMENT)
def test_bench_alignment_runs(fleet, request):
    from bench.alignment import TARGETS

    figures = bench(fleet, request, ALIGNMENT)
    has_every(figures, *TARGETS, "peer_word_start_error_ms_p50", "lag_behind_audio_ms_p50", "cpu_s_per_audio_s",
              "by_condition", "targets_met")
    assert set(figures["targets_met"]) == set(TARGETS) and figures["config"]["cases"] == 8
    assert figures["words"] > 50 and figures["noise_estimated_share"] == 1.0


@pytest.mark.timeout(300)
@pytest.mark.ahead(CONTINUITY)
def test_bench_continuity_runs(fleet, request):
    from bench.continuity import TARGETS

    figures = bench(fleet, request, CONTINUITY)
    has_every(figures, *TARGETS, "window_ttfb_added_limit_ms", "window_tokens_p50", "kv_block_size", "targets_met")
    assert set(figures["targets_met"]) == set(TARGETS) and figures["config"]["segments_paired"] == 2
    # the window is really there and really repeats what was generated, and the cache serves some of it
    assert figures["window_ids_match_generated"] and figures["window_tokens_p50"] > 7 * 12
    assert figures["window_prefix_cache_hit_rate"] > 0.5 and figures["kv_block_size"] == 32


@pytest.mark.timeout(120)
@pytest.mark.ahead(CHUNKING)
def test_bench_chunking_runs(fleet, request):
    figures = bench(fleet, request, CHUNKING)
    has_every(figures, "worker_wrong_cuts", "plugin_wrong_cuts", "worker", "plugin", "targets_met")
    assert figures["config"]["sentences"] == 30 and figures["worker"]["ends_cut_share"] > 0.5
    assert figures["worker_wrong_cuts"] == 0  # a cut inside a sentence would be a regression of the rule


@pytest.mark.timeout(300)
@pytest.mark.ahead(TEXT)
def test_bench_text_runs(fleet, request):
    from bench.text import TARGETS

    figures = bench(fleet, request, TEXT)
    has_every(figures, *TARGETS, "per_category", "serving_ms_p50", "peers", "targets_met", "stream_equals_whole")
    assert set(figures["targets_met"]) == set(TARGETS) and figures["cases"] >= 300
    assert not figures["categories_missing"] and figures["stream_equals_whole"]
    assert set(figures["peers"]) == {"num2words", "inflect", "nemo_text_processing"}
    for peer in figures["peers"].values():  # measured, or said to be absent: never a made-up figure
        assert "absent" in peer or {"accuracy", "min_category_accuracy", "serving_ms_p99"} <= set(peer)
