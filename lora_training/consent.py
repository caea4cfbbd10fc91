"""Spoken consent, checked in the training job: the recording says its phrase, in the uploads' voice.

The gateway issued the phrase (gateway.cloning.consent) and checked only that the recording
decodes and is short; here, after preprocessing:

- **the phrase**: the recording is transcribed (lora_training.asr, the job's model, else the bundled
  tiny.en) and the phrase's words heard *in order* are counted after normalising both sides
  (lowercase, digits spelled, punctuation dropped; a word counts only when heard exactly). At
  most MAX_PHRASE_WORDS_MISSED may be missed: tiny.en heard every word of the list in 210
  espeak-ng readings (and missed 3 in 222 before two words were dropped), but espeak-ng runs
  neighbours together now and then ("wallet, orange" heard as "while it are in", which failed a
  demo run with 4 words and 1 allowed miss): five words with two misses allowed pass such a
  reading, and a recording of anything else still does not hold three of five random words from
  PHRASE_WORDS in their order.
- **the speaker**: the recording's voice print (lora_training.quality.speaker) against the
  windows over (at most REFERENCE_MAX_S of) the job's clips, averaged in stretches as long as the
  recording, decided by lora_training.quality.speakers.speaker_match: the uploads' own spread (a
  low percentile of the stretches' similarity to their centroid) less `consent_speaker_margin`,
  never below `consent_min_similarity` (CheckThresholds, versioned).

A failure is a ConsentError whose message the creator reads (with the figures, also in its
`check`); a pass's figures go into the published voice's metadata (`consent`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np

from lora_training.errors import ConsentError
from lora_training.text import normalize

if TYPE_CHECKING:
    from lora_training.asr import AsrBackend
    from lora_training.clips import Clip
    from lora_training.quality.speaker import SpeakerEncoder
    from lora_training.quality.speakers import SpeakerMatch
    from lora_training.quality.thresholds import CheckThresholds
    from lora_training.settings import DataParams

__all__ = ["MAX_CONSENT_AUDIO_S", "MAX_PHRASE_WORDS_MISSED", "REFERENCE_MAX_S", "ConsentCheck", "PhraseHeard",
           "UploadVoice", "check_consent", "phrase_heard", "same_speaker",
           "words_in_order"]

MAX_CONSENT_AUDIO_S: Final = 30.0  # the recording (reading the text takes ~10 s); the gateway refuses longer
MAX_PHRASE_WORDS_MISSED: Final = 2  # of the phrase's words (5): 3 heard in order pass
REFERENCE_MAX_S: Final = 300.0  # seconds of the job's clips the voice is compared on (spread evenly)
MIN_STRETCHES: Final = 3  # the uploads' spread is taken over at least this many stretches
_WORD: Final = re.compile(r"[a-z']+")


@dataclass(frozen=True, slots=True)
class PhraseHeard:
    """What the ASR heard, and how many of the phrase's words it heard in order."""

    phrase: str
    heard: str
    words_heard: int
    words: int
    passed: bool


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
                        "thresholds_version": self.thresholds.version,
                        "speaker_margin": self.thresholds.consent_speaker_margin,
                        "min_similarity": self.thresholds.consent_min_similarity}}
        return _rounded(out)


def _words(text: str) -> list[str]:
    return _WORD.findall(normalize(text).lower())


def words_in_order(phrase: str, heard: str) -> int:
    """How many of the phrase's words appear in `heard` in the phrase's order (the longest common
    subsequence of the two word lists)."""
    want, got = _words(phrase), _words(heard)
    prev = [0] * (len(got) + 1)
    for w in want:
        row = [0]
        for j, g in enumerate(got, 1):
            row.append(prev[j - 1] + 1 if w == g else max(prev[j], row[j - 1]))
        prev = row
    return prev[-1]


def phrase_heard(phrase: str, heard: str) -> PhraseHeard:
    count, total = words_in_order(phrase, heard), len(_words(phrase))
    return PhraseHeard(phrase, heard, count, total, count >= total - MAX_PHRASE_WORDS_MISSED)


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
    """The uploads' voice: the speaker windows of (at most REFERENCE_MAX_S of) the job's clips."""

    vectors: np.ndarray  # [N, 256] unit vectors

    @classmethod
    def of(cls, clips: Sequence[Clip], encoder: SpeakerEncoder, sample_rate: int = 24000) -> UploadVoice:
        windows = [encoder.embed_windows(audio, sample_rate).vectors for audio in _reference(clips)]
        kept = [w for w in windows if len(w)]
        if sum(len(w) for w in kept) < 2:
            raise ConsentError("the uploads hold too little speech to compare with the consent recording")
        return cls(np.concatenate(kept))

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
    too wide). speakers.speaker_match decides, against the spread of those stretches."""
    from lora_training.quality.speakers import speaker_match

    consent = encoder.embed_windows(consent_audio, sample_rate)
    if len(consent) == 0:
        raise ConsentError("the consent recording holds no speech to compare with the uploads' voice: record the "
                           "speaker reading the consent text clearly")
    return speaker_match(voice.stretches(len(consent)), consent.centroid(), thresholds)


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
    heard = phrase_heard(phrase, getattr(said, "text", said))
    if not heard.passed:
        _fail(ConsentCheck(heard, None, thresholds), (
            f"the consent recording does not say the phrase it was given: {heard.words_heard} of its {heard.words} "
            f"words were heard (\"{phrase}\"; at least {heard.words - MAX_PHRASE_WORDS_MISSED} are needed). Ask "
            "POST /v1/voices/consent for a new phrase, record the speaker reading its text_to_read clearly, and "
            "upload again"))
    match = same_speaker(recording.audio, voice or UploadVoice.of(clips, encoder), encoder, thresholds)
    result = ConsentCheck(heard, match, thresholds)
    if not match.same:
        _fail(result, (
            "the voice in the consent recording is not the voice in the uploads (similarity "
            f"{match.similarity:.2f} where {match.limit:.2f} is needed; the uploads score {match.spread:.2f} against "
            "themselves): the person "
            "whose voice is cloned must read the consent phrase themselves. Record them reading a new phrase and "
            "upload again"))
    return result


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
