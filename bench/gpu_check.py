"""The GPU check: what a lent GPU machine without vLLM can measure of capacity, in one process.

1. **Codec**: the SNAC 24 kHz decoder (random weights, `gpu_worker.codec.SnacCodec` with its
   positional noise, `decode_batch` as the worker's batcher calls it, host copy included) on the
   planner's steady-state window (12 frames decoded, 8 emitted = 683 ms of audio). Sequential (one
   window per call) vs batched (B windows per call, B = 1..128), eager and `torch.compile`d
   (``dynamic=True``, as `scheduler.BatchedDecodeRunner.warm_up` compiles it). Real-time streams
   the codec alone sustains at B: B x 0.683 s / time of the call; `codec_realtime_streams_batched`
   is the best over B and both variants.
2. **Sampler**: `gpu_worker.sampling.SlotConstrainedSampler.apply` (fused mode: host staging, one
   copy, gather of 4,097 candidates, repetition penalty, nucleus draw, scatter) on float32 logits
   of the 156,940-id vocabulary, batch 1..512; µs per step (median, synchronised).
3. **Decode-step ceiling**: one decode step of the full-size shape (`stand_in.ORPHEUS_3B`) in plain
   PyTorch: per layer RMSNorm, fused QKV, RoPE, the new K/V written into a KV cache of ``kv_len``
   positions, GQA attention (SDPA), O, RMSNorm, fused gate/up, SiLU, down; then the tied LM head.
   bf16 weights, and FP8 (e4m3, per-tensor scales, dynamic per-tensor activation scales,
   `torch._scaled_mm`) for every projection as vLLM's ``quantization="fp8"`` does; the LM head stays
   bf16 in both (vLLM does not quantize it) and the KV cache is bf16 in both (SDPA reads no FP8; an
   FP8 cache halves the KV bytes, see ``floor``). On CUDA each step is captured in a CUDA graph (as
   vLLM runs decode). Also the bytes a step must read and the floor they give at the copy
   bandwidth measured here.

``streams_bound``: the largest measured batch B whose GPU time per second of serving B real-time
streams fits in one second: 82 steps/s x (FP8 step + sampler step) + B / codec real-time streams
(codec and engine counted as if they never overlapped: conservative). It ignores the scheduler,
prefill and everything vLLM adds, which is what the vLLM capacity bench is held against.

Runs without vLLM, pydantic, websockets or mmh3 (the lent machine has none): `gpu_worker.sampling`
imports two vLLM base names at module level, so when vLLM is absent `_import_sampling` gives it a
two-name module first; the sampler's rows are then added as vLLM's ``update_state`` would add them.
`--cpu` runs every step at toy sizes (CI keeps it working); ``--block-imports`` hides packages to
rehearse the GPU machine here (the test hides all four).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REALTIME_TOKENS_PER_S = 7 / (2048 / 24000)  # = gpu_worker.orpheus.TOKENS_PER_SECOND_REALTIME (82.03)
TARGETS = {"codec_realtime_streams_batched": (">=", 300), "streams_bound": (">=", 250)}  # H200


@dataclass(frozen=True, slots=True)
class CheckPlan:
    """Sizes of one run: the GPU plan, or the CPU rehearsal of every step at toy sizes."""

    codec_batches: tuple[int, ...]
    codec_reps: int
    codec_emit_frames: int  # frames a window emits (the planner's steady state: 8), plus 2 + 2 of context
    compile_backend: str  # inductor on CUDA; "eager" on CPU: dynamo captures the same graphs, no codegen
    sampler_batches: tuple[int, ...]
    sampler_reps: int
    step_batches: tuple[int, ...]
    step_reps: int
    kv_len: int
    small_shape: bool  # CPU: the tiny stand-in's shape instead of Orpheus-3B


GPU_PLAN = CheckPlan(codec_batches=(1, 2, 4, 8, 16, 32, 64, 128), codec_reps=10, codec_emit_frames=8,
                     compile_backend="inductor",
                     sampler_batches=(1, 8, 32, 64, 128, 256, 384, 512), sampler_reps=50,
                     step_batches=(1, 8, 32, 64, 128, 256, 384, 512), step_reps=20, kv_len=512, small_shape=False)
CPU_PLAN = CheckPlan(codec_batches=(1, 2), codec_reps=1, codec_emit_frames=1, compile_backend="eager",
                     sampler_batches=(1, 2), sampler_reps=2, step_batches=(1, 2), step_reps=1, kv_len=32,
                     small_shape=True)


# -- timing ---------------------------------------------------------------------------------------

def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _sig(value: float, digits: int = 4) -> float:
    """Round to significant digits: a CPU rehearsal's 0.004 streams must not print as 0."""
    return float(f"{value:.{digits}g}")


def _median_s(fn: Callable[[], object], reps: int, device: str, warm: int = 1) -> float:
    """Median wall seconds of ``fn`` over ``reps`` synchronised calls, after ``warm`` untimed ones."""
    for _ in range(warm):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


# -- 1. codec -------------------------------------------------------------------------------------

def measure_codec(device: str, plan: CheckPlan, compiled: bool) -> dict:
    """One variant (eager, or `torch.compile`d and warmed at every batch size first)."""
    import numpy as np
    import torch
    from snac import SNAC

    from gpu_worker.codec import ChunkSchedule, SnacCodec
    from gpu_worker.orpheus import FRAME_SECONDS, Frame
    from gpu_worker.stand_in import SNAC_24KHZ_CONFIG

    schedule = ChunkSchedule()
    length = schedule.left + plan.codec_emit_frames + schedule.right  # GPU: the steady-state window, 12 frames
    emitted_s = plan.codec_emit_frames * FRAME_SECONDS  # GPU: 0.683 s of audio per window
    torch.manual_seed(0)
    codec = SnacCodec(SNAC(**SNAC_24KHZ_CONFIG), device=device)
    rng = np.random.default_rng(0)
    windows = [[Frame(int(rng.integers(4096)), tuple(int(x) for x in rng.integers(4096, size=2)),
                      tuple(int(x) for x in rng.integers(4096, size=4))) for _ in range(length)]
               for _ in range(max(plan.codec_batches))]
    offsets = [4 * 1000 * i for i in range(len(windows))]
    figures: dict = {"window_frames": length, "window_emitted_s": round(emitted_s, 4)}
    if compiled:
        began = time.perf_counter()
        codec.model.decoder = torch.compile(codec.model.decoder, dynamic=True, backend=plan.compile_backend)
        for b in plan.codec_batches:  # warm every batch size, as the worker does at start-up
            codec.decode_batch(windows[:b], offsets[:b])
        _sync(device)
        figures.update(compile_backend=plan.compile_backend, compile_warm_s=round(time.perf_counter() - began, 1))
    batched = {}
    for b in plan.codec_batches:
        seconds = _median_s(lambda b=b: codec.decode_batch(windows[:b], offsets[:b]), plan.codec_reps, device)
        batched[str(b)] = {"call_ms": round(seconds * 1000, 3), "ms_per_window": round(seconds * 1000 / b, 3),
                           "realtime_streams": _sig(b * emitted_s / seconds)}
    one = _median_s(lambda: codec.decode_batch(windows[:1], offsets[:1]), plan.codec_reps, device)
    best = max(batched, key=lambda b: batched[b]["realtime_streams"])
    return {**figures, "batched": batched, "best_batch": int(best), "realtime_streams": batched[best]["realtime_streams"],
            "sequential_ms_per_window": round(one * 1000, 3), "sequential_realtime_streams": _sig(emitted_s / one)}


# -- 2. sampler -----------------------------------------------------------------------------------

def _install_vllm_names() -> None:
    """The two vLLM names `gpu_worker.sampling` imports at module level, for a machine without
    vLLM. The processor's ``apply`` (what is measured) uses neither; ``update_state`` is not run."""
    parts = ["vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.logits_processor",
             "vllm.v1.sample.logits_processor.builtin"]
    modules = {name: types.ModuleType(name) for name in parts}
    modules["vllm.v1.sample.logits_processor"].LogitsProcessor = type("LogitsProcessor", (), {})
    modules["vllm.v1.sample.logits_processor"].BatchUpdate = type("BatchUpdate", (), {})

    def unavailable(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("vLLM is not installed here: the GPU check adds rows directly")

    modules["vllm.v1.sample.logits_processor.builtin"].process_dict_updates = unavailable
    sys.modules.update(modules)


def _import_sampling() -> types.ModuleType:
    try:
        import vllm.v1.sample.logits_processor  # noqa: F401
    except ImportError:
        _install_vllm_names()
    import gpu_worker.sampling as sampling

    return sampling


def measure_sampler(device: str, plan: CheckPlan) -> dict:
    import torch

    from gpu_worker.orpheus import VOCAB_SIZE, audio_id

    sampling = _import_sampling()
    cuda = device.startswith("cuda")
    out = {}
    for b in plan.sampler_batches:
        proc = sampling.SlotConstrainedSampler(None, torch.device(device), cuda)
        outputs = [[audio_id(k % 7, (k * 37 + i) % 4096) for k in range(35)] for i in range(b)]
        for i in range(b):  # what update_state does for an added request: a row state with a home row
            proc.rows[i] = sampling._RowState(sampling.SlotSampling(seed=i), outputs[i], proc._take_home())
        generator = torch.Generator(device=device).manual_seed(b)
        pristine = torch.randn(b, VOCAB_SIZE, device=device, generator=generator)  # logits: [B, V] float32
        work = torch.empty_like(pristine)
        times = []
        for rep in range(plan.sampler_reps + 2):  # 2 warm-up steps
            work.copy_(pristine)
            _sync(device)
            began = time.perf_counter()
            proc.apply(work)
            _sync(device)
            if rep >= 2:
                times.append(time.perf_counter() - began)
            for row, token in enumerate(work.argmax(dim=1).tolist()):  # the engine appends the sampled id
                outputs[row].append(token)
        out[str(b)] = round(statistics.median(times) * 1e6, 1)
    return {"sampler_us_per_step": out}


# -- 3. decode-step ceiling -----------------------------------------------------------------------

def _fp8(w):  # w: [N, K] bf16 -> (fp8 [N, K], scale [])
    import torch

    scale = (w.abs().amax().float() / 448.0).clamp(min=1e-12)
    return (w.float() / scale).to(torch.float8_e4m3fn), scale


class _Linear:
    """y = x @ W.T in bf16, or FP8 with a dynamic per-tensor activation scale (as vLLM's fp8)."""

    def __init__(self, w, fp8: bool) -> None:
        self.fp8 = fp8
        if fp8:
            self.w, self.scale = _fp8(w)
        else:
            self.w = w

    def __call__(self, x):  # x: [M, K] bf16 -> [M, N] bf16
        import torch
        import torch.nn.functional as F

        if not self.fp8:
            return x @ self.w.t()
        rows = x.shape[0]
        if rows % 16:  # FP8 GEMMs want dimensions in multiples of 16: pad the rows, drop them after
            x = F.pad(x, (0, 0, 0, 16 - rows % 16))
        a_scale = (x.abs().amax().float() / 448.0).clamp(min=1e-12)
        a = (x.float() / a_scale).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(a, self.w.t(), scale_a=a_scale, scale_b=self.scale, out_dtype=torch.bfloat16)
        return out[:rows]


class DecodeModel:
    """Random weights of a Llama shape laid out for one batched decode step over a KV cache."""

    def __init__(self, shape, device: str, fp8: bool, max_batch: int, kv_len: int, seed: int = 0) -> None:
        import torch

        self.shape, self.kv_len = shape, kv_len
        g = torch.Generator(device=device).manual_seed(seed)

        def weight(*dims: int):
            return torch.randn(dims, device=device, dtype=torch.bfloat16, generator=g) * 0.02

        h, i = shape.hidden_size, shape.intermediate_size
        q, kv = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
        self.layers = []
        for _ in range(shape.num_hidden_layers):
            self.layers.append({
                "qkv": _Linear(weight(q + 2 * kv, h), fp8), "o": _Linear(weight(h, q), fp8),
                "gate_up": _Linear(weight(2 * i, h), fp8), "down": _Linear(weight(h, i), fp8),
                "norm1": torch.ones(h, device=device, dtype=torch.bfloat16),
                "norm2": torch.ones(h, device=device, dtype=torch.bfloat16),
                "k": torch.randn(max_batch, shape.num_key_value_heads, kv_len, shape.head_dim, device=device,
                                 dtype=torch.bfloat16, generator=g),  # [B, KVH, L, D]
                "v": torch.randn(max_batch, shape.num_key_value_heads, kv_len, shape.head_dim, device=device,
                                 dtype=torch.bfloat16, generator=g),
            })
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        self.lm_head = weight(shape.vocab_size, h)  # tied embedding, bf16 in both variants
        self.norm = torch.ones(h, device=device, dtype=torch.bfloat16)
        half = shape.head_dim // 2
        freqs = 1.0 / (shape.rope_theta ** (torch.arange(half, device=device, dtype=torch.float32) / half))
        angle = (kv_len - 1) * freqs
        self.cos = torch.cat([angle.cos(), angle.cos()]).to(torch.bfloat16)  # [D]
        self.sin = torch.cat([angle.sin(), angle.sin()]).to(torch.bfloat16)

    def _rope(self, x):  # x: [B, H, 1, D]
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin

    def step(self, x):  # x: [B, H] bf16 hidden states of the new tokens -> logits [B, V]
        import torch
        import torch.nn.functional as F

        s = self.shape
        b = x.shape[0]
        q_dim, kv_dim = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
        pos = self.kv_len - 1
        for layer in self.layers:
            h = F.rms_norm(x, (s.hidden_size,), layer["norm1"], s.rms_norm_eps)
            qkv = layer["qkv"](h)  # [B, q + 2kv]
            q = qkv[:, :q_dim].view(b, s.num_attention_heads, 1, s.head_dim)
            k = qkv[:, q_dim:q_dim + kv_dim].view(b, s.num_key_value_heads, 1, s.head_dim)
            v = qkv[:, q_dim + kv_dim:].view(b, s.num_key_value_heads, 1, s.head_dim)
            q, k = self._rope(q), self._rope(k)
            k_cache, v_cache = layer["k"][:b], layer["v"][:b]  # [B, KVH, L, D]
            k_cache[:, :, pos:pos + 1].copy_(k)
            v_cache[:, :, pos:pos + 1].copy_(v)
            attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)  # [B, H, 1, D]
            x = x + layer["o"](attn.reshape(b, q_dim))
            h = F.rms_norm(x, (s.hidden_size,), layer["norm2"], s.rms_norm_eps)
            gate, up = layer["gate_up"](h).chunk(2, dim=-1)  # [B, I] each
            x = x + layer["down"](F.silu(gate) * up)
        x = F.rms_norm(x, (s.hidden_size,), self.norm, s.rms_norm_eps)
        return x @ self.lm_head.t()  # [B, V]


def _step_timer(model: DecodeModel, batch: int, device: str, reps: int) -> tuple[float, bool]:
    """Median seconds per decode step at ``batch`` (CUDA graph replay on CUDA; eager elsewhere or
    when capture fails) and whether a graph was used."""
    import torch

    x = torch.randn(batch, model.shape.hidden_size, device=device, dtype=torch.bfloat16)
    if not device.startswith("cuda"):
        return _median_s(lambda: model.step(x), reps, device), False
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model.step(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model.step(x)
        return _median_s(graph.replay, reps, device, warm=2), True
    except RuntimeError:
        return _median_s(lambda: model.step(x), reps, device), False


def _copy_bandwidth(device: str, megabytes: int) -> float:
    """Bytes read + written per second by one device-to-device copy (the memory ceiling)."""
    import torch

    src = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _median_s(lambda: dst.copy_(src), 5, device)
    return 2 * src.numel() / seconds


def step_bytes(shape, batch: int, kv_len: int, fp8_weights: bool, fp8_kv: bool) -> int:
    """Bytes one decode step must read at least: projection weights, the bf16 LM head, the KV cache."""
    projections = sum(rows * cols for rows, cols in (shape.projection_shape(m) for m in
                      ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")))
    weights = shape.num_hidden_layers * projections * (1 if fp8_weights else 2) + 2 * shape.vocab_size * shape.hidden_size
    kv = batch * kv_len * shape.num_hidden_layers * 2 * shape.num_key_value_heads * shape.head_dim * (1 if fp8_kv else 2)
    return weights + kv


def measure_decode_step(device: str, plan: CheckPlan) -> dict:
    import torch

    from gpu_worker.stand_in import ORPHEUS_3B

    shape = (replace(ORPHEUS_3B, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=64) if plan.small_shape else ORPHEUS_3B)
    max_batch = max(plan.step_batches)
    bandwidth = _copy_bandwidth(device, 64 if plan.small_shape else 2048)
    out: dict[str, dict] = {}
    graphs = set()
    for variant, fp8 in (("bf16", False), ("fp8", True)):
        model = DecodeModel(shape, device, fp8, max_batch, plan.kv_len)
        rows = {}
        for b in plan.step_batches:
            seconds, graphed = _step_timer(model, b, device, plan.step_reps)
            graphs.add(graphed)
            rows[str(b)] = {"ms": round(seconds * 1000, 3),
                            "tokens_per_s_per_stream": round(1 / seconds, 1),
                            "floor_ms": round(step_bytes(shape, b, plan.kv_len, fp8, False) / bandwidth * 1000, 3)}
        out[variant] = rows
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    floor_fp8_kv = {str(b): round(step_bytes(shape, b, plan.kv_len, True, True) / bandwidth * 1000, 3)
                    for b in plan.step_batches}
    return {"shape": "orpheus-3b" if not plan.small_shape else "small (cpu)", "parameters": shape.parameters(),
            "kv_len": plan.kv_len, "cuda_graph": graphs == {True}, "copy_bandwidth_tb_s": round(bandwidth / 1e12, 3),
            "decode_step": out, "floor_ms_fp8_weights_fp8_kv": floor_fp8_kv}


# -- the bound ------------------------------------------------------------------------------------

def streams_bound(step_ms: dict[str, float], sampler_us: dict[str, float], codec_streams: float) -> int:
    """Largest batch B whose GPU seconds per second fit in one: 82 steps/s x (step + sampler) for the
    engine, B / codec_streams for the codec (no overlap assumed). 0 when none fits."""
    passing = [int(b) for b, ms in step_ms.items() if b in sampler_us
               and REALTIME_TOKENS_PER_S * (ms + sampler_us[b] / 1000.0) / 1000.0 + int(b) / codec_streams <= 1.0]
    return max(passing, default=0)


def _judge(figures: dict) -> dict[str, bool]:
    ops = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b}
    return {k: figures.get(k) is not None and ops[op](figures[k], bound) for k, (op, bound) in TARGETS.items()}


def run(cpu: bool = False, progress: Callable[[dict], None] | None = None) -> dict:
    """Every step, cheapest first, the compiled codec last (its compile is the slowest and least
    certain); ``progress`` gets the figures so far after each step, so a run cut short keeps them."""
    import torch

    started = time.perf_counter()
    device = "cpu" if cpu or not torch.cuda.is_available() else "cuda"
    plan = CPU_PLAN if device == "cpu" else GPU_PLAN
    figures: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
                     "plan": asdict(plan), "targets": {k: f"{op} {bound}" for k, (op, bound) in TARGETS.items()},
                     "label": "GPU" if device == "cuda" else "CPU rehearsal at toy sizes: claims nothing about GPUs",
                     "codec": {}}

    def settle(step: str) -> None:
        codec = figures["codec"]
        variants = [v for v in ("eager", "compiled") if v in codec]
        figures["codec_realtime_streams_batched"] = max((codec[v]["realtime_streams"] for v in variants), default=None)
        figures["codec_realtime_streams_sequential"] = max((codec[v]["sequential_realtime_streams"] for v in variants),
                                                           default=None)
        fp8_ms = {b: row["ms"] for b, row in figures.get("decode_step", {}).get("fp8", {}).items()}
        if fp8_ms and figures["codec_realtime_streams_batched"]:
            figures["streams_bound"] = streams_bound(fp8_ms, figures["sampler_us_per_step"],
                                                     figures["codec_realtime_streams_batched"])
            figures["streams_bound_engine_only"] = max((int(b) for b, ms in fp8_ms.items()
                                                        if REALTIME_TOKENS_PER_S * ms / 1000.0 <= 1.0), default=0)
        figures["targets_met"] = _judge(figures)
        figures["steps_done"] = [*figures.get("steps_done", []), step]
        figures["wall_s"] = round(time.perf_counter() - started, 1)
        if progress is not None:
            progress(figures)

    figures["codec"]["eager"] = measure_codec(device, plan, compiled=False)
    settle("codec_eager")
    figures.update(measure_sampler(device, plan))
    figures["sampler_us_per_step_b256"] = figures["sampler_us_per_step"].get("256")
    settle("sampler")
    step = measure_decode_step(device, plan)
    figures.update(step)
    figures["decode_step_ms_b256_fp8"] = step["decode_step"]["fp8"].get("256", {}).get("ms")
    figures["decode_step_ms_b256_bf16"] = step["decode_step"]["bf16"].get("256", {}).get("ms")
    figures["largest_batch_measured"] = max(plan.step_batches)
    settle("decode_step")
    figures["codec"]["compiled"] = measure_codec(device, plan, compiled=True)
    settle("codec_compiled")
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="every step at toy sizes on the CPU")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--block-imports", default="", help="comma-separated packages to hide (rehearse a machine "
                                                            "without them, e.g. vllm,pydantic,websockets)")
    args = parser.parse_args(argv)
    for name in filter(None, args.block_imports.split(",")):
        sys.modules[name] = None  # type: ignore[assignment]  # import of it now raises ImportError
    def write(figures: dict) -> None:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(figures, indent=2, sort_keys=True))

    figures = run(cpu=args.cpu, progress=write)
    print(json.dumps(figures, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
