"""Evaluate ONNX variants with ONNX Runtime: logits, metrics per language, golden set, latency."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from models.progress import Progress


def ort_session(path: Path, threads: int = 1) -> ort.InferenceSession:
    """A CPU session with the portable (EXTENDED) optimization level the runtime uses."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def pad_numpy(sequences: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded int64 (input_ids, attention_mask)."""
    width = max(len(s) for s in sequences)
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def ort_logits(session: ort.InferenceSession, sequences: list[list[int]], pad_id: int,
               batch_size: int = 32, name: str = "onnxruntime") -> np.ndarray:
    """Logits for every sequence (batched by length), in input order."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: np.ndarray | None = None
    progress = Progress(name, len(sequences))
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        ids, mask = pad_numpy([sequences[i] for i in index], pad_id)
        (logits,) = session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
        if out is None:
            out = np.zeros((len(sequences), logits.shape[1]), dtype=np.float32)
        out[index] = logits
        progress.advance(len(index))
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (as the runtime computes it)."""
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def batch1_latency_ms(session: ort.InferenceSession, sequence: list[int], pad_id: int,
                      runs: int = 200) -> dict:
    """Median and p90 wall time of one single-text session.run (after 20 warm-up runs)."""
    ids, mask = pad_numpy([sequence], pad_id)
    feed = {"input_ids": ids, "attention_mask": mask}
    for _ in range(20):
        session.run(["logits"], feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(["logits"], feed)
        times.append((time.perf_counter() - start) * 1000)
    return {"tokens": len(sequence), "median_ms": round(float(np.median(times)), 3),
            "p90_ms": round(float(np.percentile(times, 90)), 3), "runs": runs, "threads": 1}


def single_probs(session: ort.InferenceSession, sequence: list[int], pad_id: int,
                 width: int | None = None) -> np.ndarray:
    """Probabilities for one text run alone, right-padded to `width` tokens (None: no padding).

    Dynamic int8 quantization scales activations over the whole input tensor, padding included,
    so an int8 variant's output depends on how the runtime pads; the golden set is checked under
    several paddings.
    """
    ids, mask = pad_numpy([sequence], pad_id)
    if width is not None and width > ids.shape[1]:
        extra = width - ids.shape[1]
        ids = np.pad(ids, ((0, 0), (0, extra)), constant_values=pad_id)
        mask = np.pad(mask, ((0, 0), (0, extra)))
    (logits,) = session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
    return softmax(logits)[0]


def select_golden(languages: list[str], true_labels: np.ndarray, reference_probs: np.ndarray,
                  variant_probs: dict[str, np.ndarray], count: int = 30, min_margin: float = 0.3) -> list[int]:
    """Indices of clear-cut examples, spread across languages round-robin.

    An example qualifies when the reference and every variant predict the true label and the
    reference's top probability beats the runner-up by `min_margin` (not borderline, so small
    numeric differences between variants or CPUs cannot flip it).
    """
    top2 = np.sort(reference_probs, axis=1)[:, -2:]
    qualifies = (reference_probs.argmax(1) == true_labels) & (top2[:, 1] - top2[:, 0] >= min_margin)
    for probs in variant_probs.values():
        qualifies &= probs.argmax(1) == true_labels
    by_language: dict[str, list[int]] = {}
    for index in np.flatnonzero(qualifies):
        by_language.setdefault(languages[index], []).append(int(index))
    chosen: list[int] = []
    label_counts: dict[int, int] = {}
    while len(chosen) < count and any(by_language.values()):
        for language in sorted(by_language):
            pool = by_language[language]
            if not pool or len(chosen) >= count:
                continue
            # within a language, take the topic the set has least of so far: labels stay varied
            pick = min(pool, key=lambda i: (label_counts.get(int(true_labels[i]), 0), i))
            pool.remove(pick)
            chosen.append(pick)
            label_counts[int(true_labels[pick])] = label_counts.get(int(true_labels[pick]), 0) + 1
    return chosen
