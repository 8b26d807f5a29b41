"""Figures behind the engine's batching constants (runtime/engine/batching.py, runtime/engine/text.py):

1. the fixed cost of one session.run in token rows: batch 1 against batch 32 at the same length;
2. the golden texts (×8) through the engine with the default buckets and the planner, against
   the coarser buckets of 0.1.0 (8, 12, 16, 24, 32, 48, 64, 96, 128), in CPU ms per text;
3. random batches of 16 golden texts (what 16 socket clients make) against one text at a time,
   in wall ms per text: the engine's own ceiling for the socket service's 16-client figure.

    python3 benchmarks/batch_plan.py [--model DIR] [--variant int8-u8u8] [--rounds 6]

CPU time (process_time, all threads) is used: it is what load from other processes distorts least.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from runtime.engine.batching import DEFAULT_BUCKETS
from runtime.engine.engine import Engine, EngineLimits, SessionSettings
from runtime.engine.text import Encoded
from runtime.package.load import load_package, read_golden
from runtime.platform.appdir import DEFAULT_MODEL as DEFAULT_MODEL_DIR

REPO = Path(__file__).resolve().parent.parent

COARSE_BUCKETS = (8, 12, 16, 24, 32, 48, 64, 96, 128)


def cpu_ms(call, repeats: int, rounds: int) -> float:
    """Median CPU milliseconds of one call."""
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(repeats):
            call()
        samples.append((time.process_time() - start) * 1000 / repeats)
    return statistics.median(samples)


def call_cost(engine: Engine, rounds: int) -> None:
    """Figure 1."""
    print("length  batch-1 ms  batch-32 ms/row  fixed cost of a call (token rows)")
    for length in (4, 8, 16, 32):
        item = Encoded((5,) * length, False)
        one = cpu_ms(partial(engine.run_padded, [item], length), 10, rounds)
        row = cpu_ms(partial(engine.run_padded, [item] * 32, length), 1, rounds) / 32
        print(f"{length:6d}  {one:10.3f}  {row:15.3f}  {(one - row) / row * length:8.1f}")


def bucket_choice(model: Path, variant: str, threads: int, rounds: int) -> None:
    """Figure 2, the two settings interleaved round by round."""
    package = load_package(model)
    texts = [g["text"] for g in read_golden(package)] * 8
    engines = {name: Engine(package, variant, SessionSettings(threads=threads), EngineLimits(buckets=buckets))
               for name, buckets in (("coarse 0.1.0", COARSE_BUCKETS), ("default", DEFAULT_BUCKETS))}
    samples: dict[str, list[float]] = {name: [] for name in engines}
    for engine in engines.values():
        engine.warm_up()
        engine.classify(texts)
    for _ in range(rounds):
        for name, engine in engines.items():
            start = time.process_time()
            engine.classify(texts)
            samples[name].append((time.process_time() - start) * 1000 / len(texts))
    for name, values in samples.items():
        print(f"{name:13s} buckets: {statistics.median(values):.3f} CPU ms/text (median of {rounds}), "
              f"min {min(values):.3f}")


def batches_of_16(engine: Engine, texts: list[str], rounds: int) -> None:
    """Figure 3: throughput is wall time, so wall time here."""
    rng = random.Random(3)
    batches = [[texts[rng.randrange(len(texts))] for _ in range(16)] for _ in range(20)]
    n = 16 * len(batches)
    one, sixteen = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for batch in batches:
            for text in batch:
                engine.classify([text])
        one.append((time.perf_counter() - start) * 1000 / n)
        start = time.perf_counter()
        for batch in batches:
            engine.classify(batch)
        sixteen.append((time.perf_counter() - start) * 1000 / n)
    a, b = statistics.median(one), statistics.median(sixteen)
    print(f"random batches of 16: {b:.3f} wall ms/text (≤ {1000 / b:.0f} texts/s) vs one at a time {a:.3f} → {a / b:.2f}×")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / DEFAULT_MODEL_DIR)
    parser.add_argument("--variant", default="int8-u8u8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None, help="concurrent batches (default: --threads, as decide)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    workers = args.workers or args.threads
    engine = Engine(load_package(args.model), args.variant, SessionSettings(threads=args.threads, workers=workers))
    engine.warm_up()
    call_cost(engine, args.rounds)
    batches_of_16(engine, [g["text"] for g in read_golden(engine.package)], args.rounds)
    bucket_choice(args.model, args.variant, args.threads, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
