"""Slot-constrained sampling for Orpheus audio tokens, as a vLLM v1 logits processor.

At generated position k only the 4096 ids of slot ``k % 7`` are legal, plus END_OF_SPEECH at a
frame boundary. Two modes, chosen per request through ``SamplingParams.extra_args``:

- ``"mask"``: set every other logit to -inf and let vLLM sample (temperature, top-p and
  repetition penalty from the request's params). Correct, but vLLM still sorts the whole
  156,940-id vocabulary for top-p.
- ``"fused"``: sample here, over the slot's 4,097 candidates only (repetition penalty,
  temperature, nucleus, draw from a per-request seeded generator), then leave a single finite
  logit. The request's vLLM params are greedy with no penalties, so vLLM's sampler reduces to
  an argmax. Same distribution as "mask", a fraction of the work.

Requests without the extra arg pass through untouched. The class is loaded inside vLLM's engine
process (pass ``logits_processors=[SlotConstrainedSampler]``); it keeps per-batch-row state only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from gpu_worker.orpheus import AUDIO_BASE, CODEBOOK_SIZE, END_OF_SPEECH, FRAME_TOKENS

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

EXTRA_ARGS_KEY = "voicering_slots"
SlotMode = Literal["mask", "fused"]
CANDIDATES = CODEBOOK_SIZE + 1  # a slot's codes + END_OF_SPEECH


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

    __slots__ = ("output", "spec", "seen", "consumed", "generator")

    def __init__(self, spec: SlotSampling, output: list[int]) -> None:
        self.spec = spec
        self.output = output
        self.seen = torch.zeros((FRAME_TOKENS, CODEBOOK_SIZE), dtype=torch.bool)
        self.consumed = 0
        self.generator = torch.Generator()
        if spec.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(spec.seed)

    def slot(self) -> int:
        return len(self.output) % FRAME_TOKENS

    def eos_allowed(self) -> bool:
        return self.slot() == 0 and len(self.output) // FRAME_TOKENS >= self.spec.min_frames

    def refresh_seen(self) -> None:
        for token_id in self.output[self.consumed:]:
            offset = token_id - AUDIO_BASE
            if 0 <= offset < FRAME_TOKENS * CODEBOOK_SIZE:
                self.seen[offset // CODEBOOK_SIZE, offset % CODEBOOK_SIZE] = True
        self.consumed = len(self.output)


def nucleus_draw(scores: torch.Tensor, top_p: float, generator: torch.Generator) -> int:
    """Index drawn from softmax(scores) restricted to the smallest set with mass >= top_p.

    scores: [C] float32, already penalised and divided by temperature.
    """
    probs = torch.softmax(scores, dim=-1)  # [C]
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)  # [C]
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        keep = (cumulative - sorted_probs) < top_p  # always keeps the top candidate
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        pick = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[pick])
    return int(torch.multinomial(probs, 1, generator=generator))


def slot_scores(row_logits: torch.Tensor, state: _RowState) -> torch.Tensor:
    """The 4,097 candidate scores of one row, penalised and temperature-scaled. [C]"""
    spec = state.spec
    slot = state.slot()
    base = AUDIO_BASE + slot * CODEBOOK_SIZE
    scores = torch.empty(CANDIDATES, dtype=torch.float32)
    scores[:CODEBOOK_SIZE] = row_logits[base:base + CODEBOOK_SIZE]
    scores[CODEBOOK_SIZE] = row_logits[END_OF_SPEECH] if state.eos_allowed() else float("-inf")
    if spec.repetition_penalty != 1.0:
        state.refresh_seen()
        seen = state.seen[slot]  # [4096]
        codes = scores[:CODEBOOK_SIZE]
        penalised = torch.where(codes > 0, codes / spec.repetition_penalty, codes * spec.repetition_penalty)
        scores[:CODEBOOK_SIZE] = torch.where(seen, penalised, codes)
    if spec.temperature > 0.0:
        scores /= spec.temperature
    return scores


class SlotConstrainedSampler(LogitsProcessor):
    """Restricts (mask) or fully samples (fused) each Orpheus request's next token to its slot."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _RowState] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        SlotSampling.from_params(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: SamplingParams, _prompt: list[int] | None, output: list[int]) -> _RowState | None:
            spec = SlotSampling.from_params(params)
            return None if spec is None else _RowState(spec, output)

        process_dict_updates(self.rows, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        for index, state in self.rows.items():
            row = logits[index]  # [V]
            if state.spec.mode == "fused":
                scores = slot_scores(row.float(), state)
                if state.spec.temperature > 0.0:
                    choice = nucleus_draw(scores, state.spec.top_p, state.generator)
                else:
                    choice = int(torch.argmax(scores))
                token_id = END_OF_SPEECH if choice == CODEBOOK_SIZE else AUDIO_BASE + state.slot() * CODEBOOK_SIZE + choice
                row.fill_(float("-inf"))
                row[token_id] = 0.0
            else:
                base = AUDIO_BASE + state.slot() * CODEBOOK_SIZE
                eos = row[END_OF_SPEECH].item() if state.eos_allowed() else float("-inf")
                row[:base] = float("-inf")
                row[base + CODEBOOK_SIZE:] = float("-inf")
                row[END_OF_SPEECH] = eos
        return logits
