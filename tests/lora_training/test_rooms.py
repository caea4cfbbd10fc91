"""Issue 34, items 4 and 5, on real espeak-ng speech and sox rooms: the reverberation estimate and
its finding (lora_training.quality.rooms, checks), a voice talking under the creator
(quality.signal.voice_under) found with its file and time, and named by the speech-amount error
instead of "send transcripts". espeak-ng voices are not people and sox's reverb is not a measured
room: the figures are docs/benchmarks.md's ("Clone checks"), not real-world ones."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from lora_training.espeak import HARVARD_SENTENCES
from lora_training.quality.checks import check_recording
from lora_training.quality.rooms import convolve, exponential_room, reverb_s
from lora_training.quality.signal import voice_under
from lora_training.quality.thresholds import CheckThresholds
from lora_training.segment import speech_regions
from lora_training.settings import DataParams
from tests.fixtures.speech import SAMPLE_RATE, synthesize

TH = CheckThresholds()
DATA = DataParams()
PAUSE_S = 0.5


def sox(src: Path, dst: Path, *effect: str) -> np.ndarray:
    subprocess.run(["sox", "-D", str(src), str(dst), *effect], check=True, capture_output=True)
    return sf.read(str(dst), dtype="float64")[0]


@pytest.fixture(scope="module")
def takes(tmp_path_factory):
    """take(voice, first, count) -> float64 sentences read one by one with PAUSE_S between, cached."""
    folder = tmp_path_factory.mktemp("rooms")
    made: dict = {}

    def make(voice: str, first: int = 0, count: int = 5) -> np.ndarray:
        key = (voice, first, count)
        if key not in made:
            parts = []
            for i in range(first, first + count):
                path = synthesize(HARVARD_SENTENCES[i], voice, folder / f"{voice.replace('+', '-')}-{i}.wav")
                parts += [sf.read(str(path), dtype="float64")[0], np.zeros(int(PAUSE_S * SAMPLE_RATE))]
            made[key] = np.concatenate(parts)
        return made[key]

    make.folder = folder
    return make


def checked(name: str, audio: np.ndarray):
    return check_recording(name, audio, SAMPLE_RATE, speech_regions(audio.astype(np.float32), DATA), TH)


def under(voice: np.ndarray, other: np.ndarray, db: float) -> np.ndarray:
    """`other` talking on and on under `voice`, `db` quieter (power over each one's sounding samples)."""
    other = np.resize(other[np.abs(other) > 1e-4], voice.size)
    level = np.mean(voice[np.abs(voice) > 1e-4] ** 2) / np.mean(other ** 2)
    mixed = voice + other * np.sqrt(level * 10 ** (-db / 10))
    return mixed * (0.5 / np.max(np.abs(mixed)))


# ---- reverberation ----


def test_the_decay_time_follows_rooms_of_known_rt60(takes):
    dry = takes("en-us")
    assert reverb_s(dry) < 0.4
    for rt60 in (0.4, 0.8):
        wet = convolve(dry, exponential_room(rt60))
        assert abs(reverb_s(wet) - rt60) < 0.15, (rt60, reverb_s(wet))


def test_a_reverberant_take_is_a_reverberation_warning_and_a_dry_one_is_not(takes):
    path = takes.folder / "dry.wav"
    sf.write(str(path), takes("en-us"), SAMPLE_RATE, subtype="PCM_16")
    wet = sox(path, takes.folder / "hall.wav", "reverb", "60")
    found = [f for f in checked("hall.wav", wet) if f.code == "reverberation"]
    assert [(f.level, f.file) for f in found] == [("warn", "hall.wav")], found
    assert found[0].value >= TH.warn_reverb_s and "same room" in found[0].message
    assert not [f for f in checked("dry.wav", takes("en-us")) if f.code == "reverberation"]


# ---- a voice under the voice ----


def test_a_loud_voice_under_the_creator_blocks_and_a_faint_one_warns_naming_file_and_time(takes):
    creator, tv = takes("en-us"), takes("en+f3", 10, 8)
    loud = [f for f in checked("kitchen.wav", under(creator, tv, 20)) if f.code == "voice_under"]
    assert [(f.level, f.file) for f in loud] == [("block", "kitchen.wav")], loud
    assert 0 <= loud[0].start_s < loud[0].end_s <= creator.size / SAMPLE_RATE
    assert "another voice talks under yours in kitchen.wav" in loud[0].message
    faint = [f for f in checked("den.wav", under(creator, tv, 30)) if f.code == "voice_under"]
    assert [(f.level, f.file) for f in faint] == [("warn", "den.wav")], faint


def test_clean_noisy_humming_and_reverberant_takes_hold_no_voice_under(takes):
    creator = takes("en+f3")
    power = np.mean(creator[np.abs(creator) > 1e-4] ** 2)
    rng = np.random.default_rng(5)
    t = np.arange(creator.size) / SAMPLE_RATE
    path = takes.folder / "f3.wav"
    sf.write(str(path), creator, SAMPLE_RATE, subtype="PCM_16")
    for audio in (creator, creator + rng.standard_normal(creator.size) * np.sqrt(power / 100),
                  creator + np.sqrt(2 * power / 100) * np.sin(2 * np.pi * 50 * t),
                  sox(path, takes.folder / "f3-room.wav", "reverb", "30")):
        assert voice_under(audio).share < TH.warn_voice_under_fraction


class _UnsureAsr:
    """The ASR's verdict on overlapped speech (tiny.en's on a mixture is not what is under test here):
    unsure of every piece. The audio is real; only the transcript is stood in."""

    def __init__(self) -> None:
        from lora_training.asr import AsrModel

        self.model = AsrModel("unsure", Path("/nonexistent"), "0" * 64)

    def transcribe(self, audio, *, passage: bool = False):
        from lora_training.asr import Transcript

        return Transcript(text="uh", avg_logprob=-2.0, no_speech_prob=0.1, compression_ratio=1.0)


def test_too_little_speech_where_a_voice_talks_under_names_that_voice_not_transcripts(takes, tmp_path):
    from lora_training.errors import SpeechAmountError
    from lora_training.preprocess import preprocess

    path = tmp_path / "living-room.wav"
    sf.write(str(path), under(takes("en-us"), takes("en+f3", 10, 8), 20), SAMPLE_RATE, subtype="PCM_16")
    with pytest.raises(SpeechAmountError) as err:
        preprocess([path], None, DataParams(min_speech_s=30.0), asr=_UnsureAsr)
    message = err.value.message
    assert "another voice talks under yours in living-room.wav" in message, message
    assert "send transcripts" not in message


# ---- the consent voice across rooms and microphones ----


@pytest.fixture(scope="module")
def encoder():
    from lora_training.quality.speaker import SpeakerEncoder

    return SpeakerEncoder.load()


def test_a_dry_consent_against_reverberant_uploads_is_not_called_another_person(takes, encoder, tmp_path):
    """Issue 34 item 4: uploads in a reverberant room, the consent read dry (a phone) by the same
    voice were refused as "not the voice in the uploads" (0.73 against 0.92 in the report). The
    bar is the same (allowing for the room let other voices through, benchmarks.md), but the
    refusal now says the rooms differ and the match is unsure; another voice read dry far from the
    bar is still refused as another person, and the same voice in the same room passes."""
    from gateway.cloning.consent import text_to_read
    from lora_training.consent import UploadVoice, same_speaker

    dry = tmp_path / "uploads.wav"
    sf.write(str(dry), takes("en-us", 0, 6), SAMPLE_RATE, subtype="PCM_16")
    hall = sox(dry, tmp_path / "uploads-hall.wav", "reverb", "60").astype(np.float32)
    voice = UploadVoice.of_audio([hall], encoder)
    text = text_to_read("tiger castle 47 summer pencil guitar dragon")
    said = {v: synthesize(text, v, tmp_path / f"consent-{v}.wav") for v in ("en-us", "en+f3")}
    readings = {v: sf.read(str(p), dtype="float32")[0] for v, p in said.items()}
    own = same_speaker(readings["en-us"], voice, encoder, TH)
    assert own.rooms_differ and own.verdict == "other_room" and not own.same, own
    in_hall = sox(said["en-us"], tmp_path / "consent-hall.wav", "reverb", "60").astype(np.float32)
    assert same_speaker(in_hall, voice, encoder, TH).verdict == "same"
    other = same_speaker(readings["en+f3"], voice, encoder, TH)
    assert not other.same and other.verdict == "other_speaker", other


def test_the_other_room_refusal_says_the_room_not_another_person(takes, encoder, tmp_path):
    """What the creator reads (check_consent's message, from a real `other_room` match): the rooms,
    the decay times, and to record where the uploads were made; never "must read it themselves"."""
    from lora_training.consent import ConsentCheck, PhraseHeard, _rooms_said
    from lora_training.quality.speakers import SpeakerMatch

    said = _rooms_said((reverb_s(takes("en-us")), 0.8))
    assert "the uploads echo more" in said and "0.8 s in the uploads" in said
    check = ConsentCheck(PhraseHeard("p", "p", 7, 7, 14, 14, 0, True),
                         SpeakerMatch(0.8, 0.95, 0.9, False, "other_room", True), TH)
    assert not check.passed and check.to_dict()["speaker"]["verdict"] == "other_room"
