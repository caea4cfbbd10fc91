"""The text front end: what the voice reads for what the caller wrote (see README.md).

Standard library only, nothing heavy at import: the gateway, the CLI and the trainer import it.
"""

from gpu_worker.text.dictionary import DICTIONARY_NAME, MAX_RULES, Dictionary, InvalidDictionary, PronunciationRule, apply
from gpu_worker.text.languages import LANGUAGES, UnknownLanguage
from gpu_worker.text.normalize import MAX_TEXT_CHARS, SPOKEN_WORD, Normalized, SpokenWord, normalize
from gpu_worker.text.stream import StreamNormalizer
from gpu_worker.text.tags import MAX_TAG_CHARS, TAG, TAGS, known_tag, strip_tags

__all__ = ["DICTIONARY_NAME", "LANGUAGES", "MAX_RULES", "MAX_TAG_CHARS", "MAX_TEXT_CHARS", "SPOKEN_WORD", "TAG", "TAGS", "Dictionary",
           "InvalidDictionary", "Normalized", "PronunciationRule", "SpokenWord", "StreamNormalizer", "UnknownLanguage",
           "apply", "known_tag", "normalize", "strip_tags"]
