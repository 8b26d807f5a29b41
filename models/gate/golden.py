"""The golden set: texts every published variant must answer as the factory recorded them.

`decide selftest` runs each golden text alone and all of them in one call, and compares each
variant's answers with (1) its own outputs recorded here, made by the same `runtime.engine.engine.Engine`
runs on the factory's machine (`expected_tolerance`, the spread measured across CPU kernel
families), and (2) the reference model's probabilities (`golden_tolerance`, how far the variant
may drift from the model it was made from). An example qualifies when the reference answers its
label with a clear margin and every variant answers the same label in both runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GOLDEN_FILE = "golden.jsonl"
MIN_MARGIN = 0.3  # reference top-1 minus top-2: small numeric differences cannot flip the label
FALLBACK_MARGIN = 0.02
# max |Δp| of the FP32 graph vs the reference model on the golden set (weights stored fp16)
FP32_GOLDEN_TOLERANCE = 2e-3
# selftest's bound on |Δp| vs the variant's own expected outputs (computed on the factory's CPU).
# Measured spread of the golden runs across MLAS kernel families (the bundle's selftest
# --all-variants under qemu vs the factory's AVX-512 VNNI box). machine-alarms 2.0.0: fp32
# <= 4.6e-7 everywhere; int8-u8s8 2.2e-3 on Conroe, Nehalem, SandyBridge, cortex-a53/a72,
# neoverse-n1 and qemu max (i8mm); int8-u8u8 5e-8 on Haswell (the factory box's own u8u8 kernel),
# 2.3e-3 on Conroe, Nehalem, SandyBridge and 3.5e-3 on ARM64 (topics-multilingual 1.2.0 had
# 6.9e-4 / 8.8e-4: this model's head, unit-length features x a large linear layer, makes one
# quantization step worth more probability). int8-u8s8 on AVX2 without VNNI (VPMADDUBSW
# saturation) is off by 3.5e-2 on Haswell, a CPU the tiers never serve it on.
# The corruptions of tests/test_selftest.py (one weight scale 2 % off, one zero point +1) move
# the outputs by 2.0e-2 to 3.7e-2. int8: 9e-3 = ~2.6x the largest legitimate spread, ~2.3x
# under the smallest corruption. int8-u8s7 (served on AVX2 only, made there) takes u8s8's bound: its spread
# across kernel families is not measured yet.
EXPECTED_TOLERANCE = {"fp32": 1e-4, "int8-u8u8": 9e-3, "int8-u8s8": 9e-3, "int8-u8s7": 9e-3}
RUNS = ("alone", "batched")


@dataclass(frozen=True)
class GoldenCandidates:
    """Texts the golden set may be drawn from, in preference order."""

    texts: list[str]
    languages: list[str]
    labels: np.ndarray  # label index each text must be answered with
    reference: np.ndarray  # the reference model's probabilities (as the runtime answers: calibrated)
    labelled_by: str  # "true labels", or whose predictions stand in for them


def clear_cut(candidates: GoldenCandidates, count: int, min_margin: float = MIN_MARGIN) -> list[int]:
    """Indices of candidates the reference answers right with a top-2 margin ≥ `min_margin`, spread
    over the languages round-robin and, within a language, over the labels (least used first)."""
    top2 = np.sort(candidates.reference, axis=1)[:, -2:]
    qualifies = (candidates.reference.argmax(1) == candidates.labels) & (top2[:, 1] - top2[:, 0] >= min_margin)
    by_language: dict[str, list[int]] = {}
    for index in np.flatnonzero(qualifies):
        by_language.setdefault(candidates.languages[index], []).append(int(index))
    chosen: list[int] = []
    label_counts: dict[int, int] = {}
    while len(chosen) < count and any(by_language.values()):
        for language in sorted(by_language):
            pool = by_language[language]
            if not pool or len(chosen) >= count:
                continue
            pick = min(pool, key=lambda i: (label_counts.get(int(candidates.labels[i]), 0), i))
            pool.remove(pick)
            chosen.append(pick)
            label_counts[int(candidates.labels[pick])] = label_counts.get(int(candidates.labels[pick]), 0) + 1
    return chosen


def _probs(results) -> list[list[float]]:
    return [[round(p, 7) for p in r.probs] for r in results]


def record_runs(make_engine: Callable, names: Sequence[str], candidates: GoldenCandidates, order: list[int],
                count: int) -> tuple[list[int], dict[str, dict[str, list[list[float]]]]]:
    """The first `count` of `order` that every variant labels right alone and batched, with each
    variant's own outputs for them ({variant: {"alone": rows, "batched": rows}}), computed as
    `decide selftest` runs them: each text in its own call, then all chosen texts in one call.
    One engine at a time (`make_engine(name)`): an imported model's sessions are large."""
    texts = [candidates.texts[i] for i in order]
    alone, right = {}, np.ones(len(order), dtype=bool)
    for name in names:
        engine = make_engine(name)
        alone[name] = [engine.classify([text])[0] for text in texts]
        right &= np.array([a.label == engine.labels[int(candidates.labels[i])] for a, i in zip(alone[name], order)],
                          dtype=bool)
        del engine
    keep = list(np.flatnonzero(right)[:count])
    while keep:  # batched rows share padded shapes: a text that flips there leaves, and the rest rerun
        batched = {}
        for name in names:
            engine = make_engine(name)
            batched[name] = engine.classify([texts[k] for k in keep])
            wrong = {k for k, b in zip(keep, batched[name]) if b.label != engine.labels[int(candidates.labels[order[k]])]}
            del engine
            if wrong:
                break
        if not wrong:
            return [order[k] for k in keep], {name: {"alone": _probs([alone[name][k] for k in keep]),
                                                     "batched": _probs(batched[name])} for name in names}
        keep = [k for k in keep if k not in wrong]
    return [], {}


def worst_dp(runs: dict[str, list[list[float]]], reference: np.ndarray) -> float:
    """Largest |Δp| of a variant's recorded runs against the reference rows (as stored, 7 digits)."""
    return max((float(np.abs(np.array(rows) - np.round(reference, 7)).max()) for rows in runs.values()), default=0.0)


def golden_tolerance(name: str, runs: dict[str, list[list[float]]], reference: np.ndarray) -> float:
    """selftest's bound vs the reference: FP32's fixed one; an int8 variant's from what it measured
    here (2 × its worst |Δp| + 2e-3, rounded up to 1e-3: kernel differences between CPU families)."""
    if name == "fp32":
        return FP32_GOLDEN_TOLERANCE
    return float(np.ceil((2 * worst_dp(runs, reference) + 2e-3) * 1000) / 1000)


def write_golden(path: Path, candidates: GoldenCandidates, chosen: Sequence[int], labels: Sequence[str],
                 expected: dict[str, dict[str, list[list[float]]]]) -> None:
    """golden.jsonl: text, language, label, the reference probabilities and each variant's own outputs."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({
                "text": candidates.texts[index], "language": candidates.languages[index],
                "label": labels[int(candidates.labels[index])],
                "probs": [round(float(p), 7) for p in candidates.reference[index]],
                "expected": {name: {run: runs[run][row] for run in RUNS} for name, runs in expected.items()},
            }, ensure_ascii=False) + "\n" for row, index in enumerate(chosen))
