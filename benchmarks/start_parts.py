"""Where a cold start goes: the parts of `decide`'s start, each timed on its own (issue 39).

    python3 -m benchmarks.start_parts [--model DIR] [--runs 5]

Times, median of --runs fresh measurements (imports in a new interpreter each run, the rest in
this one): importing numpy + onnxruntime + tokenizers; building the package's tokenizer from its
tokenizer.json; creating each variant's ORT session at the tier's settings; creating it again
from the graph ORT itself optimized (what is left once constant folding is done: the difference
is what folding the shared fp16 weights into int8 costs at every start); the engine's warm-up
(one padded batch per length bucket, on a new session).
Both the tokenizer build and session creation hold the interpreter lock, so they do not overlap
in threads. Prints figures, asserts nothing; the page cache is warm.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runtime.engine.engine import Engine, SessionSettings, session_options
from runtime.package.load import load_package, read_tokenizer
from runtime.platform.appdir import default_model_dir

IMPORTS = "import time; t = time.perf_counter(); import numpy, onnxruntime, tokenizers; print(time.perf_counter() - t)"


def median_of(runs: int, measure) -> float:
    """Median seconds of `runs` calls of `measure` (which returns seconds)."""
    return statistics.median(measure() for _ in range(runs))


def import_seconds() -> float:
    """numpy + onnxruntime + tokenizers imported by a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True)
    return float(out.stdout)


def tokenizer_seconds(tokenizer_json: str) -> float:
    from tokenizers import Tokenizer

    started = time.perf_counter()
    Tokenizer.from_str(tokenizer_json)
    return time.perf_counter() - started


def session_seconds(graph: Path, settings: SessionSettings, optimized_to: Path | None = None) -> float:
    """Seconds to create a session of `graph`; `optimized_to`: also save ORT's optimized graph there."""
    import onnxruntime as ort

    options = session_options(settings)
    if optimized_to is not None:
        options.optimized_model_filepath = str(optimized_to)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         optimized_to.name + ".data")
    started = time.perf_counter()
    ort.InferenceSession(str(graph), sess_options=options, providers=["CPUExecutionProvider"])
    return time.perf_counter() - started


def variant_parts(package, name: str, settings: SessionSettings, runs: int, scratch: Path) -> str:
    """One line: the variant's session creation, the same from ORT's optimized graph, its warm-up."""
    graph = package.path(package.manifest.variants[name].file)
    optimized = scratch / f"{name}.onnx"
    session_seconds(graph, settings, optimized)
    made = median_of(runs, lambda: session_seconds(graph, settings))
    folded = median_of(runs, lambda: session_seconds(optimized, settings))
    warm = median_of(runs, lambda: Engine(package, name, settings).warm_up() / 1000)  # a new session's
    return (f"{name}: session {made:.3f}, from ORT's own optimized graph {folded:.3f} "
            f"(folding at start {made - folded:.3f}), warm-up {warm:.3f}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the embedded package")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    package = load_package(args.model or default_model_dir())
    settings = SessionSettings(threads=args.threads)
    print(f"{package.manifest.name} {package.manifest.version}, {args.threads} intra-op threads, "
          f"median of {args.runs} (seconds)")
    print(f"imports (numpy, onnxruntime, tokenizers): {median_of(args.runs, import_seconds):.3f}")
    tokenizer_json = read_tokenizer(package, True)
    print(f"tokenizer build: {median_of(args.runs, lambda: tokenizer_seconds(tokenizer_json)):.3f}")
    with tempfile.TemporaryDirectory() as scratch:
        for name in package.manifest.variants:
            print(variant_parts(package, name, settings, args.runs, Path(scratch)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
