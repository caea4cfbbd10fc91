"""voicering's LiveKit plugin, imported the way every livekit-agents provider is:

    from livekit.plugins import voicering
    tts = voicering.TTS(voice="tara", ring="redis://...", cluster_token="...")

The wheel installs this directory as the namespace package `livekit.plugins.voicering`
(`package-dir` in pyproject.toml); the implementation stays in `gateway.livekit`. Importing it
registers a livekit `Plugin` (as livekit's own plugins do), so it must first be imported on the
main thread, which the framework requires of every plugin.
"""

from __future__ import annotations

from importlib.metadata import version

from livekit.agents import Plugin

from gateway.livekit.log import logger
from gateway.livekit.transport import GatewayTransport, PoolTransport, Transport
from gateway.livekit.transcript import TaggedSpeechAgent, without_tags
from gateway.livekit.tts import TTS, ChunkedStream, SynthesizeStream, TTSOptions
from gpu_worker.protocol import ContextOptions

__all__ = ["TTS", "ChunkedStream", "GatewayTransport", "PoolTransport", "SynthesizeStream", "TTSOptions", "Transport",
           "ContextOptions", "TaggedSpeechAgent", "without_tags", "__version__"]

__version__ = version("voicering")  # the installed distribution's (read, not imported: voicering's CLI sits above gateway)


class VoiceringPlugin(Plugin):
    def __init__(self) -> None:
        super().__init__("livekit.plugins.voicering", __version__, "livekit.plugins.voicering", logger)


Plugin.register_plugin(VoiceringPlugin())
