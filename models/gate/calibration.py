"""Calibration: how far a model's scores can be trusted, and a softmax temperature that fixes it.

The temperature T divides the logits before the softmax; it is fitted on the validation split by
minimising the negative log-likelihood (a 1-D search on log T), which changes no prediction, only
how confident the scores are. The expected calibration error (ECE) is the mean |accuracy −
confidence| over 15 equal-width confidence bins, weighted by how many examples fall in each.
"""

from __future__ import annotations

import numpy as np

THRESHOLDS = (0.5, 0.7, 0.9)


def softmax_t(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of logits / temperature, in float64."""
    scaled = np.asarray(logits, dtype=np.float64) / temperature
    scaled -= scaled.max(axis=1, keepdims=True)
    exp = np.exp(scaled)
    return exp / exp.sum(axis=1, keepdims=True)


def expected_calibration_error(probs: np.ndarray, y_true: np.ndarray, bins: int = 15) -> float:
    """ECE of the top-label confidence, 15 equal-width bins."""
    if len(y_true) == 0:
        return 0.0
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == np.asarray(y_true)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1], right=True), 0, bins - 1)
    error = 0.0
    for b in range(bins):
        selected = which == b
        if selected.any():
            error += selected.mean() * abs(correct[selected].mean() - confidence[selected].mean())
    return float(error)


def negative_log_likelihood(logits: np.ndarray, y_true: np.ndarray, temperature: float) -> float:
    """Mean −log p(true label) at a temperature."""
    probs = softmax_t(logits, temperature)
    return float(-np.mean(np.log(np.maximum(probs[np.arange(len(y_true)), y_true], 1e-12))))


def fit_temperature(logits: np.ndarray, y_true: np.ndarray) -> float:
    """The T in [0.05, 20] that minimises the NLL (golden-section search on log T)."""
    y_true = np.asarray(y_true)
    low, high = np.log(0.05), np.log(20.0)
    ratio = (np.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    fa, fb = (negative_log_likelihood(logits, y_true, np.exp(x)) for x in (a, b))
    for _ in range(60):
        if fa < fb:
            high, b, fb = b, a, fa
            a = high - ratio * (high - low)
            fa = negative_log_likelihood(logits, y_true, np.exp(a))
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = negative_log_likelihood(logits, y_true, np.exp(b))
    return float(np.exp((low + high) / 2))


def coverage_table(probs: np.ndarray, y_true: np.ndarray, thresholds: tuple[float, ...] = THRESHOLDS) -> list[dict]:
    """For each threshold: the share of texts whose top score reaches it, and their accuracy."""
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == np.asarray(y_true)
    rows = []
    for threshold in thresholds:
        selected = confidence >= threshold
        rows.append({"threshold": threshold, "coverage": round(float(selected.mean()), 4) if len(correct) else 0.0,
                     "accuracy": round(float(correct[selected].mean()), 4) if selected.any() else None,
                     "n": int(selected.sum())})
    return rows
