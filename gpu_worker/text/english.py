"""English: how written English is read aloud, as ordered rules (`rules.Rules`).

Order is priority: the first rule that matches at a position and accepts wins, so the specific
shapes (tags, e-mail, URLs, phone numbers, dates, times) come before the general ones (ranges,
money, quantities, plain numbers), and the word and punctuation fallbacks come last. Each rule's
speak function says why it reads the way it does. The readings are American English defaults;
`tests/data/normalize_cases.jsonl` lists the forms speakers also use.

Rules look at most `CONTEXT_WORDS` written words to either side of their match (the stream
normalizer relies on it, see `stream.py`).
"""

from __future__ import annotations

import re
from typing import Final

from gpu_worker.text import numbers as num
from gpu_worker.text.rules import Piece, Rule, Rules
from gpu_worker.text.tags import TAG, known_tag, unknown_tag_words

__all__ = ["CONTEXT_WORDS", "LANGUAGE", "RULES", "pieces"]

CONTEXT_WORDS: Final = 3

# --- shared shapes ----------------------------------------------------------------------------

_INT = r"\d{1,3}(?:,\d{3})+|\d+"
_NUM = rf"(?:{_INT})(?:\.\d+)?|\.\d+"
_B = r"(?<![\w.])"  # a number starts a token (not "v1", not "1.2.3"'s second part)
_E = r"(?![\w])"

_MONTHS = {
    "january": "January", "february": "February", "march": "March", "april": "April", "may": "May",
    "june": "June", "july": "July", "august": "August", "september": "September", "october": "October",
    "november": "November", "december": "December", "jan": "January", "feb": "February", "mar": "March",
    "apr": "April", "jun": "June", "jul": "July", "aug": "August", "sep": "September", "sept": "September",
    "oct": "October", "nov": "November", "dec": "December",
}
_MONTH_NUMBER = {name: i for i, name in enumerate(
    ("January February March April May June July August September October November December").split(), 1)}
_MONTH = "(?:" + "|".join(sorted((m.capitalize() for m in _MONTHS), key=len, reverse=True)) + r")\.?"
_DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()

_UNITS: Final = {  # written (case-sensitive) -> (singular, plural)
    "km/h": ("kilometer per hour", "kilometers per hour"), "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"), "m/s": ("meter per second", "meters per second"),
    "km": ("kilometer", "kilometers"), "cm": ("centimeter", "centimeters"), "mm": ("millimeter", "millimeters"),
    "m": ("meter", "meters"), "mi": ("mile", "miles"), "ft": ("foot", "feet"), "yd": ("yard", "yards"),
    "kg": ("kilogram", "kilograms"), "mg": ("milligram", "milligrams"), "g": ("gram", "grams"),
    "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"),
    "ml": ("milliliter", "milliliters"), "mL": ("milliliter", "milliliters"), "L": ("liter", "liters"),
    "sec": ("second", "seconds"), "secs": ("second", "seconds"), "ms": ("millisecond", "milliseconds"),
    "min": ("minute", "minutes"), "mins": ("minute", "minutes"), "hr": ("hour", "hours"), "hrs": ("hour", "hours"),
    "KB": ("kilobyte", "kilobytes"), "kB": ("kilobyte", "kilobytes"), "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"),
    "Hz": ("hertz", "hertz"), "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"), "W": ("watt", "watts"), "kW": ("kilowatt", "kilowatts"),
    "kWh": ("kilowatt hour", "kilowatt hours"), "V": ("volt", "volts"),
    "°C": ("degree Celsius", "degrees Celsius"), "℃": ("degree Celsius", "degrees Celsius"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"), "℉": ("degree Fahrenheit", "degrees Fahrenheit"),
    "° C": ("degree Celsius", "degrees Celsius"), "° F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}
_UNIT = "(?:" + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True)) + ")"

_CURRENCIES: Final = {  # symbol -> (unit, units, subunit, subunits)
    "$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"), "¥": ("yen", "yen", "", ""), "₹": ("rupee", "rupees", "paisa", "paise"),
}
_SCALES = {"thousand": "thousand", "k": "thousand", "million": "million", "m": "million", "mn": "million",
           "billion": "billion", "b": "billion", "bn": "billion", "trillion": "trillion", "t": "trillion"}
_AMOUNT = rf"[$€£¥₹]\s?(?:{_NUM})(?:\s?(?:thousand|million|billion|trillion|bn|mn|[KkMmBT])(?![\w]))?"

_YEAR_CUES: Final = frozenset("in since by until till from year years circa c. during before after of around "
                              "summer winter spring autumn fall class".split())
_ERAS: Final = frozenset({"AD", "BC", "BCE", "CE", "A.D.", "B.C."})
_PHONE_CUES: Final = frozenset("call dial text phone fax tel tel. ring".split())


_WINDOW: Final = 64  # context is looked for this far at most: a run without spaces costs no more


def _prev_word(text: str, start: int) -> str:
    """The written word before `start` (punctuation kept, its last `_WINDOW` characters), '' at the start."""
    i = start
    stop = max(0, start - _WINDOW)
    while i > stop and text[i - 1].isspace():
        i -= 1
    j = i
    stop = max(0, i - _WINDOW)
    while j > stop and not text[j - 1].isspace():
        j -= 1
    return text[j:i]


def _next_word(text: str, end: int) -> str:
    i, stop = end, min(len(text), end + _WINDOW)
    while i < stop and text[i].isspace():
        i += 1
    j, stop = i, min(len(text), i + _WINDOW)
    while j < stop and not text[j].isspace():
        j += 1
    return text[i:j]


def _sentence_initial(text: str, start: int) -> bool:
    prev = _prev_word(text, start)
    return not prev or prev[-1] in ".!?:;\"'“”"


def _capitalized(word: str) -> bool:
    word = word.lstrip("\"'(“‘")
    return bool(word) and word[0].isupper()


def _ends_sentence(text: str, end: int) -> bool:
    """A period a rule consumed ("etc.", "St.", "p.m.") also ends the sentence when the text ends
    there or the next word is capitalized: the spoken text keeps it, so sentence splitting and
    prosody still see the sentence end."""
    rest = text[end:end + 3]
    if not rest.strip():
        return True
    return rest[0].isspace() and _capitalized(_next_word(text, end))


def _with_period(spoken: str, match: re.Match[str], text: str) -> str:
    return spoken + "." if match[0].endswith(".") and _ends_sentence(text, match.end()) else spoken


# --- tags -------------------------------------------------------------------------------------


def _tag(m: re.Match[str], text: str) -> str:
    """Known tags pass through in their trained spelling; anything else tag-shaped is read as its
    words (tags.py states the rule and why)."""
    return known_tag(m[0]) or unknown_tag_words(m[0])


# --- e-mail and URLs --------------------------------------------------------------------------

_SEPARATORS = {".": "dot", "-": "dash", "_": "underscore", "+": "plus", "/": "slash", ":": "colon", "?": "question mark",
               "=": "equals", "&": "and", "#": "hash", "~": "tilde", "%": "percent", "@": "at"}
_CHUNK = re.compile(r"[A-Za-z]+|\d+|.", re.S)
_VOWELS = frozenset("aeiouy")


def _read_chunk(chunk: str) -> str:
    """A piece of an address: digits one by one ("bob42" -> "bob four two"), a short run of
    consonants letter by letter ("bbc", "www"), anything else as a lower-case word."""
    if chunk.isdigit():
        return num.digits(chunk)
    if chunk.isalpha():
        low = chunk.lower()
        if len(low) <= 3 and not (_VOWELS & set(low)):
            return " ".join(low)
        return low
    return _SEPARATORS.get(chunk, "")


def _read_address(address: str) -> str:
    return " ".join(w for w in (_read_chunk(c) for c in _CHUNK.findall(address)) if w)


def _email(m: re.Match[str], text: str) -> str:
    """Read as people dictate addresses: "jane dot doe at gmail dot com"."""
    return _read_address(m[0])


_TLDS = "com|org|net|edu|gov|io|ai|co|uk|us|de|fr|dev|app|info|biz|me|tv|ly|ca|au|in|jp|eu|xyz|tech|news"


def _url(m: re.Match[str], text: str) -> str:
    """The scheme is not said (nobody reads "h t t p s colon slash slash" aloud); "www" is said
    letter by letter; dots, slashes and dashes are named; a trailing slash is not said."""
    address = re.sub(r"^[A-Za-z][\w+.-]*://", "", m[0]).rstrip("/")
    return _read_address(address)


# --- phone numbers ----------------------------------------------------------------------------


def _phone(m: re.Match[str], text: str) -> str:
    """Digit by digit, each written group its own breath group: "five five five, one two three"."""
    groups = re.findall(r"\+|\d+", m[0])
    out, plus = [], False
    for g in groups:
        if g == "+":
            plus = True
            continue
        out.append(("plus " if plus else "") + num.digits(g))
        plus = False
    return ", ".join(out)


def _short_phone(m: re.Match[str], text: str) -> str | None:
    """3-4 digits ("867-5309") are a phone number after a phone word or when the second group
    starts with 0 ("555-0123"); otherwise the range rule reads them."""
    if m["b"].startswith("0") or _prev_word(text, m.start()).lower().rstrip(":") in _PHONE_CUES:
        return _phone(m, text)
    return None


# --- dates ------------------------------------------------------------------------------------


def _day(d: str) -> int | None:
    n = int(d)
    return n if 1 <= n <= 31 else None


def _year_words(y: str) -> str:
    n = int(y)
    if len(y) == 2:  # '24 in 1/5/24: "twenty-four"; '05: "oh five"
        return f"oh {num.cardinal(n)}" if n < 10 else num.cardinal(n)
    return num.year(n)


def _month_day(m: re.Match[str], text: str) -> str | None:
    """"January 5, 2024" -> "January fifth, twenty twenty-four": American usage says the day as an
    ordinal after the month, the year as a year."""
    day = _day(m["d"])
    if day is None:
        return None
    spoken = f"{_MONTHS[m['mon'].rstrip('.').lower()]} {num.ordinal(day)}"
    return spoken + (f", {_year_words(m['y'])}" if m["y"] else "")


def _day_month(m: re.Match[str], text: str) -> str | None:
    """"5 January 2024" -> "the fifth of January twenty twenty-four": day-first dates are said with
    "the ... of" (British usage, where this written form comes from)."""
    day = _day(m["d"])
    if day is None:
        return None
    the = "" if _prev_word(text, m.start()).lower() == "the" else "the "
    spoken = f"{the}{num.ordinal(day)} of {_MONTHS[m['mon'].rstrip('.').lower()]}"
    return spoken + (f" {_year_words(m['y'])}" if m["y"] else "")


def _month_year(m: re.Match[str], text: str) -> str | None:
    """"June 2021" -> "June twenty twenty-one"."""
    return f"{_MONTHS[m['mon'].rstrip('.').lower()]} {_year_words(m['y'])}"


def _calendar(month: int, day: int, year: str) -> str | None:
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    name = next(n for n, i in _MONTH_NUMBER.items() if i == month)
    return f"{name} {num.ordinal(day)}, {_year_words(year)}"


def _iso_date(m: re.Match[str], text: str) -> str | None:
    """2024-01-05 is said as the date it names: "January fifth, twenty twenty-four"."""
    return _calendar(int(m["m"]), int(m["d"]), m["y"])


def _numeric_date(m: re.Match[str], text: str) -> str | None:
    """1/5/2024: month first (US), unless the first number cannot be a month (25/12/2023); with
    dots (05.01.2024) day first, as the countries that write dots do."""
    a, b = int(m["a"]), int(m["b"])
    if m["sep"] == "." or a > 12:
        a, b = b, a
    return _calendar(a, b, m["y"])


# --- times ------------------------------------------------------------------------------------


def _meridiem(ap: str | None) -> str:
    return f" {ap[0].lower()} m" if ap else ""


def _clock(h: int, minute: int, ap: str | None) -> str | None:
    if h > 24 or (ap and not 1 <= h <= 12):
        return None
    if minute == 0:
        if ap:
            return f"{num.cardinal(h)}{_meridiem(ap)}"
        return f"{num.cardinal(h)} hundred" if h > 12 or h == 0 else f"{num.cardinal(h)} o'clock"
    mins = f"oh {num.cardinal(minute)}" if minute < 10 else num.cardinal(minute)
    return f"{num.cardinal(h)} {mins}{_meridiem(ap)}"


def _time(m: re.Match[str], text: str) -> str | None:
    """3:30 pm -> "three thirty p m", 10:05 -> "ten oh five", 7:00 -> "seven o'clock", 14:00 ->
    "fourteen hundred": the clock readings speakers use; a.m./p.m. said as their letters."""
    spoken = _clock(int(m["h"]), int(m["min"]), m["ap"])
    if spoken is None:
        return None
    if m["s"]:
        spoken += f" and {num.cardinal(int(m['s']))} seconds"
    return _with_period(spoken, m, text)


def _hour(m: re.Match[str], text: str) -> str | None:
    """9am, 6 p.m., 10 PM -> "nine a m"."""
    spoken = _clock(int(m["h"]), 0, m["ap"])
    return None if spoken is None else _with_period(spoken, m, text)


def _ratio(m: re.Match[str], text: str) -> str:
    """1:1, 16:9, 3:100 (not a clock: the minutes are not two digits, or a side is over 24) -> "one
    to one"."""
    return f"{_plain_number(m['a'])} to {_plain_number(m['b'])}"


def _version(m: re.Match[str], text: str) -> str:
    """1.2.3 (a version, an outline number) -> "one point two point three": each part a number."""
    return " point ".join(_plain_number(part) for part in m[0].split("."))


def _feet_inches(m: re.Match[str], text: str) -> str:
    """5'11" -> "five foot eleven": how heights are said."""
    inches = f" {num.cardinal(int(m['i']))}" if m["i"] else ""
    return f"{num.cardinal(int(m['f']))} foot{inches}"


def _times_faster(m: re.Match[str], text: str) -> str:
    """3x, 10X (a multiple) -> "three times"."""
    return f"{_plain_number(m['n'])} times"


# --- fractions --------------------------------------------------------------------------------

_VULGAR = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅕": (1, 5), "⅖": (2, 5), "⅗": (3, 5),
           "⅘": (4, 5), "⅙": (1, 6), "⅚": (5, 6), "⅛": (1, 8), "⅜": (3, 8), "⅝": (5, 8), "⅞": (7, 8)}
_SAID_AS_NUMBERS = {"24/7": "twenty-four seven", "9/11": "nine eleven", "50/50": "fifty fifty"}


def _mixed(whole: str | None, n: int, d: int) -> str:
    if not whole:
        return num.fraction(n, d)
    part = f"a {num.fraction(1, d).split(' ', 1)[1]}" if n == 1 else num.fraction(n, d)
    return f"{num.cardinal(int(whole))} and {part}"


def _fraction(m: re.Match[str], text: str) -> str | None:
    """3/4 -> "three quarters", 2 1/2 -> "two and a half". A few fixed expressions keep their own
    reading (24/7 "twenty-four seven"); a numerator at or over the denominator is a score (10/10
    "ten out of ten"); a denominator over 100 or 0 is not read as a fraction."""
    said = _SAID_AS_NUMBERS.get(f"{m['n']}/{m['d']}")
    if said and not m["w"]:
        return said
    n, d = int(m["n"]), int(m["d"])
    if not 2 <= d <= 100 or n == 0:
        return None
    if n >= d and not m["w"]:  # 100/100, 10/10: a score, "out of"
        return f"{num.cardinal(n)} out of {num.cardinal(d)}"
    return _mixed(m["w"], n, d)


def _vulgar(m: re.Match[str], text: str) -> str:
    """½ -> "one half", 2½ -> "two and a half"."""
    n, d = _VULGAR[m["v"]]
    return _mixed(m["w"], n, d)


# --- money, quantities, ranges ----------------------------------------------------------------


def _plain_number(written: str) -> str:
    written = written.replace("−", "-")
    negative = written.startswith("-")
    body = written.lstrip("-")
    integer, _, frac = body.partition(".")
    if frac:
        words = num.decimal(integer.replace(",", ""), frac)
    elif integer.isdigit() and len(integer) > 1 and integer.startswith("0"):
        words = num.digits(integer)  # 007, 0800: said digit by digit
    else:
        words = num.number(integer)
    return f"minus {words}" if negative else words


def _money_words(sym: str, amount: str, scale: str | None) -> tuple[str, str]:
    """Words for the amount and the unit word that follows it ('', when already said)."""
    unit, units, sub, subs = _CURRENCIES[sym]
    integer, _, frac = amount.replace(",", "").partition(".")
    integer = integer or "0"
    if scale:  # $2.5 million -> "two point five million dollars"
        return f"{_plain_number(amount)} {_SCALES[scale.lower()]}", units
    if frac and len(frac) <= 2 and sub:
        cents = int(frac.ljust(2, "0"))
        dollars = int(integer)
        cent_words = f"{num.cardinal(cents)} {sub if cents == 1 else subs}"
        if dollars == 0:
            return cent_words, ""
        head = f"{num.number(integer)} {unit if dollars == 1 else units}"
        return (f"{head} and {cent_words}" if cents else head), ""
    if frac:
        return _plain_number(amount), units
    return num.number(integer), unit if int(integer) == 1 else units


def _money(m: re.Match[str], text: str) -> str:
    """$12.50 -> "twelve dollars and fifty cents", $0.99 -> "ninety-nine cents", £3.20 -> "three
    pounds and twenty pence", $2.5M -> "two point five million dollars": the unit word is said
    after the number, where the written sign stands before it."""
    words, unit = _money_words(m["sym"], m["amt"], m["scale"])
    spoken = f"{words} {unit}".strip()
    return f"minus {spoken}" if m["neg"] else spoken


def _subunit(m: re.Match[str], text: str) -> str:
    """85p -> "eighty-five pence", 50¢ -> "fifty cents"."""
    n = int(m["n"])
    word = ("penny" if n == 1 else "pence") if m["u"] == "p" else ("cent" if n == 1 else "cents")
    return f"{num.cardinal(n)} {word}"


def _unit_words(unit: str, written: str) -> str:
    singular, plural = _UNITS[unit]
    return singular if written.lstrip("-−") == "1" else plural


def _is_year(n: str, m: re.Match[str], text: str) -> bool:
    """A bare four-digit number is a year after a year word ("in 1984", "since 1776", "by 2050",
    "the year 2000") or before an era (BC, AD); any other four-digit number is a count ("2048
    lines"), which speakers read as a cardinal."""
    if not n.isdigit():
        return False
    if _next_word(text, m.end()).rstrip(".,;:!?") in _ERAS:
        return True
    return len(n) == 4 and 1000 <= int(n) <= 2099 and _prev_word(text, m.start()).lower().rstrip(",") in _YEAR_CUES


def _quantity(m: re.Match[str], text: str) -> str:
    """A number, with its percent sign or unit: "45%" -> "forty-five percent", "5 km" -> "five
    kilometers" (singular for exactly 1), "1,250" -> cardinal, "3.14" -> "three point one four",
    "-5" -> "minus five"; a year where `_is_year` says so; digit by digit after a phone word
    ("call 911") or with a leading zero."""
    written = m["n"]
    if m["pct"]:
        return f"{_plain_number(written)} percent"
    if m["unit"]:
        return f"{_plain_number(written)} {_unit_words(m['unit'], written)}"
    if _is_year(written, m, text):
        return num.year(int(written))
    if written.isdigit() and len(written) >= 3 and _prev_word(text, m.start()).lower().rstrip(":") in _PHONE_CUES:
        return num.digits(written)
    return _plain_number(written)


def _range(m: re.Match[str], text: str) -> str | None:
    """10-20, 9–5, 3-2, $10-$20, 1939–1945 -> "... to ...": a dash between two numbers is said "to",
    for ranges and for scores alike ("they won three to two"). Two years are read as years; a
    currency or unit after either end is said once, after the second."""
    a, b = m["a"], m["b"]
    sym = (a[0] if a[0] in _CURRENCIES else "") or (b[0] if b[0] in _CURRENCIES else "")
    a, b = a.lstrip("$€£¥₹ "), b.lstrip("$€£¥₹ ")
    if sym:
        left, _ = _money_words(sym, a, None)
        right, unit = _money_words(sym, b, None)
        return f"{left} to {right} {unit or _CURRENCIES[sym][1]}".strip()
    years = all(x.isdigit() and len(x) == 4 and 1000 <= int(x) <= 2099 for x in (a, b))
    if (a.isdigit() and len(a) == 4 and 1000 <= int(a) <= 2099 and b.isdigit() and len(b) == 2
            and int(b) > int(a) % 100):  # 1990-91: a season, its second year shortened
        return f"{num.year(int(a))} to {_year_words(b)}"
    read = (lambda x: num.year(int(x))) if years else _plain_number
    spoken = f"{read(a)} to {read(b)}"
    if m["pct"]:
        spoken += " percent"
    elif m["unit"]:
        spoken += " " + _unit_words(m["unit"], b)
    return spoken


def _day_range(m: re.Match[str], text: str) -> str:
    """Monday–Friday -> "Monday to Friday"."""
    return f"{m['a']} to {m['b']}"


def _ordinal(m: re.Match[str], text: str) -> str:
    """1st, 22nd, 101st -> "first", "twenty-second", "one hundred first"."""
    return num.ordinal(int(m["n"].replace(",", "")))


def _decade(m: re.Match[str], text: str) -> str:
    """1990s -> "nineteen nineties", '80s and 80s -> "eighties": a decade is its year, plural."""
    return num.decade(int(m["d"] or m["d2"] or m["d3"]))


# --- Roman numerals ---------------------------------------------------------------------------

_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
_CHAPTER_NOUNS: Final = frozenset(
    "chapter chapters part parts book volume vol vol. act scene section article appendix episode war phase level round "
    "stage title canto psalm clause schedule lesson type class category grade bowl league tier unit rule mark".split())
_REGNAL_NAMES: Final = frozenset(
    "Henry Elizabeth Louis George Edward Charles James William Richard John Paul Benedict Pius Leo Gregory Napoleon "
    "Peter Catherine Mary Victoria Philip Frederick Alexander Nicholas Ramesses Rameses Otto Ivan Innocent Clement "
    "Boniface Urban Francis Constantine Justinian Harold Stephen Anne Matilda Malcolm Robert David Alfonso Ferdinand "
    "Isabella Juan Carlos Felipe Gustav Christian Olaf Haakon Wilhelm Ludwig Rudolf Sancho Pedro Manuel Amadeus".split())


def _roman_value(s: str) -> int:
    total = 0
    for a, b in zip(s, s[1:] + " "):
        v = _ROMAN_VALUES[a]
        total += -v if b != " " and _ROMAN_VALUES[b] > v else v
    return total


def _roman(m: re.Match[str], text: str) -> str | None:
    """Roman numerals by context, since "I", "MIX" and "DC" are also words and letters:
    after a regnal name (Henry VIII, John Paul II) "the eighth"; after a chapter-like noun
    (Chapter IV, World War II, Super Bowl LVII) the cardinal; a numeral of I, V, X, L (two letters
    or more, not "XL") after another capitalized word (Rocky II) the cardinal; anything else is
    left to the acronym and word rules."""
    s = m[0].rstrip(".")
    if not s:
        return None
    prev = _prev_word(text, m.start()).rstrip(",")
    value = _roman_value(s)
    if prev in _REGNAL_NAMES:
        return _with_period(f"the {num.ordinal(value)}", m, text)
    if prev.lower() in _CHAPTER_NOUNS:
        return num.cardinal(value)
    if len(s) >= 2 and set(s) <= set("IVXL") and s != "XL" and _capitalized(prev) and prev.isalpha():
        return num.cardinal(value)
    return None


# --- abbreviations, acronyms ------------------------------------------------------------------

# written (without its period) -> (reading, kind). kinds: "title" (before a capitalized name),
# "street" (after a name or a house number), "title|street" (by context), "always", "number"
# (before a digit), "period" (only with its period: "Jan.", "Fri.")
_ABBREVIATIONS: Final = {
    "Mr": ("Mister", "title"), "Mrs": ("Missus", "title"), "Ms": ("Miz", "title"), "Prof": ("Professor", "title"),
    "Gen": ("General", "title."), "Capt": ("Captain", "title"), "Sgt": ("Sergeant", "title"),
    "Lt": ("Lieutenant", "title"), "Col": ("Colonel", "title."), "Gov": ("Governor", "title."),
    "Sen": ("Senator", "title."), "Rep": ("Representative", "title."), "Rev": ("Reverend", "title."),
    "Hon": ("Honorable", "title."), "Pres": ("President", "title."), "Fr": ("Father", "title."),
    "Mt": ("Mount", "title"), "Ft": ("Fort", "title"),
    "Dr": ("Doctor|Drive", "title|street"), "St": ("Saint|Street", "title|street"),
    "Ave": ("Avenue", "street"), "Rd": ("Road", "street"), "Blvd": ("Boulevard", "street"), "Ln": ("Lane", "street"),
    "Hwy": ("Highway", "street"), "Pkwy": ("Parkway", "street"), "Sq": ("Square", "street"),
    "Jr": ("Junior", "always"), "Sr": ("Senior", "always"), "Inc": ("Incorporated", "always"),
    "Ltd": ("Limited", "always"), "Corp": ("Corporation", "always"), "Bros": ("Brothers", "always"),
    "etc": ("et cetera", "period"), "vs": ("versus", "always"), "approx": ("approximately", "period"),
    "Apt": ("Apartment", "period"), "Dept": ("Department", "period"), "Univ": ("University", "period"),
    "Tel": ("Telephone", "period"), "No": ("number", "number"), "Nos": ("numbers", "number"),
    "e.g": ("for example", "period"), "i.e": ("that is", "period"), "a.k.a": ("also known as", "period"),
    "Mon": ("Monday", "period"), "Tue": ("Tuesday", "period"), "Tues": ("Tuesday", "period"),
    "Wed": ("Wednesday", "period"), "Thu": ("Thursday", "period"), "Thurs": ("Thursday", "period"),
    "Fri": ("Friday", "period"),
    **{k.capitalize(): (v, "period") for k, v in _MONTHS.items() if len(k) <= 4 and k != "may"},
}
_ABBREVIATION = "(?:" + "|".join(re.escape(a) for a in sorted(_ABBREVIATIONS, key=len, reverse=True)) + r")\.?"


def _abbreviation(m: re.Match[str], text: str) -> str | None:
    """Titles before a name (Dr. Smith "Doctor Smith", Mr Hyde), street words after a name or a
    house number (Main St. "Main Street", Elm Dr. "Elm Drive"); "St."/"Dr." decided by that
    context (right after a capitalized word that does not start the sentence, or an ordinal as in
"5th Ave.": the street, whatever follows; else before a capitalized name: the title);
    "No." only before a number; the rest ("etc.", "e.g.", "Jan.") with their period. A period the
    abbreviation took that also ends the sentence is kept."""
    word, dot = m[0].rstrip("."), m[0].endswith(".")
    reading, kind = _ABBREVIATIONS[word]
    after = _next_word(text, m.end())
    if kind == "number":
        return reading if dot and after[:1].isdigit() else None
    if kind == "period":
        return _with_period(reading, m, text) if dot else None
    if kind == "always":
        return _with_period(reading, m, text)
    prev = _prev_word(text, m.start())
    prev_start = text.rfind(prev, 0, m.start()) if prev else 0
    named = _capitalized(after) and after[:1].isalpha()
    after_name = bool(re.fullmatch(r"\d+(?:st|nd|rd|th)", prev)) or (
        _capitalized(prev) and prev.isalpha() and not _sentence_initial(text, prev_start))
    if kind.startswith("title") and kind != "title|street":
        if (named and (dot or kind == "title")) or (dot and kind == "title"):  # "Mr. & Mrs. Smith"
            return reading
        return None
    if kind == "street":
        return _with_period(reading, m, text) if (dot or after_name) else None
    title, street = reading.split("|")
    if after_name:  # "Baker St.", "10 Elm Dr.": a street word follows the name it belongs to
        return _with_period(street, m, text)
    return title if named else None


_WORD_ACRONYMS: Final = {  # said as words, not letters
    "NASA": "Nasa", "NATO": "Nato", "UNESCO": "Unesco", "UNICEF": "Unicef", "AIDS": "Aids", "FIFA": "Fifa",
    "NAFTA": "Nafta", "OPEC": "Opec", "LASER": "laser", "RADAR": "radar", "SCUBA": "scuba", "GIF": "gif",
    "JPEG": "jay-peg", "COVID": "Covid", "OSHA": "Osha", "FEMA": "Fema", "NASDAQ": "Nasdaq", "SWAT": "swat",
    "DARPA": "Darpa", "INTERPOL": "Interpol", "IKEA": "Ikea", "ASCII": "askey", "PIN": "pin", "SIM": "sim",
    "OK": "okay", "SARS": "Sars", "WASP": "wasp", "ZIP": "zip", "CAPTCHA": "captcha", "NIMBY": "nimby",
    "YOLO": "yolo", "GIFs": "gifs", "PINs": "pins", "LOL": "lol", "TESOL": "tesol", "ESPN": "E S P N",
}
_EMPHASIS: Final = frozenset(  # common words written in capitals for emphasis: said as words
    "A AN AND ARE BE BEST BIG BUT CAN DID DO DON'T EVER FOR GO HAS HAVE HE HELP HER HIM HIS HOW HUGE I IF IN IS IT "
    "JUST LIKE LOVE ME MORE MOST MUST MY NEVER NEXT NO NOT NOW OF ON ONLY OR OUR OUT SHE SO STOP SURE THAT THE THEM "
    "THEN THERE THEY THIS TO TOO UP VERY WAS WE WELL WERE WHAT WHEN WHO WHY WILL WITH WOW YES YOU YOUR ALL ANY BAD "
    "COOL GOOD HOT NEW OLD ONE TWO WAY WIN".split())
_SPELLED: Final = frozenset("NAACP LGBTQ USMNT NCAA IEEE USSR UCLA HTTPS HTML XHTML".split())


def _letters(s: str) -> str:
    return " ".join(s)


def _acronym(m: re.Match[str], text: str) -> str | None:
    """Capitals said letter by letter (FBI "F B I", CEOs "C E Os", U.S. "U S", AT&T "A T and T"),
    except: acronyms said as words, listed (NASA, NATO, FIFA, JPEG "jay-peg"), because no spelling
    rule tells "NASA" from "NCAA"; common words written in capitals for emphasis (NOT, NEVER); and
    unlisted runs of five letters or more with a vowel, which are emphasis far more often than
    unlisted acronyms (REALLY, ABSOLUTELY)."""
    s = m[0]
    if s.endswith("'s"):  # NASA's, the FBI's: the possessive of the acronym's reading
        return _acronym_reading(s[:-2]) + "'s"
    if "." in s:
        return _with_period(_letters(s.replace(".", "")), m, text)
    return _acronym_reading(s)


def _acronym_reading(s: str) -> str:
    if "&" in s:
        return " and ".join(_letters(part) for part in s.split("&"))
    if s in _WORD_ACRONYMS:
        return _WORD_ACRONYMS[s]
    plural = s.endswith("s") and s[:-1].isupper()
    stem = s[:-1] if plural else s
    if stem in _WORD_ACRONYMS:
        return _WORD_ACRONYMS[stem] + "s"
    if s in _EMPHASIS:
        return s.lower()
    if len(stem) >= 5 and set(stem.lower()) & _VOWELS and stem not in _SPELLED:
        return s.lower()
    return _letters(stem) + ("s" if plural else "")


_MIXED_CASE: Final = {"PhD": "P h D", "PhDs": "P h Ds", "iOS": "i O S", "macOS": "mac O S", "GHz": "gigahertz",
                      "TeX": "tech", "LaTeX": "lay-tech", "McD": "M c D"}


def _mixed_case(m: re.Match[str], text: str) -> str:
    """Mixed-case names with a fixed reading (PhD "P h D", iOS "i O S"): listed, as no case rule
    tells them apart from words."""
    return _MIXED_CASE[m[0]]


def _alphanumeric(m: re.Match[str], text: str) -> str:
    """Letters and digits in one token (MP3, 4B, v1, B2B): letters by the acronym rule, short
    letter runs spelled, digits as a number ("three D", "M P three")."""
    out = []
    for chunk in re.findall(r"[A-Za-z]+|\d+", m[0]):
        if chunk.isdigit():
            out.append(num.number(chunk) if len(chunk) <= 4 and not chunk.startswith("0") else num.digits(chunk))
        elif chunk.isupper() or len(chunk) == 1:
            out.append(_letters(chunk) if chunk not in _WORD_ACRONYMS else _WORD_ACRONYMS[chunk])
        else:
            out.append(chunk)
    return " ".join(out)


# --- symbols, words, punctuation ---------------------------------------------------------------


def _hashtag(m: re.Match[str], text: str) -> str:
    """#1 -> "number one" (a rank or a room); #python -> "hashtag python"."""
    if m["num"]:
        return f"number {_plain_number(m['num'])}"
    return f"hashtag {m['tag']}"


_SYMBOLS: Final = {"&": "and", "@": "at", "+": "plus", "=": "equals", "×": "times", "÷": "divided by",
                   "%": "percent", "~": "about", "§": "section", "©": "copyright", "°": "degrees",
                   "±": "plus or minus", "≈": "about", "≠": "not equal to", "≤": "at most", "≥": "at least",
                   "<": "less than", ">": "greater than", "$": "dollars", "€": "euros", "£": "pounds"}
_KEPT: Final = frozenset(".,!?;:'\"()[]…—–-")
_SPACED_ONLY: Final = frozenset("*<>#")


def _punct(m: re.Match[str], text: str) -> str:
    """Sentence punctuation is kept (the model paces by it). Symbols are said by name ("&" "and",
    "@" "at", "~" "about", "=" "equals"); "*", "<", ">" and "#" only when they stand alone
    (markdown's "**bold**" marks are dropped, and "#" alone always is: it is far more often a
markdown heading than a phone key); anything else (^ | \\ _ ` { } ™ ®)
    is dropped: a model reads unknown symbols unpredictably."""
    c = m[0]
    if c in _KEPT:
        return c
    if c == "/":
        return ""  # and/or -> "and or"; 1/2 and dates are read by their own rules
    alone = (m.start() == 0 or text[m.start() - 1].isspace()) and (m.end() == len(text) or text[m.end()].isspace())
    if c == "*":
        return "star" if alone else ""
    if c in _SPACED_ONLY and not alone:
        return ""
    return _SYMBOLS.get(c, "")


def _word(m: re.Match[str], text: str) -> str:
    """A plain word is said as written; digits no rule took (glued to other symbols) are read as
    numbers, never left as digits for the model to guess at."""
    word = m[0]
    if any(c.isdigit() for c in word):
        return _alphanumeric(m, text) if word.isascii() else word
    return word


# --- the rules, in priority order ---------------------------------------------------------------

_NUMBER = rf"{_B}(?P<n>-?(?:{_NUM}))"
RULES: Final = (
    Rule("tag", TAG.pattern, _tag),
    # lengths bounded (RFC 5321's 64-character local part, 63-character labels, 8 labels, 512-character
    # URLs) so a long run without spaces ("a.a.a.a...") costs linear time, not quadratic
    Rule("email", r"(?<![\w.+-])[\w.+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}(?![\w])", _email),
    Rule("url", r"(?<![\w@])(?:https?://[^\s<>\"]{1,512}?|www\.[^\s<>\"]{1,512}?|(?:[A-Za-z0-9-]{1,63}\.){1,8}(?:"
         + _TLDS + r")(?::\d{1,5})?(?:/[^\s<>\"]{0,512}?)?)(?=[.,!?;:)\]]{0,8}(?:\s|$))", _url),
    Rule("phone", r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(\d{1,4}\)|[ .-]\d{1,4}){2,6}(?![\d])", _phone),
    Rule("phone", r"(?<![\w(])(?:1[ .-])?(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\d])", _phone),
    Rule("phone", r"(?<![\w])0\d{2,4}[ -]\d{3,4}[ -]\d{3,4}(?![\d])", _phone),
    Rule("phone", r"(?<![\w.-])\d{3}-(?P<b>\d{4})(?![\d-])", _short_phone),
    Rule("date", r"(?<![\w-])(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})(?![\w-])", _iso_date),
    Rule("date", r"(?<![\w/.])(?P<a>\d{1,2})(?P<sep>/)(?P<b>\d{1,2})/(?P<y>\d{4}|\d{2})(?![\w/])", _numeric_date),
    Rule("date", r"(?<![\w/.])(?P<a>\d{1,2})(?P<sep>\.)(?P<b>\d{1,2})\.(?P<y>\d{4})(?![\w.])", _numeric_date),
    Rule("date", rf"(?<![\w])(?P<mon>{_MONTH})\s+(?P<d>\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(?P<y>\d{{4}}))?(?![\w:])",
         _month_day),
    Rule("date", rf"(?<![\w.])(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\s+(?P<mon>{_MONTH})(?:,?\s+(?P<y>\d{{4}}))?(?![\w])",
         _day_month),
    Rule("date", rf"(?<![\w])(?P<mon>{_MONTH})\s+(?P<y>1\d{{3}}|20\d{{2}})(?![\w])", _month_year),
    Rule("time", r"(?<![\w:.])(?P<h>\d{1,2}):(?P<min>[0-5]\d)(?::(?P<s>[0-5]\d))?"
         r"(?:\s?(?P<ap>[AaPp])\.?\s?[Mm]\.?(?![\w]))?(?![\d:])", _time),
    Rule("time", r"(?<![\w.])(?P<h>\d{1,2})\s?(?P<ap>[AaPp])\.?\s?[Mm]\.?(?![\w])", _hour),
    Rule("ratio", r"(?<![\w:.])(?P<a>\d+):(?P<b>\d+)(?![\w:])", _ratio),
    Rule("version", r"(?<![\w.])\d+(?:\.\d+){2,}(?![\w]|\.\d)", _version),
    Rule("unit", r"(?<![\w.])(?P<f>\d{1,2})'(?:\s?(?P<i>\d{1,2})(?:\"|''))?(?![\w'])", _feet_inches),
    Rule("number", r"(?<![\w.])(?P<n>\d+(?:\.\d+)?)[xX](?![\w])", _times_faster),
    Rule("fraction", r"(?<![\w/.])(?:(?P<w>\d+)\s)?(?P<n>\d+)/(?P<d>\d+)(?![\w/]|\.\d)", _fraction),
    Rule("fraction", r"(?<![\w.])(?:(?P<w>\d+)\s?)?(?P<v>[½⅓⅔¼¾⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞])", _vulgar),
    Rule("range", rf"(?<![\w.,-])(?P<a>[$€£¥₹]?(?:{_NUM}))\s?[-–—]\s?(?P<b>[$€£¥₹]?(?:{_NUM}))"
         rf"(?:\s?(?P<pct>%)|\s?(?P<unit>{_UNIT})(?![\w]))?(?![\w-]|\.\d)", _range),
    Rule("range", r"(?<![\w])(?P<a>" + "|".join(_DAYS) + r")\s?[–—-]\s?(?P<b>" + "|".join(_DAYS) + r")(?![\w])",
         _day_range),
    Rule("money", rf"{_B}(?P<neg>-)?(?P<sym>[$€£¥₹])\s?(?P<amt>{_NUM})"
         r"(?:\s?(?P<scale>thousand|million|billion|trillion|bn|mn|[KkMmBT])(?![\w]))?", _money),
    Rule("money", rf"{_B}(?P<n>\d+)(?P<u>p|¢)(?![\w])", _subunit),
    Rule("decade", r"(?<![\w])(?:['’](?P<d>\d0)|(?P<d2>\d{3}0)|(?P<d3>[1-9]0))s(?![\w])",
         _decade),
    Rule("ordinal", rf"{_B}(?P<n>{_INT})(?:st|nd|rd|th|ST|ND|RD|TH)(?![\w])", _ordinal),
    Rule("number", rf"{_NUMBER}(?:\s?(?P<pct>%)|\s?(?P<unit>{_UNIT})(?![\w/]))?(?![\d])", _quantity),
    Rule("hashtag", r"(?<![\w#])#(?:(?P<num>\d[\d,]*)|(?P<tag>[A-Za-z]\w*))", _hashtag),
    Rule("roman", r"(?<![\w'])(?=[IVXLCDM])M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})\.?(?![\w'&])",
         _roman),
    Rule("abbreviation", rf"(?<![\w.]){_ABBREVIATION}(?![\w])", _abbreviation),
    Rule("acronym", r"(?<![\w.&])(?:(?:[A-Z]\.){2,}|[A-Z][A-Z&]*[A-Z](?:s|'s)?)(?![\w&])", _acronym),
    Rule("acronym", r"(?<![\w])(?:" + "|".join(sorted(_MIXED_CASE, key=len, reverse=True)) + r")(?![\w])",
         _mixed_case),
    Rule("alphanumeric", r"(?<![\w])(?=[A-Za-z]*\d)(?=\d*[A-Za-z])[A-Za-z0-9]+(?![\w])", _alphanumeric),
)
_WORD_RULE: Final = Rule("word", r"[^\W\d_]+(?:['’][^\W\d_]+)*|\w+", _word)
_PUNCT_RULE: Final = Rule("punct", r"\S", _punct)
LANGUAGE: Final = Rules(RULES, _WORD_RULE, _PUNCT_RULE)


def pieces(text: str) -> list[Piece]:
    """The English reading of `text`, piece by piece (see `rules.Rules.pieces`)."""
    return LANGUAGE.pieces(text)
