"""Batch-1 latency of two model packages on the same texts: is a new default as fast as the old one?

    python3 -m benchmarks.latency_pair --baseline /tmp/topics-multilingual --candidate models/packages/machine-alarms \
        --texts models/tasks/machine-alarms/test/test.csv

Each package runs the variant the launcher picks on this CPU (or --variant NAME for both), one
intra-op thread and one worker unless --threads says otherwise, through runtime.engine.engine.Engine (its
own tokenizer included, as `decide` answers one line). Rounds alternate between the two packages
so that other load on the box hits both alike; every text of the file is timed once per round.
Prints median and p90 per package and the candidate / baseline ratio of the medians.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

from benchmarks.load import load_texts
from runtime.engine.engine import Engine, SessionSettings
from runtime.package.load import load_package
from runtime.serve.service import percentile


def chosen_variant(package) -> str:
    """The variant the launcher would pick for this CPU."""
    from runtime.platform.appdir import find_data_dir
    from runtime.platform.cpu import probe
    from runtime.platform.tiers import load_platform, select

    features = probe()
    return select(features, load_platform(find_data_dir("platforms"), features.arch), package.manifest.variants.keys()).variant


def read_texts(path: Path) -> list[str]:
    """The text column of a CSV file, or the "text" field of JSON lines (benchmarks/load.py's reader)."""
    if path.suffix == ".jsonl":
        return load_texts(path)
    with open(path, encoding="utf-8", newline="") as fh:
        return [row["text"] for row in csv.DictReader(fh)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--candidate", type=Path, required=True)
    parser.add_argument("--texts", type=Path, required=True, help="CSV with a text column, or JSON lines")
    parser.add_argument("--variant", help="this variant in both packages (default: the launcher's choice)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    texts = read_texts(args.texts)
    engines = {}
    for role, path in (("baseline", args.baseline), ("candidate", args.candidate)):
        package = load_package(path)
        variant = args.variant or chosen_variant(package)
        engine = Engine(package, variant, SessionSettings(threads=args.threads, workers=1))
        engine.warm_up()
        engines[role] = engine
    times: dict[str, list[float]] = {role: [] for role in engines}
    for _ in range(args.rounds):
        for role, engine in engines.items():
            for text in texts:
                start = time.perf_counter()
                engine.classify([text])
                times[role].append((time.perf_counter() - start) * 1000)
    medians = {}
    for role, engine in engines.items():
        ordered = sorted(times[role])
        medians[role] = statistics.median(ordered)
        manifest = engine.package.manifest
        tokens = statistics.mean(len(e.ids) for e in engine.encoder.tokenize(texts))
        print(f"{role:9} {manifest.name} {manifest.version} {engine.variant.name:10} mean {tokens:.1f} tokens: "
              f"median {medians[role]:.3f} ms, p90 {percentile(ordered, 0.9):.3f} ms ({len(ordered)} calls)")
    print(f"candidate / baseline (medians): {medians['candidate'] / medians['baseline']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
