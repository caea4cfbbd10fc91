"""Word timings for generated speech (see README.md): each word of the caller's text with the
time it is spoken at, on the context's audio clock, sent while the audio streams."""

from gpu_worker.alignment.espeak import Espeak, EspeakMissing
from gpu_worker.alignment.service import Aligner, SegmentWords
from gpu_worker.alignment.reference import Reference, blank_tags, reference_for, spoken_spans, voiced_ends, word_starts
from gpu_worker.alignment.speech_check import SpeechCheck, SpeechChecks
from gpu_worker.alignment.timer import WordTime, WordTimer
from gpu_worker.alignment.words import CallerWords, TimedWord, WordGroup

__all__ = ["Aligner", "CallerWords", "Espeak", "EspeakMissing", "Reference", "SegmentWords", "SpeechCheck", "SpeechChecks", "TimedWord",
           "WordGroup", "WordTime", "WordTimer", "blank_tags", "reference_for", "spoken_spans", "voiced_ends",
           "word_starts"]
