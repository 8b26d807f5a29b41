"""How a package's "not my case" decision depends on its rule, per writing style (issue 34).

    python -m models.research.flag_rules PACKAGE [--variant fp32] [--files test]

Every text of the validation files (dev/) goes once through the runtime's engine; the script
then applies decision rules to the stored answers and prints, per rule, what it flags: cases
(overall, per style, worst style), out of scope, resolved, noise. The rules:

- `argmax`: the package's own (a negative label on top, or novelty above its threshold);
- `margin m`: a negative label flags only when log p(negative) − log p(best case) > m;
- novelty thresholds at a quantile of the validation cases' novelty, overall or per length band.

`--files test` scores the held-out files with the rules as chosen (for the record, never to choose).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from models.research.harness import TASK

DEV = sorted((TASK / "dev").glob("*.csv"))
TEST = [TASK / "test" / n for n in ("cases-a.csv", "cases-b.csv", "noncases.csv", "noise.csv", "unreadable.csv",
                                    "styles-a.csv", "styles-b.csv")]
MARGINS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
QUANTILES = (0.98, 0.99, 0.995, 1.0)
BANDS = (8, 16, 32)  # token-length bands for per-band novelty thresholds


def answers(package: Path, variant: str, files: list[Path]) -> tuple[list, list, list]:
    """(examples, engine results, token counts) for every row of the files."""
    from models.data.userdata import join_loaded, read_labelled_file
    from runtime.engine.engine import Engine, SessionSettings
    from runtime.package.load import load_package

    data = join_loaded([read_labelled_file(f, for_training=False) for f in files])
    engine = Engine(load_package(package), variant, SessionSettings(threads=2))
    texts = [e.text for e in data.examples]
    results = []
    for start in range(0, len(texts), 64):
        results += engine.classify(texts[start:start + 64])
    return data.examples, results, [len(item.ids) for item in engine.encoder.tokenize(texts)]


def band(tokens: int) -> int:
    return next((i for i, edge in enumerate(BANDS) if tokens <= edge), len(BANDS))


class Table:
    """The stored answers as arrays, with the rules applied to them."""

    def __init__(self, package: Path, variant: str, examples: list, results: list, tokens: list):
        from runtime.package.manifest import read_manifest

        manifest = read_manifest(__import__("json").loads((package / "manifest.json").read_text()))
        self.policy = manifest.abstention_policy(variant)
        labels = list(self.policy.labels)
        self.cases = list(self.policy.case_indices)
        self.negatives = [i for i, label in enumerate(labels) if label in self.policy.negative_labels]
        self.probs = np.array([r.probs for r in results], dtype=np.float64)
        self.novelty = np.array([r.novelty if r.novelty is not None else 0.0 for r in results])
        self.unreadable = np.array([r.unknown_share > self.policy.max_unknown_share for r in results])
        self.bands = np.array([band(t) for t in tokens])
        self.kind = np.array([e.kind or "case" for e in examples])
        self.style = np.array([e.style for e in examples])
        self.language = np.array([e.language for e in examples])
        truth = [labels.index(e.label) if e.label else -1 for e in examples]
        self.truth = np.array(truth)
        best = self.probs[:, self.cases].argmax(1)
        self.leaning = np.array(self.cases)[best]
        self.best_case = self.probs[np.arange(len(results)), self.leaning]
        self.negative = self.probs[:, self.negatives].max(1) if self.negatives else np.zeros(len(results))

    def flags(self, margin: float | None, threshold: dict[int, float] | float | None) -> np.ndarray:
        """Which texts the rule flags (margin None = argmax; threshold one number or one per band)."""
        if margin is None:
            by_class = np.isin(self.probs.argmax(1), self.negatives)
        else:
            by_class = np.log(np.maximum(self.negative, 1e-12)) - np.log(np.maximum(self.best_case, 1e-12)) > margin
        if threshold is None:
            novel = np.zeros(len(self.probs), bool)
        elif isinstance(threshold, dict):
            novel = self.novelty > np.array([threshold.get(b, math.inf) for b in self.bands])
        else:
            novel = self.novelty > threshold
        return self.unreadable | by_class | novel

    def novelty_thresholds(self, quantile: float, per_band: bool) -> dict[int, float] | float:
        """Thresholds at `quantile` of this table's cases' novelty (choose them on validation)."""
        cases = self.kind == "case"
        if not per_band:
            return float(np.quantile(self.novelty[cases], quantile)) if quantile < 1 else math.inf
        out = {}
        for b in set(self.bands.tolist()):
            chosen = cases & (self.bands == b)
            out[b] = float(np.quantile(self.novelty[chosen], quantile)) if chosen.sum() >= 20 and quantile < 1 \
                else math.inf
        return out

    def figures(self, flagged: np.ndarray) -> dict:
        """Flag rates per kind and per style (cases), leaning accuracy of cases."""
        cases = self.kind == "case"
        row = {"cases_flagged": flagged[cases].mean(), "leaning": (self.leaning == self.truth)[cases].mean()}
        for kind in ("out_of_scope", "resolved", "noise"):
            chosen = self.kind == kind
            if chosen.any():
                row[kind] = flagged[chosen].mean()
        styles = defaultdict(float)
        for style in sorted(set(self.style[cases]) - {""}):
            chosen = cases & (self.style == style)
            styles[style] = flagged[chosen].mean()
        row["styles"] = dict(styles)
        row["worst_style"] = max(styles.values()) if styles else None
        return row


def show(name: str, row: dict) -> str:
    pct = lambda v: "  –  " if v is None else f"{100 * v:5.1f}"
    styles = " ".join(f"{k[:5]} {pct(v)}" for k, v in row["styles"].items())
    return (f"{name:28s} cases {pct(row['cases_flagged'])} worst {pct(row['worst_style'])} | oos "
            f"{pct(row.get('out_of_scope'))} res {pct(row.get('resolved'))} noise {pct(row.get('noise'))} | {styles}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package", type=Path)
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--files", choices=("dev", "test"), default="dev")
    args = parser.parse_args()
    dev = Table(args.package, args.variant, *answers(args.package, args.variant, DEV))
    shown = dev if args.files == "dev" else Table(args.package, args.variant,
                                                   *answers(args.package, args.variant, TEST))
    print(show("package's own rule", shown.figures(shown.flags(None, shown.policy.novelty_threshold))))
    for per_band in (False, True):
        for quantile in QUANTILES:
            threshold = dev.novelty_thresholds(quantile, per_band)  # always chosen on validation
            for margin in MARGINS:
                name = f"m {margin:.1f} q {quantile}{' band' if per_band else ''}"
                print(show(name, shown.figures(shown.flags(margin, threshold))))


if __name__ == "__main__":
    main()
