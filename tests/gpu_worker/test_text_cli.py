"""`voicering normalize "TEXT"` and `voicering normalize -` (one line out for each line in)."""

from __future__ import annotations

from typer.testing import CliRunner

from voicering.cli import app

runner = CliRunner()


def test_normalize_one_text():
    result = runner.invoke(app, ["normalize", "It costs $5 <laugh>."])
    assert result.exit_code == 0 and result.stdout == "It costs five dollars <laugh>.\n"


def test_normalize_lines_from_stdin():
    result = runner.invoke(app, ["normalize", "-"], input="Call 911\n\nDr. Who at 3:30 pm\n")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ["Call nine one one", "", "Doctor Who at three thirty p m"]


def test_unknown_language_is_a_usage_error():
    result = runner.invoke(app, ["normalize", "hi", "--language", "xx"])
    assert result.exit_code == 2 and "supported: en" in result.output
