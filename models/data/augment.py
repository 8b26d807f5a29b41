"""Augmented copies of training texts, for distillation only.

The student learns the teacher's probabilities; on a few thousand labelled rows it sees too few
texts to copy the teacher well. Noisy copies of the training texts (a word dropped, two words
swapped, case changed, accents stripped, a character dropped) are cheap extra inputs that look
like what operators type, and the teacher labels them with soft targets.
"""

from __future__ import annotations

import random
import unicodedata


def _strip_accents(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text)
    stripped = "".join(c for c in decomposed
                       if not (unicodedata.category(c) == "Mn" and "LATIN" in unicodedata.name(
                           unicodedata.normalize("NFC", c), "LATIN")))
    return unicodedata.normalize("NFC", stripped)


def _drop_word(words: list[str], rng: random.Random) -> list[str]:
    if len(words) < 3:
        return words
    i = rng.randrange(len(words))
    return words[:i] + words[i + 1:]


def _swap_words(words: list[str], rng: random.Random) -> list[str]:
    if len(words) < 2:
        return words
    i = rng.randrange(len(words) - 1)
    return words[:i] + [words[i + 1], words[i]] + words[i + 2:]


def _drop_char(text: str, rng: random.Random) -> str:
    if len(text) < 4:
        return text
    i = rng.randrange(len(text))
    return text[:i] + text[i + 1:]


def augment_text(text: str, rng: random.Random) -> str:
    """One noisy copy of `text` (one or two random edits)."""
    for _ in range(rng.choice((1, 2))):
        op = rng.randrange(6)
        words = text.split()
        if op == 0 and len(words) >= 3:
            text = " ".join(_drop_word(words, rng))
        elif op == 1 and len(words) >= 2:
            text = " ".join(_swap_words(words, rng))
        elif op == 2:
            text = text.lower()
        elif op == 3:
            text = _strip_accents(text)
        elif op == 4:
            text = text.upper() if rng.random() < 0.3 else text.rstrip(".!?。！")
        else:
            text = _drop_char(text, rng)
    return text


def augmented_copies(texts: list[str], copies: int, seed: int) -> list[tuple[int, str]]:
    """(index of the source text, augmented text) pairs: `copies` per text, unchanged copies left out."""
    rng = random.Random(seed)
    out = []
    for index, text in enumerate(texts):
        seen = {text}
        for _ in range(copies):
            noisy = augment_text(text, rng)
            if noisy.strip() and noisy not in seen:
                seen.add(noisy)
                out.append((index, noisy))
    return out
