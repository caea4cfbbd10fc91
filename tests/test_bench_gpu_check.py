"""bench/gpu.sh + bench/gpu_check.py in CPU mode, the way the lent GPU machine runs them (no vLLM,
pydantic, websockets or mmh3 importable), and the pure pieces: the streams bound, the bytes a decode step
reads, and the FP8 projection against bf16."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from bench.gpu_check import REALTIME_TOKENS_PER_S, TARGETS, _Linear, step_bytes, streams_bound
from gpu_worker.orpheus import TOKENS_PER_SECOND_REALTIME
from gpu_worker.stand_in import ORPHEUS_3B
from tests.fixtures.fleet import Command, Done


def test_realtime_rate_is_the_orpheus_one():
    assert REALTIME_TOKENS_PER_S == pytest.approx(TOKENS_PER_SECOND_REALTIME)


def test_streams_bound_adds_engine_sampler_and_codec_time():
    step = {"64": 4.0, "128": 6.0, "256": 10.0}  # ms per decode step
    sampler = {"64": 100.0, "128": 150.0, "256": 300.0}  # µs per step
    # 256: 82.03 x 10.3 ms = 0.845 s/s of engine time + 256 / 2000 = 0.128 of codec -> 0.973: fits
    assert streams_bound(step, sampler, codec_streams=2000) == 256
    # with a slower codec the 256 row no longer fits (0.845 + 0.256 > 1), 128 still does
    assert streams_bound(step, sampler, codec_streams=1000) == 128
    assert streams_bound({"1": 20.0}, {"1": 1.0}, codec_streams=1000) == 0  # 20 ms steps: 50 tok/s < 82


def test_step_bytes_for_orpheus_3b():
    body = ORPHEUS_3B.parameters() - ORPHEUS_3B.vocab_size * ORPHEUS_3B.hidden_size - (2 * 28 + 1) * 3072  # minus norms
    head = 2 * ORPHEUS_3B.vocab_size * ORPHEUS_3B.hidden_size  # bf16 LM head in both variants
    assert step_bytes(ORPHEUS_3B, 1, 0, fp8_weights=True, fp8_kv=True) == body + head
    assert step_bytes(ORPHEUS_3B, 1, 0, fp8_weights=False, fp8_kv=False) == 2 * body + head
    kv_per_token = 28 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head dim x bf16 bytes = 114,688
    assert step_bytes(ORPHEUS_3B, 256, 512, True, False) - step_bytes(ORPHEUS_3B, 0, 0, True, False) == \
        256 * 512 * kv_per_token


def test_fp8_projection_matches_bf16():
    torch.manual_seed(0)
    w = torch.randn(256, 512, dtype=torch.bfloat16) * 0.02
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    exact = _Linear(w, fp8=False)(x).float()
    approx = _Linear(w, fp8=True)(x).float()
    assert approx.shape == (4, 256)
    assert ((approx - exact).norm() / exact.norm()).item() < 0.1  # e4m3 rounding, not a wrong scale


# the script as the GPU machine runs it: no vLLM and none of the serving stack importable (started
# ahead of this test by the suite's fleet, tests/fixtures/fleet.py)
GPU_SH = Command("gpu.sh", ("bash", "bench/gpu.sh", "--cpu", "--block-imports",
                            "vllm,pydantic,pydantic_settings,websockets,mmh3"),
                 timeout_s=400, env={"PYTHON": sys.executable, "OUT": "{out}"})


@pytest.mark.ahead(GPU_SH)
def test_gpu_sh_cpu_mode_as_the_gpu_machine_runs_it(fleet, request):
    def judged(done: Done) -> dict:
        assert done.returncode == 0, done.stderr[-3000:]
        figures = json.loads(done.stdout)
        assert json.loads((done.out / "gpu-check.json").read_text()) == figures
        return figures

    figures = fleet.result(request, GPU_SH, judged)
    assert figures["device"] == "cpu" and figures["label"].startswith("CPU")
    for key in ("codec_realtime_streams_batched", "sampler_us_per_step_b256", "decode_step_ms_b256_fp8", "streams_bound"):
        assert key in figures, key
    assert figures["steps_done"] == ["codec_eager", "sampler", "decode_step", "codec_compiled"]
    codec = figures["codec"]
    assert codec["eager"]["window_frames"] == 5 and codec["compiled"]["compile_backend"] == "eager"
    for variant in ("eager", "compiled"):
        assert set(codec[variant]["batched"]) == {"1", "2"}
        assert all(row["call_ms"] > 0 and row["realtime_streams"] > 0 for row in codec[variant]["batched"].values())
    assert figures["codec_realtime_streams_batched"] == max(codec[v]["realtime_streams"] for v in ("eager", "compiled")) > 0
    assert set(figures["sampler_us_per_step"]) == {"1", "2"} and min(figures["sampler_us_per_step"].values()) > 0
    assert figures["sampler_us_per_step_b256"] is None and figures["decode_step_ms_b256_fp8"] is None  # toy sizes
    for variant in ("bf16", "fp8"):
        assert all(row["ms"] > 0 and row["floor_ms"] > 0 for row in figures["decode_step"][variant].values())
    assert figures["cuda_graph"] is False
    assert figures["streams_bound"] == 0  # a 2-core CPU holds no real-time stream
    assert set(figures["targets_met"]) == set(TARGETS) and not any(figures["targets_met"].values())


def test_decode_step_runs_the_whole_stack_in_both_variants():
    from dataclasses import replace

    from bench.gpu_check import DecodeModel

    small = replace(ORPHEUS_3B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    logits = {fp8: DecodeModel(small, "cpu", fp8, max_batch=4, kv_len=8).step(x).float() for fp8 in (False, True)}
    assert logits[False].shape == logits[True].shape == (3, ORPHEUS_3B.vocab_size)
    assert torch.isfinite(logits[True]).all()
    # same seed, same weights: FP8 changes the logits by rounding only
    assert ((logits[True] - logits[False]).norm() / logits[False].norm()).item() < 0.2
