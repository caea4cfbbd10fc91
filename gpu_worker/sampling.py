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
sort, one scatter), never a Python loop over vocabulary-sized rows. The host's per-step work is a
loop over the rows filling one packed numpy array (row, slot, flags, sampling parameters, one
uniform, the codes generated since the last step), copied to the device once; the penalty history
(codes seen per slot) lives on the device and is updated by one scatter per step.

Slot counting: a row's slot is ``len(output) % 7``, where ``output`` is vLLM's live list of the
request's generated ids. With async scheduling (CUDA) vLLM appends a placeholder (-1) for the
token in flight and replaces it before logits processors run whenever a custom processor is
installed (`update_async_output_token_ids`); placeholders still count as a generated position,
and the repetition-penalty history stops at the first placeholder so no token is ever skipped.

Requests without the extra arg pass through untouched. The class is loaded inside vLLM's engine
process (pass ``logits_processors=[SlotConstrainedSampler]``); it keeps per-request state only.
It implements vLLM's V1 model-runner interface; the engine pins the V1 runner (see engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import torch

from gpu_worker.orpheus import AUDIO_BASE, CODEBOOK_SIZE, END_OF_SPEECH, FRAME_TOKENS, REFERENCE_SAMPLING

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

EXTRA_ARGS_KEY = "voicering_slots"
SlotMode = Literal["mask", "fused"]
CANDIDATES = CODEBOOK_SIZE + 1  # a slot's codes + END_OF_SPEECH (last column)
PLACEHOLDER = -1  # vLLM's id for a token sampled but not yet copied back (async scheduling)
SEEN_PER_ROW = FRAME_TOKENS * CODEBOOK_SIZE  # a request's seen-code flags: every slot's codes


@dataclass(frozen=True, slots=True)
class SlotSampling:
    """What travels in ``SamplingParams.extra_args[EXTRA_ARGS_KEY]`` (plain dict on the wire)."""

    mode: SlotMode = "fused"
    temperature: float = REFERENCE_SAMPLING.temperature
    top_p: float = REFERENCE_SAMPLING.top_p
    repetition_penalty: float = REFERENCE_SAMPLING.repetition_penalty
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
    """One request's view: its live output list, sampling spec, home row in the device-side seen
    table, how much of the output is marked there, and its generator."""

    __slots__ = ("output", "spec", "home", "consumed", "rng")

    def __init__(self, spec: SlotSampling, output: list[int], home: int) -> None:
        self.spec = spec
        self.output = output
        self.home = home
        self.consumed = 0
        self.rng = np.random.default_rng(spec.seed)  # seed None: fresh OS entropy

    def slot(self) -> int:
        return len(self.output) % FRAME_TOKENS

    def eos_allowed(self) -> bool:
        return self.slot() == 0 and len(self.output) // FRAME_TOKENS >= self.spec.min_frames

    def unseen_codes(self) -> list[int]:
        """Audio offsets (``slot * 4096 + code``) generated since the last call, up to (not past)
        an unresolved placeholder; the caller marks them in the seen table."""
        output = self.output
        end = len(output)
        offsets = []
        while self.consumed < end:
            token_id = output[self.consumed]
            if token_id == PLACEHOLDER:
                break
            offset = token_id - AUDIO_BASE
            if 0 <= offset < SEEN_PER_ROW:
                offsets.append(offset)
            self.consumed += 1
        return offsets


class _Step(NamedTuple):
    """One step's per-row parameters on the device, fused rows first, then masked rows."""

    rows: torch.Tensor  # [n] long: batch rows
    slots: torch.Tensor  # [n] long
    eos_ok: torch.Tensor  # [n] bool
    homes: torch.Tensor  # [f] long: rows of the seen table (fused rows)
    penalty: torch.Tensor  # [f] float32
    temperature: torch.Tensor  # [f] float32
    top_p: torch.Tensor  # [f] float32
    uniform: torch.Tensor  # [f] float32
    marks: torch.Tensor  # [m] long: flat indices into the seen table to set


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
    """Restricts (mask) or fully samples (fused) each Orpheus request's next token to its slot.

    Per step the host packs every row's parameters (batch row, slot, end-of-speech flag, seen-table
    row, penalty, temperature, top_p, uniform) and the codes generated since the last step into one
    float64 array, copied to the device once (pinned where vLLM pins). Which codes each request has
    generated per slot lives on the device, in one ``[capacity, 7, 4096]`` bool table; a request
    owns a row of it (its ``home``) for its life, whatever batch row it moves to.
    """

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _RowState] = {}
        self.device = device
        self.pin_memory = is_pin_memory
        scheduler = getattr(vllm_config, "scheduler_config", None)
        capacity = getattr(scheduler, "max_num_seqs", None) or 8
        self.seen = torch.zeros((capacity, FRAME_TOKENS, CODEBOOK_SIZE), dtype=torch.bool, device=device)
        self._free = list(range(capacity - 1, -1, -1))  # homes not held by any live row; pop() takes the lowest

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        SlotSampling.from_params(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: SamplingParams, _prompt: list[int] | None, output: list[int]) -> _RowState | None:
            spec = SlotSampling.from_params(params)
            return None if spec is None else _RowState(spec, output, self._take_home())

        if process_dict_updates(self.rows, batch_update, new_state):
            held = {state.home for state in self.rows.values()}
            self._free = [h for h in range(len(self.seen) - 1, -1, -1) if h not in held]

    def _take_home(self) -> int:
        """A free row of the seen table, cleared (grows the table when every row is held)."""
        if not self._free:
            grown = len(self.seen)
            self.seen = torch.cat([self.seen, torch.zeros_like(self.seen)])  # [2 * capacity, 7, 4096]
            self._free = list(range(len(self.seen) - 1, grown - 1, -1))
        home = self._free.pop()
        self.seen[home].zero_()
        return home

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        fused = [(i, s) for i, s in self.rows.items() if s.spec.mode == "fused"]
        masked = [(i, s) for i, s in self.rows.items() if s.spec.mode == "mask"]
        penalised = any(s.spec.repetition_penalty != 1.0 for _, s in fused)
        step = self._stage(fused, masked, penalised)
        f = len(fused)
        if fused:
            self._apply_fused(logits, step, f, penalised)
        if masked:
            rows, slots, eos_ok = step.rows[f:], step.slots[f:], step.eos_ok[f:]
            scores, ids = gather_candidates(logits, rows, slots, eos_ok)  # [m, C]
            logits.index_fill_(0, rows, float("-inf"))
            logits[rows[:, None], ids] = scores.to(logits.dtype)
        return logits

    def _stage(self, fused: list[tuple[int, _RowState]], masked: list[tuple[int, _RowState]],
               penalised: bool) -> _Step:
        """Everything this step needs from the host, in one host-to-device copy."""
        f, n = len(fused), len(fused) + len(masked)
        marks = [state.home * SEEN_PER_ROW + offset for _, state in fused for offset in state.unseen_codes()] \
            if penalised else []
        packed = np.zeros(3 * n + 5 * f + len(marks), dtype=np.float64)  # ids < 2**53 are exact; floats round as torch.tensor would
        table = packed[:3 * n].reshape(3, n)
        for j, (row, state) in enumerate(fused + masked):
            table[:, j] = (row, state.slot(), state.eos_allowed())
        params = packed[3 * n:3 * n + 5 * f].reshape(5, f)
        for j, (_, state) in enumerate(fused):
            spec = state.spec
            params[:, j] = (state.home, spec.repetition_penalty, spec.temperature, spec.top_p, state.rng.random())
        packed[3 * n + 5 * f:] = marks
        host = torch.from_numpy(packed)
        if self.pin_memory:
            host = host.pin_memory()
        dev = host.to(self.device, non_blocking=True)  # the step's only host-to-device copy
        table_d, params_d = dev[:3 * n].view(3, n), dev[3 * n:3 * n + 5 * f].view(5, f)
        as_float = params_d[1:].float()  # [4, f]
        return _Step(rows=table_d[0].long(), slots=table_d[1].long(), eos_ok=table_d[2] != 0,
                     homes=params_d[0].long(), penalty=as_float[0], temperature=as_float[1], top_p=as_float[2],
                     uniform=as_float[3], marks=dev[3 * n + 5 * f:].long())

    def _apply_fused(self, logits: torch.Tensor, step: _Step, f: int, penalised: bool) -> None:
        rows, slots = step.rows[:f], step.slots[:f]
        scores, ids = gather_candidates(logits, rows, slots, step.eos_ok[:f])  # [f, C]
        if penalised:
            self.seen.view(-1).index_fill_(0, step.marks, True)
            penalise(scores, self.seen[step.homes, slots], step.penalty)  # seen: [f, 4096]
        choice = nucleus_pick(scores, step.temperature, step.top_p, step.uniform)  # [f]
        token_ids = ids.gather(1, choice[:, None]).squeeze(1)  # [f]
        logits.index_fill_(0, rows, float("-inf"))
        logits[rows, token_ids] = 0.0
