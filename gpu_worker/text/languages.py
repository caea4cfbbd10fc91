"""The language registry: a language code -> the module holding its rules.

Callers say `normalize(text, language="de")`; adding German is a `german.py` exposing
`LANGUAGE` (a `rules.Rules`) and one line here, without touching any caller. Modules are imported
on first use, so a process that only ever speaks English never loads another language's tables.
"""

from __future__ import annotations

import importlib
from typing import Final, Protocol

from gpu_worker.text.rules import Piece

__all__ = ["LANGUAGES", "Language", "UnknownLanguage", "language"]


class Language(Protocol):
    def pieces(self, text: str) -> list[Piece]: ...


LANGUAGES: Final = {"en": "gpu_worker.text.english"}


class UnknownLanguage(ValueError):
    """A language code with no rules; the message lists the codes there are."""


def language(code: str) -> Language:
    """The rules for `code` ("en", "en-US" and "EN" all name English)."""
    base = code.strip().lower().replace("_", "-").split("-", 1)[0]
    module = LANGUAGES.get(base)
    if module is None:
        raise UnknownLanguage(f"no text rules for language {code!r}; supported: {', '.join(sorted(LANGUAGES))}")
    return importlib.import_module(module).LANGUAGE
