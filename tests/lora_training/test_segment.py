"""Cutting recordings at pauses, and aligning a whole-file transcript to its sentences (real espeak speech)."""

import numpy as np
import pytest

from lora_training.errors import TranscriptError
from lora_training.segment import align, pack, speech_regions
from lora_training.settings import DataParams
from lora_training.text import sentences
from tests.fixtures.speech import CREATOR_VOICE, SAMPLE_RATE, pad_silence, read_pcm16, synthesize

DATA = DataParams()


def _speech(clips) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Clips joined, each after 600 ms of silence; returns float audio and each clip's sample span."""
    parts, spans, at = [], [], 0
    for clip in clips:
        x = pad_silence(clip.load(), SAMPLE_RATE, 600).astype(np.float32) / 32768.0
        spans.append((at + int(0.6 * SAMPLE_RATE), at + x.size))
        parts.append(x)
        at += x.size
    return np.concatenate(parts), spans


def test_regions_skip_silence_and_keep_short_gaps(speech_corpus):
    audio, spans = _speech(speech_corpus[:3])
    regions = speech_regions(audio, DATA)
    assert len(regions) == 3  # inner pauses of a sentence are shorter than min_pause_ms
    for (start, end), (lo, hi) in zip(regions, spans, strict=True):
        assert lo - 480 <= start <= lo + 2400  # within 20 ms before / 100 ms after the padded onset
        assert start < end <= hi


def test_pack_cuts_in_pauses_within_clip_limits(speech_corpus):
    audio, spans = _speech(speech_corpus[:10])
    pieces = pack(speech_regions(audio, DATA), audio.size, DATA)
    assert pieces[0].start == 0 and pieces[-1].end == audio.size
    for before, after in zip(pieces, pieces[1:], strict=False):
        assert before.end == after.start  # contiguous cuts
        assert before.last < before.end < after.first  # each cut inside silence
    assert all(p.speech_s <= DATA.clip_max_s for p in pieces)
    assert sum(p.speech_s < DATA.clip_min_s for p in pieces) <= 1


def test_align_matches_sentences_to_their_audio(speech_corpus):
    clips = speech_corpus[:10]
    audio, spans = _speech(clips)
    text = " ".join(c.transcript for c in clips)
    pieces = align(sentences(text), speech_regions(audio, DATA), audio.size, DATA, name="take.wav")
    assert " ".join(p.text for p in pieces) == text
    for piece in pieces:  # every sentence of a piece lies inside it
        inside = [c.transcript for c, (lo, hi) in zip(clips, spans, strict=True) if piece.start <= lo and hi <= piece.end + 1]
        assert " ".join(inside) == piece.text


def test_a_transcript_of_another_recording_is_refused(speech_corpus):
    audio, _ = _speech(speech_corpus[:8])
    wrong = " ".join(c.transcript for c in speech_corpus[8:10])  # 2 sentences for 8 spoken ones
    with pytest.raises(TranscriptError, match="does not follow the audio"):
        align(sentences(wrong), speech_regions(audio, DATA), audio.size, DATA, name="take.wav")
    too_many = " ".join(c.transcript for c in speech_corpus[:20])
    with pytest.raises(TranscriptError, match="20 sentences"):
        align(sentences(too_many), speech_regions(audio, DATA), audio.size, DATA, name="take.wav")


def test_a_sentence_longer_than_a_clip_is_dropped_and_reported(speech_corpus):
    from lora_training.clips import cut

    data = DataParams(clip_min_s=1.0, clip_max_s=4.0)
    audio, _ = _speech(speech_corpus[:2])
    joined = np.concatenate([audio, audio])  # ~10 s of speech under a transcript of one sentence
    words = ", ".join(c.transcript.rstrip(".") for c in speech_corpus[:2])
    one_sentence = f"{words}, {words}"  # what is said, with no stop in it
    pieces = align([one_sentence], speech_regions(joined, data), joined.size, data, name="long.wav")
    clips, dropped = cut(joined, "long.wav", pieces, data)
    assert clips == [] and "over clip_max_s" in dropped[0]["reason"] and dropped[0]["file"] == "long.wav"


PARAGRAPH = " ".join([  # ~630 characters: a paragraph, not the three seconds it is paired with
    "The birch canoe slid on the smooth planks, and the sheet was glued to the dark blue background.",
    "It is easy to tell the depth of a well, and these days a chicken leg is a rare dish.",
    "Rice is often served in round bowls, and the juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck, and the hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us, and a large size in stockings is hard to sell.",
    "The boy was there when the sun rose, and a rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring, and kick the ball straight and follow through.",
])


def test_a_one_clip_file_is_checked_against_its_transcript_too(tmp_path):
    """Regression (issue 25): a file whose speech fits one clip skipped the reading-rate check, so
    three seconds of speech under a 630-character paragraph trained to `ready`."""
    spoken = "The birch canoe slid on the smooth planks."
    path = synthesize(spoken, CREATOR_VOICE, tmp_path / "take-07.wav")
    audio = path_audio(path)
    regions = speech_regions(audio, DATA)
    assert (regions[-1][1] - regions[0][0]) / SAMPLE_RATE <= DATA.clip_max_s  # one clip: the early path
    assert 600 <= len(PARAGRAPH) <= 660
    with pytest.raises(TranscriptError, match=r"^take-07\.wav: the transcript does not follow the audio") as refused:
        align(sentences(PARAGRAPH), regions, audio.size, DATA, name="take-07.wav")
    assert refused.value.code == "transcripts" and "characters/s" in refused.value.message
    with pytest.raises(TranscriptError, match=r"^take-07\.wav: "):  # one long sentence: the same early path
        align([PARAGRAPH], regions, audio.size, DATA, name="take-07.wav")
    with pytest.raises(TranscriptError, match=r"^take-07\.wav: "):  # far too little text for the speech
        align(["Yes."], regions, audio.size, DATA, name="take-07.wav")

    pieces = align(sentences(spoken), regions, audio.size, DATA, name="take-07.wav")  # its own words pass
    assert [(p.start, p.end, p.text) for p in pieces] == [(0, audio.size, spoken)]


def path_audio(path) -> np.ndarray:
    return read_pcm16(path)[0].astype(np.float32) / 32768.0
