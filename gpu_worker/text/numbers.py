"""English number words: cardinals, ordinals, digits, decimals, years, fractions. Pure, no I/O.

Every reading here is the one an American English speaker uses by default; where speakers differ
(the British "one hundred and five", "nought point five") the case set accepts both, and these
functions pick one so a voice is trained and prompted with the same words every time.
Integers longer than `MAX_DIGITS` are read digit by digit: nobody says "one quintillion ...",
and an unbounded integer would make the reading (and its cost) unbounded too.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_DIGITS", "cardinal", "decade", "decimal", "digits", "fraction", "number", "ordinal",
           "ordinal_words", "year"]

MAX_DIGITS: Final = 15  # below 10**15: up to "nine hundred ninety-nine trillion ..."

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_WORDS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                  "nine": "ninth", "twelve": "twelfth"}


def cardinal(n: int) -> str:
    """0 <= n < 10**15 in words, American style (no "and"): 2026 -> 'two thousand twenty-six'.

    Hyphens join tens and ones ("twenty-six") as written English does; the tokenizer sees the
    same words either way, and one spelling keeps training and serving identical."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {cardinal(rest)}" if rest else "")
    for scale, word in _SCALES:
        if n >= scale:
            high, rest = divmod(n, scale)
            if high >= 1000:
                break
            return f"{cardinal(high)} {word}" + (f" {cardinal(rest)}" if rest else "")
    raise ValueError(f"{n} is out of range (below 10**{MAX_DIGITS})")


def ordinal_words(words: str) -> str:
    """The ordinal of a cardinal reading: 'twenty-one' -> 'twenty-first', 'forty' -> 'fortieth'."""
    cut = max(words.rfind(" "), words.rfind("-"))
    head, last = words[:cut + 1], words[cut + 1:]
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + last


def ordinal(n: int) -> str:
    """21 -> 'twenty-first', 100 -> 'one hundredth'."""
    return ordinal_words(cardinal(n))


def digits(text: str) -> str:
    """Each digit in turn ('0' is 'zero'): phone numbers, long ids, ports. Non-digits are skipped."""
    return " ".join(_ONES[int(c)] for c in text if c.isdigit())


def decimal(integer: str, fraction: str) -> str:
    """'3', '14' -> 'three point one four': the digits after the point are read one by one, as
    speakers read measurements ("nine point eight one", never "nine point eighty-one")."""
    head = number(integer) if integer else "zero"
    return f"{head} point {digits(fraction)}" if fraction else head


def number(text: str) -> str:
    """A written integer ('1,234', '-5', '007') in words; over `MAX_DIGITS` digits, digit by digit."""
    negative = text.startswith(("-", "−"))
    plain = text.lstrip("-−").replace(",", "")
    if not plain.isdigit():
        raise ValueError(f"{text!r} is not an integer")
    words = digits(plain) if len(plain) > MAX_DIGITS else cardinal(int(plain))
    return f"minus {words}" if negative else words


def year(n: int) -> str:
    """A year as it is said: 1984 'nineteen eighty-four', 1900 'nineteen hundred', 1805 'eighteen oh
    five', 2005 'two thousand five', 2026 'twenty twenty-six', 476 'four seventy-six'.

    2000-2009 keep "two thousand": nobody says "twenty oh five" by default; from 2010 the pair
    reading ("twenty ten") is what most speakers and newsreaders use."""
    if n < 0:
        raise ValueError("years are non-negative (the era is a separate word: BC, AD)")
    if n < 100 or n % 1000 == 0 or 2000 <= n < 2010 or n >= 10_000:
        return cardinal(n)
    high, low = divmod(n, 100)
    if low == 0:
        return f"{cardinal(high)} hundred"
    return f"{cardinal(high)} {'oh ' + _ONES[low] if low < 10 else cardinal(low)}"


def decade(n: int) -> str:
    """1990 -> 'nineteen nineties', 80 -> 'eighties', 2000 -> 'two thousands'."""
    words = year(n) if n >= 100 else cardinal(n)
    if words.endswith("y"):
        return words[:-1] + "ies"
    return words + "s"


_DENOMINATORS = {2: ("half", "halves"), 4: ("quarter", "quarters")}


def fraction(numerator: int, denominator: int) -> str:
    """3/4 -> 'three quarters', 1/2 -> 'one half', 5/8 -> 'five eighths'.

    "Quarter" over "fourth": both are heard, quarter is the more common in speech."""
    if denominator <= 0:
        raise ValueError("a fraction's denominator is positive")
    singular, plural = _DENOMINATORS.get(denominator) or (ordinal(denominator), ordinal(denominator) + "s")
    return f"{cardinal(numerator)} {singular if numerator == 1 else plural}"
