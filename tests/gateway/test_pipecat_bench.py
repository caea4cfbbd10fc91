"""The Pipecat bench's verdicts can fail: no workers, just its targets."""

from __future__ import annotations

from bench.pipecat import TARGETS
from bench.proxy import judge

MET = {"added_ttfb_ms_p50": 1.5, "interrupt_to_silence_ms_p50": 12.0, "frames_after_interrupt": 0,
       "sockets_per_service": 1, "failed_turns": 0}


def test_every_target_is_judged_and_each_can_fail():
    assert set(TARGETS) == set(MET) and all(judge(MET, TARGETS).values())
    failing = {"added_ttfb_ms_p50": 5.1, "interrupt_to_silence_ms_p50": 51.0, "frames_after_interrupt": 1,
               "sockets_per_service": 2, "failed_turns": 1}
    for name, value in failing.items():
        verdict = judge(MET | {name: value}, TARGETS)
        assert verdict[name] is False and all(v for k, v in verdict.items() if k != name)
    assert judge(MET | {"sockets_per_service": None}, TARGETS)["sockets_per_service"] is False  # unmeasured fails
