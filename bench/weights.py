"""The stand-in weights every serving bench speaks with (`.cache/stand-in`).

The tiny model with the published SNAC shape (`snac-24khz`), not the narrow codec the test suite
uses: on a CPU the codec is most of a stream's cost, so the benches pay what a deployment's codec
costs and their figures stay comparable with the ones in docs/benchmarks.md. Built once, shared.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH_STAND_IN = REPO / ".cache" / "stand-in"


def bench_stand_in():
    """`StandInPaths` of the shared bench stand-in (two voices), built on first use."""
    from gpu_worker.stand_in import build_stand_in

    return build_stand_in(BENCH_STAND_IN, voices=2, codec="snac-24khz")
