"""What `python -m models train` costs and makes, from an empty cache (the figures of docs/factory.md).

    python3 benchmarks/factory_cost.py [--data FILE] [--test FILE] [--quick] [--work DIR]

Runs `nice -n 10 /usr/bin/time -v python3 -m models train --data FILE --out DIR` with a fresh
`DECIDE_FACTORY_CACHE` (so the teacher features are computed too), then prints CPU seconds
(user + system: the box may be shared, wall time is the scheduler's), wall time, peak RSS, the
package's files and their `zip -9`, both zips estimated from it (the zip without a model: ~49 MB
x86_64, ~29 MB aarch64, docs/bundle.md), and `python -m models evaluate` on the independent test
set. A second call with --reuse-cache times a rerun with another --out name (the cache hit).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "models" / "tasks" / "machine-alarms"
ZIP_WITHOUT_MODEL_MB = {"x86_64": 49.0, "aarch64": 29.0}


def timed_train(data: Path, out: Path, cache: Path, quick: bool, threads: int | None) -> dict:
    """One training run under /usr/bin/time -v: CPU seconds, wall, peak RSS (and the log's tail)."""
    command = ["nice", "-n", "10", "/usr/bin/time", "-v", sys.executable, "-m", "models", "train",
               "--data", str(data), "--out", str(out)] + (["--quick"] if quick else [])
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "DECIDE_FACTORY_CACHE": str(cache),
                               "HOME": str(cache), **({"DECIDE_FACTORY_THREADS": str(threads)} if threads else {})})
    if done.returncode != 0:
        raise SystemExit(f"train failed ({done.returncode}): {done.stderr[-2000:]}")

    def field(name: str) -> str:
        return re.search(rf"{re.escape(name)}: (.+)", done.stderr).group(1).strip()

    return {"cpu_s": round(float(field("User time (seconds)")) + float(field("System time (seconds)")), 1),
            "wall": field("Elapsed (wall clock) time (h:mm:ss or m:ss)"),
            "peak_rss_gb": round(int(field("Maximum resident set size (kbytes)")) / 1e6, 2)}


def zip9_mb(package: Path) -> float:
    """`zip -9 -r` of the package directory, in MB."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "package.zip"
        subprocess.run(["zip", "-q", "-9", "-r", str(archive), package.name], cwd=package.parent, check=True)
        return archive.stat().st_size / 1e6


def accuracy(package: Path, test: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "models", "evaluate", "--model", str(package), "--data", str(test),
                           "--json", "--latency-runs", "5"], cwd=REPO, capture_output=True, text=True, check=True)
    return {name: round(100 * v["accuracy"], 1) for name, v in json.loads(done.stdout)["variants"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=TASK / "train" / "train.csv")
    parser.add_argument("--test", type=Path, default=TASK / "test" / "test.csv")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--work", type=Path, default=None, help="where the package and the cache go (default: a temp dir)")
    parser.add_argument("--threads", type=int, help="torch threads (DECIDE_FACTORY_THREADS; default: the factory's, "
                        "up to 4). 1 keeps CPU seconds honest on a busy box: waiting threads spin")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="decide-factory-cost-"))
    cache, out = work / "cache", work / ("quick" if args.quick else "default")
    first = timed_train(args.data, out, cache, args.quick, args.threads)
    rerun = timed_train(args.data, work / "renamed", cache, args.quick, args.threads)  # another --out: the cache hits
    files = sum(p.stat().st_size for p in out.iterdir()) / 1e6
    zipped = zip9_mb(out)
    manifest = json.loads((out / "manifest.json").read_text())
    threads = f", {args.threads} torch thread(s)" if args.threads else ""
    print(f"## python -m models train --data {args.data.name}{' --quick' if args.quick else ''}{threads}\n")
    print(f"- fresh cache: {first['cpu_s']} s CPU, {first['wall']} wall, peak RSS {first['peak_rss_gb']} GB")
    print(f"- again with another --out (cache hit): {rerun['cpu_s']} s CPU, {rerun['wall']} wall")
    print(f"- package: {files:.1f} MB of files, zip -9 {zipped:.1f} MB; variants {', '.join(manifest['variants'])}"
          + (f"; left out: {', '.join(manifest['provenance']['rejected_variants'])}"
             if manifest["provenance"]["rejected_variants"] else ""))
    print("- zip with it, estimated: " + ", ".join(f"{arch} {base + zipped:.1f} MB"
                                                   for arch, base in ZIP_WITHOUT_MODEL_MB.items()))
    print(f"- accuracy on {args.test.name} (%): " + ", ".join(f"{k} {v}" for k, v in accuracy(out, args.test).items()))
    print(f"- work dir: {work}")


if __name__ == "__main__":
    main()
