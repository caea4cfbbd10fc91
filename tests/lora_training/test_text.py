"""Transcript normalization (the serving normalizer, gpu_worker.text): numbers spelled out, whitespace
collapsed, sentences split. The normalizer's own cases are in tests/gpu_worker/test_text_*.py."""

import pytest

from lora_training.text import cardinal, normalize, ordinal, sentences


@pytest.mark.parametrize(("n", "words"), [
    (0, "zero"), (13, "thirteen"), (40, "forty"), (42, "forty-two"), (100, "one hundred"),
    (2026, "two thousand twenty-six"), (1_000_001, "one million one"),
])
def test_cardinal(n, words):
    assert cardinal(n) == words


@pytest.mark.parametrize(("n", "words"), [(1, "first"), (2, "second"), (12, "twelfth"), (20, "twentieth"),
                                          (21, "twenty-first"), (103, "one hundred third")])
def test_ordinal(n, words):
    assert ordinal(n) == words


def test_normalize_numbers_whitespace_and_tags():
    assert normalize("  We won  1st prize:\n$5 and 45% more in 2026 ! <laugh> ") == (
        "We won first prize: five dollars and forty-five percent more in twenty twenty-six! <laugh>"
    )
    # "in 2026" is a year (gpu_worker.text.english._is_year); 2026 alone is a count
    assert normalize("2026 people") == "two thousand twenty-six people"
    assert normalize("3.5 km, 1,000 people") == "three point five kilometers, one thousand people"


def test_sentences_split_on_lines_and_end_marks():
    assert sentences('Hello there. How are you? I am "fine." Yes\nA new line') == [
        "Hello there.", "How are you?", 'I am "fine."', "Yes", "A new line"]
