"""Speaker embeddings (lora_training.quality.speaker) and the checks built on them (speakers.py):
a second voice in an upload, found with its file and time, and a consent recording matched to the
upload's voice. Speech is made here with espeak-ng: en-us (male) is the creator; en+f3 and
en-us+f2 (female) are other people. Fixtures are module-scoped: the model loads once and every
clip is embedded once (~1.5 min of audio in all)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from lora_training.quality.speaker import (
    WEIGHTS_SHA256,
    NoSpeech,
    SpeakerEncoder,
    SpeakerWeightsError,
    SpeakerWindows,
    check_weights,
    cosine,
    hz_to_mel,
    mel_filterbank,
    weights_path,
)
from lora_training.quality.speakers import MAX_RANGES_LISTED, second_speaker, speaker_match
from lora_training.quality.thresholds import CheckThresholds
from tests.fixtures.speech import SENTENCES, read_pcm16, speech_edges, synthesize

RATE = 24000
CREATOR = "en-us"
OTHERS = ("en+f3", "en-us+f2")
CONSENT_TEXT = "I consent to a synthetic copy of my voice: amber, orbit, seven, lantern."


@pytest.fixture(scope="module")
def encoder() -> SpeakerEncoder:
    return SpeakerEncoder.load()


@pytest.fixture(scope="module")
def speak(tmp_path_factory):
    """speak(voice, first_sentence, count) -> int16 samples of `count` Harvard sentences, cached."""
    folder = tmp_path_factory.mktemp("speaker")
    made: dict[tuple[str, int, int], np.ndarray] = {}

    def make(voice: str, first: int, count: int = 3) -> np.ndarray:
        key = (voice, first, count)
        if key not in made:
            text = " ".join(SENTENCES[first:first + count])
            path = synthesize(text, voice, folder / f"{voice.replace('+', '-')}-{first}-{count}.wav")
            made[key] = read_pcm16(path)[0]
        return made[key]

    return make


@pytest.fixture(scope="module")
def clean_upload(encoder, speak) -> dict[str, SpeakerWindows]:
    """Three files of the creator alone, nine sentences (~21 s)."""
    return {f"take-{i}.wav": encoder.embed_windows(speak(CREATOR, 3 * i)) for i in range(3)}


def mixed(parts: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """The parts end to end, and each part's speech (first to last loud sample) in seconds."""
    spans, at = [], 0
    for part in parts:
        first, last = speech_edges(part)
        spans.append(((at + first) / RATE, (at + last) / RATE))
        at += part.size
    return np.concatenate(parts), spans


@pytest.fixture(scope="module")
def interview(encoder, speak):
    """interview.wav: the creator (3 sentences), another voice (4), the creator again (3): ~40 % other."""
    audio, spans = mixed([speak(CREATOR, 9), speak(OTHERS[0], 12, 4), speak(CREATOR, 16)])
    return encoder.embed_windows(audio), spans[1]


# ---- the model and its front end ----


def test_weights_are_the_pinned_file(tmp_path):
    path = weights_path()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == WEIGHTS_SHA256
    check_weights(path)
    tampered = tmp_path / "pretrained.pt"
    shutil.copyfile(path, tampered)
    with tampered.open("r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(SpeakerWeightsError, match="reinstall resemblyzer==0.1.4"):
        check_weights(tampered)
    with pytest.raises(SpeakerWeightsError, match="not found"):
        check_weights(tmp_path / "missing.pt")


def test_loading_imports_neither_resemblyzer_nor_torch_in_the_package():
    """The package `__init__` stays torch-free (the gateway imports it), and the encoder runs the
    weights without executing resemblyzer (whose `__init__` needs librosa and webrtcvad)."""
    code = (
        "import sys, lora_training.quality, lora_training.quality.findings, lora_training.quality.thresholds\n"
        "assert 'torch' not in sys.modules, 'torch imported by the quality package'\n"
        "from lora_training.quality.speaker import SpeakerEncoder\n"
        "SpeakerEncoder.load()\n"
        "assert not any(m.split('.')[0] in ('resemblyzer', 'librosa', 'webrtcvad') for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def test_mel_scale_and_filters_match_librosa_documented_values():
    # librosa.hz_to_mel docs: 60 Hz -> 0.9; 110, 220, 440 Hz -> 1.65, 3.3, 6.6 (linear part); 11025 Hz (log part)
    assert np.allclose(hz_to_mel([60, 110, 220, 440, 11025]), [0.9, 1.65, 3.3, 6.6, 49.91059448015905])
    bank = mel_filterbank(22050, 2048, 128)  # librosa.filters.mel(sr=22050, n_fft=2048), documented rows
    assert bank.shape == (128, 1025)
    assert np.allclose(bank[0, :6], [0, 0.016182853, 0.032365706, 0.028990088, 0.012807235, 0], atol=1e-7)
    assert np.allclose(bank[1, :9], [0, 0, 0, 0.009779236, 0.025962089, 0.035393705, 0.019210852, 0.003028, 0],
                       atol=1e-7)


def test_same_voice_is_clearly_closer_than_another_voice(encoder, speak):
    creator = [encoder.embed(speak(CREATOR, i)) for i in (0, 3)]
    others = [encoder.embed(speak(v, 3)) for v in OTHERS]
    assert all(e.shape == (256,) and e.dtype == np.float32 and abs(np.linalg.norm(e) - 1) < 1e-5
               for e in creator + others)
    same = cosine(creator[0], creator[1])
    other = max(cosine(creator[0], o) for o in others)
    assert same > 0.85, same
    assert other < 0.8, other
    assert same - other > 0.1


def test_level_does_not_change_the_voice(encoder, speak):
    audio = speak(CREATOR, 0)
    quiet = (audio.astype(np.float32) / 32768.0) * 0.05
    assert cosine(encoder.embed(audio), encoder.embed(quiet)) > 0.99


def test_windows_lie_over_the_given_speech_regions(encoder, speak):
    one, two = speak(CREATOR, 0), speak(CREATOR, 3)
    gap = np.zeros(3 * RATE, dtype=np.int16)
    audio = np.concatenate([one, gap, two])
    e1, e2 = speech_edges(one), speech_edges(two)
    regions = [e1, (one.size + gap.size + e2[0], one.size + gap.size + e2[1])]
    windows = encoder.embed_windows(audio, RATE, regions=regions)
    assert windows.vectors.shape == (len(windows), 256) and len(windows) >= 8
    inside = [(a / RATE - 0.01, (b + 1) / RATE + 0.01) for a, b in regions]
    for t in np.concatenate([windows.start_s, windows.end_s]):
        assert any(lo <= t <= hi for lo, hi in inside), t
    silence = np.zeros(RATE, dtype=np.int16)
    assert len(encoder.embed_windows(silence)) == 0
    with pytest.raises(NoSpeech, match="no speech"):
        encoder.embed(silence)


# ---- a second speaker ----


def test_a_clean_single_speaker_upload_gives_no_finding(clean_upload, encoder, speak):
    assert second_speaker(clean_upload, CheckThresholds()) == []
    female = {f"f-{i}.wav": encoder.embed_windows(speak(OTHERS[1], 3 * i)) for i in range(2)}
    assert second_speaker(female, CheckThresholds()) == []


def test_another_voice_is_found_with_its_file_and_time(interview):
    windows, (start, end) = interview
    findings = second_speaker({"interview.wav": windows}, CheckThresholds())
    assert len(findings) == 1, [f.message for f in findings]
    finding = findings[0]
    assert finding.level == "block" and finding.code == "second_speaker"  # ~40 % of the speech
    assert finding.file == "interview.wav"
    assert abs(finding.start_s - start) <= 1.0 and abs(finding.end_s - end) <= 1.0, (finding, start, end)
    assert "interview.wav" in finding.message and "another voice speaks at" in finding.message
    assert finding.value > 30


def test_a_smaller_share_of_another_voice_warns(clean_upload, encoder, speak):
    audio, spans = mixed([speak(CREATOR, 20), speak(OTHERS[0], 24), speak(CREATOR, 27)])
    upload = {"call.wav": encoder.embed_windows(audio), **clean_upload}  # other voice: ~3 of 18 sentences
    findings = second_speaker(upload, CheckThresholds())
    assert [f.level for f in findings] == ["warn"], [f.message for f in findings]
    assert findings[0].file == "call.wav"
    assert abs(findings[0].start_s - spans[1][0]) <= 1.0 and abs(findings[0].end_s - spans[1][1]) <= 1.0
    assert 10 < findings[0].value < 30
    stricter = CheckThresholds(block_second_speaker_fraction=0.12)
    assert [f.level for f in second_speaker(upload, stricter)] == ["block"]
    laxer = CheckThresholds(warn_second_speaker_fraction=0.5, block_second_speaker_fraction=0.6)
    assert second_speaker(upload, laxer) == []


def test_many_stretches_are_capped_and_counted():
    """Pure: windows alternating between two voices in 12 stretches of one file."""
    rng = np.random.default_rng(0)
    voice = np.zeros((2, 256))
    voice[0, :128], voice[1, 128:] = 1.0, 1.0
    labels = np.tile(np.repeat([0, 0, 1], 3), 12)  # [108]: 12 stretches of 3 windows of voice 1
    vectors = voice[labels] + 0.05 * rng.standard_normal((labels.size, 256))
    starts = np.arange(labels.size) * 0.8
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    windows = SpeakerWindows(starts, starts + 1.6, vectors)
    findings = second_speaker({"long.wav": windows}, CheckThresholds())
    assert len(findings) == MAX_RANGES_LISTED + 1
    assert all(f.level == "block" for f in findings)  # a third of the speech
    assert [f.file for f in findings[:-1]] == ["long.wav"] * MAX_RANGES_LISTED
    assert findings[-1].file is None and "4 more" in findings[-1].message
    assert all(a.end_s < b.start_s for a, b in zip(findings[:-2], findings[1:-1]))


# ---- consent: is the recording the upload's voice? ----


def test_consent_by_the_same_voice_is_accepted_and_by_another_refused(clean_upload, encoder, tmp_path):
    reference = SpeakerWindows(*(np.concatenate(parts) for parts in zip(
        *((w.start_s, w.end_s, w.vectors) for w in clean_upload.values()))))
    said = {v: read_pcm16(synthesize(CONSENT_TEXT, v, tmp_path / f"consent-{i}.wav"))[0]
            for i, v in enumerate((CREATOR, *OTHERS))}
    own = speaker_match(reference, encoder.embed(said[CREATOR]))
    assert own.same, own
    assert 0 < own.spread < 1 and own.limit <= own.similarity
    for voice in OTHERS:
        match = speaker_match(reference, encoder.embed(said[voice]))
        assert not match.same, (voice, match)
        assert match.similarity < own.similarity - 0.1
    as_list = list(reference.vectors)  # a reference given as a list of embeddings is the same reference
    assert speaker_match(as_list, encoder.embed(said[CREATOR])) == own
