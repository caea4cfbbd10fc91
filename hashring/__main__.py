"""`python -m hashring ...`: the ring CLI without the rest of voicering (same as `voicering ring`)."""

from hashring.cli import app

app(prog_name="python -m hashring")
