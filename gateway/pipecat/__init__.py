"""voicering in Pipecat: a TTS service for the gateway's `/v1/tts/stream` (the `pipecat` extra).

    from gateway.pipecat import VoiceringTTSService
    tts = VoiceringTTSService(api_key=KEY, url="https://voices.example.com",
                              settings=VoiceringTTSService.Settings(voice="my-clone"))

    settings.py  VoiceringTTSSettings: voice, utterance options, switches; the `start` they become
    errors.py    VoiceringError (the gateway's code and message) and its Pipecat ErrorCategory
    service.py   VoiceringTTSService: Pipecat's WebsocketTTSService over one gateway socket

Imports pipecat, websockets and the worker protocol's messages; never FastAPI, torch or vLLM.
See docs/pipecat.md.
"""

from gateway.pipecat.errors import VoiceringError
from gateway.pipecat.service import VoiceringTTSService
from gateway.pipecat.settings import VoiceringTTSSettings

__all__ = ["VoiceringError", "VoiceringTTSService", "VoiceringTTSSettings"]
