"""The words consent phrases are drawn from (gateway.cloning.consent): common, concrete, distinct
words that Whisper tiny.en hears right in espeak-ng speech read in the consent text.

Chosen (2026-12, this machine) from 568 candidates, each read 8 times inside the consent text
(`lora_training.consent.consent_text`: six words and a two-digit number at a time, in random
groups, by the male en-us and the female en+f3 voice, 4 readings in a first round, 4 more in a
second for the 297 heard in all of the first): these 239 were heard every time. The list is
public; what makes it safe is its size: espeak-ng reads it in about two and a half minutes (with
commas), five times the longest consent recording (`MAX_CONSENT_AUDIO_S`), and the job refuses a
recording that says much more than its text (`MAX_EXTRA_WORDS`). docs/training.md, "Spoken
consent", has the calibration and the measured pass rates.
"""

from __future__ import annotations

from typing import Final

__all__ = ["PHRASE_WORDS"]

PHRASE_WORDS: Final = (
    "airport", "alligator", "almond", "alpaca", "ambulance", "animal", "ankle", "arrow", "asteroid", "athlete",
    "autumn", "balloon", "beetle", "biscuit", "bishop", "blanket", "blender", "bracelet", "breakfast",
    "broccoli", "cactus", "calendar", "camera", "candle", "candy", "cannon", "canoe", "captain", "caramel",
    "cardboard", "cargo", "carpet", "carrot", "cartoon", "cashew", "cashier", "castle", "cathedral",
    "cauliflower", "cement", "century", "champion", "chapter", "chicken", "cinnamon", "circle", "circus",
    "citrus", "clover", "cobra", "coffee", "compass", "copper", "costume", "creature", "cricket", "crimson",
    "crocodile", "crystal", "cucumber", "curtain", "custard", "dinner", "dragon", "dumpling", "elephant",
    "emerald", "envelope", "fabric", "falcon", "farmer", "festival", "fiddle", "finger", "fireworks",
    "flamingo", "fortress", "fossil", "fountain", "galaxy", "garlic", "ginger", "gladiator", "golden", "guitar",
    "hammer", "hamster", "harmonica", "harvest", "helicopter", "helmet", "highway", "hotel", "hurricane",
    "husky", "insect", "island", "jellyfish", "jungle", "kingdom", "kitten", "kiwi", "lantern", "lemon",
    "lemonade", "leopard", "library", "lighthouse", "lily", "lizard", "macaroni", "machine", "magazine",
    "magic", "mammal", "mammoth", "mango", "maple", "market", "mascot", "megaphone", "melon", "mermaid",
    "microphone", "mirror", "monkey", "moonlight", "mosaic", "mosquito", "mountain", "muffin", "museum",
    "music", "mustard", "napkin", "necklace", "nectar", "needle", "nickel", "noodle", "notebook", "octopus",
    "orange", "oyster", "palace", "pancake", "pancreas", "paper", "parachute", "parcel", "passport", "pearl",
    "pencil", "pendant", "penguin", "perfume", "pilot", "pirate", "pizza", "plastic", "playground", "plumber",
    "pocket", "pony", "postcard", "potato", "prairie", "propeller", "pumpkin", "pyramid", "python", "raccoon",
    "rainbow", "reindeer", "rhino", "riddle", "robot", "rocket", "ruby", "safari", "salad", "salmon", "sandal",
    "sandwich", "sardine", "sausage", "shampoo", "signal", "silver", "sister", "skeleton", "skyscraper",
    "snorkel", "spaceship", "spaghetti", "sponge", "starfish", "stereo", "sticker", "strawberry", "student",
    "suitcase", "summer", "sunflower", "tango", "teacher", "telescope", "temple", "tennis", "thunder", "ticket",
    "tiger", "timber", "toaster", "tomato", "toothbrush", "tower", "treasure", "trolley", "trophy", "trumpet",
    "turtle", "tuxedo", "typhoon", "umbrella", "unicorn", "vinegar", "volcano", "waffle", "wagon", "wallet",
    "wardrobe", "warrior", "whistle", "windmill", "window", "winter", "wrestler", "yellow"
)
