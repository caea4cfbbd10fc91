"""Slot-constrained sampling for Orpheus audio tokens, as a vLLM v1 logits processor.

At generated position k only the 4096 ids of slot ``k % 7`` are legal, plus END_OF_SPEECH at a
frame boundary. Two modes, chosen per request through ``SamplingParams.extra_args``:

- ``"mask"``: set every other logit to -inf and let vLLM sample (temperature, top-p and
  repetition penalty from the request's params). Correct, but vLLM still sorts the whole
  156,940-id vocabulary for top-p (its CPU and native paths do; see docs/worker.md).
- ``"fused"``: sample here, over the slot's 4,097 candidates only (repetition penalty,
  temperature, nucleus, one uniform draw per row from a per-request seeded generator), then leave
  a single finite logit. The request's vLLM params are greedy with no penalties, so vLLM's
  sampler reduces to an argmax. Same distribution as "mask", a fraction of the work.

Both modes run once per step for the whole batch (a gather of ``[n, 4097]`` candidates, one
sort, one scatter), never a Python loop over vocabulary-sized rows.

Slot counting: a row's slot is ``len(output) % 7``, where ``output`` is vLLM's live list of the
request's generated ids. With async scheduling (CUDA) vLLM appends a placeholder (-1) for the
token in flight and replaces it before logits processors run whenever a custom processor is
installed (`update_async_output_token_ids`); placeholders still count as a generated position,
and the repetition-penalty history stops at the first placeholder so no token is ever skipped.

Requests without the extra arg pass through untouched. The class is loaded inside vLLM's engine
process (pass ``logits_processors=[SlotConstrainedSampler]``); it keeps per-batch-row state only.
It implements vLLM's V1 model-runner interface; the engine pins the V1 runner (see engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from gpu_worker.orpheus import AUDIO_BASE, CODEBOOK_SIZE, END_OF_SPEECH, FRAME_TOKENS

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

EXTRA_ARGS_KEY = "voicering_slots"
SlotMode = Literal["mask", "fused"]
CANDIDATES = CODEBOOK_SIZE + 1  # a slot's codes + END_OF_SPEECH (last column)
PLACEHOLDER = -1  # vLLM's id for a token sampled but not yet copied back (async scheduling)


@dataclass(frozen=True, slots=True)
class SlotSampling:
    """What travels in ``SamplingParams.extra_args[EXTRA_ARGS_KEY]`` (plain dict on the wire)."""

    mode: SlotMode = "fused"
    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    seed: int | None = None
    min_frames: int = 1  # END_OF_SPEECH is illegal before this many frames

    def as_extra_args(self) -> dict[str, Any]:
        return {EXTRA_ARGS_KEY: {"mode": self.mode, "temperature": self.temperature, "top_p": self.top_p,
                                 "repetition_penalty": self.repetition_penalty, "seed": self.seed,
                                 "min_frames": self.min_frames}}

    @classmethod
    def from_params(cls, params: SamplingParams) -> SlotSampling | None:
        raw = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
        if raw is None:
            return None
        spec = cls(**raw)
        if spec.mode not in ("mask", "fused"):
            raise ValueError(f"slot sampling mode must be 'mask' or 'fused', got {spec.mode!r}")
        if not 0.0 < spec.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {spec.top_p}")
        if spec.temperature < 0.0 or spec.repetition_penalty <= 0.0:
            raise ValueError("temperature must be >= 0 and repetition_penalty > 0")
        return spec


class _RowState:
    """One request's view: its live output list, sampling spec, seen codes per slot, generator."""

    __slots__ = ("output", "spec", "seen", "consumed", "rng")

    def __init__(self, spec: SlotSampling, output: list[int], device: torch.device) -> None:
        self.spec = spec
        self.output = output
        self.seen = torch.zeros((FRAME_TOKENS, CODEBOOK_SIZE), dtype=torch.bool, device=device)
        self.consumed = 0
        self.rng = np.random.default_rng(spec.seed)  # seed None: fresh OS entropy

    def slot(self) -> int:
        return len(self.output) % FRAME_TOKENS

    def eos_allowed(self) -> bool:
        return self.slot() == 0 and len(self.output) // FRAME_TOKENS >= self.spec.min_frames

    def refresh_seen(self) -> None:
        """Mark generated codes as seen, up to (not past) an unresolved placeholder."""
        output = self.output
        end = len(output)
        while self.consumed < end:
            token_id = output[self.consumed]
            if token_id == PLACEHOLDER:
                return
            offset = token_id - AUDIO_BASE
            if 0 <= offset < FRAME_TOKENS * CODEBOOK_SIZE:
                self.seen[offset // CODEBOOK_SIZE, offset % CODEBOOK_SIZE] = True
            self.consumed += 1


def gather_candidates(logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                      eos_ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's 4,097 candidate logits and their vocabulary ids.

    logits: [B, V]; rows, slots: [n] long; eos_ok: [n] bool -> (scores [n, C] float32, ids [n, C] long).
    END_OF_SPEECH (last column) is -inf where it is not allowed.
    """
    codes = torch.arange(CODEBOOK_SIZE, device=logits.device)  # [4096]
    ids = AUDIO_BASE + slots[:, None] * CODEBOOK_SIZE + codes[None, :]  # [n, 4096]
    eos = torch.full((len(rows), 1), END_OF_SPEECH, dtype=torch.long, device=logits.device)  # [n, 1]
    ids = torch.cat([ids, eos], dim=1)  # [n, C]
    scores = logits[rows[:, None], ids].float()  # [n, C]
    scores[:, -1] = torch.where(eos_ok, scores[:, -1], torch.full_like(scores[:, -1], float("-inf")))
    return scores, ids


def penalise(scores: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Repetition penalty on codes already generated in this slot (vLLM's rule: divide positive
    logits, multiply negative ones). scores: [n, C]; seen: [n, 4096] bool; penalty: [n]."""
    codes = scores[:, :CODEBOOK_SIZE]  # [n, 4096] view
    p = penalty[:, None]  # [n, 1]
    penalised = torch.where(codes > 0, codes / p, codes * p)
    codes.copy_(torch.where(seen, penalised, codes))
    return scores


def nucleus_pick(scores: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                 uniform: torch.Tensor) -> torch.Tensor:
    """Column index per row: softmax(scores / T) restricted to the smallest set with mass >= top_p,
    drawn by inverse CDF with the given uniforms; T == 0 rows take the argmax.

    scores: [n, C]; temperature, top_p, uniform: [n] -> [n] long.
    """
    greedy = temperature <= 0.0  # [n]
    t = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]  # [n, 1]
    probs = torch.softmax(scores / t, dim=-1)  # [n, C]
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # [n, C]
    cumulative = torch.cumsum(sorted_probs, dim=-1)  # [n, C]
    keep = ((cumulative - sorted_probs) < top_p[:, None]) & (sorted_probs > 0)  # a prefix; holds the top candidate
    kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))  # [n, C]
    kept_cdf = torch.cumsum(kept, dim=-1)  # [n, C]
    target = (uniform * kept_cdf[:, -1])[:, None]  # [n, 1]
    last_kept = keep.sum(dim=-1, keepdim=True) - 1  # [n, 1]; guards u * total rounding up to total
    position = torch.minimum(torch.searchsorted(kept_cdf, target, right=True), last_kept)  # [n, 1]
    picked = order.gather(1, position).squeeze(1)  # [n]
    return torch.where(greedy, scores.argmax(dim=-1), picked)


class SlotConstrainedSampler(LogitsProcessor):
    """Restricts (mask) or fully samples (fused) each Orpheus request's next token to its slot."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _RowState] = {}
        self.device = device

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        SlotSampling.from_params(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: SamplingParams, _prompt: list[int] | None, output: list[int]) -> _RowState | None:
            spec = SlotSampling.from_params(params)
            return None if spec is None else _RowState(spec, output, self.device)

        process_dict_updates(self.rows, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        fused = [(i, s) for i, s in self.rows.items() if s.spec.mode == "fused"]
        masked = [(i, s) for i, s in self.rows.items() if s.spec.mode == "mask"]
        if fused:
            self._apply_fused(logits, fused)
        if masked:
            self._apply_mask(logits, masked)
        return logits

    def _host(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def _layout(self, entries: list[tuple[int, _RowState]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = self._host([i for i, _ in entries], torch.long)
        slots = self._host([s.slot() for _, s in entries], torch.long)
        eos_ok = self._host([s.eos_allowed() for _, s in entries], torch.bool)
        return rows, slots, eos_ok

    def _apply_fused(self, logits: torch.Tensor, entries: list[tuple[int, _RowState]]) -> None:
        rows, slots, eos_ok = self._layout(entries)
        scores, ids = gather_candidates(logits, rows, slots, eos_ok)  # [n, C]
        penalties = [s.spec.repetition_penalty for _, s in entries]
        if any(p != 1.0 for p in penalties):
            for _, state in entries:
                state.refresh_seen()
            seen = torch.stack([state.seen[state.slot()] for _, state in entries])  # [n, 4096]
            penalise(scores, seen, self._host(penalties, torch.float32))
        temperature = self._host([s.spec.temperature for _, s in entries], torch.float32)
        top_p = self._host([s.spec.top_p for _, s in entries], torch.float32)
        uniform = self._host([s.rng.random() for _, s in entries], torch.float32)
        choice = nucleus_pick(scores, temperature, top_p, uniform)  # [n]
        token_ids = ids.gather(1, choice[:, None]).squeeze(1)  # [n]
        logits.index_fill_(0, rows, float("-inf"))
        logits[rows, token_ids] = 0.0

    def _apply_mask(self, logits: torch.Tensor, entries: list[tuple[int, _RowState]]) -> None:
        rows, slots, eos_ok = self._layout(entries)
        scores, ids = gather_candidates(logits, rows, slots, eos_ok)  # [n, C]
        logits.index_fill_(0, rows, float("-inf"))
        logits[rows[:, None], ids] = scores.to(logits.dtype)
