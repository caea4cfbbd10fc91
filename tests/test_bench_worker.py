"""bench/worker.py's round plan: every ratio compares phases measured back to back, and which side
goes first alternates from round to round."""

from __future__ import annotations

from bench.worker import CONCURRENCY, _plan


def _names(round_index: int) -> list[str]:
    return [name for name, *_ in _plan(round_index, ["lora"], ["base"], "fused", "off")]


def test_each_ratio_pair_is_adjacent_in_every_round():
    top = CONCURRENCY[-1]
    pairs = [(f"fused_c{c}", f"off_c{c}") for c in CONCURRENCY] + [(f"fused_c{top}", f"base_fused_c{top}")]
    for r in range(4):
        names = _names(r)
        assert len(names) == len(set(names)) == 2 * len(CONCURRENCY) + 1
        for a, b in pairs:
            assert abs(names.index(a) - names.index(b)) == 1, (r, a, b)


def test_which_side_goes_first_alternates():
    for c in CONCURRENCY:
        firsts = [_names(r).index(f"fused_c{c}") < _names(r).index(f"off_c{c}") for r in range(4)]
        assert firsts == [firsts[0], not firsts[0]] * 2
