"""Figures of `decide score` (issue 24), measured in one run on this machine, printed (not asserted):

1. throughput of `decide score` on N short records (≤ 16 tokens) against the bare engine on the
   same windows: a pilot on --bare-records picks the faster way to drive it (`Engine.classify` per
   window with the engine's own workers, as the engine serves; or the plan's windows at once, as
   `decide score` runs them), which then runs all N records in a child process, interleaved with
   the `decide score` run in turns of 20 s (the other one SIGSTOPped), so both see the same
   machine: a shared host's speed drifts by several percent over minutes. Target ≥ 90 %.
2. peak RSS of the `decide score` process tree (polled). Target ≤ 500 MB.
3. resume: a fresh run SIGKILLed once its parts cover ~50 % of the records, then `--resume`; the
   output's ids checked against the input's. Target: 0 lost, 0 duplicated.
4. with --ray: a local 2-CPU Ray instance started here; `decide score` and Ray Data's
   map_batches(DecidePredictor) on the first 20,000 records: same labels, max |Δscore| (target
   ≤ 1e-6 for the same variant), throughput (target ≥ 70 % of decide score), and 1 → 2 actors.

    python3 benchmarks/score.py                              # 1,000,000 records, default model
    nice -n 10 python3 benchmarks/score.py --records 50000   # a quick check of the script
    python3 benchmarks/score.py --ray                        # + the Ray Data figures (needs the ray extra)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runtime.package.load import load_package, read_golden
from runtime.platform.appdir import DEFAULT_MODEL as DEFAULT_MODEL_DIR

REPO = Path(__file__).resolve().parent.parent
SHORT_TOKENS = 16


def short_texts(model: Path, texts_file: Path | None) -> list[str]:
    """Texts of at most SHORT_TOKENS tokens: from --texts, else the package's task files
    (models/tasks/<name>/) and golden set."""
    from tokenizers import Tokenizer

    package = load_package(model)
    if texts_file is not None:
        texts = [json.loads(line)["text"] for line in texts_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        texts = [g["text"] for g in read_golden(package)]
        for path in sorted((REPO / "models" / "tasks" / package.manifest.name).glob("*/*.csv")):
            with open(path, newline="", encoding="utf-8") as fh:
                texts += [row["text"] for row in csv.DictReader(fh) if row.get("text")]
    tokenizer = Tokenizer.from_file(str(package.path(package.manifest.tokenizer)))
    short = [t for t in dict.fromkeys(texts) if len(tokenizer.encode(t).ids) <= SHORT_TOKENS]
    if not short:
        raise SystemExit(f"no texts of at most {SHORT_TOKENS} tokens")
    return short


def write_input(path: Path, texts: list[str], count: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"id": i, "text": texts[i % len(texts)]}, ensure_ascii=False) + "\n" for i in range(count))


BARE_MODES = ("engine workers", "windows at once")
SLICE_S = 20.0  # turn length when interleaving: short against the minutes over which a shared host's speed drifts
POLL_S = 0.05


def bare_engine(model: Path, variant: str | None, texts: list[str], count: int,
                modes: tuple[str, ...] = BARE_MODES, before_timing=lambda: None) -> dict[str, float]:
    """Records/s (and records per CPU-second) of the bare engine on decide score's windows of the
    first `count` records, for each way of driving it in `modes`; `before_timing()` runs once the
    engine is loaded and warm, just before the clock starts."""
    from concurrent.futures import ThreadPoolExecutor

    from runtime.engine.classifier import Classifier
    from runtime.score.pool import plan, scoring_cores
    from runtime.score.windows import WINDOW_RECORDS

    run_plan = plan(scoring_cores())
    windows = [[texts[i % len(texts)] for i in range(start, min(start + WINDOW_RECORDS, count))]
               for start in range(0, count, WINDOW_RECORDS)]
    figures = {}

    def timed(mode: str, run) -> None:
        before_timing()
        started, cpu = time.perf_counter(), time.process_time()
        run()
        figures[mode] = count / (time.perf_counter() - started)
        figures[f"{mode} per CPU-s"] = count / (time.process_time() - cpu)

    if "engine workers" in modes:
        engine = Classifier.load(model, variant=variant, threads=run_plan.threads, workers=run_plan.workers).engine
        engine.classify(windows[0])
        timed("engine workers", lambda: [engine.classify(window) for window in windows])
        del engine
    if "windows at once" in modes:
        single = Classifier.load(model, variant=variant, threads=run_plan.threads, workers=1).engine
        with ThreadPoolExecutor(run_plan.workers) as pool:
            timed("windows at once", lambda: list(pool.map(single.classify, windows)))
    return figures


def bare_child(args: argparse.Namespace) -> int:
    """The bare engine as a child process of `interleaved`: load and warm, say "ready", wait for a
    line on stdin, run all records, print its CPU seconds as JSON (its own clock would count the
    time it spent stopped: the parent measures its running time)."""
    def ready() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    figures = bare_engine(args.model, args.variant, short_texts(args.model, args.texts), args.records,
                          (args.bare_child,), before_timing=ready)
    print(json.dumps({"cpu_s": args.records / figures[f"{args.bare_child} per CPU-s"]}), flush=True)
    return 0


def tree_rss_kb(pid: int) -> int:
    """Resident set size of a process and all its descendants, in KiB (from /proc). Walks each
    process's own `task/*/children` rather than every process on the machine: polled every 50 ms,
    a walk of all of /proc cost ~2 ms of CPU (~4 % of a core) taken from the run it measures."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, ValueError):
            pass
    return total


def start_score(args: list[str]) -> subprocess.Popen:
    """`decide score` in its own process group (so that the whole tree can be stopped and continued)."""
    if not any(Path("/proc/self/task").glob("*/children")):  # CONFIG_PROC_CHILDREN: tree_rss_kb needs it
        raise SystemExit("this kernel has no /proc/PID/task/TID/children: the process tree's RSS cannot be polled")
    return subprocess.Popen([sys.executable, "-m", "runtime", "score", *args, "-q"], cwd=REPO,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def reap(process: subprocess.Popen) -> resource.struct_rusage | None:
    """The child's own resource usage (with its reaped children's) once it has exited, else None.
    wait4 rather than RUSAGE_CHILDREN: another child (the bare engine) may run at the same time."""
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if pid == 0:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage


def score_figures(process: subprocess.Popen, usage: resource.struct_rusage, seconds: float, peak_kb: int) -> dict[str, float]:
    """A finished decide score run's figures; SystemExit with its message if it failed."""
    if process.returncode != 0:
        raise SystemExit(f"decide score failed ({process.returncode}): {process.stderr.read().strip()}")
    return {"killed": False, "seconds": seconds, "peak_mb": peak_kb / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}


def run_score(args: list[str], kill_when=None) -> dict[str, float]:
    """Run `decide score`, polling the tree's RSS; kill_when(): SIGKILL it once that returns True."""
    started = time.perf_counter()
    process = start_score(args)
    peak = 0
    while (usage := reap(process)) is None:
        peak = max(peak, tree_rss_kb(process.pid))
        if kill_when is not None and kill_when():
            os.kill(process.pid, signal.SIGKILL)  # the main process only, as a user would: workers die with it
            process.wait()
            return {"killed": True, "seconds": time.perf_counter() - started, "peak_mb": peak / 1024}
        time.sleep(POLL_S)
    return score_figures(process, usage, time.perf_counter() - started, peak)


def interleaved(score_args: list[str], bare_args: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """`decide score` and the bare engine (a child process, loaded and warm first) on the same
    records, taking turns of SLICE_S on the machine while the other is SIGSTOPped; each one's rate
    is its records over its own running time. A shared host's speed drifts by several percent over
    minutes (the bare engine's CPU per record on identical windows varied by 8.7 % between sixths
    of one 600k run): run one after the other, the two would not see the same machine."""
    bare = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *bare_args], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    processes = {"bare": bare}
    try:
        if bare.stdout.readline().strip() != "ready":
            raise SystemExit("the bare engine child did not start (see its error above)")
        os.killpg(bare.pid, signal.SIGSTOP)
        bare.stdin.write("go\n")  # read once it is continued
        bare.stdin.flush()
        processes["score"] = start_score(score_args)
        running, usage = dict.fromkeys(processes, 0.0), {}
        active, since, peak, turns = "score", time.perf_counter(), 0, 0
        while len(usage) < len(processes):
            for name, process in processes.items():
                if name not in usage and (used := reap(process)) is not None:
                    usage[name] = used
            now, other = time.perf_counter(), "bare" if active == "score" else "score"
            if active in usage or (other not in usage and now - since >= SLICE_S):
                running[active] += now - since
                if active not in usage:
                    os.killpg(processes[active].pid, signal.SIGSTOP)
                if other not in usage:
                    os.killpg(processes[other].pid, signal.SIGCONT)
                active, since, turns = other, now, turns + 1
            if "score" not in usage:
                peak = max(peak, tree_rss_kb(processes["score"].pid))
            time.sleep(POLL_S)
    finally:
        for process in processes.values():
            if process.returncode is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    if bare.returncode != 0:
        raise SystemExit(f"the bare engine child failed ({bare.returncode})")
    scored = score_figures(processes["score"], usage["score"], running["score"], peak)
    return {**scored, "turns": turns}, {"seconds": running["bare"], **json.loads(bare.stdout.readline())}


def parts_done(work: Path) -> int:
    """Records in the finished part files of a running job."""
    done = 0
    for part in work.glob("part-*"):
        if not part.name.endswith(".tmp"):
            done = max(done, int(part.name.split("-")[2].split("@")[0]))
    return done


def check_ids(path: Path, count: int) -> tuple[int, int]:
    """(lost, duplicated) ids of an output against range(count)."""
    seen = [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines()]
    unique = set(seen)
    return len(set(range(count)) - unique), len(seen) - len(unique)


def ray_figures(source: Path, model: Path, variant: str, count: int, tmp: Path) -> None:
    """decide score vs Ray Data on the same file: labels, |Δscore|, throughput, 1 → 2 actors."""
    import pyarrow.parquet as pq
    import ray

    from runtime.score.ray_data import BATCH_SIZE, DecidePredictor

    subset = tmp / "ray-input.jsonl"
    with open(source, encoding="utf-8") as fh, open(subset, "w", encoding="utf-8") as out:
        out.writelines(fh.readline() for _ in range(count))
    local = run_score([str(subset), "--output", str(tmp / "local.parquet"), "--model", str(model), "--variant", variant])
    local_rate = count / local["seconds"]
    reference = {str(r["id"]): r for r in pq.read_table(tmp / "local.parquet").to_pylist()}  # local: text ids
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - started
    rates = {}
    try:
        for actors in (1, 2):
            target = tmp / f"ray-{actors}.parquet"
            started = time.perf_counter()
            ray.data.read_json(str(subset), num_cpus=0).map_batches(
                DecidePredictor, fn_constructor_kwargs={"package": str(model), "variant": variant},
                compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=1, batch_size=BATCH_SIZE,
                batch_format="pyarrow").write_parquet(str(target), ray_remote_args={"num_cpus": 0})
            rates[actors] = count / (time.perf_counter() - started)
    finally:
        ray.shutdown()
    got = {str(r["id"]): r for r in pq.read_table(tmp / "ray-2.parquet").to_pylist()}  # Ray: the reader's int64
    same_labels = sum(got[k]["label"] == r["label"] for k, r in reference.items() if k in got)
    delta = max(abs(got[k]["score"] - r["score"]) for k, r in reference.items() if r["score"] is not None)
    print(f"Ray Data, local instance with 2 CPUs (ray.init {init_s:.1f} s, not counted), {count:,} records, variant {variant}:")
    print(f"  decide score: {local_rate:,.0f} rec/s ({local['seconds']:.1f} s with start-up)")
    for actors, rate in rates.items():
        print(f"  Ray Data, {actors} actor{'s' if actors > 1 else ''} × 1 thread: {rate:,.0f} rec/s "
              f"= {rate / local_rate * 100:.0f} % of decide score" + (" (target ≥ 70 %)" if actors == 2 else ""))
    print(f"  scaling 1 → 2 actors: {rates[2] / rates[1]:.2f}×")
    print(f"  same ids: {sorted(got) == sorted(reference)}; same labels: {same_labels:,}/{len(reference):,}; "
          f"max |Δscore| {delta:.1e} (target ≤ 1e-6)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--model", type=Path, default=REPO / DEFAULT_MODEL_DIR)
    parser.add_argument("--variant", default=None, help="default: what decide picks on this CPU")
    parser.add_argument("--texts", type=Path, default=None, help='JSON lines with a "text" field')
    parser.add_argument("--bare-records", type=int, default=100_000,
                        help="records of the pilot that picks the faster way to drive the bare engine")
    parser.add_argument("--ray", action="store_true", help="also the Ray Data figures (ray extra)")
    parser.add_argument("--ray-records", type=int, default=20_000)
    parser.add_argument("--bare-child", choices=BARE_MODES, help=argparse.SUPPRESS)  # see bare_child
    args = parser.parse_args()
    if args.bare_child:
        return bare_child(args)

    from runtime.engine.classifier import prepare
    from runtime.score.pool import plan, scoring_cores

    setup = prepare(args.model, variant=args.variant)
    variant = setup.choice.variant
    texts = short_texts(args.model, args.texts)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"decide score benchmark: {args.records:,} short records ({len(texts):,} distinct texts ≤ {SHORT_TOKENS} "
          f"tokens), model {setup.package.manifest.name} {variant}, tier {setup.choice.tier.name}, "
          f"{scoring_cores()} usable cores ({cpu}), load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="decide-score-bench-") as tmp_name:
        tmp = Path(tmp_name)
        source = tmp / "in.jsonl"
        write_input(source, texts, args.records)
        pilot_count = min(args.records, args.bare_records)
        pilot = bare_engine(args.model, variant, texts, pilot_count)
        mode = max(BARE_MODES, key=pilot.__getitem__)
        print(f"bare engine pilot on {pilot_count:,} records: "
              + ", ".join(f"{key} {pilot[key]:,.0f} rec/s" for key in BARE_MODES) + f"; the reference: {mode}")
        bare_args = ["--bare-child", mode, "--records", str(args.records), "--model", str(args.model),
                     "--variant", variant, *(["--texts", str(args.texts)] if args.texts else [])]
        scored, bare = interleaved([str(source), "--output", str(tmp / "out.jsonl"), "--model", str(args.model),
                                    "--variant", variant], bare_args)
        best, best_cpu = args.records / bare["seconds"], args.records / bare["cpu_s"]
        rate, per_cpu = args.records / scored["seconds"], args.records / scored["cpu_s"]
        print(f"interleaved in turns of {SLICE_S:.0f} s ({scored['turns']} switches), each timed over its own "
              "running time:")
        print(f"  bare engine ({mode}) on all {args.records:,} records: {best:,.0f} rec/s, "
              f"{best_cpu:,.0f} records per CPU-second")
        print(f"  decide score ({plan(scoring_cores()).describe()}): {rate:,.0f} rec/s incl. start-up "
              f"= {rate / best * 100:.1f} % of the bare engine (target ≥ 90 %); {per_cpu:,.0f} records per "
              f"CPU-second = {per_cpu / best_cpu * 100:.1f} %")
        # Polled, not ru_maxrss: a child's ru_maxrss counts the parent's pages it shared before exec.
        print(f"peak RSS of the decide score process tree {scored['peak_mb']:.0f} MB (polled every 50 ms; "
              "target ≤ 500 MB)")
        lost, duplicated = check_ids(tmp / "out.jsonl", args.records)
        print(f"complete run: {lost} ids lost, {duplicated} duplicated")
        work = tmp / "resumed.jsonl.parts"
        resume_args = [str(source), "--output", str(tmp / "resumed.jsonl"), "--model", str(args.model), "--variant", variant]
        killed = run_score(resume_args, kill_when=lambda: parts_done(work) >= args.records // 2)
        if not killed["killed"]:  # too few records: the run ended before half of them were in parts
            print(f"resume: not measured, the run finished before {args.records // 2:,} records were in parts "
                  "(use more --records)")
        else:
            at = parts_done(work)
            resumed = run_score([*resume_args, "--resume"])
            lost, duplicated = check_ids(tmp / "resumed.jsonl", args.records)
            print(f"resume: SIGKILL after {killed['seconds']:.0f} s with {at:,} records ({at / args.records * 100:.0f} %) "
                  f"in parts; --resume took {resumed['seconds']:.0f} s: {lost} ids lost, {duplicated} duplicated "
                  "(target 0, 0)")
        if args.ray:
            ray_figures(source, args.model, variant, min(args.ray_records, args.records), tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
