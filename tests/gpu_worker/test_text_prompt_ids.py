"""Issue 36 item 5: a trainer's transcript and a request with the same written text produce the
same prompt ids (the training path: lora_training.text.normalize -> sentences -> training_ids; the
serving path: gpu_worker.text.normalize -> orpheus.prompt_ids)."""

from __future__ import annotations

import pytest

from gpu_worker.orpheus import Frame, prompt_ids, training_ids
from gpu_worker.text import normalize as serving_normalize
from lora_training.text import normalize as transcript_normalize
from lora_training.text import sentences


class _Tok:  # the TextTokenizer slice; a character tokenizer shows any difference in the text
    def encode(self, text: str) -> list[int]:
        return [128000, *(ord(c) for c in text)]


WRITTEN = [
    "On Jan. 5, 2024, Dr. Smith paid $1,200 for 3 tickets.",
    "It's 20°C at 3:30 pm <laugh> and 45% of NASA's FBI agents agree.",
    "Call 555-123-4567 or visit example.com/docs before 10/31/2025.",
    "Henry VIII had 6 wives; Chapter IV says so.",
]


@pytest.mark.parametrize("written", WRITTEN)
def test_transcript_and_request_prompt_ids_agree(written):
    frames = [Frame(1, (2, 3), (4, 5, 6, 7))]
    (clip_text,) = sentences(transcript_normalize(written))  # one sentence: one clip
    ids, audio_start = training_ids(_Tok(), "alice", clip_text, frames)
    served = prompt_ids(_Tok(), "alice", serving_normalize(written).text)
    assert ids[:audio_start] == served


def test_the_transcript_path_really_normalizes():
    assert transcript_normalize("$5 at 3:30 pm") == "five dollars at three thirty p m"
