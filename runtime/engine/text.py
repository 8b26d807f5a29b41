"""Tokenize texts: each text of a request is encoded here once, clipped to the model's character
budget first; the ids go to the batching plan (batching.py), which pads them to length buckets.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from tokenizers import Tokenizer

# Texts are cut to max_length × this many characters before the tokenizer sees them: `tokenizers`
# encodes the whole text before truncating (one 1 MiB text costs ~56 MB and ~3 s), and nothing
# past max_length tokens reaches the model anyway. The longest piece of the default vocabulary
# is 16 characters, so 32 per token leaves a 2× margin: a cut only changes a result for texts
# that are almost all whitespace or characters the normalizer drops, and those say truncated.
CHARS_PER_TOKEN = 32


def max_text_chars(max_length: int) -> int:
    """The character budget of one text for a model of `max_length` tokens."""
    return max_length * CHARS_PER_TOKEN


def clip_text(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` cut to `max_chars` characters, and whether it was cut."""
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars], True


@dataclass(frozen=True)
class Encoded:
    """One tokenized text: ids without padding, whether truncation cut it, and the share of its
    characters (spaces aside) that fell into the tokenizer's unknown piece (runtime/package/abstain.py)."""

    ids: tuple[int, ...]
    truncated: bool
    unknown_share: float = 0.0


# Characters of the supplementary private-use planes: in no vocabulary, so a model with an
# unknown piece gives them its id.
UNKNOWN_PROBES = ("\U000f0000", "\U0010fffd")


def unknown_token_id(tokenizer: Tokenizer) -> int | None:
    """The id the tokenizer's model gives characters it has no piece for (None if it has none:
    byte-level BPE, byte fallback).

    Asked of the model object, not of its JSON: serialising and parsing a 2 MB tokenizer holds
    the interpreter lock for ~0.2 s, which stalled every answer while a live swap loaded a package."""
    model = tokenizer.model
    token = getattr(model, "unk_token", None)  # WordLevel, WordPiece, BPE
    if isinstance(token, str):
        return tokenizer.token_to_id(token)
    try:  # Unigram does not expose unk_id: it is what an unseen character becomes
        found = [model.tokenize(probe) for probe in UNKNOWN_PROBES]
    except Exception:  # noqa: BLE001 — tokenizers raises its own types for "no unk_id"
        return None
    ids = {tokens[0].id for tokens in found if len(tokens) == 1}
    return ids.pop() if len(ids) == 1 and all(len(tokens) == 1 for tokens in found) else None


def unknown_share(text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]],
                  special: Sequence[int], unk_id: int | None) -> float:
    """Share of the text's non-space characters (in what the tokens cover) that only the unknown
    piece covers; 1.0 when no token covers any character (nothing the model could read)."""
    known = unknown = 0
    for token, (start, end), is_special in zip(ids, offsets, special):
        if is_special:
            continue
        chars = sum(not c.isspace() for c in text[start:end])
        if token == unk_id:
            unknown += max(chars, 1)
        else:
            known += chars
    return 1.0 if known + unknown == 0 else unknown / (known + unknown)


class TextEncoder:
    """A `tokenizers` tokenizer with truncation to the model's max length; padding done here."""

    _shared: ClassVar[weakref.WeakValueDictionary[tuple, TextEncoder]] = weakref.WeakValueDictionary()
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def shared(cls, tokenizer_json: str, max_length: int, pad_id: int) -> TextEncoder:
        """The encoder of an engine alive in this process with the very same tokenizer text and
        settings, else a new one. Building a tokenizer holds the interpreter lock (~0.3 s for the
        default's 60k pieces: `tokenizers` parses and builds without releasing it), so a live swap
        between packages of one tokenizer (a retrained head, a rollback) must not build it again
        while the served model answers. Encoders are read-only after construction."""
        key = (hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(), max_length, pad_id)
        with cls._shared_lock:
            encoder = cls._shared.get(key)
        if encoder is None:
            encoder = cls(tokenizer_json, max_length, pad_id)
            with cls._shared_lock:
                encoder = cls._shared.setdefault(key, encoder)
        return encoder

    def __init__(self, tokenizer_json: str, max_length: int, pad_id: int):
        """`tokenizer_json`: the text of a tokenizer.json (read and verified by the caller, so
        the tokenizer is built from exactly the bytes that were checked)."""
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length)
        self.max_length = max_length
        self.max_chars = max_text_chars(max_length)
        self.pad_id = pad_id
        self.unk_id = unknown_token_id(self.tokenizer)

    def tokenize(self, texts: Sequence[str]) -> list[Encoded]:
        """Tokenize a batch (Rust-side parallel batch encode; one text skips the thread pool).
        Texts over the character budget are cut first and count as truncated."""
        clipped = [clip_text(text, self.max_chars) for text in texts]
        if len(clipped) == 1:
            encodings = [self.tokenizer.encode(clipped[0][0])]
        else:
            encodings = self.tokenizer.encode_batch([text for text, _ in clipped])
        return [Encoded(tuple(e.ids), bool(e.overflowing) or cut,
                        unknown_share(text, e.ids, e.offsets, e.special_tokens_mask, self.unk_id))
                for e, (text, cut) in zip(encodings, clipped)]


