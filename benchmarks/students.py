"""Student shapes side by side on machine-alarms (issue 27): today's 4-layer transformer student, the
conv-attention hybrids (models/training/hybrid.py) and a 2-layer transformer, each with both heads
(mean features → linear; Julia-1's [CLS] ⊕ mean ⊕ max → 2-layer MLP, models/training/heads.py).

    nice -n 10 env DECIDE_FACTORY_THREADS=2 python3 benchmarks/students.py build [--out DIR] [--only NAME ...]
    python3 benchmarks/students.py table [--packages DIR] [--rounds 7] [--calls 20] [--json FILE]

build: one package per candidate and head in DIR (default /tmp/decide-students), each through
  models.train.train_package (the factory's one path: train → publish) with the machine-alarms recipe, the training files of models/tasks/machine-
  alarms/train/ that hold its eight case labels (the recipe's + languages-a.csv + languages-b.csv),
  the candidate's student_arch / student_layers, the head, and the variants fp32, int8-u8u8,
  int8-u8s8, int8-u8s7 (publish makes those this machine's CPU tier serves). Both heads of a candidate
  share one distilled encoder (its checkpoint is head-independent). --reduced trains on a subset
  (train_subset 1500, 1 distillation epoch, no augmented copies): quicker, not the real figures.
  Prints the CPU seconds (user + sys) of every build.
table: every package of DIR on this CPU, one process, numbers from runtime.engine.engine.Engine:
  accuracy on the held-out in-scope cases (test/cases-a.csv + cases-b.csv) and on their part in
  languages no training file has; dev accuracy (dev/dev.csv cases: what settings were chosen on);
  int8 determinism (label changes, text alone vs in one classify call with all the others);
  size of one variant (graph + shared data + tokenizer); batch-1 latency at 8, 32, 64 and 128
  tokens and bulk throughput at batch 32 (held-out texts) with 1 and 2 intra-op threads.
  Timing is interleaved: every round runs every (package, variant, threads) once, in an order
  rotated per round; the figures are medians over all calls of all rounds. One run. Variants a
  package lacks (not made on this CPU's tier, or rejected by the gate) are re-made from its FP32
  graph for timing and scoring only, and marked. --variants limits the table to some variants.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TASK = REPO / "models" / "tasks" / "machine-alarms"
HELD_OUT = ("test/cases-a.csv", "test/cases-b.csv")
DEV = "dev/dev.csv"
EXTRA_TRAIN = ("models/tasks/machine-alarms/train/languages-a.csv", "models/tasks/machine-alarms/train/languages-b.csv")
DEFAULT_OUT = Path("/tmp/decide-students")
VARIANTS = ["fp32", "int8-u8u8", "int8-u8s8", "int8-u8s7"]
HEADS = ("mean-linear", "pooled-mlp")
LENGTHS = (8, 32, 64, 128)
BULK = 32
# candidate → recipe keys on top of machine-alarms (transformer-4 is today's student)
CANDIDATES = {
    "transformer-4": {"student_layers": [0, 4, 8, 11]},
    "transformer-2": {"student_layers": [0, 11]},
    "hybrid-3c1a": {"student_layers": None,
                    "student_arch": {"kind": "hybrid", "conv_layers": 3, "attention_layers": 1}},
    "hybrid-2c2a": {"student_layers": None,
                    "student_arch": {"kind": "hybrid", "conv_layers": 2, "attention_layers": 2}},
    "hybrid-3c1a-gated": {"student_layers": None,
                          "student_arch": {"kind": "hybrid", "conv_layers": 3, "attention_layers": 1,
                                           "fusion": "gated"}},
}
BASELINE = "transformer-4-mean-linear"


# --reduced: fewer training rows and one distillation epoch (labelled as reduced wherever it is reported)
REDUCED = {"train_subset": 1500, "distill_augment": 0, "feature_distill": {"epochs": 1, "lr": 3e-4, "head_reg": 1e-3}}


def candidate_recipe(candidate: str, head: str, reduced: bool = False):
    """machine-alarms + the case training files + the candidate's shape and head (validated)."""
    from models.data.recipes import load_recipe, recipe_from_dict

    base = asdict(load_recipe("machine-alarms"))
    extra = list(base["extra_data"]) + [p for p in EXTRA_TRAIN if p not in base["extra_data"]]
    # one recipe name per candidate: both heads reuse the same cached student checkpoint (the cache is
    # keyed on content, so the name only labels the package)
    return recipe_from_dict({**base, **CANDIDATES[candidate], **(REDUCED if reduced else {}),
                             "name": f"students-{candidate}", "extra_data": extra, "head": head, "variants": VARIANTS,
                             "description": f"issue 27 candidate {candidate}, head {head}"
                             + (" (reduced training: benchmarks/students.py --reduced)" if reduced else "")})


def build_all(out: Path, only: list[str], reduced: bool = False) -> None:
    """Build every candidate × head package (each in a child process, so its CPU time is its own)."""
    out.mkdir(parents=True, exist_ok=True)
    for candidate in CANDIDATES:
        for head in HEADS:
            name = f"{candidate}-{head}"
            if only and candidate not in only and name not in only:
                continue
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.monotonic()
            result = subprocess.run([sys.executable, str(Path(__file__).resolve()), "build-one", candidate, head,
                                     "--out", str(out / name), *(["--reduced"] if reduced else [])], check=False)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
            line = {"package": name, "status": status, "reduced": reduced, "cpu_seconds": round(cpu, 1),
                    "wall_seconds": round(time.monotonic() - started, 1), "load": os.getloadavg()}
            print(json.dumps(line), flush=True)
            with open(out / "builds.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")


def build_one(candidate: str, head: str, out: Path, reduced: bool = False) -> int:
    from models.train import train_package  # the factory's one path: recipe → package

    train_package(candidate_recipe(candidate, head, reduced), out)
    return 0


# -- data ------------------------------------------------------------------------------------------------

def read_cases(relative: str) -> list[dict]:
    """Rows of a task file that are cases (kind 'case', or no kind column)."""
    with open(TASK / relative, encoding="utf-8", newline="") as fh:
        return [row for row in csv.DictReader(fh) if row.get("kind", "case") in ("case", "")]


def training_languages() -> set[str]:
    """Languages of every training file the candidates learn from."""
    recipe = candidate_recipe("transformer-4", "mean-linear")
    languages = set()
    for path in [recipe.data_path(), *recipe.extra_paths()]:
        with open(path, encoding="utf-8", newline="") as fh:
            languages |= {row.get("lang", "") for row in csv.DictReader(fh)}
    return languages


def accuracy(engine, rows: list[dict]) -> float:
    answers = engine.classify([r["text"] for r in rows])
    return 100.0 * sum(a.label == r["label"] for a, r in zip(answers, rows)) / max(1, len(rows))


def determinism(engine, texts: list[str]) -> tuple[int, float]:
    """Label changes and max |Δp| between each text alone and the same text in one call with all others."""
    together = engine.classify(texts)
    changes, worst = 0, 0.0
    for text, batched in zip(texts, together):
        alone = engine.classify([text])[0]
        changes += alone.label != batched.label
        worst = max(worst, max(abs(p - q) for p, q in zip(alone.probs, batched.probs)))
    return changes, worst


def variant_megabytes(package, variant: str) -> float:
    files = [*package.manifest.variants[variant].files(), package.manifest.tokenizer]
    return sum(package.path(f).stat().st_size for f in files) / 1e6


def training_texts() -> list[str]:
    """Texts of every training file the candidates learn from (calibration of re-made int8 variants)."""
    recipe = candidate_recipe("transformer-4", "mean-linear")
    texts = []
    for path in [recipe.data_path(), *recipe.extra_paths()]:
        with open(path, encoding="utf-8", newline="") as fh:
            texts += [row["text"] for row in csv.DictReader(fh)]
    return texts


def with_rejected(package, scratch: Path, calibration_texts: list[str], wanted: list[str]):
    """The package, plus the int8 variants of VARIANTS its gate rejected, re-made for timing and scoring only.

    A rejected graph is deleted by the factory; its speed and its accuracy loss are still part of the
    comparison. It is re-made from the package's FP32 graph by models.quantize.int8 (as the factory does,
    but calibrated on the training files' texts rather than the training split) in a copy of the
    package under `scratch`; the published package is not touched.
    """
    import shutil
    from dataclasses import replace

    from models.quantize.int8 import quantize_variants, text_feeds
    from runtime.engine.text import TextEncoder
    from runtime.package.load import Package, file_entry

    manifest = package.manifest
    missing = [v for v in wanted if v not in manifest.variants]
    kept = {n: v for n, v in manifest.variants.items() if n in wanted or n == "fp32"}
    if not missing:
        return Package(package.root, replace(manifest, variants=kept))
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(package.root, scratch)
    fp32 = manifest.variants["fp32"]
    encoder = TextEncoder(package.path(manifest.tokenizer).read_text(encoding="utf-8"), manifest.max_length,
                          manifest.pad_id)
    paths = quantize_variants(scratch / fp32.file.file, scratch, text_feeds(encoder, calibration_texts), missing)
    variants = dict(kept)
    for name, path in paths.items():
        variants[name] = replace(fp32, name=name, file=file_entry(scratch, path.name), precision="int8",
                                 quantization=None, metrics={})
    return Package(scratch, replace(manifest, variants=variants))


def rejected_note(package, variant: str) -> str:
    """'' for a published variant; why the factory left out one the table re-made."""
    if variant in package.manifest.variants:
        return ""
    reasons = package.manifest.provenance.get("rejected_variants", {}).get(variant)
    if not reasons:
        return " (not built; re-made)"
    if reasons[0].startswith("not made on this machine"):
        return " (not for this CPU's tier; re-made)"
    return " (gate: rejected; re-made)"


def rejected_lines(published: dict) -> list[str]:
    """Why the factory left out each variant the table re-made (publish's rejected_variants)."""
    return [f"- {name} {variant}: {'; '.join(reasons)}" for name, package in published.items()
            for variant, reasons in package.manifest.provenance.get("rejected_variants", {}).items()]


# -- timing ----------------------------------------------------------------------------------------------

def length_items(engine, texts: list[str], length: int, count: int = 6) -> list:
    """`count` token sequences of exactly `length` tokens: held-out texts joined, cut, specials kept."""
    from runtime.engine.text import Encoded

    encoded = engine.encoder.tokenize(texts)
    pieces = [token for item in encoded for token in item.ids[1:-1]]
    first, last = encoded[0].ids[0], encoded[0].ids[-1]
    body = length - 2
    step = max(1, (len(pieces) - body) // count)
    return [Encoded((first, *pieces[i * step:i * step + body], last), False) for i in range(count)]


def time_config(engine, items_by_length: dict, bulk_batches: list, calls: int, times: dict, clock) -> None:
    """One round of one (package, variant, threads): `calls` batch-1 calls per length, every bulk batch once."""
    for length, items in items_by_length.items():
        for call in range(calls):
            item = items[call % len(items)]
            start = clock()
            engine.run_padded([item], length)
            times[length].append((clock() - start) * 1000)
    start = clock()
    for batch in bulk_batches:
        engine.classify_encoded(batch)
    times["bulk"].append(BULK * len(bulk_batches) / max(clock() - start, 1e-9))


def measure_speed(packages: dict, threads: list[int], rounds: int, calls: int, texts: list[str],
                  clock=time.perf_counter) -> dict:
    """Median batch-1 ms per length and bulk texts/s per (package, variant, threads), interleaved rounds."""
    from runtime.engine.engine import Engine, SessionSettings

    engines, inputs = {}, {}
    for name, package in packages.items():
        for variant in package.manifest.variants:
            for count in threads:
                engine = Engine(package, variant, SessionSettings(threads=count), verify=False)
                engine.warm_up()
                engines[(name, variant, count)] = engine
        first = engines[(name, next(iter(package.manifest.variants)), threads[0])]
        encoded = first.encoder.tokenize(texts[: BULK * 4])
        inputs[name] = ({n: length_items(first, texts, n) for n in LENGTHS},
                        [encoded[i:i + BULK] for i in range(0, len(encoded), BULK)])
    times = {key: {**{n: [] for n in LENGTHS}, "bulk": []} for key in engines}
    keys = list(engines)
    for round_index in range(rounds):
        shift = round_index * max(1, len(keys) // max(1, rounds)) % len(keys)
        for key in keys[shift:] + keys[:shift]:
            time_config(engines[key], *inputs[key[0]], calls, times[key], clock)
        print(f"timing round {round_index + 1}/{rounds} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return {key: {str(k): statistics.median(v) for k, v in table.items()} for key, table in times.items()}


# -- report ----------------------------------------------------------------------------------------------

def cpu_description() -> dict:
    """This CPU: model name, the x86 SIMD flags that decide int8 kernels, the runtime's tier."""
    from runtime.platform.appdir import find_data_dir
    from runtime.platform.cpu import probe
    from runtime.platform.tiers import load_platform, select

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    features = probe()
    flags = sorted(f for f in features.flags if f in ("avx2", "fma", "avx512f", "avx512bw") or "vnni" in f)
    platform_tiers = load_platform(find_data_dir("platforms"), features.arch)
    return {"model": model, "flags": flags, "vnni": any("vnni" in f for f in flags),
            "usable_cores": features.usable_cores, "select": lambda names: select(features, platform_tiers, names)}


def served_variants(cpu: dict, package) -> tuple[str, int]:
    """(variant, threads) the runtime would serve this package with on this CPU."""
    choice = cpu["select"](package.manifest.variants.keys())
    cap = choice.tier.threads_max or cpu["usable_cores"]
    return choice.variant, min(cpu["usable_cores"], cap)


def quality(packages: dict, held_out: list[dict], absent: set[str], dev: list[dict]) -> dict:
    """Accuracy figures and int8 determinism per (package, variant), through the runtime's engine (2 threads)."""
    from runtime.engine.engine import Engine, SessionSettings

    out = {}
    absent_rows = [r for r in held_out if r.get("lang") in absent]
    for name, package in packages.items():
        for variant in package.manifest.variants:
            engine = Engine(package, variant, SessionSettings(threads=2))
            changes, worst = determinism(engine, [r["text"] for r in held_out])
            out[(name, variant)] = {"held_out": accuracy(engine, held_out), "absent": accuracy(engine, absent_rows),
                                    "dev": accuracy(engine, dev), "changes": changes, "max_dp": worst,
                                    "mb": variant_megabytes(package, variant)}
            print(f"quality {name} {variant}: {out[(name, variant)]}", file=sys.stderr)
    return out


def markdown(packages: dict, published: dict, quality_rows: dict, speed: dict, threads: list[int],
             cpu: dict) -> list[str]:
    """The side-by-side table: one row per package and variant."""
    timing_head = " | ".join(f"{t}T {n}" for t in threads for n in (*LENGTHS, "bulk/s"))
    lines = [f"| student | head | variant | held-out % | absent-lang % | dev % | MB | {timing_head} | alone≠batched |",
             "|" + "---|" * (8 + len(threads) * (len(LENGTHS) + 1))]
    for name, package in packages.items():
        head = next((h for h in HEADS if name.endswith(f"-{h}")), "")
        candidate = name[: len(name) - len(head) - 1] if head else name
        served = served_variants(cpu, published[name])[0]
        for variant in package.manifest.variants:
            q = quality_rows[(name, variant)]
            cells = []
            for count in threads:
                s = speed[(name, variant, count)]
                cells += [f"{s[str(n)]:.2f}" for n in LENGTHS] + [f"{s['bulk']:.0f}"]
            label = variant + (" (served)" if variant == served else "") + rejected_note(published[name], variant)
            lines.append(f"| {candidate} | {head} | {label} | {q['held_out']:.1f} | {q['absent']:.1f} | {q['dev']:.1f} "
                         f"| {q['mb']:.1f} | " + " | ".join(cells) + f" | {q['changes']} ({q['max_dp']:.0e}) |")
    return lines


def goal_lines(published: dict, quality_rows: dict, speed: dict, cpu: dict) -> list[str]:
    """The issue's goal figures: served int8 vs own FP32 (runtime threads), int8 vs today's student at 64/128."""
    lines = []
    base = published.get(BASELINE)
    base_variant = served_variants(cpu, base)[0] if base else None
    for name, package in published.items():
        variant, count = served_variants(cpu, package)
        if variant == "fp32" or (name, "fp32", count) not in speed:
            continue
        own = speed[(name, variant, count)]
        fp32 = speed[(name, "fp32", count)]
        ratios = " ".join(f"{n}: {fp32[str(n)] / own[str(n)]:.2f}×" for n in LENGTHS)
        line = f"- {name}: served {variant} ({count} threads) vs its own FP32 at batch 1 — {ratios}"
        if base and (BASELINE, base_variant, 1) in speed and (name, variant, 1) in speed:
            other = speed[(BASELINE, base_variant, 1)]
            mine = speed[(name, variant, 1)]
            faster = " ".join(f"{n}: {other[str(n)] / mine[str(n)]:.2f}×" for n in (64, 128))
            delta = quality_rows[(name, variant)]["held_out"] - quality_rows[(BASELINE, base_variant)]["held_out"]
            line += f"; vs {BASELINE} {base_variant} (1 thread) {faster}, held-out {delta:+.1f} points"
        lines.append(line)
    return lines


def table(packages_dir: Path, rounds: int, calls: int, threads: list[int], json_path: Path | None,
          clock: str = "wall", variants: list[str] = VARIANTS) -> int:
    import onnxruntime

    from runtime.package.load import load_package

    published = {d.name: load_package(d) for d in sorted(packages_dir.iterdir()) if (d / "manifest.json").is_file()}
    if not published:
        print(f"no packages in {packages_dir}: run `python3 benchmarks/students.py build` first", file=sys.stderr)
        return 2
    calibration = training_texts()
    packages = {name: with_rejected(package, packages_dir / ".rejected" / name, calibration, variants)
                for name, package in published.items()}
    held_out = [r for f in HELD_OUT for r in read_cases(f)]
    absent = {r["lang"] for r in held_out} - training_languages()
    dev = read_cases(DEV)
    cpu = cpu_description()
    load_before = os.getloadavg()
    quality_rows = quality(packages, held_out, absent, dev)
    speed = measure_speed(packages, threads, rounds, calls, [r["text"] for r in held_out],
                          time.perf_counter if clock == "wall" else time.process_time)
    print(f"CPU: {cpu['model']}, flags {' '.join(cpu['flags'])} ({'VNNI' if cpu['vnni'] else 'no VNNI'}), "
          f"{cpu['usable_cores']} usable cores; onnxruntime {onnxruntime.__version__}; load average "
          f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {rounds} rounds × {calls} calls per length; "
          f"{'wall time' if clock == 'wall' else 'process CPU time (all threads of the call)'}")
    print(f"held-out: {len(held_out)} cases ({', '.join(HELD_OUT)}), absent-language part {len(held_out) and sum(r['lang'] in absent for r in held_out)} "
          f"({' '.join(sorted(absent))}); dev: {len(dev)} cases ({DEV}); latency ms (batch 1), bulk texts/s (batch {BULK})")
    print()
    print("\n".join(markdown(packages, published, quality_rows, speed, threads, cpu)))
    print()
    print("\n".join(goal_lines(published, quality_rows, speed, cpu)))
    print()
    print("\n".join(rejected_lines(published)))
    if json_path:
        json_path.write_text(json.dumps({
            "cpu": {k: v for k, v in cpu.items() if k != "select"}, "rounds": rounds, "calls": calls, "clock": clock,
            "absent_languages": sorted(absent), "quality": {" ".join(k): v for k, v in quality_rows.items()},
            "speed": {f"{k[0]} {k[1]} {k[2]}T": v for k, v in speed.items()}}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build")
    build.add_argument("--out", type=Path, default=DEFAULT_OUT)
    build.add_argument("--only", nargs="*", default=[], help="candidates (or candidate-head) to build")
    build.add_argument("--reduced", action="store_true", help=f"quicker, reduced training: {REDUCED}")
    one = sub.add_parser("build-one")
    one.add_argument("candidate", choices=list(CANDIDATES))
    one.add_argument("head", choices=HEADS)
    one.add_argument("--out", type=Path, required=True)
    one.add_argument("--reduced", action="store_true")
    report = sub.add_parser("table")
    report.add_argument("--packages", type=Path, default=DEFAULT_OUT)
    report.add_argument("--rounds", type=int, default=7)
    report.add_argument("--calls", type=int, default=20, help="batch-1 calls per length per round")
    report.add_argument("--threads", default="1,2")
    report.add_argument("--json", type=Path)
    report.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS,
                        help="variants to score and time (fp32 is always kept)")
    report.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time per call, steadier on a busy box (at 1 thread close to an "
                             "idle core's latency; at 2 threads the sum of both threads' work)")
    args = parser.parse_args(argv)
    if args.command == "build":
        build_all(args.out, args.only, args.reduced)
        return 0
    if args.command == "build-one":
        return build_one(args.candidate, args.head, args.out, args.reduced)
    return table(args.packages, args.rounds, args.calls, [int(t) for t in args.threads.split(",")], args.json,
                 args.clock, sorted(set(args.variants) | {"fp32"}, key=VARIANTS.index))


if __name__ == "__main__":
    raise SystemExit(main())
