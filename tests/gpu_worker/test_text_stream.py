"""StreamNormalizer: text in pieces reads exactly as the whole text, at every split point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.text import Dictionary, PronunciationRule, StreamNormalizer, normalize
from gpu_worker.text.stream import MAX_HELD_CHARS

INPUTS = [
    "It costs $1,200 today.",
    "On Jan. 5, 2024, Dr. Smith paid $1,200 for 3 tickets at 3:30 pm. He said <laugh> it was fine.",
    "In Paris call +33 1 23 45 67 89 or write to a.b@c.co.uk. Henry VIII and Chapter IV. It's 20°C.",
    "Call (555) 123-4567 by 10:05 a.m. on 12/25/2023, then visit https://example.com/docs-v2 <sigh>.",
    "We won 3-2 in 1984; it was 99.9% fun, 2 1/2 hours, about ~10 km/h and -5°F. Main St. Here.",
]
CASES = [json.loads(line)["written"] for line in
         (Path(__file__).resolve().parents[1] / "data" / "normalize_cases.jsonl").read_text().splitlines()]


def streamed(parts, **kw) -> str:
    s = StreamNormalizer(**kw)
    return "".join(s.push(p) for p in parts) + s.flush()


@pytest.mark.parametrize("text", INPUTS)
def test_every_split_point_reads_as_one_piece(text):
    whole = normalize(text).text
    for i in range(len(text) + 1):
        assert streamed([text[:i], text[i:]]) == whole, (text[:i], text[i:])


@pytest.mark.parametrize("text", INPUTS)
def test_char_by_char_and_word_by_word(text):
    whole = normalize(text).text
    assert streamed(list(text)) == whole
    words = text.split(" ")
    assert streamed([w if i == len(words) - 1 else w + " " for i, w in enumerate(words)]) == whole


def test_the_case_set_split_everywhere():
    for text in CASES:
        whole = normalize(text).text
        for i in range(len(text) + 1):
            assert streamed([text[:i], text[i:]]) == whole, (text[:i], text[i:])


def test_a_number_split_across_messages_is_read_once():
    assert streamed(["It costs $1,", "200 today."]) == "It costs one thousand two hundred dollars today."
    assert streamed(["at 3:30", " pm"]) == "at three thirty p m"


def test_text_is_released_before_flush():
    s = StreamNormalizer()
    out = s.push("Hello there, my friend. How are you doing today? I am fine ")
    assert out.startswith("Hello there, my friend. How are you") and s.pending
    assert out + s.flush() == normalize("Hello there, my friend. How are you doing today? I am fine").text


def test_flush_starts_a_new_utterance():
    s = StreamNormalizer()
    assert s.push("one 1") + s.flush() == "one one"
    assert s.push("2") + s.flush() == "two"
    assert s.flush() == ""


def test_a_run_without_spaces_is_bounded():
    s = StreamNormalizer()
    out = s.push("x" * (MAX_HELD_CHARS + 10))
    assert out == "x" * (MAX_HELD_CHARS + 10) and s.pending == ""
    out += "".join(s.push("y") for _ in range(3 * MAX_HELD_CHARS)) + s.flush()
    assert out.count("y") == 3 * MAX_HELD_CHARS


def test_pushing_a_spaceless_run_char_by_char_is_bounded():
    import time

    s = StreamNormalizer()
    start = time.perf_counter()
    out = "".join(s.push(c) for c in "a." * 2_000) + s.flush()
    assert time.perf_counter() - start < 10 and out.count("a") == 2_000
    assert len(s._buffer) == 0


def test_dictionary_in_a_stream():
    d = Dictionary("d", (PronunciationRule("New York City", "noo york sitty"),))
    text = "I love New York City at 9 pm."
    whole = normalize(text, dictionary=d).text
    assert "noo york sitty" in whole
    for i in range(len(text) + 1):
        assert streamed([text[:i], text[i:]], dictionary=d) == whole


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(INPUTS + CASES[::7]), st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_any_splits(text, cuts):
    points = sorted({c % (len(text) + 1) for c in cuts})
    parts = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    assert streamed(parts) == normalize(text).text
