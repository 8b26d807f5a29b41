"""Where the time of one model call goes: ONNX Runtime's own profiler, summed per operator type.

Used to explain the int8-vs-FP32 ratio (which operators int8 speeds up, which it adds, which it
leaves alone) for the texts benchmarks/compare.py uses. Runs each variant on the same texts at one
batch size and prints microseconds per call by operator type, side by side.

    python3 benchmarks/op_profile.py [--model DIR] [--texts short|medium] [--batch 1] [--calls 30]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks.compare import DEFAULT_MODEL, text_sets
from runtime.package.load import load_package

REPO = Path(__file__).resolve().parent.parent

def op_times_us(model: Path, variant: str, texts: list[str], batch: int, calls: int, threads: int) -> dict[str, float]:
    """Mean microseconds per call spent in each operator type (ORT profiler, after one warm-up call)."""
    import onnxruntime as ort

    from runtime.engine.engine import Engine, SessionSettings, session_options

    engine = Engine(load_package(model), variant, SessionSettings(threads=threads), verify=False)
    options = session_options(engine.settings)
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = os.path.join(tmp, "ort")
        session = ort.InferenceSession(str(engine.package.path(engine.variant.file)), options,
                                       providers=["CPUExecutionProvider"])
        engine.session = session  # the engine's padding and batching, the profiled session
        encoded = engine.encoder.tokenize(texts)
        chunks = [[encoded[(i * batch + k) % len(encoded)] for k in range(batch)] for i in range(calls + 1)]
        for chunk in chunks:
            engine.classify_encoded(chunk)
        events = json.loads(Path(session.end_profiling()).read_text())
    totals: dict[str, float] = defaultdict(float)
    runs = 0
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            runs += 1
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            totals[event["args"]["op_name"]] += event["dur"]
    # drop the warm-up call's share by averaging over all runs (the first run is one of calls + 1)
    return {op: us / max(runs, 1) for op, us in totals.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--texts", choices=("short", "medium"), default="medium")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    package = load_package(args.model)
    texts = text_sets(package)[args.texts]
    variants = list(package.manifest.variants)
    times = {v: op_times_us(args.model, v, texts, args.batch, args.calls, args.threads) for v in variants}
    ops = sorted({op for t in times.values() for op in t}, key=lambda op: -max(t.get(op, 0) for t in times.values()))
    print(f"{package.manifest.name} {package.manifest.version}, {args.texts} texts, batch {args.batch}, "
          f"{args.threads} threads: µs per call by operator type (ORT profiler)")
    print(f"{'operator':<28}" + "".join(f"{v:>14}" for v in variants))
    for op in ops:
        print(f"{op:<28}" + "".join(f"{times[v].get(op, 0):>14.0f}" for v in variants))
    print(f"{'total':<28}" + "".join(f"{sum(times[v].values()):>14.0f}" for v in variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
