"""decide side by side with what a user would pick instead — same model, same texts, same machine, one run.

Contenders (benchmarks/contenders.py): (a) transformers + PyTorch eager on the package's own
weights (benchmarks/torch_model.py), FP32 and PyTorch's dynamic int8 (quantize_dynamic), each at
every --torch-threads count; (b) a bare ONNX Runtime script on the package's ONNX file (fastembed's
way); (c) the same with every input padded to 128 tokens (julia-1 article §3.1); decide's engine
in-process; decide over stdin/stdout (`python -m runtime`); the frozen binary from
dist/decide-<version>-linux-<arch>.zip. ORT contenders run every variant of the package.
The headline compares FP32 with FP32 and int8 with int8, then across, each time against PyTorch
at its faster thread count for that workload.

Measured: latency p50/p95/p99 and throughput at batch 1/4/16/32 on a short set (≤ 16 tokens) and
a medium set (64–128 tokens); peak RSS; exec → first answer from a cold process; RSS of decide
after warm-up and after 100k requests through stdin. The machine is shared, so every measurement
runs in rounds that alternate the systems (A B C … A B C …, order rotated each round); figures are
medians over rounds and ratios are taken within a round, then the median of those.

    python3 benchmarks/compare.py                      # writes benchmarks/results/compare.{md,png,json}
    python3 benchmarks/compare.py --quick              # a short run for development
    python3 benchmarks/compare.py --systems torch,engine,bare,"decide stdin" --batches 1,32 --leak-requests 0
                                                       # the headline rows only (fits a 3-minute quiet slot)
    python3 benchmarks/compare.py --render benchmarks/results/compare.json   # redraw table + plot only

The contenders are in contenders.py; the headline, the targets, the table and the plot in
compare_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.compare_report import headline, targets
from benchmarks.compare_runs import Entry, cold_starts, slow_leak
from benchmarks.contenders import (
    WireSystem,
    WorkerSystem,
)
from runtime.package.load import Package, load_package, read_golden, sha256_file
from runtime.platform.appdir import DEFAULT_MODEL as DEFAULT_MODEL_DIR
from runtime.serve.service import percentile

REPO = Path(__file__).resolve().parent.parent
SHORT_TOKENS = 16
MEDIUM_TARGETS = (64, 80, 96, 112, 128)  # token targets the medium texts cycle through
DEFAULT_MODEL = REPO / DEFAULT_MODEL_DIR  # the embedded default (runtime/platform/appdir.py)
RESULTS = REPO / "benchmarks" / "results"
CACHE = Path(os.environ.get("DECIDE_COMPARE_CACHE", Path.home() / ".cache" / "decide" / "compare"))
TORCH_NAME = "PyTorch eager"


# ----------------------------------------------------------------------------- texts

def text_sets(package: Package) -> dict[str, list[str]]:
    """short: golden texts of ≤ 16 tokens; medium: golden texts joined to 64–128 tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(package.path(package.manifest.tokenizer)))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    pool = [g["text"] for g in read_golden(package)]
    if not pool:
        raise SystemExit(f"package {package.root} has no golden set to take texts from")
    counts = [len(e.ids) for e in tokenizer.encode_batch(pool)]
    short = [t for t, n in zip(pool, counts) if n <= SHORT_TOKENS]
    limit = package.manifest.max_length
    medium = []
    for start in range(len(pool)):
        target = min(MEDIUM_TARGETS[start % len(MEDIUM_TARGETS)], limit)
        pieces, i = [], start
        while len(tokenizer.encode(" ".join(pieces)).ids) < target:
            pieces.append(pool[i % len(pool)])
            i += 1
        medium.append(" ".join(pieces))
    return {"short": short or [pool[counts.index(min(counts))]], "medium": medium}


def token_stats(package: Package, texts: list[str]) -> dict[str, float]:
    """min/median/max token count (special tokens included, truncated at max length)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(package.path(package.manifest.tokenizer)))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=package.manifest.max_length)
    counts = sorted(len(e.ids) for e in tokenizer.encode_batch(texts))
    return {"count": len(counts), "min": counts[0], "median": statistics.median(counts), "max": counts[-1]}


# ----------------------------------------------------------------------------- contenders

def torch_checkpoint(package: Package) -> tuple[Path | None, str]:
    """The package's model in PyTorch, saved whole for the torch worker.

    Rebuilt from the package's own FP32 graph (benchmarks/torch_model.py), so PyTorch computes
    with exactly the weights decide serves (max |Δp| vs ORT FP32 ~1e-6), and cached as a plain
    `torch.save(model)` + tokenizer.json, so the worker's cold start is what a user's would be.
    Retraining through the factory is no substitute: `python -m models train --recipe` does not give the
    published weights back bit for bit. Returns (folder, "") or (None, why not)."""
    fp32 = package.manifest.variants.get("fp32")
    if fp32 is None:
        return None, "package has no fp32 variant to take the PyTorch weights from"
    key = f"{package.manifest.name}-{package.manifest.version}-{fp32.file.sha256[:12]}"
    folder = CACHE / "torch" / key
    if (folder / "model.pt").is_file():
        return folder, ""
    import torch

    from benchmarks.torch_model import torch_classifier

    try:
        model = torch_classifier(package)
    except (ValueError, KeyError) as exc:
        return None, f"cannot rebuild the PyTorch model from {fp32.file.file}: {exc}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model, folder / "model.pt")
    tokenizer_file = package.path(package.manifest.tokenizer)
    (folder / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    from tokenizers import Tokenizer

    pad_token = Tokenizer.from_file(str(tokenizer_file)).id_to_token(package.manifest.pad_id)
    (folder / "meta.json").write_text(json.dumps({"pad_token": pad_token, "max_length": package.manifest.max_length,
                                                  "weights": f"{fp32.file.file} sha256 {fp32.file.sha256}"}),
                                      encoding="utf-8")
    return folder, ""


def bundle_command(zip_path: Path) -> tuple[list[str], str]:
    """The frozen `decide` unpacked from the bundle zip (cached by checksum), or ([], why not)."""
    if not zip_path.is_file():
        return [], f"no bundle at {zip_path.relative_to(REPO) if zip_path.is_relative_to(REPO) else zip_path} (build it: python3 build.py)"
    target = CACHE / "bundle" / sha256_file(zip_path)[:16]
    binary = target / "decide" / "decide"
    if not binary.is_file():
        target.mkdir(parents=True, exist_ok=True)
        # `unzip` keeps the symlinks PyInstaller ≥ 6 puts in onedir; zipfile would not.
        subprocess.run(["unzip", "-q", "-o", str(zip_path), "-d", str(target)], check=True)
    return [str(binary)], ""


def decide_choice(model: Path) -> dict[str, Any]:
    """`decide info --json`: the CPU flags, tier and variant decide picks on this machine."""
    out = subprocess.run([sys.executable, "-m", "runtime", "info", "--json", "--model", str(model)],
                         cwd=REPO, capture_output=True, check=True)
    return json.loads(out.stdout)


def plan_entries(package: Package, args: argparse.Namespace, checkpoint: tuple[Path | None, str],
                 bundle: tuple[list[str], str], torch_threads: list[int]) -> list[Entry]:
    """Every row: which contender, which variant, or why it is skipped.

    Every variant of the package runs (fp32 and each int8 one, not only decide's pick), and
    PyTorch runs FP32 and its dynamic int8 at each thread count, so each side is at its best."""
    variants = package.manifest.variants
    rejected = package.manifest.provenance.get("rejected_variants", {})
    no_int8 = ("package has no int8 variant"
               + (f" (factory gate rejected {', '.join(sorted(rejected))})" if rejected else ""))
    precisions: list[tuple[str, str | None]] = [(v.precision, name) for name, v in variants.items()]
    if "fp32" not in variants:
        precisions.append(("fp32", None))
    if not any(p == "int8" for p, _ in precisions):
        precisions.append(("int8", None))
    entries = [Entry(TORCH_NAME, precision, precision, "worker", system="torch", skipped=checkpoint[1], threads=t)
               for precision in ("fp32", "int8") for t in torch_threads]
    for name, kind, system, command, skipped in (
        ("bare ORT", "worker", "bare", [], ""),
        ("fixed-128 ORT", "worker", "fixed128", [], ""),
        ("decide in-process", "worker", "engine", [], ""),
        ("decide stdin", "wire", "", [sys.executable, "-m", "runtime"], ""),
        ("decide frozen", "wire", "", bundle[0], bundle[1]),
    ):
        for precision, variant in precisions:
            entries.append(Entry(name, precision, variant or "-", kind, system, command,
                                 skipped or ("" if variant else no_int8 if precision == "int8" else "no fp32 variant")))
    wanted = set(args.systems.split(",")) if args.systems else None
    return [e for e in entries if wanted is None or e.system in wanted or e.name in wanted or e.label in wanted]


def start(entry: Entry, model: Path, threads: int, texts: dict[str, list[str]], texts_file: Path,
          checkpoint: Path | None) -> None:
    """Start the entry's process and wait until it is warm; a failure skips the row with the reason."""
    try:
        if entry.kind == "worker":
            entry.handle = WorkerSystem(entry.system, model, entry.variant if entry.variant != "-" else "fp32",
                                        entry.threads or threads, texts_file,
                                        checkpoint if entry.system == "torch" else None)
        else:
            entry.handle = WireSystem(entry.command, model, entry.variant, texts)
            for kind in texts:  # warm the same shapes the workers warmed
                entry.handle.run(kind, 32, 0.0, 1, 0)
    except (OSError, RuntimeError, TimeoutError, json.JSONDecodeError) as exc:
        entry.skipped = f"failed to start: {exc}"


# ----------------------------------------------------------------------------- measurements

def interleaved(entries: list[Entry], kinds: list[str], batches: list[int], rounds: int,
                seconds: float, min_calls: int) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """Rounds × (text set, batch) × systems, systems alternating and their order rotated per round."""
    live = [e for e in entries if not e.skipped]
    segments: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for round_index in range(rounds):
        order = live[round_index % len(live):] + live[:round_index % len(live)]
        for kind in kinds:
            for batch in batches:
                for entry in order:
                    result = entry.handle.run(kind, batch, seconds, min_calls, offset=round_index * 7)
                    result["round"] = round_index
                    result["load_avg"] = os.getloadavg()[0]
                    segments.setdefault((entry.label, kind, batch), []).append(result)
        print(f"  round {round_index + 1}/{rounds} done, load avg {os.getloadavg()[0]:.1f}", file=sys.stderr)
    return segments


def summarise(segments: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    """Pooled latency percentiles; throughput and CPU ms per item as medians over rounds."""
    pooled = sorted(ms for s in segments for ms in s["ms"])
    per_round = [len(s["ms"]) * batch / s["wall_s"] for s in segments]
    cpu_per_item = [s["cpu_s"] * 1000 / (len(s["ms"]) * batch) for s in segments]
    return {
        "calls": len(pooled),
        "p50_ms": round(percentile(pooled, 0.50), 3),
        "p95_ms": round(percentile(pooled, 0.95), 3),
        "p99_ms": round(percentile(pooled, 0.99), 3),
        "items_per_s": round(statistics.median(per_round), 1),
        "items_per_s_rounds": [round(x, 1) for x in per_round],
        "cpu_ms_per_item": round(statistics.median(cpu_per_item), 3),
    }


def ratio(segments: dict[tuple[str, str, int], list[dict[str, Any]]], a: str, b: str, kind: str,
          batch: int) -> dict[str, Any] | None:
    """Throughput of a over b: per-round ratios (same load), their median; also p50 and CPU ratios."""
    sa, sb = segments.get((a, kind, batch)), segments.get((b, kind, batch))
    if not sa or not sb:
        return None
    per_round = [(len(x["ms"]) / x["wall_s"]) / (len(y["ms"]) / y["wall_s"]) for x, y in zip(sa, sb)]
    p50 = statistics.median([statistics.median(y["ms"]) / statistics.median(x["ms"]) for x, y in zip(sa, sb)])
    cpu_rounds = [(y["cpu_s"] / len(y["ms"])) / (x["cpu_s"] / len(x["ms"])) for x, y in zip(sa, sb) if x["cpu_s"] > 0]
    cpu = statistics.median(cpu_rounds) if cpu_rounds else 0.0
    return {"a": a, "b": b, "texts": kind, "batch": batch, "throughput_ratio": round(statistics.median(per_round), 3),
            "rounds": [round(r, 3) for r in per_round], "p50_ratio": round(p50, 3), "cpu_ratio": round(cpu, 3)}


def agreement(entries: list[Entry], kinds: list[str]) -> dict[str, Any]:
    """Same answers? argmax agreement and max |Δp| of each row against the first FP32 reference."""
    live = [e for e in entries if not e.skipped]
    outputs = {e.label: {k: e.handle.outputs(k) for k in kinds} for e in live}
    reference = next((e.label for e in live if e.precision == "fp32"), None)
    if reference is None:
        return {}
    result: dict[str, Any] = {"reference": reference}
    for label, by_kind in outputs.items():
        same, total, max_dp = 0, 0, 0.0
        for kind in kinds:
            for mine, ref in zip(by_kind[kind], outputs[reference][kind]):
                if not mine:
                    continue
                total += 1
                same += max(range(len(mine)), key=mine.__getitem__) == max(range(len(ref)), key=ref.__getitem__)
                max_dp = max(max_dp, max(abs(x - y) for x, y in zip(mine, ref)))
        result[label] = {"argmax_agree": f"{same}/{total}", "max_abs_dp": round(max_dp, 6)}
    return result


# ----------------------------------------------------------------------------- report

def versions() -> dict[str, str]:
    """Versions of the Python packages the contenders use."""
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "onnxruntime", "numpy", "tokenizers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def arguments() -> argparse.Namespace:
    """The command line (the module docstring is its help)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--bundle", type=Path, default=None,
                        help="bundle zip (default dist/decide-<version>-linux-<arch>.zip)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--batches", default="1,4,16,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="time per system per (texts, batch) per round")
    parser.add_argument("--min-calls", type=int, default=1, help="calls per segment at least (slow cells)")
    parser.add_argument("--threads", type=int, default=None, help="threads of every ORT contender (default: decide's)")
    parser.add_argument("--torch-threads", default="1,2",
                        help="PyTorch intra-op thread counts, one row each (the headline takes the faster per "
                             "workload: on a busy 2-core box 2 OpenMP threads can wait at barriers)")
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--leak-requests", type=int, default=100_000)
    parser.add_argument("--systems", default="", help="comma-separated subset (torch,bare,fixed128,engine, or row names)")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 0.2 s, 1 cold run, 5k leak requests")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="only rewrite the table and plot from a saved compare.json")
    return parser.parse_args()


@dataclass
class Measured:
    """What the interleaved rounds measured, per row label."""

    warm_memory: dict[str, dict[str, int]]
    peak_memory: dict[str, dict[str, int]]
    agreement: dict[str, Any]
    segments: dict[tuple[str, str, int], list[dict[str, Any]]]
    cold: dict[str, Any]


def measure(entries: list[Entry], args: argparse.Namespace, threads: int, texts: dict[str, list[str]],
            batches: list[int], checkpoint: Path | None) -> Measured:
    """Start every system, check that they agree, run the interleaved rounds, then the cold starts."""
    kinds = list(texts)
    with tempfile.TemporaryDirectory(prefix="decide-compare-") as tmp:
        texts_file = Path(tmp) / "texts.json"
        texts_file.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
        for entry in entries:
            if not entry.skipped:
                print(f"  starting {entry.label}", file=sys.stderr)
                start(entry, args.model, threads, texts, texts_file, checkpoint)
        try:
            warm_memory = {e.label: e.handle.memory() for e in entries if not e.skipped}
            agree = agreement(entries, kinds)
            segments = interleaved(entries, kinds, batches, args.rounds, args.seconds, args.min_calls)
            peak_memory = {e.label: e.handle.memory() for e in entries if not e.skipped}
        finally:
            for entry in entries:
                if entry.handle is not None:
                    entry.handle.close()
        print("  cold starts", file=sys.stderr)
        cold = cold_starts(entries, args.model, threads, texts, texts_file, checkpoint, args.cold_runs)
    return Measured(warm_memory, peak_memory, agree, segments, cold)


def leak_run(entries: list[Entry], args: argparse.Namespace, texts: dict[str, list[str]],
             variant: str | None) -> dict[str, Any]:
    """The slow-leak run through stdin: the frozen binary on decide's own variant if it ran, else a wire row."""
    leak_entry = next((e for e in entries if e.kind == "wire" and not e.skipped and e.name == "decide frozen"
                       and e.variant == variant), None) or next(
        (e for e in entries if e.kind == "wire" and not e.skipped), None)
    leak: dict[str, Any] = {"skipped": "no decide stdin row ran" if leak_entry is None else "--leak-requests 0"}
    if leak_entry is not None and args.leak_requests > 0:
        print(f"  {args.leak_requests} requests through stdin of {leak_entry.label}", file=sys.stderr)
        leak = slow_leak(leak_entry, args.model, texts, args.leak_requests)
    return leak


def result_rows(entries: list[Entry], measured: Measured, kinds: list[str], batches: list[int]) -> list[dict[str, Any]]:
    """One report row per system: its settings, memory, cold start, agreement and every cell."""
    rows = []
    for entry in entries:
        row: dict[str, Any] = {"system": entry.label, "name": entry.name, "system_kind": entry.system or entry.kind,
                               "precision": entry.precision, "variant": entry.variant, "skipped": entry.skipped}
        if entry.threads:
            row["threads"] = entry.threads
        if not entry.skipped:
            row["load_s"] = entry.handle.load_s
            row["rss_after_warm_up_kb"] = measured.warm_memory[entry.label]["rss_kb"]
            row["peak_rss_kb"] = measured.peak_memory[entry.label]["peak_rss_kb"]
            row["cold_first_answer"] = measured.cold.get(entry.label)
            row["agreement"] = measured.agreement.get(entry.label)
            row["cells"] = {f"{kind}/{batch}": summarise(measured.segments[(entry.label, kind, batch)], batch)
                            for kind in kinds for batch in batches}
        rows.append(row)
    return rows


def compared_pairs(entries: list[Entry]) -> list[tuple[str, str]]:
    """Every row against every PyTorch row; each row against bare ORT on its variant; int8 against own FP32."""
    live = [e for e in entries if not e.skipped]
    return [(a.label, b.label) for a in live for b in live if a is not b and (
        b.system == "torch" or b.system == "bare" and a.variant == b.variant
        or a.precision == "int8" and b.name == a.name and b.precision == "fp32" and b.threads == a.threads)]


def main() -> int:
    args = arguments()
    if args.render:
        from benchmarks.compare_report import write_results

        for path in write_results(json.loads(args.render.read_text(encoding="utf-8")), args.out,
                                  plot_png=not args.no_plot):
            print(f"wrote {path}", file=sys.stderr)
        return 0
    if args.quick:
        args.rounds, args.seconds, args.cold_runs, args.leak_requests = 2, 0.2, 1, 5000
    args.model = args.model.resolve()
    started = time.perf_counter()
    from runtime.version import __version__

    if not (args.model / "manifest.json").is_file():
        raise SystemExit(f"no model package at {args.model}: build it with `python -m models train --recipe {args.model.name}`")
    package = load_package(args.model)
    info = decide_choice(args.model)
    threads = args.threads or info["cpu"]["usable_cores"]
    bundle_zip = args.bundle or REPO / "dist" / f"decide-{__version__}-linux-{info['cpu']['arch']}.zip"
    texts = text_sets(package)
    batches = [int(b) for b in args.batches.split(",")]
    kinds = list(texts)
    print(f"compare: {package.manifest.name} {package.manifest.version}, {threads} threads, "
          f"load avg {os.getloadavg()[0]:.1f}", file=sys.stderr)

    checkpoint = torch_checkpoint(package) if not args.systems or "torch" in args.systems else (None, "not selected")
    torch_threads = [int(t) for t in args.torch_threads.split(",")]
    entries = plan_entries(package, args, checkpoint, bundle_command(bundle_zip), torch_threads)
    measured = measure(entries, args, threads, texts, batches, checkpoint[0])
    leak = leak_run(entries, args, texts, info["choice"]["variant"])
    report: dict[str, Any] = {
        "model": {"name": package.manifest.name, "version": package.manifest.version, "path": str(args.model),
                  "variants": list(package.manifest.variants), "max_length": package.manifest.max_length},
        "decide_version": __version__, "decide_choice": info["choice"], "tiers_passed":
            [t["name"] for t in info["tiers"] if t["pass"]],
        "cpu": {"arch": info["cpu"]["arch"], "model": cpu_model_name(), "usable_cores": threads,
                "flags": info["cpu"]["flags"], "source": info["cpu"]["source"]},
        "threads": threads, "torch_threads": torch_threads, "versions": versions(),
        "texts": {kind: token_stats(package, texts[kind]) for kind in kinds},
        "settings": {"rounds": args.rounds, "seconds": args.seconds, "batches": batches,
                     "cold_runs": args.cold_runs, "leak_requests": args.leak_requests},
        "rows": result_rows(entries, measured, kinds, batches),
        "ratios": [r for a, b in compared_pairs(entries) for kind in kinds for batch in batches
                   if (r := ratio(measured.segments, a, b, kind, batch)) is not None],
        "agreement_reference": measured.agreement.get("reference"),
        "slow_leak": leak,
        "no_int8": next((e.skipped for e in entries if e.precision == "int8" and e.skipped), ""),
        "load_avg_1min_end": round(os.getloadavg()[0], 2),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "command": " ".join(["python3", "benchmarks/compare.py", *sys.argv[1:]]),
    }
    report["headline"] = headline(report)
    report["targets"] = targets(report)
    report["run_seconds"] = round(time.perf_counter() - started, 1)

    from benchmarks.compare_report import write_results

    paths = write_results(report, args.out, plot_png=not args.no_plot)
    print("\n".join(f"wrote {p}" for p in paths), file=sys.stderr)
    for target in report["targets"]:
        print(f"{target['verdict']:>6}  {target['target']}: {target['measured']} (goal {target['goal']})")
    return 0


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("" if there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("model name", "Model")):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    sys.exit(main())
