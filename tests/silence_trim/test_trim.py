"""Trimming clips for datasets: within margin of speech, never inside it, no click, files and folders."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from silence_trim import AudioFileError, TrimOptions, measure, summarize, trim, trim_file, trim_folder
from silence_trim.pcm import fade_gains
from tests.fixtures.speech import pad_silence
from tests.silence_trim.conftest import PADS_MS, make_case

SR = 24000
MARGIN_MS, FADE_MS = 20.0, 5.0
MARGIN, FADE = round(MARGIN_MS * SR / 1000), round(FADE_MS * SR / 1000)
SLACK = round(10.0 * SR / 1000)


def check_trim(case, detector, vad=None):
    """Output starts within margin + 10 ms of speech, and every speech sample is kept untouched."""
    result = trim(case.audio, SR, TrimOptions(detector=detector, margin_ms=MARGIN_MS, fade_ms=FADE_MS), vad=vad)
    first, last = case.speech
    if result.start > 0:  # something was cut: neither the cut nor its fade-in reaches speech
        assert result.start + FADE <= first, f"{case.label}: fade or cut reaches speech at {first} (cut {result.start})"
    assert first - result.start <= MARGIN + SLACK, f"{case.label}: {first - result.start} samples kept before speech"
    if result.end < case.audio.shape[0]:
        assert result.end - FADE > last, f"{case.label}: cut at {result.end} reaches speech ending {last}"
    kept = result.audio[first - result.start : last + 1 - result.start]
    assert np.array_equal(kept, case.audio[first : last + 1]), case.label
    assert result.audio.dtype == case.audio.dtype
    return result


@pytest.mark.parametrize("detector", ["energy", "vad"])
def test_clean_speech_is_trimmed_to_margin_and_never_cut(clips, vad, detector):
    for i, c in enumerate(clips if detector == "energy" else clips[:8]):
        for pad in PADS_MS:
            check_trim(make_case(c, pad, "clean", tail_ms=pad), detector, vad)


@pytest.mark.parametrize("noise", ["white-60", "dc", "hum-30"])
def test_energy_trim_with_quiet_noise_floors(clips, noise):
    for i, c in enumerate(clips[:12]):
        for pad in PADS_MS:
            check_trim(make_case(c, pad, noise, tail_ms=300, seed=i), "energy")


@pytest.mark.parametrize("noise", ["white-60", "white-45", "hum-30"])
def test_vad_trim_keeps_everything_above_the_noise(clips, vad, noise):
    for i, c in enumerate(clips[:8]):
        for pad in (100, 1500):
            check_trim(make_case(c, pad, noise, tail_ms=300, seed=i), "vad", vad)


def test_the_cut_is_faded_with_no_click(clip):
    case = make_case(clip, 600, "white-60", tail_ms=600)
    result = trim(case.audio, SR)
    head = case.audio[result.start : result.start + FADE]
    assert np.allclose(result.audio[:FADE], head * fade_gains(FADE))
    assert abs(result.audio[0]) <= abs(head[0]) * 0.01  # starts from (almost) zero
    assert np.allclose(result.audio[-FADE:], case.audio[result.end - FADE : result.end] * fade_gains(FADE)[::-1])


def test_result_reports_what_was_removed(clip):
    result = trim(pad_silence(clip, SR, 600, 400), SR)
    assert result.removed_head_ms == pytest.approx(result.report.leading_silence_ms - MARGIN_MS, abs=0.05)
    assert result.removed_tail_ms == pytest.approx(result.report.trailing_silence_ms - MARGIN_MS, abs=0.05)
    assert result.duration_ms == pytest.approx(result.report.speech_ms + 2 * MARGIN_MS, abs=0.05)
    assert measure(result.audio, SR).leading_silence_ms == pytest.approx(MARGIN_MS, abs=5.0)


def test_head_only_and_tail_only(clip):
    audio = pad_silence(clip, SR, 600, 600)
    head_only = trim(audio, SR, TrimOptions(tail=False))
    tail_only = trim(audio, SR, TrimOptions(head=False))
    assert head_only.end == audio.size and head_only.start > 0
    assert tail_only.start == 0 and tail_only.end < audio.size
    assert np.array_equal(tail_only.audio[:100], audio[:100])


def test_all_silence_is_returned_unchanged(vad):
    for detector in ("energy", "vad"):
        audio = np.zeros(SR, dtype=np.int16)
        result = trim(audio, SR, TrimOptions(detector=detector), vad=vad)
        assert not result.report.has_speech and np.array_equal(result.audio, audio)
        assert result.removed_head_ms == result.removed_tail_ms == 0.0


def test_stereo_is_measured_on_its_mix_and_cut_on_every_channel(clip):
    mono = pad_silence(clip, SR, 600, 300)
    stereo = np.stack([mono, (mono // 2).astype(np.int16)], axis=1)
    result = trim(stereo, SR, TrimOptions(downmix=True))
    assert result.audio.shape[1] == 2
    reference = trim(mono, SR)
    assert abs(result.start - reference.start) <= round(0.005 * SR)  # the mix is 3.5 dB quieter


@pytest.mark.parametrize("suffix,subtype", [(".wav", "PCM_16"), (".flac", "PCM_16"), (".wav", "FLOAT"), (".flac", "PCM_24")])
def test_files_keep_their_format_and_kept_samples(tmp_path, clip, suffix, subtype):
    source, target = tmp_path / f"in{suffix}", tmp_path / "out" / f"trimmed{suffix}"
    sf.write(source, pad_silence(clip, SR, 600, 300), SR, subtype=subtype)
    outcome = trim_file(source, target)
    assert sf.info(target).subtype == subtype and sf.info(target).samplerate == SR
    original, trimmed = sf.read(source, dtype="float64")[0], sf.read(target, dtype="float64")[0]
    start = round(outcome.removed_head_ms * SR / 1000)
    middle = slice(FADE, trimmed.size - FADE)
    assert np.array_equal(trimmed[middle], original[start:][middle])


def test_folder_batch_reports_each_file_and_survives_a_corrupt_one(tmp_path, speech_corpus):
    source = tmp_path / "in"
    (source / "sub").mkdir(parents=True)
    for i, c in enumerate(speech_corpus[:3]):
        sf.write(source / ("sub" if i == 2 else "") / f"{i}.wav", pad_silence(c.load(), SR, 600), SR)
    (source / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt garbage")
    (source / "notes.txt").write_text("not audio")
    outcomes = trim_folder(source, tmp_path / "out")
    assert [o.source.name for o in outcomes] == ["0.wav", "1.wav", "broken.wav", "2.wav"]
    broken = outcomes[2]
    assert broken.error and "broken.wav" in broken.error and broken.target is None
    assert (tmp_path / "out" / "sub" / "2.wav").is_file()
    summary = summarize(outcomes)
    assert (summary["files"], summary["trimmed"], summary["failed"]) == (4, 3, 1)
    assert summary["removed_head_ms_mean"] == pytest.approx(600 - MARGIN_MS + 12, abs=30)


def test_folder_refuses_to_overwrite_its_source(tmp_path):
    with pytest.raises(ValueError, match="is the source folder"):
        trim_folder(tmp_path, tmp_path)


def test_a_corrupt_or_missing_file_is_a_clear_error(tmp_path):
    corrupt = tmp_path / "corrupt.flac"
    corrupt.write_bytes(b"fLaC" + bytes(100))
    for path in (corrupt, tmp_path / "missing.wav"):
        with pytest.raises(AudioFileError, match=f"cannot read .*{path.name}"):
            trim_file(path, tmp_path / "out.wav")
