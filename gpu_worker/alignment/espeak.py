"""espeak-ng's C library through ctypes: speech for a text together with where each word starts.

The aligner's reference (what a text sounds like, word by word) and the alignment bench's truth
both come from here. The command line cannot give word positions; the library reports a WORD
event with the sample each word starts at. The library is one synthesizer per process: every
`Espeak` holds the process's one lock while it speaks and points the library's callback at
itself first, so two of them (the worker's aligner and a test's) never take each other's audio.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass

import numpy as np

__all__ = ["Espeak", "EspeakMissing", "Spoken", "WordEvent"]

_SYNCHRONOUS = 2  # AUDIO_OUTPUT_SYNCHRONOUS: the callback gets every buffer before espeak_Synth returns
_EVENT_END_OF_LIST, _EVENT_WORD = 0, 1
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_SSML = 0x10
_RATE = 1  # espeakRATE, words per minute
_LIBRARY = "libespeak-ng.so.1"
_SYNTHESIZER = threading.Lock()  # the library's one synthesizer, whichever Espeak drives it


class EspeakMissing(RuntimeError):
    """libespeak-ng is not installed (Debian: apt-get install libespeak-ng1, which espeak-ng pulls in)."""


class _Id(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):  # espeak_EVENT (speak_lib.h)
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", _Id)]


_Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


@dataclass(frozen=True, slots=True)
class WordEvent:
    """One word as espeak-ng read it: its characters in the text (0-based, in characters) and the
    sample its sound starts at."""

    start: int
    length: int
    sample: int


@dataclass(frozen=True, slots=True)
class Spoken:
    pcm: np.ndarray  # float32 mono in [-1, 1]
    sample_rate: int
    words: tuple[WordEvent, ...]


class Espeak:
    """`Espeak().speak(text, voice="en-us", wpm=175)`; thread-safe (one synthesis at a time in the process)."""

    def __init__(self, library: str = _LIBRARY) -> None:
        try:
            self._lib = ctypes.CDLL(ctypes.util.find_library("espeak-ng") or library)
        except OSError as err:
            raise EspeakMissing(f"libespeak-ng is not installed ({err}): apt-get install espeak-ng") from None
        self._pcm: list[np.ndarray] = []
        self._words: list[WordEvent] = []
        self._callback = _Callback(self._on_audio)  # kept: the library holds only a pointer to it
        with _SYNTHESIZER:
            self.sample_rate = self._lib.espeak_Initialize(_SYNCHRONOUS, 0, None, 0)
        if self.sample_rate <= 0:
            raise EspeakMissing("libespeak-ng did not initialize (no espeak-ng-data?): apt-get install espeak-ng")

    def speak(self, text: str, *, voice: str = "en-us", wpm: int = 175, ssml: bool = False) -> Spoken:
        """`text` spoken; word positions count characters of `text` (SSML markup included)."""
        data = text.encode("utf-8")
        with _SYNTHESIZER:
            self._lib.espeak_SetSynthCallback(self._callback)
            self._pcm, self._words = [], []
            if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"espeak-ng has no voice {voice!r}")
            self._lib.espeak_SetParameter(_RATE, int(wpm), 0)
            flags = _CHARS_UTF8 | (_SSML if ssml else 0)
            self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, flags, None, None)
            self._lib.espeak_Synchronize()
            pcm = np.concatenate(self._pcm) if self._pcm else np.zeros(0, np.int16)
            words = tuple(self._words)
        return Spoken(pcm.astype(np.float32) / 32768.0, self.sample_rate, words)

    def _on_audio(self, wav, count, events) -> int:  # noqa: ANN001 - ctypes pointers
        if count > 0 and wav:
            self._pcm.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        i = 0
        while events[i].type != _EVENT_END_OF_LIST:
            event = events[i]
            if event.type == _EVENT_WORD:  # text_position counts from 1
                self._words.append(WordEvent(event.text_position - 1, event.length, event.sample))
            i += 1
        return 0
