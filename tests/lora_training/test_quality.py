"""The upload checks' signal measures and findings (lora_training.quality.signal, .checks, .job) on
espeak-ng speech made at test time with known faults: noise at a known SNR, gain and clamp,
8 kHz resampled up, inserted silences, too quiet; and clean speech that passes with no block.
Pure: no worker, no gateway."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import soxr

from lora_training.errors import UploadCheckError
from lora_training.espeak import HARVARD_SENTENCES
from lora_training.ingest import BLOCK_FRAMES, ingest
from lora_training.quality.checks import Clipping, check_recording, check_upload, merge, record
from lora_training.quality.findings import blocks
from lora_training.quality.job import JobChecks
from lora_training.quality.signal import clip_runs, region_mask, snr_db
from lora_training.quality.thresholds import CheckThresholds
from lora_training.segment import speech_regions
from lora_training.settings import DataParams
from tests.fixtures.speech import SAMPLE_RATE, synthesize, white_noise

TH = CheckThresholds()
DATA = DataParams()


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> dict[str, np.ndarray]:
    """Six Harvard sentences per espeak-ng voice (~13 s each), 24 kHz float64, digital-zero pauses."""
    folder = tmp_path_factory.mktemp("quality")
    out = {}
    for voice in ("en-us", "en+f3"):
        path = synthesize(" ".join(HARVARD_SENTENCES[:6]), voice, folder / f"{voice}.wav")
        out[voice] = sf.read(str(path), dtype="float64")[0]
    return out


def checked(name: str, audio: np.ndarray, rate: int = SAMPLE_RATE, **kw):
    return check_recording(name, audio, rate, speech_regions(audio.astype(np.float32), DATA), TH, **kw)


def codes(findings, level=None) -> set[str]:
    return {f.code for f in findings if level is None or f.level == level}


def test_clean_speech_passes_with_no_block(speech):
    for voice, audio in speech.items():
        found = checked(f"{voice}.wav", audio)
        assert not blocks(found), found
        assert "low_snr" not in codes(found) and "clipping" not in codes(found) and "loudness" not in codes(found)


@pytest.mark.parametrize("voice", ["en-us", "en+f3"])
def test_snr_estimate_rises_with_the_true_snr_and_is_within_5_db_from_10_to_30(speech, voice):
    clean = speech[voice]
    regions = speech_regions(clean.astype(np.float32), DATA)
    power = np.mean(clean[region_mask(regions, clean.size)] ** 2)  # the speech's power where it speaks
    truths = [5, 10, 15, 20, 25, 30, 35]
    estimates = []
    for truth in truths:
        noise_dbfs = 10 * np.log10(power) - truth
        noisy = clean + white_noise(clean.size, noise_dbfs, seed=truth)
        estimates.append(snr_db(noisy, speech_regions(noisy.astype(np.float32), DATA)).snr_db)
    assert all(b > a for a, b in zip(estimates, estimates[1:], strict=False)), list(zip(truths, estimates))
    for truth, estimate in zip(truths, estimates, strict=True):
        if 10 <= truth <= 30:
            assert abs(estimate - truth) <= 5.0, (truth, estimate)


def test_noise_at_10_db_blocks_and_at_20_db_warns_naming_the_file(speech):
    clean = speech["en-us"]
    power = np.mean(clean[region_mask(speech_regions(clean.astype(np.float32), DATA), clean.size)] ** 2)
    for snr, level in ((10, "block"), (20, "warn")):
        noisy = clean + np.random.default_rng(snr).standard_normal(clean.size) * np.sqrt(power / 10 ** (snr / 10))
        found = [f for f in checked("street.wav", noisy) if f.code == "low_snr"]
        assert [f.level for f in found] == [level]
        assert found[0].file == "street.wav" and "street.wav" in found[0].message and "quiet room" in found[0].message
        assert found[0].start_s is not None and found[0].end_s > found[0].start_s


def test_gain_and_clamp_is_clipping_found_with_its_file_and_time(speech, tmp_path):
    audio = speech["en+f3"].copy()
    start, end = 4 * SAMPLE_RATE, 7 * SAMPLE_RATE
    audio[start:end] = np.clip(audio[start:end] * 6.0, -1.0, 1.0)  # +16 dB on 0:04-0:07, clamped
    path = tmp_path / "loud.wav"
    sf.write(str(path), audio, SAMPLE_RATE, subtype="PCM_16")
    recording = ingest(path, DATA.model_copy(update={"max_clipped_fraction": 0.5}))  # past ingest's own refusal
    found = [f for f in check_recording("loud.wav", recording.audio, recording.source_rate,
                                        speech_regions(recording.audio, DATA), TH,
                                        clipping=Clipping.of(recording)) if f.code == "clipping"]
    assert [f.level for f in found] == ["block"]
    assert found[0].file == "loud.wav" and 4.0 <= found[0].start_s < found[0].end_s <= 7.0
    assert "0:04" in found[0].message and "input gain" in found[0].message


def test_one_short_clamp_is_a_warning_at_its_time(speech, tmp_path):
    audio = speech["en-us"].copy()
    at = int(np.argmax(np.abs(audio[5 * SAMPLE_RATE:6 * SAMPLE_RATE]))) + 5 * SAMPLE_RATE
    audio[at:at + 6] = 1.0  # six samples held at full scale at 0:05
    path = tmp_path / "pop.wav"
    sf.write(str(path), audio, SAMPLE_RATE, subtype="PCM_16")
    recording = ingest(path, DATA)
    found = [f for f in checked("pop.wav", recording.audio, clipping=Clipping.of(recording)) if f.code == "clipping"]
    assert [f.level for f in found] == ["warn"] and found[0].value == 6
    assert abs(found[0].start_s - at / SAMPLE_RATE) < 1e-3 and "0:05" in found[0].message


def test_clipped_runs_carry_across_decoded_blocks(tmp_path):
    x = 0.3 * np.sin(np.arange(48_000 * 4) / 10.0)
    x[2 * BLOCK_FRAMES - 5:2 * BLOCK_FRAMES + 20] = -1.0  # 25 frames across a block boundary
    x[100_000:100_004] = 1.0
    path = tmp_path / "runs.wav"
    sf.write(str(path), x.astype(np.float32), 48_000, subtype="FLOAT")
    stats = ingest(path, DATA).clip
    assert (stats.samples, stats.longest) == (29, 25)
    assert stats.longest_at_s == pytest.approx((2 * BLOCK_FRAMES - 5) / 48_000)
    assert stats.first_s == pytest.approx(100_000 / 48_000)
    runs = clip_runs(np.array([1, 1, 0, 1, 1, 1], bool), carried=4)
    assert (runs.longest, runs.longest_at, runs.open_run) == (6, -4, 3)


def test_8_khz_audio_resampled_up_is_a_bandwidth_block(speech):
    phone = soxr.resample(soxr.resample(speech["en-us"], SAMPLE_RATE, 8000), 8000, SAMPLE_RATE)
    found = [f for f in checked("call.wav", phone) if f.code == "narrow_band"]
    assert [f.level for f in found] == ["block"] and found[0].value < 4000
    assert "call.wav" in found[0].message and "kHz" in found[0].message


def test_inserted_silences_are_found_with_their_times_and_said_fixed(speech):
    clean = speech["en-us"]
    cut = 6 * SAMPLE_RATE
    gap = np.zeros(12 * SAMPLE_RATE)
    audio = np.concatenate([clean[:cut], gap, clean[cut:], gap, gap])
    found = checked("pauses.wav", audio)
    long = [f for f in found if f.code == "long_silence"]
    assert all(f.level == "fixed" for f in long) and len(long) == 2
    assert 6.0 <= long[0].start_s < 6.5 and 17.5 < long[0].end_s <= 18.5
    assert "0:06" in long[0].message and "cut out before training" in long[0].message
    share = [f for f in found if f.code == "silence_share"]
    assert [f.level for f in share] == ["fixed"] and share[0].value > 100 * TH.warn_silence_fraction
    assert not blocks(found)


def test_too_quiet_speech_is_a_loudness_block_and_a_little_quiet_a_warning(speech):
    for gain_db, level in ((-30.0, "block"), (-14.0, "warn")):
        found = [f for f in checked("far.wav", speech["en+f3"] * 10 ** (gain_db / 20)) if f.code == "loudness"]
        assert [f.level for f in found] == [level], (gain_db, found)
        assert "LUFS" in found[0].message and "microphone" in found[0].message


def test_a_low_sample_rate_is_said(speech):
    assert [f.level for f in checked("old.wav", speech["en-us"], rate=16_000) if f.code == "sample_rate"] == ["warn"]
    assert [f.level for f in checked("old.wav", speech["en-us"], rate=11_025) if f.code == "sample_rate"] == ["block"]


def test_little_speech_is_a_warning_of_the_upload():
    (found,) = check_upload(120.0, TH)
    assert (found.level, found.code, found.file) == ("warn", "speech_amount", None)
    assert check_upload(TH.warn_speech_s + 1, TH) == []


def test_the_job_fails_once_listing_every_block_and_keeps_warnings(speech, tmp_path):
    clean = speech["en-us"]
    phone = soxr.resample(soxr.resample(clean, SAMPLE_RATE, 8000), 8000, SAMPLE_RATE)
    paths = {}
    for name, audio in (("clean.wav", clean), ("call.wav", phone), ("far.wav", clean * 10 ** (-30 / 20))):
        paths[name] = tmp_path / name
        sf.write(str(paths[name]), audio, SAMPLE_RATE, subtype="PCM_16")
    checks = JobChecks()
    for path in paths.values():
        recording = ingest(path, DATA)
        checks.file(recording, speech_regions(recording.audio, DATA))
    with pytest.raises(UploadCheckError) as refused:
        checks.finish(40.0)
    assert refused.value.code == "upload_checks"
    assert {(f.file, f.code) for f in refused.value.findings} == {("call.wav", "narrow_band"), ("far.wav", "loudness")}
    assert "call.wav" in refused.value.message and "far.wav" in refused.value.message

    ok = JobChecks()
    recording = ingest(paths["clean.wav"], DATA)
    ok.file(recording, speech_regions(recording.audio, DATA))
    assert [f["code"] for f in ok.finish(40.0)] == ["speech_amount"]


def test_findings_of_two_stages_are_kept_once_with_the_thresholds_version(speech):
    gateway = check_upload(100.0, TH)
    job = check_upload(99.95, TH) + checked("a.wav", speech["en-us"])
    assert len(merge(gateway, job)) == len(job)
    kept = record([f.to_dict() for f in gateway], [f.to_dict() for f in job])
    assert kept["thresholds_version"] == TH.version and len(kept["findings"]) == len(job)


def test_the_measures_are_pure(speech):
    audio = speech["en+f3"]
    assert checked("x.wav", audio) == checked("x.wav", audio.copy())


def test_a_job_whose_upload_is_half_another_voice_is_refused_naming_the_file(speech, tmp_path):
    """The job stage runs the second-speaker check over every file (the speaker model, real): one
    file in another voice, as much speech as the creator's, is a block that names that file; the
    creator's voice alone passes."""
    paths = {}
    for voice, audio in speech.items():
        paths[voice] = tmp_path / f"{voice}.wav"
        sf.write(str(paths[voice]), audio, SAMPLE_RATE, subtype="PCM_16")

    def run(names: list[str]) -> list[dict]:
        checks = JobChecks(speakers=True)
        speech_s = 0.0
        for voice in names:
            recording = ingest(paths[voice], DATA)
            regions = speech_regions(recording.audio, DATA)
            speech_s += sum(end - start for start, end in regions) / SAMPLE_RATE
            checks.file(recording, regions)
        return checks.finish(speech_s)

    assert "second_speaker" not in {f["code"] for f in run(["en-us"])}
    with pytest.raises(UploadCheckError) as refused:
        run(["en-us", "en+f3"])
    found = [f for f in refused.value.findings if f.code == "second_speaker"]
    assert found and all(f.level == "block" for f in found), refused.value.findings
    assert {f.file for f in found} == {"en+f3.wav"} or {f.file for f in found} == {"en-us.wav"}, found


def test_speech_is_voiced_and_noise_is_not(speech):
    """The second-speaker check's gate: noise a level gate lets through never reads as a voice."""
    from lora_training.quality.signal import voiced_share

    rng = np.random.default_rng(3)
    for audio in speech.values():
        assert voiced_share(audio) >= 3 * TH.speaker_min_voiced_share / 2
        noisy = audio + rng.standard_normal(audio.size) * np.sqrt(np.mean(audio ** 2)) * 10 ** (-10 / 20)
        assert voiced_share(noisy) > TH.speaker_min_voiced_share  # still a voice at 10 dB SNR
    white = rng.standard_normal(3 * SAMPLE_RATE) * 0.1
    assert voiced_share(white) < TH.speaker_min_voiced_share / 4
    assert voiced_share(np.convolve(white, np.ones(30) / 30, "same")) < TH.speaker_min_voiced_share / 4
