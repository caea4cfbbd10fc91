"""`voicering normalize "TEXT" [--language en]`: print what the voice will read for TEXT.

`voicering normalize -` reads standard input and prints one line out for each line in (an empty
line for an empty one), for batch checks. A developer who hears a word read wrong sees here
whether the normalizer or the voice did it. Exit status: 0 read, 1 a line was refused (too long),
2 a usage error (a language without rules, or a dictionary that cannot be read).

`print_readings` is the command's body, with a pronunciation dictionary already loaded; the command
itself (its options, and `--dictionary NAME --tenant T`, which reads a tenant's dictionary from
Redis through the tenant layer) is `voicering/normalize.py`: this package imports no Redis.
"""

from __future__ import annotations

import sys

import typer

from gpu_worker.errors import TextTooLong
from gpu_worker.text.dictionary import Dictionary
from gpu_worker.text.languages import UnknownLanguage
from gpu_worker.text.normalize import normalize

__all__ = ["print_readings"]


def print_readings(text: str, language: str = "en", dictionary: Dictionary | None = None) -> None:
    """Print the reading of `text` (or of each line of standard input for "-"), after `dictionary`."""
    lines = (line.rstrip("\n") for line in sys.stdin) if text == "-" else iter([text])
    failed = False
    for line in lines:
        try:
            typer.echo(normalize(line, language, dictionary=dictionary).text)
        except UnknownLanguage as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        except TextTooLong as exc:
            typer.echo("", nl=True)  # one line out for each line in, even a refused one
            typer.echo(f"error: {exc}", err=True)
            failed = True
    if failed:
        raise typer.Exit(1)
