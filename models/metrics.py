"""Classification metrics and the quantization gate (pure numpy, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, labels: tuple[str, ...]) -> dict:
    """Accuracy, macro-F1 (over classes present in y_true or y_pred) and per-class recall."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    f1s, recall = [], {}
    for index, label in enumerate(labels):
        true_pos = int(np.sum((y_true == index) & (y_pred == index)))
        actual = int(np.sum(y_true == index))
        predicted = int(np.sum(y_pred == index))
        if actual == 0 and predicted == 0:
            continue
        if actual:
            recall[label] = true_pos / actual
        denominator = actual + predicted
        f1s.append(2 * true_pos / denominator if denominator else 0.0)
    return {
        "n": int(len(y_true)),
        "accuracy": float(np.mean(y_true == y_pred)) if len(y_true) else 0.0,
        "macro_f1": float(np.mean(f1s)) if f1s else 0.0,
        "recall": recall,
    }


def metrics_by_language(y_true: np.ndarray, y_pred: np.ndarray, languages: list[str],
                        labels: tuple[str, ...]) -> dict:
    """{"all": metrics, "by_language": {lang: {n, accuracy, macro_f1}}}."""
    languages_arr = np.asarray(languages)
    by_language = {}
    for language in sorted(set(languages)):
        selected = languages_arr == language
        result = classification_metrics(y_true[selected], y_pred[selected], labels)
        by_language[language] = {k: round(v, 4) if isinstance(v, float) else v
                                 for k, v in result.items() if k != "recall"}
    overall = classification_metrics(y_true, y_pred, labels)
    return {"all": overall, "by_language": by_language}


@dataclass(frozen=True)
class GateResult:
    """Whether a quantized variant may be published, and why not."""

    passed: bool
    macro_f1_drop_points: float
    worst_recall_drop_points: float
    failures: tuple[str, ...]


def quantization_gate(reference: dict, candidate: dict, max_f1_drop: float = 1.0,
                      max_recall_drop: float = 3.0) -> GateResult:
    """Publish only if macro-F1 is within `max_f1_drop` points of the reference and no class's recall drops more than `max_recall_drop` points."""
    f1_drop = 100.0 * (reference["macro_f1"] - candidate["macro_f1"])
    failures = []
    if f1_drop > max_f1_drop:
        failures.append(f"macro-F1 drops {f1_drop:.2f} points (limit {max_f1_drop})")
    worst = 0.0
    for label, ref_recall in reference["recall"].items():
        drop = 100.0 * (ref_recall - candidate["recall"].get(label, 0.0))
        worst = max(worst, drop)
        if drop > max_recall_drop:
            failures.append(f"class {label!r} recall drops {drop:.2f} points "
                            f"({100 * ref_recall:.1f} → {100 * candidate['recall'].get(label, 0.0):.1f})")
    return GateResult(not failures, round(f1_drop, 3), round(worst, 3), tuple(failures))
