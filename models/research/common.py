"""Shared helpers of the machine-alarms model experiments (not product code).

Validation split: 3 of the 14 texts of every (label, language) cell of train.csv (480 rows), fixed seed.
test.csv is only scored for the final candidates (the caller asks for it explicitly).
"""

from __future__ import annotations

import csv
import json
import os
import random
import resource
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

TASK = Path(__file__).resolve().parents[1] / "tasks" / "machine-alarms"
OUT = Path(os.environ.get("MX_OUT", "/tmp/mx"))


def load_rows(name: str) -> list[dict]:
    with open(TASK / name, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def split_train(seed: int = 13, per_cell: int = 3) -> tuple[list[dict], list[dict]]:
    """(train, val) of train.csv, stratified per label+language."""
    cells = defaultdict(list)
    for row in load_rows("train.csv"):
        cells[(row["label"], row["lang"])].append(row)
    rng = random.Random(seed)
    train, val = [], []
    for key in sorted(cells):
        items = sorted(cells[key], key=lambda r: r["text"])
        rng.shuffle(items)
        val += items[:per_cell]
        train += items[per_cell:]
    return train, val


LABELS = tuple(sorted({r["label"] for r in load_rows("train.csv")}))


def y_of(rows: list[dict]) -> np.ndarray:
    return np.array([LABELS.index(r["label"]) for r in rows])


def per_language(rows: list[dict], pred: np.ndarray, min_count: int = 15) -> dict:
    """Accuracy per language (languages with >= min_count texts) and its minimum."""
    y = y_of(rows)
    langs = defaultdict(list)
    for i, r in enumerate(rows):
        langs[r["lang"]].append(i)
    acc = {l: float((pred[ix] == y[ix]).mean()) for l, ix in sorted(langs.items()) if len(ix) >= min_count}
    worst = min(acc, key=acc.get)
    return {"by_lang": {l: round(a, 3) for l, a in acc.items()}, "min_lang": worst, "min_acc": round(acc[worst], 3)}


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> float:
    """Temperature minimising validation NLL (grid + refinement)."""
    def nll(t):
        p = softmax(logits / t)
        return -np.log(p[np.arange(len(y)), y] + 1e-12).mean()
    grid = np.exp(np.linspace(np.log(0.05), np.log(20), 200))
    best = grid[np.argmin([nll(t) for t in grid])]
    fine = np.linspace(best * 0.9, best * 1.1, 41)
    return float(fine[np.argmin([nll(t) for t in fine])])


def calibration(logits: np.ndarray, y: np.ndarray, t: float, threshold: float = 0.9) -> dict:
    """ECE (15 bins) and accuracy/coverage at max-probability >= threshold, after temperature t."""
    p = softmax(logits / t)
    conf, pred = p.max(1), p.argmax(1)
    correct = pred == y
    bins = np.linspace(0, 1, 16)
    ece = 0.0
    for lo, hi in zip(bins[:-1], bins[1:]):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ece += m.mean() * abs(correct[m].mean() - conf[m].mean())
    sel = conf >= threshold
    return {"T": round(t, 3), "ece": round(float(ece), 4), "coverage@0.9": round(float(sel.mean()), 3),
            "acc@0.9": round(float(correct[sel].mean()) if sel.any() else float("nan"), 4)}


class Clock:
    """Wall and CPU seconds (this process and its children)."""

    def __init__(self) -> None:
        self.wall = time.monotonic()
        self.cpu = self._cpu()

    @staticmethod
    def _cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    def read(self) -> dict:
        return {"wall_s": round(time.monotonic() - self.wall, 1), "cpu_s": round(self._cpu() - self.cpu, 1)}


def record(name: str, result: dict) -> None:
    """Append one result line to OUT/results.jsonl (and print it)."""
    OUT.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"name": name, **result}, ensure_ascii=False)
    print(line, flush=True)
    with open(OUT / "results.jsonl", "a", encoding="utf-8") as f:
        f.write(line + "\n")
