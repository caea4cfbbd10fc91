"""Orpheus token layout: property tests on ids <-> frames and the assembler's misalignment rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_worker.orpheus import (
    AUDIO_BASE,
    AUDIO_END,
    CODEBOOK_SIZE,
    END_OF_SPEECH,
    FRAME_TOKENS,
    PROMPT_SUFFIX,
    START_OF_HUMAN,
    FrameAssembler,
    Frame,
    audio_id,
    frames_from_levels,
    frames_to_ids,
    ids_to_frames,
    levels_from_frames,
    max_audio_tokens,
    prompt_ids,
    slot_of,
    training_ids,
)

codes = st.integers(min_value=0, max_value=CODEBOOK_SIZE - 1)
frame_st = st.builds(lambda c0, c1, c2: Frame(c0, tuple(c1), tuple(c2)), codes,
                     st.lists(codes, min_size=2, max_size=2), st.lists(codes, min_size=4, max_size=4))


class _Tok:
    def encode(self, text: str) -> list[int]:
        return [128000, *(ord(c) for c in text)]


@given(st.lists(frame_st, max_size=30))
def test_frames_ids_round_trip(frames):
    assert ids_to_frames(frames_to_ids(frames)) == frames


@given(st.lists(frame_st, max_size=20))
def test_levels_round_trip(frames):
    assert frames_from_levels(levels_from_frames(frames)) == frames


def test_code_bounds():
    assert audio_id(0, 0) == AUDIO_BASE
    assert audio_id(6, 4095) == AUDIO_END - 1
    assert ids_to_frames([audio_id(s, 0) for s in range(7)]) == [Frame(0, (0, 0), (0, 0, 0, 0))]
    assert ids_to_frames([audio_id(s, 4095) for s in range(7)]) == [Frame(4095, (4095, 4095), (4095,) * 4)]
    with pytest.raises(ValueError):
        audio_id(0, 4096)
    with pytest.raises(ValueError):
        audio_id(7, 0)
    # "code 4096" of slot 0 is slot 1's code 0: the assembler never takes it as a slot-0 code
    asm = FrameAssembler()
    assert asm.push(AUDIO_BASE + 4096) is None and asm.invalid == 1 and asm.expected_slot == 0


def test_slot_mapping_follows_snac_levels():
    frame = Frame(1, (2, 5), (3, 4, 6, 7))
    ids = frames_to_ids([frame])
    assert [slot_of(i) for i in ids] == list(range(7))
    assert [(i - AUDIO_BASE) % CODEBOOK_SIZE for i in ids] == [1, 2, 3, 4, 5, 6, 7]


garbage_ids = st.one_of(
    st.integers(min_value=0, max_value=AUDIO_BASE - 1).filter(lambda i: i != END_OF_SPEECH),
    st.integers(min_value=AUDIO_END, max_value=200_000),
    st.integers(min_value=AUDIO_BASE, max_value=AUDIO_END - 1),  # audio ids, possibly of the wrong slot
)


@given(st.lists(frame_st, min_size=1, max_size=12), st.lists(st.tuples(st.integers(0, 500), garbage_ids), max_size=40))
def test_garbage_never_shifts_later_frames(frames, insertions):
    clean = frames_to_ids(frames)
    extra: dict[int, list[int]] = {}  # garbage inserted before clean token k (expected slot k % 7)
    inserted = 0
    for pos, gid in insertions:
        k = min(pos, len(clean))
        if slot_of(gid) == k % FRAME_TOKENS:
            continue  # would be a valid token there, not garbage
        extra.setdefault(k, []).append(gid)
        inserted += 1
    dirty = [g for k, token in enumerate(clean) for g in (*extra.get(k, []), token)] + extra.get(len(clean), [])
    asm = FrameAssembler()
    assert list(asm.extend(dirty)) == frames
    assert asm.invalid == inserted


def test_end_of_speech_finishes_and_drops_partial_frame():
    ids = frames_to_ids([Frame(1, (1, 1), (1, 1, 1, 1))]) + [audio_id(0, 9), audio_id(1, 9), END_OF_SPEECH, audio_id(2, 9)]
    asm = FrameAssembler()
    assert len(list(asm.extend(ids))) == 1
    assert asm.finished and asm.dropped_partial == 2


def test_prompt_and_training_layout():
    ids = prompt_ids(_Tok(), "tara", "hi")
    assert ids[0] == START_OF_HUMAN and ids[1] == 128000
    assert ids[-4:] == list(PROMPT_SUFFIX)
    assert "".join(chr(i) for i in ids[2:-4]) == "tara: hi"
    frames = [Frame(5, (6, 7), (8, 9, 10, 11))]
    seq, audio_start = training_ids(_Tok(), "tara", "hi", frames)
    assert seq[:audio_start] == ids
    assert seq[audio_start:-2] == frames_to_ids(frames)
    assert seq[-2:] == [END_OF_SPEECH, 128262]


def test_max_tokens_grows_with_text_and_is_whole_frames():
    short, long = max_audio_tokens("hi"), max_audio_tokens("hello " * 50)
    assert long > short
    assert (short - 1) % FRAME_TOKENS == 0
