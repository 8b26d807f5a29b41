"""Shared helpers of the machine-alarms model experiments (not product code).

Validation split: 3 of the 14 texts of every (label, language) cell of train.csv (480 rows), fixed seed.
test.csv is only scored for the final candidates (the caller asks for it explicitly). Results and
saved features go to OUT: $DECIDE_RESEARCH_DIR, else research/ in the factory cache.
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

from models.cache import cache_dir
from models.gate.calibration import expected_calibration_error, softmax_t
from models.training.distill import fit_linear

TASK = Path(__file__).resolve().parents[1] / "tasks" / "machine-alarms"
OUT = Path(os.environ.get("DECIDE_RESEARCH_DIR") or cache_dir() / "research")
FILES = {"train.csv": TASK / "train" / "train.csv", "test.csv": TASK / "test" / "test.csv"}


def load_rows(name: str) -> list[dict]:
    """Rows of a task file: "train.csv", "test.csv", or a path."""
    with open(FILES.get(name, name), encoding="utf-8") as f:
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


def calibration(logits: np.ndarray, y: np.ndarray, t: float, threshold: float = 0.9) -> dict:
    """ECE (15 bins) and accuracy/coverage at max-probability >= threshold, after temperature t."""
    p = softmax_t(logits, t)
    conf, correct = p.max(1), p.argmax(1) == y
    sel = conf >= threshold
    return {"T": round(t, 3), "ece": round(expected_calibration_error(p, y), 4),
            "coverage@0.9": round(float(sel.mean()), 3),
            "acc@0.9": round(float(correct[sel].mean()) if sel.any() else float("nan"), 4)}


def logistic_regression(x: np.ndarray, y: np.ndarray, evaluate: list[np.ndarray], reg: float = 1e-4) -> list[np.ndarray]:
    """models.training.distill.fit_linear on (x, y); the logits it gives each array of `evaluate`."""
    weight, bias = fit_linear(x.astype(np.float32), y, len(LABELS), reg)
    return [e @ weight.T + bias for e in evaluate]


def layer_means(model, tokenizer, texts: list[str], prefix: str = "query: ") -> np.ndarray:
    """L2-normalised masked mean of every layer's hidden states of `prefix + text`: [texts, layers, hidden]."""
    import torch

    from models.training.classifier import masked_mean
    from models.training.loops import pad_tensors, sorted_batches

    seqs = [e.ids for e in tokenizer.encode_batch([prefix + t for t in texts])]
    out = np.zeros((len(texts), model.config.num_hidden_layers, model.config.hidden_size), dtype=np.float32)
    with torch.no_grad():
        for index in sorted_batches(seqs, 64):
            ids, mask = pad_tensors([seqs[i] for i in index], tokenizer.token_to_id("<pad>"))
            states = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[1:]
            means = torch.stack([masked_mean(h, mask) for h in states], 1)
            out[index] = torch.nn.functional.normalize(means, dim=-1).numpy()
    return out


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
