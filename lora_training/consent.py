"""Spoken consent, checked in the training job: the recording says its phrase, in the uploads' voice.

The gateway issued the phrase (gateway.cloning.consent) and checked only that the recording
decodes and is short; here, after preprocessing:

- **the reading**: the recording is transcribed (lora_training.asr, the job's model, else the
  bundled tiny.en) and held to the text the creator was given (`consent_text`: CONSENT_SENTENCE,
  then the phrase), both sides normalised (lowercase, digits spelled, punctuation dropped; a
  word counts only when heard exactly). Three things must hold (`reading_heard`):
  the sentence, at most MAX_SENTENCE_WORDS_MISSED of its words missed in order; the phrase's
  items (its words and its number) heard in order, at most MAX_PHRASE_WORDS_MISSED missed; and
  at most MAX_EXTRA_WORDS words heard beyond the text's own count. The last is what stops a
  replay: a recording that says much more than the text (a reading of the whole public word
  list, say, which holds every phrase's words) fails however many phrase words it holds. The
  allowances are tiny.en's errors on espeak-ng readings (it runs neighbours together, "wallet,
  orange" heard as "while it are in", and hears "I consent" as "I can send"); docs/training.md,
  "Spoken consent", has the calibration and the measured pass rates.
- **the speaker**: the recording's voice print (lora_training.quality.speaker) against the
  windows over (at most REFERENCE_MAX_S of) the job's clips, averaged in stretches as long as the
  recording, decided by lora_training.quality.speakers.speaker_match: the uploads' own spread (a
  low percentile of the stretches' similarity to their centroid) less `consent_speaker_margin`,
  never below `consent_min_similarity` (CheckThresholds, versioned). A refusal is said in one of
  two ways: `other_room` when the recording sounds like another room or microphone than the uploads
  (lora_training.quality.rooms) and comes within `consent_room_band` of the limit (unsure: record
  where the uploads were made), else `other_speaker` (another person must not read it).

A failure is a ConsentError whose message the creator reads (with the figures, also in its
`check`); a pass's figures go into the published voice's metadata (`consent`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np

from lora_training.errors import ConsentError
from lora_training.text import normalize

if TYPE_CHECKING:
    from lora_training.asr import AsrBackend
    from lora_training.clips import Clip
    from lora_training.quality.rooms import RoomProfile
    from lora_training.quality.speaker import SpeakerEncoder
    from lora_training.quality.speakers import SpeakerMatch
    from lora_training.quality.thresholds import CheckThresholds
    from lora_training.settings import DataParams

__all__ = ["CONSENT_SENTENCE", "MAX_CONSENT_AUDIO_S", "MAX_EXTRA_WORDS", "MAX_PHRASE_WORDS_MISSED",
           "MAX_SENTENCE_WORDS_MISSED", "REFERENCE_MAX_S", "ConsentCheck", "PhraseHeard", "UploadVoice",
           "check_consent", "consent_text", "reading_heard", "same_speaker", "words_in_order"]

MAX_CONSENT_AUDIO_S: Final = 30.0  # the recording (reading the text takes ~11 s); the gateway refuses longer
CONSENT_SENTENCE: Final = "I consent to the training and use of a synthetic copy of my voice."
MAX_SENTENCE_WORDS_MISSED: Final = 6  # of its 14 words, in order: tiny.en hears "I can send ... emphatic copy on"
MAX_PHRASE_WORDS_MISSED: Final = 2  # of the phrase's items (a 2-digit number is one item)
MAX_EXTRA_WORDS: Final = 8  # words heard beyond the text's own count (a word heard as two or three: "while it are in")
REFERENCE_MAX_S: Final = 300.0  # seconds of the job's clips the voice is compared on (spread evenly)
MIN_STRETCHES: Final = 3  # the uploads' spread is taken over at least this many stretches
_WORD: Final = re.compile(r"[a-z']+")


@dataclass(frozen=True, slots=True)
class PhraseHeard:
    """What the ASR heard of the consent text: the sentence's words and the phrase's items heard in
    order, and how many words beyond the text's count."""

    phrase: str
    heard: str
    words_heard: int  # the phrase's items (words, and its number) heard in order
    words: int
    sentence_words_heard: int
    sentence_words: int
    extra_words: int  # words heard beyond the text's count (negative: fewer)
    passed: bool

    def why_not(self) -> str | None:
        """What the creator must do when the reading failed, in words; None when it passed."""
        if self.passed:
            return None
        again = ("Ask POST /v1/voices/consent for a new phrase, record the speaker reading its text_to_read clearly, "
                 "once, and upload again")
        if self.extra_words > MAX_EXTRA_WORDS:
            return (f"the consent recording says much more than the consent text: {self.extra_words} words more were "
                    f"heard than the text has (at most {MAX_EXTRA_WORDS} pass). {again}")
        if self.sentence_words_heard < self.sentence_words - MAX_SENTENCE_WORDS_MISSED:
            return (f"the consent recording does not say the consent sentence (\"I consent to ...\"): "
                    f"{self.sentence_words_heard} of its {self.sentence_words} words were heard (at least "
                    f"{self.sentence_words - MAX_SENTENCE_WORDS_MISSED} are needed). {again}")
        return (f"the consent recording does not say the phrase it was given: {self.words_heard} of its {self.words} "
                f"words were heard (\"{self.phrase}\"; at least {self.words - MAX_PHRASE_WORDS_MISSED} are needed). "
                f"{again}")


@dataclass(frozen=True, slots=True)
class ConsentCheck:
    phrase: PhraseHeard
    speaker: SpeakerMatch | None  # None: not compared (the phrase already failed)
    thresholds: CheckThresholds

    @property
    def passed(self) -> bool:
        return self.phrase.passed and self.speaker is not None and self.speaker.same

    def to_dict(self) -> dict:
        out = {"passed": self.passed, "phrase": asdict(self.phrase),
               "speaker": asdict(self.speaker) if self.speaker else None,
               "rule": {"max_phrase_words_missed": MAX_PHRASE_WORDS_MISSED,
                        "max_sentence_words_missed": MAX_SENTENCE_WORDS_MISSED, "max_extra_words": MAX_EXTRA_WORDS,
                        "thresholds_version": self.thresholds.version,
                        "speaker_margin": self.thresholds.consent_speaker_margin,
                        "min_similarity": self.thresholds.consent_min_similarity}}
        return _rounded(out)


@lru_cache(maxsize=32)
def _words(text: str) -> tuple[str, ...]:
    """The words `text` is heard as. Cached: a check reads one heard text against many phrases (a
    replay test holds one transcript to thousands), and normalizing it is most of a check's cost."""
    return tuple(_WORD.findall(normalize(text).lower()))


def consent_text(phrase: str) -> str:
    """What the creator reads aloud for `phrase` (its items, space-separated): the sentence, then the
    items (gateway.cloning.consent issues the phrase and shows this as `text_to_read`)."""
    return f"{CONSENT_SENTENCE} My words are: {', '.join(phrase.split())}."


def _items(phrase: str) -> list[tuple[str, ...]]:
    """The phrase's items as the words they are heard as: "lemon" -> (lemon,), "47" -> (forty, seven)."""
    return [_words(item) for item in phrase.split()]


def words_in_order(phrase: str, heard: str) -> int:
    """How many of the phrase's items appear in `heard` in the phrase's order, an item of several
    words (a number) counting when its words are heard together: the longest common subsequence
    of the items and the heard words."""
    return _in_order([i for i in _items(phrase) if i], _words(heard))


def _in_order(items: Sequence[tuple[str, ...]], got: Sequence[str]) -> int:
    """`words_in_order` on words already read (the heard text is normalized once per check)."""
    prev = [0] * (len(got) + 1)  # prev[j]: items matched so far within got[:j]
    for item in items:
        n, last = len(item), item[-1]
        row = [0] * (len(got) + 1)
        for j in range(1, len(got) + 1):
            best = prev[j] if prev[j] > row[j - 1] else row[j - 1]
            # the item's last word first: a cheap test that rules out nearly every position
            if got[j - 1] == last and j >= n and prev[j - n] + 1 > best and (n == 1 or tuple(got[j - n:j]) == item):
                best = prev[j - n] + 1
            row[j] = best
        prev = row
    return prev[-1]


def reading_heard(phrase: str, heard: str) -> PhraseHeard:
    """Hold what the ASR heard to the consent text of `phrase` (the module doc's three rules)."""
    got = _words(heard)
    sentence = [(word,) for word in _words(CONSENT_SENTENCE)]
    sentence_words, sentence_heard = len(sentence), _in_order(sentence, got)
    items = [i for i in _items(phrase) if i]
    count, total = _in_order(items, got), len(items)
    extra = len(got) - len(_words(consent_text(phrase)))
    passed = (sentence_heard >= sentence_words - MAX_SENTENCE_WORDS_MISSED
              and count >= total - MAX_PHRASE_WORDS_MISSED and extra <= MAX_EXTRA_WORDS)
    return PhraseHeard(phrase, heard, count, total, sentence_heard, sentence_words, extra, passed)


def _reference(clips: Sequence[Clip]) -> list[np.ndarray]:
    """At most REFERENCE_MAX_S of the clips' audio, taken evenly across them (every file is heard)."""
    total = sum(c.duration_s for c in clips)
    if total <= REFERENCE_MAX_S:
        return [c.audio for c in clips]
    step = total / REFERENCE_MAX_S
    picked, acc = [], 0.0
    for i, clip in enumerate(clips):
        acc += 1.0
        if acc >= step or i == len(clips) - 1:
            acc -= step
            picked.append(clip.audio)
    return picked


@dataclass(frozen=True)
class UploadVoice:
    """The uploads' voice: the speaker windows of (at most REFERENCE_MAX_S of) the job's clips, and
    their room (`rooms.RoomProfile`), to say when the consent recording was made elsewhere."""

    vectors: np.ndarray  # [N, 256] unit vectors
    room: RoomProfile | None = None  # None: rooms are not compared

    @classmethod
    def of(cls, clips: Sequence[Clip], encoder: SpeakerEncoder, sample_rate: int = 24000) -> UploadVoice:
        return cls.of_audio(_reference(clips), encoder, sample_rate)

    @classmethod
    def of_audio(cls, audio: Sequence[np.ndarray], encoder: SpeakerEncoder, sample_rate: int = 24000) -> UploadVoice:
        from lora_training.quality.rooms import room_profile

        windows = [encoder.embed_windows(a, sample_rate).vectors for a in audio]
        kept = [w for w in windows if len(w)]
        if sum(len(w) for w in kept) < 2:
            raise ConsentError("the uploads hold too little speech to compare with the consent recording")
        return cls(np.concatenate(kept), room_profile(np.concatenate(list(audio)), sample_rate))

    def stretches(self, windows: int) -> list[np.ndarray]:
        """Unit means of consecutive runs of `windows` windows (fewer when the upload is short, so
        there are at least MIN_STRETCHES)."""
        size = max(1, min(windows, len(self.vectors) // MIN_STRETCHES))
        return [_unit(self.vectors[at:at + size].mean(axis=0)) for at in range(0, len(self.vectors) - size + 1, size)]


def same_speaker(consent_audio: np.ndarray, voice: UploadVoice, encoder: SpeakerEncoder,
                 thresholds: CheckThresholds, sample_rate: int = 24000) -> SpeakerMatch:
    """The recording's voice print against the uploads', like with like: the recording's windows
    averaged, and the uploads' windows averaged in stretches of as many windows (a print of 10 s
    of speech varies far less than one of a 1.6 s window, so single windows would set the spread
    too wide). speakers.speaker_match decides, against the spread of those stretches.

    The room is not allowed for in the decision (measured: bringing the recordings into one room by
    equalising and adding a simulated room, or lowering the bar when rooms differ, let far more
    other voices through than it saved genuine ones; docs/benchmarks.md, "Clone checks"). It is in
    the verdict: a refused recording that sounds like another room or microphone than the uploads
    (`RoomProfile.differs_from`) and comes within `consent_room_band` of the limit is `other_room`
    (unsure: record where the uploads were made), not `other_speaker`."""
    from dataclasses import replace

    from lora_training.quality.rooms import room_profile
    from lora_training.quality.speakers import speaker_match

    consent = encoder.embed_windows(consent_audio, sample_rate)
    if len(consent) == 0:
        raise ConsentError("the consent recording holds no speech to compare with the uploads' voice: record the "
                           "speaker reading the consent text clearly")
    match = speaker_match(voice.stretches(len(consent)), consent.centroid(), thresholds)
    if voice.room is None:
        return match
    differ = room_profile(consent_audio, sample_rate).differs_from(voice.room)
    if differ and not match.same and match.similarity >= match.limit - thresholds.consent_room_band:
        return replace(match, verdict="other_room", rooms_differ=True)
    return replace(match, rooms_differ=differ)


def check_consent(path: Path, phrase: str, clips: Sequence[Clip], data: DataParams, *, asr: AsrBackend,
                  encoder: SpeakerEncoder, thresholds: CheckThresholds | None = None,
                  voice: UploadVoice | None = None) -> ConsentCheck:
    """Check the consent recording at `path` against the job's clips (or their `voice`, when already
    made); returns the figures, raises ConsentError (figures in `.check`) when it does not say the
    phrase or is not the uploads' voice."""
    from lora_training.ingest import ingest
    from lora_training.quality.thresholds import CheckThresholds

    thresholds = thresholds or CheckThresholds()
    recording = ingest(path, data, max_s=MAX_CONSENT_AUDIO_S)
    said = asr.transcribe(recording.audio, passage=True)
    heard = reading_heard(phrase, getattr(said, "text", said))
    if not heard.passed:
        _fail(ConsentCheck(heard, None, thresholds), heard.why_not() or "")
    voice = voice or UploadVoice.of(clips, encoder)
    match = same_speaker(recording.audio, voice, encoder, thresholds)
    result = ConsentCheck(heard, match, thresholds)
    if match.verdict == "other_room":
        _fail(result, (
            "the consent recording sounds like another room or microphone than the uploads"
            f"{_rooms_said(_decays(recording.audio, voice))}, and the voices match only {match.similarity:.2f} "
            f"where {match.limit:.2f} is needed: too unsure to accept (a room or a microphone alone moves the "
            "match this much). Record the consent phrase in the same room with the same microphone as the "
            "uploads, or upload takes made where the consent is recorded, and upload again"))
    if not match.same:
        _fail(result, (
            "the voice in the consent recording is not the voice in the uploads (similarity "
            f"{match.similarity:.2f} where {match.limit:.2f} is needed; the uploads score {match.spread:.2f} against "
            "themselves): the person "
            "whose voice is cloned must read the consent phrase themselves. Record them reading a new phrase and "
            "upload again"))
    return result


def _decays(consent_audio: np.ndarray, voice: UploadVoice) -> tuple[float, float]:
    """(the consent recording's decay time, the uploads'), seconds."""
    from lora_training.quality.rooms import reverb_s

    return reverb_s(consent_audio), voice.room.reverb_s if voice.room else float("nan")


def _rooms_said(decays: tuple[float, float]) -> str:
    consent, uploads = decays
    if not (np.isfinite(consent) and np.isfinite(uploads)) or abs(consent - uploads) < 0.15:
        return " (their tone differs)"
    wetter = "the uploads echo more" if uploads > consent else "the consent recording echoes more"
    return f" ({wetter}: the room rings {uploads:.1f} s in the uploads, {consent:.1f} s in the consent recording)"


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def _fail(result: ConsentCheck, message: str) -> None:
    raise ConsentError(message, check=result)


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value
