"""Vocabulary trimming for Unigram (SentencePiece) tokenizers.

e5-small's 250,002-piece XLM-R vocabulary is ~80% of its weights. We keep (a) the special pieces,
(b) every single-character piece of the base vocabulary, in every script (digits, punctuation and
symbols included: 15,396 of them for XLM-R), (c) every piece the training text uses, (d) the most
probable remaining pieces of the training text's scripts, and (e) a reserved share of the budget
for the most probable pieces of every other script. Unigram re-segments text whose pieces were
removed into smaller kept pieces, so (b) means no script the base tokenizer can read becomes
`<unk>` (a Thai or Hebrew sentence used to become one unknown piece when only the training
scripts were kept), and (e) keeps words of languages absent from the training data from being
spelled out letter by letter. Kept pieces stay in their original order, so new id i is old id
`kept[i]` and the embedding matrix is `old_embedding[kept]`.
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


# Share of the budget left for the pieces of scripts the training text does not use (e).
OTHER_SCRIPTS_SHARE = 0.1


def piece_script(piece: str) -> str:
    """The one script of a piece's letters; "MIXED" for several, "NONE" for digits and symbols."""
    found = {char_script(c) for c in piece_chars(piece)} - {None}
    return found.pop() if len(found) == 1 else ("MIXED" if found else "NONE")


def proportional_order(vocab: list, candidates: list[int]) -> list[int]:
    """`candidates` ordered so that any prefix holds the same share of every script's pieces, each
    script's best-scored first: what a budget keeps is spread over scripts as the base vocabulary
    spreads them (its piece counts follow how many languages write a script), not by global score,
    which the largest languages' pieces lead."""
    by_script: dict[str, list[int]] = {}
    for i in sorted(candidates, key=lambda i: -vocab[i][1]):
        by_script.setdefault(piece_script(vocab[i][0]), []).append(i)
    rank = {i: (n + 0.5) / len(ids) for ids in by_script.values() for n, i in enumerate(ids)}
    return sorted(candidates, key=lambda i: (rank[i], -vocab[i][1]))


def select_pieces(tokenizer_json: dict, train_texts: list[str], budget: int,
                  other_scripts_share: float = OTHER_SCRIPTS_SHARE, policy: str = "training-scripts",
                  single_characters: bool = True) -> np.ndarray:
    """Old ids to keep (sorted): specials, every single character, pieces the text uses, then
    `policy` "training-scripts": top-scored pieces of the text's scripts, then of every other script
    (see the module docstring); "proportional": the same share of every script's pieces.
    single_characters=False: a character the text does not use is left out (a tiered word table
    keeps every other piece in its tail, models/training/word_table.py)."""
    vocab = tokenizer_json["model"]["vocab"]
    tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json))
    scripts = text_scripts(train_texts)
    keep = {token["id"] for token in tokenizer_json.get("added_tokens", []) if token["special"]}
    if vocab[-1][0] == "<mask>":
        keep.discard(len(vocab) - 1)  # a classifier never sees the masked-LM token
    if single_characters:
        keep |= {i for i, (piece, _) in enumerate(vocab) if len(piece_chars(piece)) == 1 and piece != "<mask>"}
    for encoding in tokenizer.encode_batch(train_texts, add_special_tokens=False):
        keep.update(encoding.ids)
    by_score = sorted((i for i, (piece, _) in enumerate(vocab) if i not in keep and piece != "<mask>"),
                      key=lambda i: -vocab[i][1])
    if policy == "proportional":
        keep.update(proportional_order(vocab, by_score)[: max(0, budget - len(keep))])
        return np.array(sorted(keep), dtype=np.int64)
    own = [i for i in by_score if piece_fits(vocab[i][0], scripts)]
    others = [i for i in by_score if not piece_fits(vocab[i][0], scripts)]
    reserve = min(len(others), int(budget * other_scripts_share))
    keep.update(own[: max(0, budget - reserve - len(keep))])
    keep.update(others[: max(0, budget - len(keep))])
    return np.array(sorted(keep), dtype=np.int64)


def tail_pieces(tokenizer_json: dict, kept: np.ndarray, count: int | None = None) -> np.ndarray:
    """Base ids `select_pieces` left out (sorted), but the masked-LM token a classifier never sees:
    all of them, or `count`: every single character first (no script the base reads becomes
    `<unk>`), then the others in `proportional_order` (the same share of every script)."""
    vocab = tokenizer_json["model"]["vocab"]
    left = [int(i) for i in np.setdiff1d(np.arange(len(vocab)), kept) if vocab[i][0] != "<mask>"]
    if count is not None and count < len(left):
        single = [i for i in left if len(piece_chars(vocab[i][0])) == 1]
        longer = [i for i in left if len(piece_chars(vocab[i][0])) > 1]
        left = sorted(single + proportional_order(vocab, longer)[: max(0, count - len(single))])
    return np.array(left, dtype=np.int64)


def script_probe_texts(tokenizer_json: dict, pieces_per_script: int = 40) -> dict[str, str]:
    """One probe text per script of the base vocabulary: its most probable multi-character pieces
    written as words (what a word of that script looks like to the base tokenizer)."""
    by_script: dict[str, list[str]] = {}
    for piece, _ in sorted(tokenizer_json["model"]["vocab"], key=lambda item: -item[1]):
        chars = piece_chars(piece)
        found = {char_script(c) for c in chars} - {None}
        if len(chars) > 1 and len(found) == 1:
            words = by_script.setdefault(found.pop(), [])
            if len(words) < pieces_per_script:
                words.append(chars)
    return {script: " ".join(words) for script, words in sorted(by_script.items())}


def unk_rate_by_script(tokenizer: Tokenizer, probes: dict[str, str]) -> dict[str, float]:
    """Unknown-piece rate of `tokenizer` on each script's probe text (script_probe_texts)."""
    return {script: round(unk_rate(tokenizer, [text]), 4) for script, text in probes.items()}


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


VOCABULARY_TEXTS = 6000  # pseudo-texts a `transfer_text: "vocabulary"` student is also distilled on
MIN_SCRIPT_PIECES = 50  # a script with fewer kept pieces gets no pseudo-text of its own


def vocabulary_texts(tokenizer_json: dict, base: Tokenizer, ids: np.ndarray, count: int = VOCABULARY_TEXTS,
                     seed: int = 13) -> list[str]:
    """Unlabelled pseudo-texts made of the pieces `ids` (ids of `base`, the tokenizer of `tokenizer_json`): each text 6–16 words of one
    script, every script drawn equally often, each word a word-start piece (by the piece's
    probability) and sometimes a continuation. A student distilled on labelled text of a few dozen
    languages sees only their pieces; these texts show it every kept piece the way its teacher
    reads it, so a language no training file has is not read by layers that never met its words.
    A text is kept only if the base tokenizer reads it with `ids` alone: then any tokenizer holding
    them reads it the same way, so a tiered table's tail never reaches training."""
    vocab = tokenizer_json["model"]["vocab"]
    starts: dict[str, list[int]] = {}
    inner: dict[str, list[int]] = {}
    for i in ids:
        piece = vocab[int(i)][0]
        script = piece_script(piece)
        if script in ("NONE", "MIXED") or len(piece_chars(piece)) < 2:
            continue
        (starts if piece.startswith(METASPACE) else inner).setdefault(script, []).append(int(i))
    scripts = sorted(s for s in starts if len(starts[s]) + len(inner.get(s, [])) >= MIN_SCRIPT_PIECES)
    if not scripts:
        return []
    rng = np.random.default_rng(seed)

    def weights(pieces: list[int]) -> np.ndarray:
        scores = np.array([vocab[i][1] for i in pieces])
        w = np.exp(0.5 * (scores - scores.max()))  # flatter than the scores: more of the pieces come up
        return w / w.sum()

    tables = {s: (starts[s], weights(starts[s]), inner.get(s, []),
                  weights(inner[s]) if inner.get(s) else None) for s in scripts}
    allowed = {int(i) for i in ids}
    reads_as_kept: dict[str, bool] = {}

    def word(first, p_first, rest, p_rest) -> str | None:
        for _ in range(5):  # glued pieces can read as a left-out piece: draw again
            text = vocab[first[rng.choice(len(first), p=p_first)]][0]
            if rest and rng.random() < 0.3:
                text += vocab[rest[rng.choice(len(rest), p=p_rest)]][0]
            if text not in reads_as_kept:  # the pre-tokenizer splits at spaces: a word reads alone
                ids_read = base.encode(text.replace(METASPACE, " "), add_special_tokens=False).ids
                reads_as_kept[text] = set(ids_read) <= allowed
            if reads_as_kept[text]:
                return text
        return None

    texts = []
    for n in range(count):
        table = tables[scripts[n % len(scripts)]]
        words = [w for w in (word(*table) for _ in range(int(rng.integers(6, 17)))) if w]
        texts.append("".join(words).replace(METASPACE, " ").strip())
    return [t for t in texts if t]
