#!/usr/bin/env python3
"""Cold start of the frozen binary: process start → first answer line, median of N runs.

    python3 bundle_spec/coldstart.py build/x86_64/decide            # unpacked bundle folder
    python3 bundle_spec/coldstart.py build/x86_64/decide --drop-caches   # also empty the page cache (root)

Each run starts a new `decide` process, writes one request line and stops the clock when the
answer line arrives (model load, warm-up and the first inference included). Prints figures, asserts
nothing. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def drop_page_cache() -> None:
    """Write back and drop the page cache, so the binary and model are read from disk again."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def time_to_first_answer(binary: Path, request: str) -> float:
    """Seconds from starting `binary` to reading its answer to `request`."""
    started = time.perf_counter()
    process = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(request + "\n")
    process.stdin.flush()
    answer = process.stdout.readline()
    elapsed = time.perf_counter() - started
    process.stdin.close()
    process.wait(timeout=60)
    if "label" not in json.loads(answer):
        raise SystemExit(f"unexpected answer: {answer!r}")
    return elapsed


def main(argv: list[str]) -> int:
    """Measure and print; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="the unpacked bundle folder (holds ./decide)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before each run")
    parser.add_argument("--text", default="Der Server antwortet nicht mehr, bitte neu starten.")
    args = parser.parse_args(argv)
    request = json.dumps({"id": 1, "text": args.text}, ensure_ascii=False)
    times = []
    for run in range(args.runs):
        if args.drop_caches:
            drop_page_cache()
        times.append(time_to_first_answer(args.bundle / "decide", request))
        print(f"run {run + 1}: {times[-1]:.3f} s", flush=True)
    caches = "page cache dropped" if args.drop_caches else "page cache warm"
    print(f"cold start to first answer ({caches}): median {statistics.median(times):.3f} s "
          f"of {args.runs} (min {min(times):.3f}, max {max(times):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
