"""The full emulated CPU matrix of the zips of this tree, as one table.

    python3 benchmarks/matrix.py --arch all --fresh   # build both zips from this commit, then
                                                      # every x86_64 and aarch64 model (as root)
    python3 benchmarks/matrix.py                      # same with the zips of this tree if built
    python3 benchmarks/matrix.py --arch x86_64 --cpu Nehalem --cpu Penryn
    python3 benchmarks/matrix.py --json matrix.json   # also write the rows as JSON
    python3 benchmarks/matrix.py --arch aarch64 --variant fp32   # FP32 kernels on every model
    python3 benchmarks/matrix.py --arch aarch64 --speed 8 --no-cells  # int8 vs FP32 CPU per text

The zips are the ones whose build manifest names this commit and inputs digest (dist/ or the
build cache; bundle_spec.matrix.zip_for_tree), never merely the newest; `--fresh` rebuilds them
first (build times: README, "The bundle"), `--zip` names one explicitly.
For each CPU model the frozen bundle runs under qemu-user (bundle_spec/matrix.py, qemu_user.py): `decide info --json` (flags, tier, variant),
`decide selftest --json`, then a few golden texts through `decide` on stdin, compared with the
native FP32 reference probabilities within the tolerance the manifest records for the variant.
A row for the host itself (no emulation) comes first. Exit status 1 if any cell failed (SIGILL,
traceback, selftest failure, |Δp| over tolerance, or a refusal that is not exit 3 + one line).

Emulation is 100-500x slower than native: expect minutes per cell; timings are not speeds.
`--speed N` is a sanity check only: CPU time per text of every variant on every emulated model
(N golden texts minus one, one text per model call, one thread), i.e. how TCG executes each
kernel, not how the real CPU would.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from dataclasses import asdict
from pathlib import Path

from bundle_spec import matrix as emulation
from bundle_spec.common import REPO
from bundle_spec.qemu_user import ensure_qemu, run_emulated
from runtime.platform.appdir import DEFAULT_MODEL


def cpu_seconds(bundle: emulation.Bundle, cpu: str, variant: str, texts: list[str]) -> float:
    """CPU time (all processes, user + system) of serving `texts` one per call on an emulated CPU."""
    models = emulation.X86_CPU_MODELS if bundle.arch == "x86_64" else emulation.ARM_CPU_MODELS
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = run_emulated(
        [str(bundle.executable), "--variant", variant, "--threads", "1", "--max-batch", "1", "-q"],
        bundle.arch, models[cpu], ld_prefix=bundle.libc_root, input=lines, timeout=emulation.EMULATED_TIMEOUT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or len(done.stdout.splitlines()) != len(texts):
        raise RuntimeError(f"{cpu} {variant}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def speed_table(bundle: emulation.Bundle, cpus: list[str], count: int) -> str:
    """Emulated CPU ms per text for every variant and CPU model; start-up cancels out (N − 1 texts)."""
    texts, _, _ = emulation.golden_requests(bundle.model_dir, count)
    variants = list(json.loads((bundle.model_dir / "manifest.json").read_text())["variants"])
    rows = [("CPU model", *(f"{v} ms/text" for v in variants))]
    for cpu in cpus:
        per_text = [(cpu_seconds(bundle, cpu, v, texts) - cpu_seconds(bundle, cpu, v, texts[:1]))
                    * 1000 / (len(texts) - 1) for v in variants]
        rows.append((cpu, *(f"{ms:.0f}" for ms in per_text)))
        print(f"[matrix] speed {cpu}: {rows[-1][1:]}", file=sys.stderr)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows)


def zip_of_this_tree(arch: str, model: Path, fresh: bool) -> Path | None:
    """The zip built from this commit and inputs; built first with `fresh` (None: say why)."""
    log = REPO / "build" / f"matrix-build-{arch}.log"
    if fresh:
        print(f"[matrix] {arch}: building the zip of this commit (log: {log})", file=sys.stderr)
    try:
        if fresh or os.geteuid() == 0:
            return emulation.zip_for_tree(arch, model, log, rebuild=fresh)
        raise emulation.BundleUnavailable("building one needs root")
    except emulation.BundleUnavailable as exc:
        print(f"[matrix] {arch}: no zip of this tree ({exc}); run with --fresh as root", file=sys.stderr)
        return None


def main(arguments: list[str] | None = None) -> int:
    """Run the chosen cells and print the table; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=("x86_64", "aarch64", "all"), default="all")
    parser.add_argument("--cpu", action="append", help="CPU model(s) to run (default: all)")
    parser.add_argument("--requests", type=int, default=4, help="golden texts sent per cell")
    parser.add_argument("--variant", help="force this model variant in every cell (default: the tier's)")
    parser.add_argument("--no-native", action="store_true", help="skip the native host row")
    parser.add_argument("--speed", type=int, metavar="N",
                        help="also print emulated CPU ms per text of each variant (N golden texts)")
    parser.add_argument("--no-cells", action="store_true", help="with --speed: skip the matrix cells")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("--fresh", action="store_true",
                        help="build the zips from this commit first (build.py, as root), even if built")
    parser.add_argument("--zip", type=Path, help="run this zip instead (with one --arch)")
    parser.add_argument("--model", type=Path, default=REPO / DEFAULT_MODEL, help="model the zips embed")
    args = parser.parse_args(arguments)

    ensure_qemu()
    arches = ("x86_64", "aarch64") if args.arch == "all" else (args.arch,)
    cells: list[emulation.CellResult] = []
    speeds: list[str] = []
    for arch in arches:
        zip_path = args.zip or zip_of_this_tree(arch, args.model, args.fresh)
        if zip_path is None:
            continue
        bundle = emulation.unpack_bundle(zip_path, arch)
        size_mb = zip_path.stat().st_size / 1e6
        print(f"[matrix] {arch}: {zip_path.name} ({size_mb:.1f} MB)", file=sys.stderr)
        models = emulation.X86_CPU_MODELS if arch == "x86_64" else emulation.ARM_CPU_MODELS
        chosen = [name for name in models if not args.cpu or name in args.cpu]
        if args.speed:
            speeds.append(f"{arch}, emulated CPU ms per text (not real speed):\n"
                          + speed_table(bundle, chosen, args.speed))
        if args.no_cells:
            continue
        if arch == "x86_64" and not args.no_native:
            cells.append(emulation.run_cell(bundle, "native", args.requests, emulate=False,
                                            variant=args.variant))
            print(emulation.format_table(cells[-1:]), file=sys.stderr)
        for name in chosen:
            cells.append(emulation.run_cell(bundle, name, args.requests, variant=args.variant))
            print(emulation.format_table(cells[-1:]).splitlines()[-1], file=sys.stderr)
    for table in speeds:
        print(table + "\n")
    if not cells and not speeds:
        print("[matrix] nothing to run: build a zip first", file=sys.stderr)
        return 2
    if cells:
        print(emulation.format_table(cells))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=2))
    return 0 if all(c.ok for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
