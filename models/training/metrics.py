"""Classification metrics and the quantization gate (pure numpy, no torch)."""

from __future__ import annotations

import math
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
        "n": len(y_true),
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


def confusion_pairs(y_true: np.ndarray, y_pred: np.ndarray, labels: tuple[str, ...], top: int = 10) -> list[dict]:
    """The most frequent (true label → predicted label) mistakes, most frequent first."""
    counts: dict[tuple[int, int], int] = {}
    for t, p in zip(np.asarray(y_true).tolist(), np.asarray(y_pred).tolist()):
        if t != p:
            counts[(t, p)] = counts.get((t, p), 0) + 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]
    return [{"true": labels[t], "predicted": labels[p], "count": n} for (t, p), n in ranked]


def binomial_tail(successes: int, trials: int) -> float:
    """P(X ≥ successes) for X ~ Binomial(trials, 1/2): the exact one-sided McNemar test."""
    if trials == 0:
        return 1.0
    return sum(math.comb(trials, k) for k in range(successes, trials + 1)) / 2.0 ** trials


def wilson_lower(successes: int, trials: int, z: float = 1.96) -> float:
    """Lower end of the Wilson score interval (95 % by default) of a proportion."""
    if trials == 0:
        return 0.0
    p = successes / trials
    centre = p + z * z / (2 * trials)
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return (centre - spread) / (1 + z * z / trials)


@dataclass(frozen=True)
class GateResult:
    """Whether a quantized variant may be published, and why not."""

    passed: bool
    accuracy_drop_points: float
    agreement: float  # share of examples where the variant's top label equals FP32's
    agreement_lower_95: float  # Wilson lower bound of that share
    lost: int  # examples FP32 gets right and the variant wrong
    gained: int  # the reverse
    worst_class: str
    worst_class_p: float  # one-sided exact McNemar p-value of the worst class's net loss
    failures: tuple[str, ...]


def quantization_gate(y_true: np.ndarray, reference_pred: np.ndarray, candidate_pred: np.ndarray,
                      labels: tuple[str, ...], max_accuracy_drop: float = 1.5, max_class_drop: float = 3.0,
                      alpha: float = 0.05) -> GateResult:
    """Paired gate of an int8 variant against FP32 on the same held-out examples.

    Rejects when (a) accuracy drops more than `max_accuracy_drop` points, or (b) a class loses
    more than `max_class_drop` recall points AND that loss is significant: among the class's
    examples where the two disagree on correctness, the variant's losses outnumber its gains
    with an exact one-sided McNemar (sign) test p < `alpha`. With ~30 examples a class, one or
    two flipped predictions are noise (p ≥ 0.25) and no longer reject a variant; a collapsed
    class still does.
    """
    y_true, ref, cand = np.asarray(y_true), np.asarray(reference_pred), np.asarray(candidate_pred)
    n = len(y_true)
    ref_ok, cand_ok = ref == y_true, cand == y_true
    lost, gained = int(np.sum(ref_ok & ~cand_ok)), int(np.sum(~ref_ok & cand_ok))
    drop = 100.0 * (lost - gained) / n if n else 0.0
    agree = int(np.sum(ref == cand))
    failures = []
    if drop > max_accuracy_drop:
        failures.append(f"accuracy drops {drop:.2f} points (limit {max_accuracy_drop}; {lost} lost, {gained} gained "
                        f"of {n})")
    worst, worst_p = "", 1.0
    for index, label in enumerate(labels):
        in_class = y_true == index
        size = int(in_class.sum())
        if not size:
            continue
        class_lost = int(np.sum(in_class & ref_ok & ~cand_ok))
        class_gained = int(np.sum(in_class & ~ref_ok & cand_ok))
        p = binomial_tail(class_lost, class_lost + class_gained) if class_lost > class_gained else 1.0
        if p < worst_p:
            worst, worst_p = label, p
        class_drop = 100.0 * (class_lost - class_gained) / size
        if class_drop > max_class_drop and p < alpha:
            failures.append(f"class {label!r} recall drops {class_drop:.2f} points ({class_lost} lost, "
                            f"{class_gained} gained of {size}; p = {p:.3f})")
    return GateResult(not failures, round(drop, 3), round(agree / n, 4) if n else 1.0,
                      round(wilson_lower(agree, n), 4), lost, gained, worst, round(worst_p, 4), tuple(failures))
