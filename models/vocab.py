"""Vocabulary trimming for Unigram (SentencePiece) tokenizers.

e5-small's 250,002-piece XLM-R vocabulary is ~80% of its weights. We keep (a) the special pieces,
(b) every single-character piece of the scripts the target languages are written in, plus every
non-letter single character (digits, punctuation, symbols), (c) every piece the training text
uses, and (d) the most probable remaining pieces of those scripts up to a budget. Unigram
re-segments text whose pieces were removed into smaller kept pieces, so (b) keeps the
unknown-piece rate close to the untrimmed tokenizer's. Kept pieces stay in their original order,
so new id i is old id `kept[i]` and the embedding matrix is `old_embedding[kept]`.
"""

from __future__ import annotations

import copy
import functools
import json
import unicodedata
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

METASPACE = "\u2581"


@functools.cache
def char_script(char: str) -> str | None:
    """Script of a letter or mark (first word of its Unicode name, 'CJK' for ideographs); None otherwise."""
    if not unicodedata.category(char).startswith(("L", "M")):
        return None
    try:
        return unicodedata.name(char).split()[0]
    except ValueError:
        return "UNNAMED"


def text_scripts(texts: Iterable[str]) -> set[str]:
    """Scripts of all letters used in `texts`."""
    chars = set().union(*(set(t) for t in texts))
    return {s for s in map(char_script, chars) if s is not None}


def piece_chars(piece: str) -> str:
    """The characters a piece covers, without the leading word-boundary marker."""
    return piece[1:] if piece.startswith(METASPACE) and len(piece) > 1 else piece


def piece_fits(piece: str, scripts: set[str]) -> bool:
    """True if every letter of the piece is written in one of `scripts`."""
    return all(char_script(c) in scripts or char_script(c) is None for c in piece_chars(piece))


def select_pieces(tokenizer_json: dict, train_texts: list[str], budget: int) -> np.ndarray:
    """Old ids to keep (sorted): specials, single characters, pieces the text uses, then top-scored pieces."""
    vocab = tokenizer_json["model"]["vocab"]
    tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json))
    scripts = text_scripts(train_texts)
    keep = {token["id"] for token in tokenizer_json.get("added_tokens", []) if token["special"]}
    if vocab[-1][0] == "<mask>":
        keep.discard(len(vocab) - 1)  # a classifier never sees the masked-LM token
    keep |= {i for i, (piece, _) in enumerate(vocab)
             if len(piece_chars(piece)) == 1 and piece_fits(piece, scripts)}
    for encoding in tokenizer.encode_batch(train_texts, add_special_tokens=False):
        keep.update(encoding.ids)
    if len(keep) < budget:
        candidates = sorted(
            (i for i, (piece, _) in enumerate(vocab)
             if i not in keep and piece != "<mask>" and piece_fits(piece, scripts)),
            key=lambda i: -vocab[i][1],
        )
        keep.update(candidates[: budget - len(keep)])
    return np.array(sorted(keep), dtype=np.int64)


def trim_tokenizer_json(tokenizer_json: dict, kept: np.ndarray, max_length: int) -> dict:
    """A Unigram tokenizer.json restricted to `kept` old ids (renumbered 0..len-1), truncating at max_length."""
    new_id = {int(old): new for new, old in enumerate(kept)}
    # everything but the base vocabulary (250k pieces, replaced below): copying it took seconds
    trimmed = copy.deepcopy({k: v for k, v in tokenizer_json.items() if k != "model"})
    trimmed["model"] = model = copy.deepcopy({k: v for k, v in tokenizer_json["model"].items() if k != "vocab"})
    if model["type"] != "Unigram":
        raise ValueError(f"vocabulary trimming supports Unigram tokenizers, not {model['type']}")
    model["vocab"] = [tokenizer_json["model"]["vocab"][int(old)] for old in kept]
    model["unk_id"] = new_id[tokenizer_json["model"]["unk_id"]]
    trimmed["added_tokens"] = [
        {**token, "id": new_id[token["id"]]}
        for token in tokenizer_json.get("added_tokens", []) if token["id"] in new_id
    ]
    post = trimmed.get("post_processor") or {}
    for special in post.get("special_tokens", {}).values():
        special["ids"] = [new_id[i] for i in special["ids"]]
    trimmed["truncation"] = {"direction": "Right", "max_length": max_length,
                             "strategy": "LongestFirst", "stride": 0}
    trimmed["padding"] = None
    return trimmed


def unk_rate(tokenizer: Tokenizer, texts: list[str]) -> float:
    """Share of content pieces that are the unknown piece."""
    unk_id = tokenizer.token_to_id("<unk>")
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    total = sum(len(e.ids) for e in encodings)
    unknown = sum(e.ids.count(unk_id) for e in encodings)
    return unknown / total if total else 0.0


def load_tokenizer_json(path: Path) -> dict:
    """tokenizer.json as a dict."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def tokenizer_from_json(tokenizer_json: dict) -> Tokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json dict."""
    return Tokenizer.from_str(json.dumps(tokenizer_json))
