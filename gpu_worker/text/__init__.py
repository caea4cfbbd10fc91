"""The text front end: what the voice reads for what the caller wrote (see README.md).

Standard library only, nothing heavy at import: the gateway, the CLI and the trainer import it.
"""

from gpu_worker.text.dictionary import Dictionary, InvalidDictionary, PronunciationRule, apply
from gpu_worker.text.languages import LANGUAGES, UnknownLanguage
from gpu_worker.text.normalize import MAX_TEXT_CHARS, Normalized, SpokenWord, normalize
from gpu_worker.text.stream import StreamNormalizer
from gpu_worker.text.tags import TAGS, strip_tags

__all__ = ["LANGUAGES", "MAX_TEXT_CHARS", "TAGS", "Dictionary", "InvalidDictionary", "Normalized",
           "PronunciationRule", "SpokenWord", "StreamNormalizer", "UnknownLanguage", "apply", "normalize",
           "strip_tags"]
