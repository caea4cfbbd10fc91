"""bench/clone.py through `voicering bench clone --json --quick`: every figure is there, within its
bounds, and the checks meet their targets on the quick corpus (two base files, five faults each)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bench.cli import app
from bench.clone import FAULTS, TARGETS

KEYS = ("fault_detection_rate", "clean_false_block_rate", "snr_error_db_p90", "checks_s_per_audio_min",
        "asr_s_per_audio_min", "consent_other_speaker_accepted", "consent_same_speaker_refused")


def test_bench_clone_quick_reports_every_figure_within_its_bounds():
    result = CliRunner().invoke(app, ["clone", "--json", "--quick"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert all(key in figures for key in KEYS), sorted(figures)
    assert figures["faulty_files"] == 2 * len(FAULTS) and figures["clean_files"] == 2
    met = figures["targets_met"]
    assert set(met) == set(TARGETS)
    assert met["fault_detection_rate"] and figures["fault_detection_rate"] >= 0.95, figures["missed_faults"]
    assert met["clean_false_block_rate"] and figures["clean_false_block_rate"] <= 0.05
    assert 0.0 <= figures["snr_error_db_p90"] <= 5.0 and figures["snr_cases"] == 10
    assert figures["checks_s_per_audio_min"] > 0.0
    assert "not comparable" in figures["note"]
    if figures["asr_s_per_audio_min"] is None:
        assert figures["asr_unavailable"]
    else:
        assert figures["asr_s_per_audio_min"] > 0.0
    if figures["consent_same_speaker_refused"] is None:
        assert figures["speaker_unavailable"] and figures["consent_other_speaker_accepted"] is None
    else:
        trials = figures["consent_trials"]
        assert trials > 0 and len(figures["consent_wrong"]) == (figures["consent_other_speaker_accepted"]
                                                                + figures["consent_same_speaker_refused"])
        assert figures["consent_same_speaker_refused"] == 0 and met["consent_same_speaker_refused"]
        assert met["consent_other_speaker_accepted"] == (figures["consent_other_speaker_accepted"] == 0)
        # every "other" voice is one: no two voice names read the consent alike, sample for sample
        assert figures["consent_voice_aliases"] == 0 and met["consent_voice_aliases"], \
            figures["consent_voice_alias_pairs"]
        assert figures["consent_other_speaker_accepted"] == 0 and met["consent_other_speaker_accepted"], \
            figures["consent_wrong"]
