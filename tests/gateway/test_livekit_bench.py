"""The LiveKit bench's verdicts can fail: no workers, just its targets."""

from __future__ import annotations

from bench.livekit import TARGETS
from bench.proxy import judge

MET = {"plugin_minus_direct_ttfb_ms_p50": -1.0, "plugin_overhead_ms_p50": 1.2, "first_audio_before_text_complete": True,
       "interrupt_to_silence_ms_p50": 3.0, "frames_after_interrupt": 0, "sockets_per_worker": 1, "failed_turns": 0}


def test_every_target_is_judged_and_each_can_fail():
    assert set(TARGETS) == set(MET) and all(judge(MET, TARGETS).values())
    failing = {"plugin_minus_direct_ttfb_ms_p50": 5.1, "plugin_overhead_ms_p50": 6.0,
               "first_audio_before_text_complete": False, "interrupt_to_silence_ms_p50": 51.0,
               "frames_after_interrupt": 1, "sockets_per_worker": 2, "failed_turns": 1}
    for name, value in failing.items():
        verdict = judge(MET | {name: value}, TARGETS)
        assert verdict[name] is False and all(v for k, v in verdict.items() if k != name)
    assert judge(MET | {"sockets_per_worker": None}, TARGETS)["sockets_per_worker"] is False  # unmeasured fails
