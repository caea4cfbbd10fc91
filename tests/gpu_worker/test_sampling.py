"""Slot-constrained sampling: the vectorised pieces against straightforward references, and the
processor's row bookkeeping under vLLM's batch updates (adds, moves, swaps, async placeholders).
The engine-level checks (invalid_tokens == 0 across concurrent streams) are in test_fleet.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from gpu_worker.orpheus import AUDIO_BASE, CODEBOOK_SIZE, END_OF_SPEECH, FRAME_TOKENS, VOCAB_SIZE, audio_id
from gpu_worker.sampling import (
    CANDIDATES,
    PLACEHOLDER,
    SlotConstrainedSampler,
    SlotSampling,
    gather_candidates,
    nucleus_pick,
    penalise,
)


def reference_pick(scores: np.ndarray, temperature: float, top_p: float, u: float) -> int:
    """One row, the textbook way: softmax, sort, smallest prefix with mass >= top_p, inverse CDF."""
    if temperature == 0.0:
        return int(np.argmax(scores))
    z = scores.astype(np.float64) / temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    mass, nucleus = 0.0, []
    for index in order:
        if mass >= top_p or probs[index] == 0.0:
            break
        nucleus.append(index)
        mass += probs[index]
    weights = probs[nucleus] / probs[nucleus].sum()
    return int(nucleus[min(np.searchsorted(np.cumsum(weights), u, side="right"), len(nucleus) - 1)])


@given(st.integers(0, 2**31 - 1), st.sampled_from([0.0, 0.6, 1.0, 1.3]), st.sampled_from([0.05, 0.5, 0.8, 1.0]))
@settings(max_examples=60, deadline=None)
def test_nucleus_pick_matches_the_reference(seed, temperature, top_p):
    rng = np.random.default_rng(seed)
    scores = rng.normal(0, 3, size=(4, 64)).astype(np.float32)
    scores[1, 5] = 20.0  # a dominant candidate
    scores[2, -1] = -np.inf  # end of speech not allowed here
    uniform = rng.random(4).astype(np.float32)
    picks = nucleus_pick(torch.from_numpy(scores), torch.full((4,), temperature), torch.full((4,), top_p),
                         torch.from_numpy(uniform))
    expected = [reference_pick(scores[i], temperature, top_p, float(uniform[i])) for i in range(4)]
    assert picks.tolist() == expected
    assert picks[2] != 63


def test_nucleus_pick_distribution_follows_the_renormalised_nucleus():
    scores = torch.tensor([[2.0, 1.0, 0.5, -1.0, float("-inf")]])
    probs = torch.softmax(scores[0], 0)
    cumulative_before = torch.cumsum(probs, 0) - probs
    keep = int((cumulative_before < 0.8).sum())
    target = probs[:keep] / probs[:keep].sum()
    u = torch.rand(20_000, generator=torch.Generator().manual_seed(0))
    picks = nucleus_pick(scores.expand(len(u), -1), torch.ones(len(u)), torch.full((len(u),), 0.8), u)
    counts = torch.bincount(picks, minlength=5).float() / len(u)
    assert counts[keep:].sum() == 0  # outside the nucleus, and never the masked end of speech
    assert torch.allclose(counts[:keep], target, atol=0.02)


def test_uniform_at_the_top_never_picks_outside_the_nucleus():
    scores = torch.tensor([[1.0, 1.0, float("-inf")]])
    pick = nucleus_pick(scores, torch.ones(1), torch.ones(1), torch.tensor([1.0 - 2**-24]))
    assert pick.item() in (0, 1)


def test_gather_candidates_takes_the_slot_and_end_of_speech():
    logits = torch.arange(VOCAB_SIZE, dtype=torch.float32).repeat(3, 1)  # logit == id
    rows, slots = torch.tensor([0, 2]), torch.tensor([3, 0])
    scores, ids = gather_candidates(logits, rows, slots, torch.tensor([False, True]))
    assert scores.shape == (2, CANDIDATES) and ids.shape == (2, CANDIDATES)
    assert ids[0, 0] == audio_id(3, 0) and ids[0, CODEBOOK_SIZE - 1] == audio_id(3, CODEBOOK_SIZE - 1)
    assert ids[1, 0] == audio_id(0, 0) and (ids[:, -1] == END_OF_SPEECH).all()
    assert scores[0, -1] == float("-inf") and scores[1, -1] == END_OF_SPEECH
    assert torch.equal(scores[:, :-1], ids[:, :-1].float())


def test_penalty_equals_vllms_repetition_penalty_on_the_slot():
    from vllm.model_executor.layers.utils import apply_penalties

    torch.manual_seed(0)
    logits = torch.randn(1, VOCAB_SIZE) * 3
    history = [audio_id(2, 7), audio_id(2, 9), audio_id(5, 7), audio_id(2, 4000)]
    seen = torch.zeros(1, CODEBOOK_SIZE, dtype=torch.bool)
    seen[0, [7, 9, 4000]] = True
    scores, _ = gather_candidates(logits, torch.tensor([0]), torch.tensor([2]), torch.tensor([True]))
    ours = penalise(scores, seen, torch.tensor([1.3]))
    theirs = apply_penalties(logits.clone(), torch.full((1, 1), VOCAB_SIZE), torch.tensor([history]),
                             torch.zeros(1), torch.zeros(1), torch.tensor([1.3]))
    base = audio_id(2, 0)
    torch.testing.assert_close(ours[0, :CODEBOOK_SIZE], theirs[0, base:base + CODEBOOK_SIZE])


def _params(**spec) -> SamplingParams:
    return SamplingParams(temperature=0.0, extra_args=SlotSampling(**spec).as_extra_args())


def _processor() -> SlotConstrainedSampler:
    return SlotConstrainedSampler(None, torch.device("cpu"), False)


def test_fused_leaves_one_legal_logit_per_row_and_passes_others_through():
    proc = _processor()
    outputs = [[], [audio_id(s, 1) for s in range(3)], [audio_id(s % 7, 1) for s in range(14)]]
    proc.update_state(BatchUpdate(4, [], [(0, _params(seed=1), [], outputs[0]),
                                          (1, _params(seed=2, mode="mask"), [], outputs[1]),
                                          (2, _params(seed=3), [], outputs[2]),
                                          (3, SamplingParams(), [], [])], []))
    logits = torch.randn(4, VOCAB_SIZE)
    untouched = logits[3].clone()
    proc.apply(logits)
    finite = [torch.isfinite(logits[i]).nonzero().flatten().tolist() for i in range(4)]
    assert len(finite[0]) == 1 and AUDIO_BASE <= finite[0][0] < AUDIO_BASE + CODEBOOK_SIZE  # slot 0, no EOS yet
    slot3 = set(range(audio_id(3, 0), audio_id(3, 0) + CODEBOOK_SIZE))
    assert set(finite[1]) == slot3  # mask mode: the whole slot, nothing else
    assert len(finite[2]) == 1 and (finite[2][0] in range(AUDIO_BASE, AUDIO_BASE + CODEBOOK_SIZE) or finite[2][0] == END_OF_SPEECH)
    assert torch.equal(logits[3], untouched)


def test_end_of_speech_only_at_a_frame_boundary_after_min_frames():
    proc = _processor()
    frame = [audio_id(s, 0) for s in range(FRAME_TOKENS)]
    rows = {0: frame, 1: frame + frame[:3], 2: []}
    proc.update_state(BatchUpdate(3, [], [(i, _params(mode="mask", min_frames=1), [], out) for i, out in rows.items()], []))
    logits = torch.zeros(3, VOCAB_SIZE)
    logits[:, END_OF_SPEECH] = 50.0
    proc.apply(logits)
    assert torch.isfinite(logits[0, END_OF_SPEECH])
    assert not torch.isfinite(logits[1, END_OF_SPEECH]) and not torch.isfinite(logits[2, END_OF_SPEECH])


def test_same_seed_same_tokens_and_state_follows_moves_and_swaps():
    def run(moves: bool) -> list[int]:
        proc = _processor()
        a_out, b_out = [], []
        proc.update_state(BatchUpdate(2, [], [(0, _params(seed=5), [], a_out), (1, _params(seed=6), [], b_out)], []))
        a_index, b_index = 0, 1
        torch.manual_seed(0)
        for step in range(30):
            if moves and step % 4 == 3:
                proc.update_state(BatchUpdate(2, [], [], [(0, 1, MoveDirectionality.SWAP)]))
                a_index, b_index = b_index, a_index
            logits = torch.randn(2, VOCAB_SIZE)
            if a_index == 1:
                logits = logits.flip(0)  # same logits per request whichever row it sits in
            proc.apply(logits)
            a_out.append(int(logits[a_index].argmax()))
            b_out.append(int(logits[b_index].argmax()))
        return a_out + b_out

    assert run(False) == run(True)


def test_placeholder_never_hides_a_token_from_the_penalty():
    proc = _processor()
    out = [audio_id(0, 11)]
    proc.update_state(BatchUpdate(1, [], [(0, _params(seed=1, repetition_penalty=1e6, temperature=0.0), [], out)], []))
    state = proc.rows[0]
    out.append(PLACEHOLDER)  # async scheduling: sampled, not yet copied back
    assert state.unseen_codes() == [audio_id(0, 11) - AUDIO_BASE]
    assert state.consumed == 1 and state.unseen_codes() == []  # stops at the placeholder until it is resolved
    out[-1] = audio_id(1, 22)  # vLLM fills it in before the next apply
    out.extend(audio_id(s, 0) for s in range(2, 7))
    out.extend([audio_id(0, 1)])
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, audio_id(1, 22)] = 5.0  # would win greedily unless penalised as already seen
    logits[0, audio_id(1, 23)] = 4.0
    proc.apply(logits)
    assert int(logits[0].argmax()) == audio_id(1, 23)


@pytest.mark.parametrize("bad", [{"mode": "loose"}, {"top_p": 0.0}, {"temperature": -1.0}])
def test_bad_specs_are_rejected_at_admission(bad):
    with pytest.raises(ValueError):
        SlotConstrainedSampler.validate_params(_params(**bad))


def _mixed_batch(n: int) -> tuple[SlotConstrainedSampler, list[list[int]]]:
    proc = _processor()
    outputs = [[audio_id(k % 7, (5 * i + k) % CODEBOOK_SIZE) for k in range(i)] for i in range(n)]
    proc.update_state(BatchUpdate(n, [], [(i, _params(seed=i, mode="mask" if i % 3 == 2 else "fused"), [], out)
                                          for i, out in enumerate(outputs)], []))
    return proc, outputs


def _count_calls(monkeypatch, owner, names: tuple[str, ...], counts: dict[str, int]) -> None:
    for name in names:
        original = getattr(owner, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


def _calls_per_apply(monkeypatch, n: int, steps: int = 3) -> dict[str, int]:
    """Tensor-making and tensor-writing calls made by `steps` applies over a batch of n rows."""
    proc, outputs = _mixed_batch(n)
    counts = dict.fromkeys(("tensor", "as_tensor", "from_numpy", "to", "copy_", "__setitem__", "index_put_"), 0)
    with monkeypatch.context() as patch:
        _count_calls(patch, torch, ("tensor", "as_tensor", "from_numpy"), counts)
        _count_calls(patch, torch.Tensor, ("to", "copy_", "__setitem__", "index_put_"), counts)
        for _ in range(steps):
            logits = torch.randn(n, VOCAB_SIZE)
            proc.apply(logits)
            for i, out in enumerate(outputs):
                out.append(int(logits[i].argmax()) if i % 3 != 2 else audio_id(len(out) % 7, 0))
    return counts


def test_one_host_to_device_copy_per_step_whatever_the_batch(monkeypatch):
    """Per-row parameters travel in one packed array: one tensor made from host data per step, and
    no tensor call is made once per row (a per-row copy or write would scale with the batch). 20
    rows also outgrow the seen table's default capacity."""
    small, large = _calls_per_apply(monkeypatch, 8), _calls_per_apply(monkeypatch, 20)
    assert small["tensor"] + small["as_tensor"] + small["from_numpy"] == 3  # one per step
    assert small == large


def test_requests_keep_their_own_penalty_history_in_a_shared_batch():
    """Each request's seen codes stay its own when many share (and outgrow) the seen table and
    rows are handed to new requests (which reuse freed table rows): every request's tokens in the
    batch equal its tokens sampled alone."""
    def logits_for(request: int, k: int) -> torch.Tensor:
        return torch.randn(VOCAB_SIZE, generator=torch.Generator().manual_seed(1000 * request + k))

    def run(batch: list[int], steps: int, arrivals: dict[int, tuple[int, int]]) -> dict[int, list[int]]:
        """arrivals: step -> (batch row, new request) replacing that row's request before the step."""
        proc, outs, where = _processor(), {}, {}

        def add(row: int, request: int) -> BatchUpdate:
            outs[request] = []
            where[row] = request
            return BatchUpdate(len(batch), [], [(row, _params(seed=request, repetition_penalty=3.0), [], outs[request])], [])

        for row, request in enumerate(batch):
            proc.update_state(add(row, request))
        for step in range(steps):
            if step in arrivals:
                proc.update_state(add(*arrivals[step]))
            logits = torch.stack([logits_for(where[row], len(outs[where[row]])) for row in range(len(batch))])
            proc.apply(logits)
            for row in range(len(batch)):
                outs[where[row]].append(int(logits[row].argmax()))
        return outs

    together = run(list(range(12)), 24, {10: (0, 99), 12: (1, 98)})  # 98 reuses request 0's freed row
    for request in (0, 5, 11, 98, 99):
        assert together[request] == run([request], len(together[request]), {})[request]
