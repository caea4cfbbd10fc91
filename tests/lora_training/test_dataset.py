"""SNAC encoding with its cache, Orpheus training sequences, labels, de-duplication, held-out split."""

import numpy as np
import pytest

from gpu_worker.orpheus import (
    AUDIO_BASE, END_OF_AI, END_OF_HUMAN, END_OF_SPEECH, END_OF_TEXT, START_OF_AI, START_OF_HUMAN, START_OF_SPEECH,
    START_OF_TEXT, Frame,
)
from lora_training.clips import Clip
from lora_training.dataset import IGNORE, FrameCache, build_examples, dedup_frames, encode, split
from lora_training.trainer import collate


class CountingCodec:
    """The real codec, counting the clips it is asked to encode."""

    def __init__(self, codec) -> None:
        self.codec = codec
        self.encoded = 0

    def encode_batch(self, clips):
        self.encoded += len(clips)
        return self.codec.encode_batch(clips)


def _clip(i: int, seconds: float) -> Clip:
    rng = np.random.default_rng(i)
    return Clip(f"c{i}", "f.wav", f"text {i}", (rng.standard_normal(int(seconds * 24000)) * 0.1).astype(np.float32), 0.0, 0.0)


def test_encode_is_cached_by_clip_content(codec, tmp_path):
    clips = [_clip(0, 0.5), _clip(1, 0.3)]
    counting = CountingCodec(codec)
    first = encode(counting, clips, FrameCache(tmp_path, "snac"), batch_s=10)
    assert counting.encoded == 2
    assert [len(first["c0"]), len(first["c1"])] == [6, 4]  # ceil(n / 2048) frames
    assert first["c0"] == codec.encode(clips[0].audio)  # batching does not change the codes
    again = encode(counting, clips, FrameCache(tmp_path, "snac"), batch_s=10)  # a new process reads the cache
    assert counting.encoded == 2 and again == first
    encode(counting, clips, FrameCache(tmp_path, "another codec"), batch_s=10)
    assert counting.encoded == 4


def test_sequences_follow_the_orpheus_layout_with_loss_on_audio(stand_in):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stand_in.model)
    frames = {"c0": [Frame(1, (2, 3), (4, 5, 6, 7)), Frame(8, (9, 10), (11, 12, 13, 14))]}
    clip = Clip("c0", "f.wav", "Hello there.", np.zeros(4096, np.float32), 0.0, 0.0)
    (example,) = build_examples(tokenizer, "alice", [clip], frames, dedup=False)
    ids = list(example.input_ids)
    text_ids = tokenizer.encode("alice: Hello there.")
    assert ids[: 1 + len(text_ids)] == [START_OF_HUMAN, *text_ids] and text_ids[0] == START_OF_TEXT
    audio_start = 1 + len(text_ids) + 4
    assert ids[audio_start - 4: audio_start] == [END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]
    assert example.audio_start == audio_start
    assert ids[audio_start: audio_start + 7] == [AUDIO_BASE + s * 4096 + c for s, c in enumerate((1, 2, 4, 5, 3, 6, 7))]
    assert ids[-2:] == [END_OF_SPEECH, END_OF_AI] and len(ids) == audio_start + 14 + 2
    labels = example.labels()
    assert labels[:audio_start] == [IGNORE] * audio_start and labels[audio_start:] == ids[audio_start:]
    batch = collate([example, build_examples(tokenizer, "alice", [clip], {"c0": frames["c0"][:1]}, dedup=False)[0]])
    assert batch["input_ids"].shape == batch["labels"].shape == (2, len(ids))
    assert batch["attention_mask"][1].sum().item() == len(ids) - 7
    assert (batch["labels"][1, len(ids) - 7:] == IGNORE).all()


def test_dedup_drops_frames_repeating_the_level0_code():
    frames = [Frame(5, (0, 0), (0, 0, 0, 0)), Frame(5, (1, 1), (1, 1, 1, 1)), Frame(6, (0, 0), (0, 0, 0, 0)),
              Frame(5, (0, 0), (0, 0, 0, 0))]
    assert dedup_frames(frames) == [frames[0], frames[2], frames[3]]


@pytest.mark.parametrize("count", [3, 10, 100])
def test_split_is_fixed_by_the_seed_and_holds_out_a_few(count, stand_in):
    from lora_training.dataset import Example

    examples = [Example(f"c{i}", (i,), 0) for i in range(count)]
    train, held = split(examples, eval_fraction=0.05, eval_max=4, seed=7)
    assert len(train) + len(held) == count and not {e.clip_id for e in train} & {e.clip_id for e in held}
    assert len(held) == (0 if count < 4 else min(4, max(1, round(0.05 * count))))
    assert split(examples, eval_fraction=0.05, eval_max=4, seed=7) == (train, held)
