"""What a voicering turn is spoken with: the service's runtime-updatable settings, and the `start`
message they become on `/v1/tts/stream`.

`VoiceringTTSSettings` is a Pipecat `TTSSettings`: the same class is the service's store (every
field set) and a sparse delta in a `TTSUpdateSettingsFrame(delta=...)` (unset fields `NOT_GIVEN`).
A context copies the settings when it starts, so an update applies from the next turn and never
changes a voice mid-sentence.

    settings -> start_message(context_id, text, settings) -> the `start`'s JSON (docs/api.md)

Every option left at None is left off the wire (the gateway's default applies), so a gateway that
predates an option is never sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from pipecat.services.settings import TTSSettings
from pipecat.utils.types import NOT_GIVEN, NotGiven, is_given

from gpu_worker.errors import BadMessage
from gpu_worker.protocol import ContextOptions, Start, encode, parse_client

__all__ = ["VoiceringTTSSettings", "default_settings", "start_message", "check_settings"]

# the worker protocol's per-context knobs a caller may set (docs/protocol.md); the rest of
# ContextOptions is the gateway's (pronunciations) or a switch of its own below (alignment, normalize)
UTTERANCE_OPTIONS = ("temperature", "top_p", "repetition_penalty", "max_tokens", "seed", "trim_silence")


def _unset():
    return field(default_factory=lambda: NOT_GIVEN)


@dataclass
class VoiceringTTSSettings(TTSSettings):
    """Settings of `VoiceringTTSService` (store and delta, as every Pipecat `TTSSettings`).

    Parameters:
        voice: the tenant's voice name (a clone of yours or a base voice such as ``tara``).
        temperature, top_p, repetition_penalty, max_tokens, seed: sampling of each context
            (docs/protocol.md; None: the worker's default). ``seed`` makes a turn reproducible.
        trim_silence: drop each segment's head silence (None: on).
        pronunciations: names of your pronunciation dictionaries (at most 3), applied in order;
            None: the voice's defaults, (): none at all.
        alignment: ask for word timings (``options.alignment: "word"``), which become Pipecat's
            word-timestamp frames (TTSTextFrame with a PTS). False: the sentence's text is pushed
            once its audio ends.
        continuity: prompt each sentence with what the turn said before (the voice carries its
            prosody across sentences); None: the gateway's default (on), and the option is not sent.
        normalize: read numbers, dates, currency... as spoken (None: on); False speaks the text as
            written, for text you normalized yourself.
    """

    temperature: float | None | NotGiven = _unset()
    top_p: float | None | NotGiven = _unset()
    repetition_penalty: float | None | NotGiven = _unset()
    max_tokens: int | None | NotGiven = _unset()
    seed: int | None | NotGiven = _unset()
    trim_silence: bool | None | NotGiven = _unset()
    pronunciations: tuple[str, ...] | None | NotGiven = _unset()
    alignment: bool | NotGiven = _unset()
    continuity: bool | None | NotGiven = _unset()
    normalize: bool | None | NotGiven = _unset()


def default_settings() -> VoiceringTTSSettings:
    """The store before the caller's settings are applied: every option the server's default
    (None), word timings on, no model or language concept (None, as Pipecat asks of a service
    without them)."""
    values = {f.name: None for f in fields(VoiceringTTSSettings) if f.name != "extra"}
    return VoiceringTTSSettings(**{**values, "alignment": True})


def start_message(context_id: str, text: str, settings: VoiceringTTSSettings, *, auto_chunking: bool = False) -> str:
    """The `start` of one context: its voice, first text and options, as the gateway reads them.
    ``auto_chunking``: the service streams tokens, so the worker cuts segments (`chunking: "auto"`)."""
    options = ContextOptions(**{name: getattr(settings, name) for name in UTTERANCE_OPTIONS},
                             normalize=settings.normalize, alignment="word" if settings.alignment else None,
                             continuity=settings.continuity, chunking="auto" if auto_chunking else None)
    names = tuple(settings.pronunciations) if settings.pronunciations is not None else None
    return encode(Start(context_id, settings.voice or "", text, options, pronunciations=names))


def check_settings(settings: VoiceringTTSSettings) -> str | None:
    """Why the gateway would refuse a start with these settings (read by the protocol's own
    parser), or None."""
    if not settings.voice:
        return "a voice is required: VoiceringTTSService.Settings(voice='your-voice')"
    missing = [f.name for f in fields(settings) if f.name != "extra" and not is_given(getattr(settings, f.name))]
    if missing:
        return f"settings not set: {', '.join(missing)}"
    try:
        parse_client(start_message("check", "", settings))
    except BadMessage as exc:
        return exc.message
    return None
