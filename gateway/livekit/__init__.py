"""voicering inside LiveKit: a livekit-agents TTS plugin (`tts.py`) over the worker fleet
(`transport.py`), and the agent server that joins rooms and speaks (`agent.py`, `voicering agent`).

    from gateway.livekit import TTS
    tts = TTS(voice="tara", ring="redis://...", cluster_token="...")

Imports livekit-agents (the `gateway` extra); never torch or vLLM. The names below load on first
use, so `voicering --help` (which registers `cli.py`) loads neither livekit nor Redis. See
docs/livekit.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.livekit.transport import Opened, PoolTransport, Transport, Context
    from gateway.livekit.tts import TTS, ChunkedStream, SynthesizeStream, TTSOptions

__all__ = ["TTS", "ChunkedStream", "Opened", "PoolTransport", "SynthesizeStream", "TTSOptions", "Transport", "Context"]

_HOME = {"TTS": "tts", "ChunkedStream": "tts", "SynthesizeStream": "tts", "TTSOptions": "tts",
         "Opened": "transport", "PoolTransport": "transport", "Transport": "transport", "Context": "transport"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'gateway.livekit' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gateway.livekit.{_HOME[name]}"), name)
