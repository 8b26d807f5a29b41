"""decide as a Python library: load a package once, classify lists of texts in your own program.

    python3 examples/library.py "Unter der Hydraulikpresse steht eine Öllache" "hello, anyone there?"
    python3 examples/library.py --model models/packages/machine-alarms --min-score 0.6 "..."

Needs the runtime's Python packages (requirements.txt) and this checkout (or the installed
decide-classifier) on the path. The answers are the protocol's: `label` is the decision (None when
the model abstains, with `reason`), `leaning` and `score` what it leans to. See docs/scoring.md.
"""

from __future__ import annotations

import argparse

from runtime import Classifier


def main() -> int:
    parser = argparse.ArgumentParser(description="Classify texts with decide's library API.")
    parser.add_argument("texts", nargs="+")
    parser.add_argument("--model", default=None, help="model package directory (default: the embedded one)")
    parser.add_argument("--min-score", type=float, default=None, help="abstain below this calibrated score")
    args = parser.parse_args()

    # Probes the CPU, picks tier and variant, verifies the package, then loads it warm.
    classifier = Classifier.load(args.model, min_score=args.min_score)
    print(f"# {classifier.describe()['model']['name']}, variant {classifier.variant}")
    for text, answer in zip(args.texts, classifier.classify(args.texts)):
        decision = answer.label or f"(abstained: {answer.reason})"
        print(f"{decision}\t{answer.leaning} {answer.score:.3f}\t{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
