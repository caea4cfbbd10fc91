"""A context's prompt window: what the voice said earlier in the context, in front of the next prompt.

Orpheus speaks each prompt from nothing, so every segment of an agent's reply would start its
intonation afresh. The window puts the context's earlier turns before the next prompt in Orpheus's
multi-turn layout, each turn the request's own prompt followed by exactly the audio ids the model
generated for it and the end markers::

    [SOH] tok("{voice}: {text}") [EOT, EOH, SOA, SOS]  audio ids ...  [EOS, EOA]

The next request therefore begins with the very tokens the engine computed for the previous one,
and vLLM's prefix cache (full KV blocks hashed by token ids and LoRA) serves them without prefill.

Bounded by tokens and by seconds of audio. The window only grows: dropping its oldest turn would
change the prefix and miss the cache for the whole window, so when a turn would pass a bound the
window restarts from that newest turn alone (one turn's prefill per restart). A window lives and
dies with its context, on the worker that speaks it (a relay forwards; the owner holds it); a
cancelled context's window is dropped with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_worker.orpheus import END_OF_SPEECH, FRAME_SECONDS, FRAME_TOKENS, TRAINING_SUFFIX

__all__ = ["PromptWindow", "WindowLimits"]


@dataclass(frozen=True, slots=True)
class WindowLimits:
    """At most this much of the context's past goes before a prompt (docs/worker.md says why these)."""

    max_tokens: int = 1024
    max_audio_s: float = 10.0


class PromptWindow:
    """`before(room)` for each request; `add(prompt, generated)` once it has been spoken."""

    def __init__(self, limits: WindowLimits) -> None:
        self.limits = limits
        self._turns: list[list[int]] = []
        self._audio_s: list[float] = []

    @property
    def ids(self) -> list[int]:
        return [i for turn in self._turns for i in turn]

    def before(self, room: int) -> list[int]:
        """The window's ids to put before the next prompt: all of it when it fits in ``room`` tokens
        (what the model's context leaves beside the prompt and the audio budget), else the newest
        turns that fit (a prefix the cache has not seen: correct, only slower)."""
        turns, total = self._turns, sum(len(t) for t in self._turns)
        while turns and total > room:
            total -= len(turns[0])
            turns = turns[1:]
        return [i for turn in turns for i in turn]

    def add(self, prompt: list[int], generated: list[int]) -> None:
        """One spoken request: its own prompt (without the window) and every id the engine generated
        for it, the end-of-speech id included or not."""
        audio = generated[:-1] if generated and generated[-1] == END_OF_SPEECH else generated
        turn = [*prompt, *audio, *TRAINING_SUFFIX]  # laid out as the model was trained
        audio_s = len(audio) / FRAME_TOKENS * FRAME_SECONDS
        if len(turn) > self.limits.max_tokens or audio_s > self.limits.max_audio_s:
            self._turns, self._audio_s = [], []  # a turn past the bounds alone: the next prompt starts afresh
            return
        if (sum(len(t) for t in self._turns) + len(turn) > self.limits.max_tokens
                or sum(self._audio_s) + audio_s > self.limits.max_audio_s):
            self._turns, self._audio_s = [], []
        self._turns.append(turn)
        self._audio_s.append(audio_s)

    def clear(self) -> None:
        self._turns, self._audio_s = [], []
