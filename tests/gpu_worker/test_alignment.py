"""The aligner (gpu_worker.alignment) on real espeak-ng speech through its C library, silero's real
speech check, and the text front end's real readings. Accuracy figures are the bench's
(`voicering bench alignment`); these tests hold the mechanics: every word timed once, in order,
while the audio streams, back in the caller's words, and noise never passed off as aligned."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from gpu_worker.alignment import (CallerWords, Espeak, SpeechChecks, WordTimer, blank_tags, reference_for,
                                  spoken_spans, word_starts)
from gpu_worker.alignment.dtw import StreamingDtw
from gpu_worker.alignment.features import FeatureStream, features
from gpu_worker.text import normalize

RATE = 24000
CHUNK = 2048


@pytest.fixture(scope="module")
def espeak() -> Espeak:
    return Espeak()


@pytest.fixture(scope="module")
def checks() -> SpeechChecks:
    return SpeechChecks()


def speech(espeak: Espeak, text: str, voice: str, wpm: int) -> tuple[np.ndarray, np.ndarray]:
    """`text` read by espeak-ng at 24 kHz, and where each of its spoken words starts (s)."""
    spoken = espeak.speak(blank_tags(text), voice=voice, wpm=wpm)
    pcm = soxr.resample(spoken.pcm, spoken.sample_rate, RATE).astype(np.float32)
    return pcm, word_starts(spoken_spans(text), spoken) / spoken.sample_rate


def stream(timer: WordTimer, pcm: np.ndarray) -> tuple[list, list]:
    """(words timed while the audio streamed, words timed at its end)."""
    early = [w for at in range(0, len(pcm), CHUNK) for w in timer.push(pcm[at:at + CHUNK])]
    return early, timer.finish()


def test_espeak_reports_each_word_where_its_sound_starts(espeak):
    text = "Hello there, general Kenobi."
    spoken = espeak.speak(text)
    assert spoken.sample_rate > 0 and len(spoken.pcm) > spoken.sample_rate // 2
    assert [text[w.start:w.start + w.length] for w in spoken.words if w.length] == ["Hello", "there", "general",
                                                                                  "Kenobi"]
    samples = [w.sample for w in spoken.words if w.length]
    assert samples == sorted(samples) and samples[-1] < len(spoken.pcm)
    with pytest.raises(ValueError, match="no voice"):
        espeak.speak(text, voice="xx-nonexistent")


def test_features_are_the_same_streamed_in_any_pieces_as_whole():
    pcm = np.random.default_rng(1).standard_normal(RATE).astype(np.float32) * 0.1
    whole, levels = features(pcm, RATE)
    stream_ = FeatureStream(RATE)
    parts = [stream_.push(pcm[a:a + n]) for a, n in zip(range(0, RATE, 777), [777] * 40)]
    assert np.allclose(np.concatenate([p[0] for p in parts]), whole, atol=1e-4)
    assert np.allclose(np.concatenate([p[1] for p in parts]), levels, atol=1e-4)
    assert len(whole) == 98  # 25 ms windows every 10 ms over 1 s


def test_warping_recovers_a_known_stretch_and_forgetting_old_columns_changes_nothing_later():
    rng = np.random.default_rng(2)
    reference = rng.standard_normal((40, 13)).astype(np.float32)
    repeats = np.ones(40, int)
    repeats[[5, 6, 20]] = 3  # three reference frames last three test frames each
    test = np.repeat(reference, repeats, axis=0) + rng.normal(0, 0.01, (repeats.sum(), 13)).astype(np.float32)
    expected = np.concatenate(([0], np.cumsum(repeats)[:-1]))  # each reference frame's first test frame
    dtw = StreamingDtw(reference)
    dtw.push(test[:20])
    dtw.forget_before(0)
    dtw.push(test[20:])
    assert dtw.best_end() == 39
    assert np.array_equal(dtw.path(39), expected)
    dtw.forget_before(int(expected[25]))
    assert np.array_equal(dtw.path(39, floor=25)[25:], expected[25:])


def test_the_reference_times_every_spoken_word_and_never_reads_a_tag(espeak):
    text = normalize("Well <laugh> I paid $5, honestly.").text
    ref = reference_for(text, espeak)
    assert ref.words == ["Well", "I", "paid", "five", "dollars", "honestly"]
    assert list(ref.starts) == sorted(ref.starts) and all(ref.ends > ref.starts)
    assert "laugh" not in blank_tags(text) and len(blank_tags(text)) == len(text)


def test_words_are_timed_while_the_audio_streams_once_each_in_order_and_close_to_where_they_start(espeak, checks):
    text = "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob."
    pcm, truth = speech(espeak, text, "en+f3", 150)  # another voice and rate than the reference's
    timer = WordTimer(reference_for(text, espeak), RATE, check=checks.new(RATE))
    early, final = stream(timer, pcm)
    timed = early + final
    assert [w.index for w in timed] == list(range(len(truth)))  # every word once, in order
    assert len(early) >= len(truth) // 2  # most came out before the audio ended
    starts = [w.start_s for w in timed]
    assert starts == sorted(starts) and all(w.end_s >= w.start_s for w in timed)
    assert not any(w.estimated for w in timed)
    errors = np.abs(np.array(starts) - truth)
    assert np.median(errors) < 0.04 and errors.max() < 0.25, errors


@pytest.mark.parametrize("voice, wpm", [("en+f3", 150), ("en-us+m3", 190), ("en+m1", 120)])
def test_no_word_starts_before_the_one_before_it_ends(espeak, checks, voice, wpm):
    """A caption lights the word whose times hold the playing position: two words overlapping by a
    frame lit two at once (the web page's caption beside CPU burners; aligned at 10 ms hops, each
    word's start was floored at the last word's start only, so it could fall inside its end)."""
    text = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
    pcm, _ = speech(espeak, text, voice, wpm)
    early, final = stream(WordTimer(reference_for(text, espeak), RATE, check=checks.new(RATE)), pcm)
    timed = early + final
    assert [w.index for w in timed] == list(range(len(timed))) and not any(w.estimated for w in timed)
    assert [(a.index, a.end_s, b.start_s) for a, b in zip(timed, timed[1:]) if b.start_s < a.end_s] == []


def test_noise_gets_the_estimate_at_its_end_and_nothing_before(espeak, checks):
    text = "This line would be spoken by a real voice."
    ref = reference_for(text, espeak)
    noise = (np.random.default_rng(3).standard_normal(int(2.0 * RATE)) * 0.1).astype(np.float32)
    timer = WordTimer(ref, RATE, check=checks.new(RATE))
    early, final = stream(timer, noise)
    assert early == [] and len(final) == len(ref.words) and all(w.estimated for w in final)
    assert final[-1].end_s <= 2.0 + 1e-6 and [w.start_s for w in final] == sorted(w.start_s for w in final)


def test_without_audio_every_word_is_an_estimate_at_zero(espeak):
    timer = WordTimer(reference_for("Nothing came.", espeak), RATE)
    assert [(w.start_s, w.estimated) for w in timer.finish()] == [(0.0, True), (0.0, True)]
    assert timer.finish() == []


def test_the_caller_gets_back_their_own_words_not_the_spoken_ones():
    normalized = normalize("I paid $5 at 3:30pm <laugh> on Dec. 4th, okay?")
    words = CallerWords.of(normalized)
    assert [normalized.text[a:b] for a, b in words.spans][:4] == ["I", "paid", "five", "dollars"]
    times = [(i, i * 0.5, i * 0.5 + 0.4) for i in range(len(words.spans))]
    first, rest = words.push(times[:3]), words.push(times[3:])
    assert [w.text for w in first] == ["I", "paid"]  # "$5" waits for "dollars"
    assert [w.text for w in rest] == ["$5", "at", "3:30pm", "on", "Dec. 4th", "okay"]
    assert (rest[0].start_s, rest[0].end_s) == (1.0, 1.9)  # from "five"'s start to "dollars"' end
    verbatim = CallerWords.verbatim("Spoken as <sigh> written.")
    assert [w.text for w in verbatim.push([(0, 0.0, 0.2), (1, 0.3, 0.5), (2, 0.6, 0.9)])] == ["Spoken", "as",
                                                                                              "written"]


async def test_a_segment_spoken_as_two_requests_is_timed_on_the_context_s_clock(espeak):
    from gpu_worker.alignment import Aligner

    aligner = Aligner(RATE)
    sent: list[tuple[list, bool]] = []

    async def send(words, estimated):
        sent.append((words, estimated))

    try:
        words = aligner.segment(CallerWords.of(normalize("First I paid $5. Then we left.")), send)
        pieces = ["First I paid five dollars.", "Then we left."]  # as the engine's requests read it
        offset, truth, first_len = 0.25, [], 0.0  # a quarter second of the context's audio came before
        for piece in pieces:
            pcm, starts = speech(espeak, piece, "en-us+m3", 160)
            words.begin(piece, offset)
            for at in range(0, len(pcm), CHUNK):
                words.feed(pcm[at:at + CHUNK])  # never waits: the segment's task times it
            words.end_piece()
            truth += list(starts + offset)
            first_len = first_len or len(pcm) / RATE
            offset += len(pcm) / RATE
        await words.close(offset)
    finally:
        aligner.close()
    timed = [w for batch, estimated in sent for w in batch]
    assert not any(estimated for _, estimated in sent) and len(sent) > 2, sent  # in several messages
    assert [w.text for w in timed] == ["First", "I", "paid", "$5", "Then", "we", "left"]
    firsts = [truth[i] for i in (0, 1, 2, 3, 5, 6, 7)]  # "$5" starts with "five"
    assert np.median(np.abs(np.array([w.start_s for w in timed]) - firsts)) < 0.04
    assert timed[4].start_s >= 0.25 + first_len - 0.05
