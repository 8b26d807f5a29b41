"""How far each variant's golden outputs move between CPU kernel families (sets `expected_tolerance`).

Runs the selftest's golden batches (each text alone; all texts in one call) through the runtime
engine, without warm-up, and prints max |Δp| against the variant's own expected outputs stored in
golden.jsonl (computed on the factory's CPU). Run it natively and under qemu-user on older x86
CPU models (SSE4.2, AVX, AVX2 kernels of MLAS), e.g.:

    python3 benchmarks/kernel_spread.py [--model DIR]
    python3 bundle_spec/qemu_user.py run --arch x86_64 --cpu Haswell -- python3 benchmarks/kernel_spread.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from runtime.engine.engine import Engine
from runtime.package.load import load_package, read_golden
from runtime.platform.appdir import DEFAULT_MODEL


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=REPO / DEFAULT_MODEL)
    parser.add_argument("--variants", nargs="*")
    args = parser.parse_args()
    package = load_package(args.model)
    golden = read_golden(package)
    texts = [g["text"] for g in golden]
    report = {}
    for name in args.variants or list(package.manifest.variants):
        engine = Engine(package, name, verify=False)
        runs = {"alone": [engine.classify([t])[0] for t in texts], "batched": engine.classify(texts)}
        worst = max(abs(p - q) for run, results in runs.items() for r, g in zip(results, golden)
                    for p, q in zip(r.probs, g["expected"][name][run]))
        labels = sum(r.label == g["label"] for results in runs.values() for r, g in zip(results, golden))
        report[name] = {"max_abs_dp_vs_expected": worst, "labels_ok": f"{labels}/{2 * len(golden)}"}
        print(json.dumps({name: report[name]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
