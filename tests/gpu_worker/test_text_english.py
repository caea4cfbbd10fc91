"""gpu_worker.text.english: the context rules, read exactly (the case set checks breadth; these pin
the rules whose reading depends on the words around them, and the symbols' rules)."""

from __future__ import annotations

import pytest

from gpu_worker.text import normalize
from gpu_worker.text.english import RULES


def said(text: str) -> str:
    return normalize(text).text


@pytest.mark.parametrize(("written", "spoken"), [
    # a four-digit number is a year after a year word or before an era, a count otherwise
    ("in 1984", "in nineteen eighty-four"), ("1984 people", "one thousand nine hundred eighty-four people"),
    ("476 AD", "four seventy-six A D"), ("the year 2000", "the year two thousand"),
    # Dr. and St. by context
    ("Dr. Smith", "Doctor Smith"), ("We met Dr. Lee.", "We met Doctor Lee."), ("It's on Elm Dr.", "It's on Elm Drive."),
    ("I live on Baker St. He does too.", "I live on Baker Street. He does too."),
    ("We flew to St. Louis.", "We flew to Saint Louis."), ("Dr Jekyll", "Doctor Jekyll"), ("In 2024, Dr. Lee left.", "In twenty twenty-four, Doctor Lee left."),
    ("Go to 5th Ave. now", "Go to fifth Avenue now"),
    ("No. 5", "number five"), ("No. I won't.", "No. I won't."),
    # Roman numerals only in context; "I" is a pronoun elsewhere
    ("Henry VIII", "Henry the eighth"), ("Chapter IV", "Chapter four"), ("Rocky II", "Rocky two"),
    ("So I did", "So I did"), ("Can I go?", "Can I go?"), ("Washington DC", "Washington D C"),
    ("an IV drip", "an I V drip"),
    # acronyms: letters, listed words, emphasis
    ("FBI", "F B I"), ("NASA", "Nasa"), ("CEOs", "C E Os"), ("U.S. troops", "U S troops"), ("AT&T", "A T and T"), ("NASA's FBI's", "Nasa's F B I's"),
    ("This is REALLY big", "This is really big"), ("do NOT go", "do not go"), ("OK", "okay"),
    # symbols
    ("**bold** text", "bold text"), ("# Heading", "Heading"), ("a < b", "a less than b"), ("x^2", "x two"),
    ("w/e", "w e"), ("A & B", "A and B"), ("me@ home", "me at home"),
    # times, money edge cases
    ("at 14:00", "at fourteen hundred"), ("at 12:00 pm", "at twelve p m"), ("$0.01", "one cent"),
    ("£1.50", "one pound and fifty pence"), ("$1.234", "one point two three four dollars"), ("1p", "one penny"),
    # ranges and scores
    ("10-20%", "ten to twenty percent"), ("5-10 km", "five to ten kilometers"), ("well-known", "well-known"),
    ("COVID-19", "Covid-nineteen"), ("a 5-year-old", "a five-year-old"),
    # numbers inside words
    ("MP3", "M P three"), ("4K", "four K"), ("Apt. 4B", "Apartment four B"),
    # found by probing after the case set was written (regressions)
    ("in 1990-91", "in nineteen ninety to ninety-one"), ("3x faster", "three times faster"),
    ("5'11\" tall", "five foot eleven tall"), ("100/100", "one hundred out of one hundred"),
    ("version 1.2.3", "version one point two point three"), ("a 1:1 ratio", "a one to one ratio"),
    ("Mr. & Mrs. Smith", "Mister and Missus Smith"), ("He said 'yes' twice", "He said 'yes' twice"),
    ("x_1", "x one"),
])
def test_reads(written, spoken):
    assert said(written) == spoken


def test_dates_in_common_forms_read_the_same_date():
    forms = ["January 5, 2024", "Jan. 5, 2024", "2024-01-05", "1/5/2024", "Jan 5th, 2024"]
    assert {said(f) for f in forms} == {"January fifth, twenty twenty-four"}
    assert said("25/12/2023") == "December twenty-fifth, twenty twenty-three"  # 25 cannot be a month
    assert said("05.01.2024") == "January fifth, twenty twenty-four"  # dots: day first
    assert said("2024-13-45") != "", "an impossible ISO date is still read (as numbers)"


def test_phone_numbers_digit_by_digit_in_breath_groups():
    assert said("555-123-4567") == "five five five, one two three, four five six seven"
    assert said("Call 911") == "Call nine one one"
    assert said("+44 20 7946 0958") == "plus four four, two zero, seven nine four six, zero nine five eight"


def test_urls_and_email():
    assert said("https://example.com/a-b_c?x=1") == "example dot com slash a dash b underscore c question mark x equals one"
    assert said("Mail me at j.doe@mail.co.uk.") == "Mail me at j dot doe at mail dot co dot uk."
    assert said("www.bbc.co.uk") == "w w w dot b b c dot co dot uk"


def test_every_rule_says_why():
    for rule in RULES:
        assert rule.speak.__doc__, f"rule {rule.name} ({rule.speak.__name__}) has no docstring"
