"""Orpheus token layout: prompt ids in, SNAC frames out, all on token ids (never decoded text).

A frame is 7 audio tokens. Token k of the generated audio (k counted over *accepted* audio
tokens) has slot ``k % 7`` and id ``AUDIO_BASE + slot * CODEBOOK_SIZE + code``. Slots map to
SNAC levels: slot 0 -> level 0; slots 1, 4 -> level 1; slots 2, 3, 5, 6 -> level 2.

Pure functions and one small state machine (`FrameAssembler`); no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

START_OF_TEXT = 128000
END_OF_TEXT = 128009
START_OF_SPEECH = 128257
END_OF_SPEECH = 128258
START_OF_HUMAN = 128259
END_OF_HUMAN = 128260
START_OF_AI = 128261
END_OF_AI = 128262
PAD = 128263
AUDIO_BASE = 128266
CODEBOOK_SIZE = 4096
FRAME_TOKENS = 7
VOCAB_SIZE = 156_940
AUDIO_END = AUDIO_BASE + FRAME_TOKENS * CODEBOOK_SIZE  # one past the last audio id

SAMPLE_RATE = 24_000
SAMPLES_PER_FRAME = 2048
FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE  # 85.33 ms
TOKENS_PER_SECOND_REALTIME = FRAME_TOKENS / FRAME_SECONDS  # ~82 tokens/s

PROMPT_SUFFIX = (END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH)


@dataclass(frozen=True, slots=True)
class ReferenceSampling:
    """The Orpheus reference sampling (FIELD-NOTES): every default in the worker reads these."""

    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1  # >= 1.1 is required; higher speaks faster


REFERENCE_SAMPLING = ReferenceSampling()
TRAINING_SUFFIX = (END_OF_SPEECH, END_OF_AI)


class TextTokenizer(Protocol):
    """The slice of a Hugging Face tokenizer we use: text -> ids with BOS (128000) first."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class Frame:
    """One SNAC coarse frame: 1 level-0 code, 2 level-1 codes, 4 level-2 codes (0..4095)."""

    c0: int
    c1: tuple[int, int]
    c2: tuple[int, int, int, int]

    def slot_codes(self) -> tuple[int, int, int, int, int, int, int]:
        """Codes in generation order (slots 0..6)."""
        return (self.c0, self.c1[0], self.c2[0], self.c2[1], self.c1[1], self.c2[2], self.c2[3])

    @classmethod
    def from_slot_codes(cls, codes: Sequence[int]) -> Frame:
        s0, s1, s2, s3, s4, s5, s6 = codes
        return cls(c0=s0, c1=(s1, s4), c2=(s2, s3, s5, s6))


def prompt_ids(tokenizer: TextTokenizer, voice: str | None, text: str) -> list[int]:
    """`[SOH] + tok("{voice}: {text}") + [EOT, EOH, SOA, SOS]`; a base model without voice gets text alone."""
    spoken = f"{voice}: {text}" if voice else text
    return [START_OF_HUMAN, *tokenizer.encode(spoken), *PROMPT_SUFFIX]


def audio_id(slot: int, code: int) -> int:
    if not 0 <= slot < FRAME_TOKENS:
        raise ValueError(f"slot {slot} outside 0..6")
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"code {code} outside 0..{CODEBOOK_SIZE - 1}")
    return AUDIO_BASE + slot * CODEBOOK_SIZE + code


def slot_of(token_id: int) -> int | None:
    """Slot an audio id belongs to, or None for any id outside the audio range."""
    if AUDIO_BASE <= token_id < AUDIO_END:
        return (token_id - AUDIO_BASE) // CODEBOOK_SIZE
    return None


def frames_to_ids(frames: Iterable[Frame]) -> list[int]:
    return [audio_id(slot, code) for frame in frames for slot, code in enumerate(frame.slot_codes())]


def training_ids(tokenizer: TextTokenizer, voice: str, text: str, frames: Iterable[Frame]) -> tuple[list[int], int]:
    """A training sequence and the index where its audio part starts (loss is taken from there)."""
    prompt = prompt_ids(tokenizer, voice, text)
    return [*prompt, *frames_to_ids(frames), *TRAINING_SUFFIX], len(prompt)


def frames_from_levels(levels: Sequence[Sequence[int]]) -> list[Frame]:
    """SNAC codes per level ([T], [2T], [4T]) -> frames."""
    l0, l1, l2 = levels
    n = len(l0)
    if len(l1) != 2 * n or len(l2) != 4 * n:
        raise ValueError(f"level lengths {len(l0)}/{len(l1)}/{len(l2)} are not T/2T/4T")
    return [
        Frame(
            c0=int(l0[i]),
            c1=(int(l1[2 * i]), int(l1[2 * i + 1])),
            c2=(int(l2[4 * i]), int(l2[4 * i + 1]), int(l2[4 * i + 2]), int(l2[4 * i + 3])),
        )
        for i in range(n)
    ]


def levels_from_frames(frames: Sequence[Frame]) -> tuple[list[int], list[int], list[int]]:
    """Frames -> SNAC codes per level ([T], [2T], [4T])."""
    l0 = [f.c0 for f in frames]
    l1 = [c for f in frames for c in f.c1]
    l2 = [c for f in frames for c in f.c2]
    return l0, l1, l2


@dataclass(slots=True)
class FrameAssembler:
    """Turns generated token ids into frames, one id at a time.

    Rule: the assembler expects slot ``accepted % 7``. An id is accepted only if it is an audio
    id of exactly that slot; anything else (text or special tokens, ids past the audio range,
    audio ids of another slot) is counted in ``invalid`` and dropped *without advancing* the
    slot. So garbage never shifts later frames: the frames equal those of the same stream with
    the garbage removed. END_OF_SPEECH finishes the stream; a partial frame at the end is
    dropped and counted in ``dropped_partial``.
    """

    _pending: list[int] = field(default_factory=list)
    accepted: int = 0
    invalid: int = 0
    dropped_partial: int = 0
    finished: bool = False

    @property
    def expected_slot(self) -> int:
        return len(self._pending)

    def push(self, token_id: int) -> Frame | None:
        """Feed one id; returns a Frame when this id completed one."""
        if self.finished:
            return None
        if token_id == END_OF_SPEECH:
            self.finish()
            return None
        if slot_of(token_id) != self.expected_slot:
            self.invalid += 1
            return None
        self._pending.append((token_id - AUDIO_BASE) % CODEBOOK_SIZE)
        self.accepted += 1
        if len(self._pending) == FRAME_TOKENS:
            frame = Frame.from_slot_codes(self._pending)
            self._pending = []
            return frame
        return None

    def extend(self, token_ids: Iterable[int]) -> Iterator[Frame]:
        for token_id in token_ids:
            frame = self.push(token_id)
            if frame is not None:
                yield frame

    def finish(self) -> None:
        if not self.finished:
            self.dropped_partial = len(self._pending)
            self._pending = []
            self.finished = True


def ids_to_frames(token_ids: Iterable[int]) -> list[Frame]:
    return list(FrameAssembler().extend(token_ids))


def max_audio_tokens(text: str, *, floor_s: float = 1.0, s_per_char: float = 0.12, cap_s: float = 120.0) -> int:
    """A generous upper bound on speech tokens for a text (~8 characters per second, slow speech)."""
    seconds = min(cap_s, floor_s + s_per_char * len(text))
    frames = int(seconds / FRAME_SECONDS) + 1
    return frames * FRAME_TOKENS + 1  # + END_OF_SPEECH
