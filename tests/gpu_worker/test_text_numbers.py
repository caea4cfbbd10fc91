"""gpu_worker.text.numbers: the number words training and serving share."""

from __future__ import annotations

import pytest

from gpu_worker.text.numbers import MAX_DIGITS, cardinal, decade, decimal, digits, fraction, number, ordinal, year


@pytest.mark.parametrize(("n", "words"), [
    (0, "zero"), (13, "thirteen"), (40, "forty"), (42, "forty-two"), (100, "one hundred"), (101, "one hundred one"),
    (2026, "two thousand twenty-six"), (1_000_001, "one million one"), (-5, "minus five"),
    (999_999_999_999_999, "nine hundred ninety-nine trillion nine hundred ninety-nine billion nine hundred "
     "ninety-nine million nine hundred ninety-nine thousand nine hundred ninety-nine"),
])
def test_cardinal(n, words):
    assert cardinal(n) == words


def test_cardinal_bound():
    with pytest.raises(ValueError):
        cardinal(10**MAX_DIGITS)


@pytest.mark.parametrize(("n", "words"), [(1, "first"), (2, "second"), (3, "third"), (12, "twelfth"), (20, "twentieth"),
                                          (21, "twenty-first"), (103, "one hundred third"), (1000, "one thousandth")])
def test_ordinal(n, words):
    assert ordinal(n) == words


@pytest.mark.parametrize(("n", "words"), [
    (1984, "nineteen eighty-four"), (1900, "nineteen hundred"), (1805, "eighteen oh five"), (2000, "two thousand"),
    (2005, "two thousand five"), (2010, "twenty ten"), (2026, "twenty twenty-six"), (1066, "ten sixty-six"),
    (476, "four seventy-six"), (44, "forty-four"), (1000, "one thousand"),
])
def test_year(n, words):
    assert year(n) == words


def test_decade_decimal_fraction_digits():
    assert decade(1990) == "nineteen nineties" and decade(80) == "eighties" and decade(2000) == "two thousands"
    assert decimal("3", "14") == "three point one four" and decimal("", "5") == "zero point five"
    assert fraction(1, 2) == "one half" and fraction(3, 4) == "three quarters" and fraction(5, 8) == "five eighths"
    assert fraction(2, 3) == "two thirds" and fraction(1, 10) == "one tenth"
    assert digits("+1 (555) 0") == "one five five five zero"


def test_number_reads_long_runs_digit_by_digit():
    assert number("1,234") == "one thousand two hundred thirty-four"
    assert number("-7") == "minus seven"
    long = "1" * (MAX_DIGITS + 1)
    assert number(long) == " ".join(["one"] * (MAX_DIGITS + 1))
    with pytest.raises(ValueError):
        number("12a")
