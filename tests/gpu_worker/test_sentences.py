"""Long segments -> engine requests: every piece fits the model's context, cuts fall at sentence
ends first (then clause breaks, then spaces), nothing is lost or reordered, and text that no
request can hold is a client error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engine import Voice, plan_requests
from gpu_worker.errors import TextTooLong
from gpu_worker.orpheus import max_audio_tokens
from gpu_worker.sentences import split_to_fit

VOICE = Voice("tara", "tara")


def bpe_like(voice: Voice, text: str) -> list[int]:
    """~4 characters per token, 4 tokens per character outside ASCII (emoji), plus the Orpheus frame."""
    n = sum(1 if ord(c) < 128 else 16 for c in text)
    return [0] * (n // 4 + 9)


def test_short_text_is_one_request_with_a_length_bound():
    [request] = plan_requests(bpe_like, VOICE, "Hello there.", 4096)
    assert request.text == "Hello there." and request.max_tokens == max_audio_tokens("Hello there.")


def test_long_text_is_cut_at_sentence_ends_and_every_request_fits():
    sentences = [f"Sentence number {i} tells a little more of the story." for i in range(80)]
    requests = plan_requests(bpe_like, VOICE, " ".join(sentences), 4096)
    assert len(requests) > 1
    assert " ".join(r.text for r in requests) == " ".join(sentences)
    for r in requests:
        assert r.text.endswith(".")  # cut where a speaker pauses
        assert len(r.prompt) + max_audio_tokens(r.text) <= 4096 and len(r.prompt) + r.max_tokens <= 4096


def test_a_sentence_too_long_for_one_request_is_cut_at_clauses_then_spaces():
    clauses = ", ".join(f"clause {i} goes on" for i in range(120))
    words = " ".join(["word"] * 900)
    for text, mark in ((clauses, ","), (words, None)):
        pieces = split_to_fit(text, lambda piece: len(piece) <= 300)
        assert " ".join(pieces) == text and all(len(p) <= 300 for p in pieces)
        if mark:
            assert all(p.endswith(mark) for p in pieces[:-1])


def test_a_run_without_spaces_that_cannot_fit_is_text_too_long():
    with pytest.raises(TextTooLong, match="without a space"):
        plan_requests(bpe_like, VOICE, "\U0001F600" * 4000, 4096)  # ~16,000 prompt tokens, nowhere to cut


def test_a_client_cap_is_clamped_to_the_room_left_in_the_context():
    text = " ".join(["A fairly long sentence of words."] * 8)
    [request] = plan_requests(bpe_like, VOICE, text, 4096, max_tokens=8192)
    assert len(request.prompt) + request.max_tokens == 4096


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.sampled_from("abc .,!?"), min_size=1, max_size=40), min_size=1, max_size=60),
       st.integers(20, 400))
def test_splitting_keeps_every_word_in_order(parts, limit):
    text = " ".join(parts)
    try:
        pieces = split_to_fit(text, lambda piece: len(piece) <= limit)
    except TextTooLong:
        assert any(len(word) > limit for word in text.split())
        return
    assert " ".join(pieces) == " ".join(text.split())
    assert all(0 < len(p) <= limit for p in pieces)
