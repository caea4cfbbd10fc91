"""Offline ring analysis (no Redis): how evenly a ring spreads voices and load, and how many voices
move when a worker leaves or joins. Used by `voicering ring simulate` and by `bench/ring.py`."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from hashring.ring import DEFAULT_VNODES, Ring

__all__ = ["Movement", "SimulationReport", "max_over_mean", "movement", "simulate", "voice_ids", "worker_ids"]


def worker_ids(count: int) -> list[str]:
    return [f"worker-{i:03d}" for i in range(count)]


def voice_ids(count: int) -> list[str]:
    return [f"voice-{i:06d}" for i in range(count)]


def max_over_mean(per_node: Mapping[str, float], nodes: Sequence[str]) -> float:
    """Largest value over the mean, counting nodes that have none as 0."""
    values = [per_node.get(n, 0) for n in nodes]
    mean = sum(values) / len(values)
    return max(values) / mean if mean else 0.0


@dataclass(frozen=True, slots=True)
class Movement:
    """Mean fraction of voices whose first owner changed over `trials` single removals (additions);
    `foreign` counts voices that moved between two nodes neither of which was removed or added."""

    on_remove: float
    on_add: float
    foreign: int
    trials: int


def movement(ring: Ring, voices: Sequence[str], *, trials: int = 16, seed: int = 0) -> Movement:
    rng = random.Random(seed)
    before = [ring.owner(v) for v in voices]
    ids = [n.id for n in ring.nodes]
    removed_moves, added_moves, foreign = [], [], 0
    for trial in range(trials):
        gone = rng.choice(ids)
        if len(ids) > 1:
            shrunk = ring.without_node(gone)
            moved = [(a, b) for a, b in zip(before, (shrunk.owner(v) for v in voices)) if a != b]
            foreign += sum(1 for a, _ in moved if a != gone)
            removed_moves.append(len(moved) / len(voices))
        else:
            removed_moves.append(1.0)  # the only worker left: every voice loses its home
        new = f"joiner-{seed}-{trial}"
        grown = ring.with_node(new)
        moved = [(a, b) for a, b in zip(before, (grown.owner(v) for v in voices)) if a != b]
        foreign += sum(1 for _, b in moved if b != new)
        added_moves.append(len(moved) / len(voices))
    return Movement(sum(removed_moves) / trials, sum(added_moves) / trials, foreign, trials)


@dataclass(frozen=True, slots=True)
class SimulationReport:
    workers: int
    voices: int
    vnodes: int
    share_max_over_mean: float  # largest fraction of hash space any worker owns, over the mean
    share_min_over_mean: float
    voices_max_over_mean: float  # busiest worker's voice count over the mean
    voices_min_over_mean: float
    moved_fraction_on_remove: float
    moved_fraction_on_add: float
    moved_ideal_on_remove: float  # 1 / workers
    moved_ideal_on_add: float  # 1 / (workers + 1)
    moved_foreign: int
    trials: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def simulate(
    workers: int, voices: int, *, vnodes: int = DEFAULT_VNODES, trials: int = 16, seed: int = 0
) -> SimulationReport:
    if workers < 1 or voices < 1:
        raise ValueError("simulate needs at least one worker and one voice")
    nodes = worker_ids(workers)
    ring = Ring(nodes, vnodes=vnodes)
    shares = ring.shares()
    share_values = [shares[n] for n in nodes]
    mean_share = 1 / workers
    voice_list = voice_ids(voices)
    counts = Counter(ring.owner(v) for v in voice_list)
    mean_voices = voices / workers
    moves = movement(ring, voice_list, trials=trials, seed=seed)
    return SimulationReport(
        workers=workers,
        voices=voices,
        vnodes=vnodes,
        share_max_over_mean=max(share_values) / mean_share,
        share_min_over_mean=min(share_values) / mean_share,
        voices_max_over_mean=max(counts.get(n, 0) for n in nodes) / mean_voices,
        voices_min_over_mean=min(counts.get(n, 0) for n in nodes) / mean_voices,
        moved_fraction_on_remove=moves.on_remove,
        moved_fraction_on_add=moves.on_add,
        moved_ideal_on_remove=1 / workers,
        moved_ideal_on_add=1 / (workers + 1),
        moved_foreign=moves.foreign,
        trials=trials,
    )
