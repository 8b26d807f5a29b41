"""Closing figures of the runtime (issue 3), measured in one run on this machine:

1. protocol overhead at batch 1: `decide` answering one request line at a time over pipes,
   against a bare in-process loop (tokenize + session.run only, same model, variant, threads, texts);
   both sides are measured in alternating rounds so machine load affects them alike;
2. piped bulk throughput (`decide < bulk.jsonl > out`) against batch-1 throughput over the wire;
3. short texts (≤ 16 tokens) with length buckets against fixed 128-token padding (engine level);
4. time from exec to the first answer (fresh process, one request).

Targets (printed, not asserted): overhead ≤ 10 %, bulk ≥ 3× batch 1, buckets ≥ 3× fixed padding.

    python3 benchmarks/protocol_overhead.py [--model DIR] [--command "dist/decide/decide"] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime.package.load import load_package, read_golden  # stdlib-only modules
from runtime.platform.appdir import DEFAULT_MODEL as DEFAULT_MODEL_DIR

REPO = Path(__file__).resolve().parent.parent
SHORT_TOKENS = 16
FIXED_PADDING = 128


def short_texts(model: Path, texts: list[str]) -> list[str]:
    """The texts of at most SHORT_TOKENS tokens (special tokens included)."""
    from tokenizers import Tokenizer

    package = load_package(model)
    tokenizer = Tokenizer.from_file(str(package.path(package.manifest.tokenizer)))
    return [t for t in texts if len(tokenizer.encode(t).ids) <= SHORT_TOKENS]


def decide_command(args: argparse.Namespace) -> list[str]:
    """The program under test: `python -m runtime` by default, or e.g. the frozen binary."""
    return shlex.split(args.command) if args.command else [sys.executable, "-m", "runtime"]


def chosen_variant(args: argparse.Namespace) -> tuple[str, str, int]:
    """Variant, tier and thread count the program itself picks here (so the bare loop matches)."""
    cmd = [*decide_command(args), "info", "--json", "--model", str(args.model)]
    if args.variant:
        cmd += ["--variant", args.variant]
    report = json.loads(subprocess.run(cmd, cwd=REPO, capture_output=True, check=True).stdout)
    return report["choice"]["variant"], report["choice"]["tier"], report["cpu"]["usable_cores"]


class BareLoop:
    """What a minimal script does: tokenize one text, session.run, nothing else."""

    def __init__(self, model: Path, variant: str, threads: int):
        import numpy as np
        import onnxruntime as ort
        from tokenizers import Tokenizer

        package = load_package(model)
        manifest = package.manifest
        self.np = np
        self.tokenizer = Tokenizer.from_file(str(package.path(manifest.tokenizer)))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=manifest.max_length)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(package.path(manifest.variants[variant].file)), options,
                                            providers=["CPUExecutionProvider"])

    def __call__(self, text: str) -> None:
        ids = self.np.array([self.tokenizer.encode(text).ids], dtype=self.np.int64)
        self.session.run(["logits"], {"input_ids": ids, "attention_mask": self.np.ones_like(ids)})


class WireClient:
    """A running `decide --ready` answering one request at a time over pipes."""

    def __init__(self, command: list[str], model: Path, variant: str):
        self.proc = subprocess.Popen([*command, "--model", str(model), "--variant", variant, "--ready", "--quiet"],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready = json.loads(self._read_line(timeout=300))
        assert ready.get("event") == "ready", ready

    def _read_line(self, timeout: float = 60) -> bytes:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise TimeoutError("decide did not answer")
        return self.proc.stdout.readline()

    def __call__(self, text: str) -> None:
        self.proc.stdin.write(json.dumps({"text": text}, ensure_ascii=False).encode("utf-8") + b"\n")
        self.proc.stdin.flush()
        response = json.loads(self._read_line())
        assert "label" in response, response

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc; works on a not yet reaped zombie."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(call, texts: list[str]) -> list[float]:
    """Milliseconds per call over the texts."""
    out = []
    for text in texts:
        start = time.perf_counter()
        call(text)
        out.append((time.perf_counter() - start) * 1000)
    return out


def protocol_overhead(args, variant: str, threads: int, texts: list[str], short: set[str]) -> dict[str, Any]:
    """Figure 1 (and the batch-1 wire throughput for figure 2, all texts and the short ones)."""
    bare, wire = BareLoop(args.model, variant, threads), WireClient(decide_command(args), args.model, variant)
    try:
        timed(bare, texts[:5]), timed(wire, texts[:5])  # warm both
        bare_ms, wire_ms = [], []
        bare_cpu = wire_cpu = 0.0
        for _ in range(args.rounds):
            for text in texts:  # alternate request by request so load changes hit both sides alike
                start = time.process_time()
                bare_ms += timed(bare, [text])
                bare_cpu += time.process_time() - start
                start = process_cpu_s(wire.proc.pid)
                wire_ms += timed(wire, [text])
                wire_cpu += process_cpu_s(wire.proc.pid) - start
    finally:
        wire.close()
    bare_p50, wire_p50 = statistics.median(bare_ms), statistics.median(wire_ms)
    # CPU time is what load on a shared machine distorts least (wall time includes waiting for a core).
    return {
        "bare_cpu_ms": round(bare_cpu * 1000 / len(bare_ms), 3),
        "wire_server_cpu_ms": round(wire_cpu * 1000 / len(wire_ms), 3),
        "overhead_cpu_pct": round((wire_cpu / bare_cpu - 1) * 100, 1),
        "requests_each": len(bare_ms),
        "bare_p50_ms": round(bare_p50, 3), "wire_p50_ms": round(wire_p50, 3),
        "bare_mean_ms": round(statistics.fmean(bare_ms), 3), "wire_mean_ms": round(statistics.fmean(wire_ms), 3),
        "overhead_p50_pct": round((wire_p50 / bare_p50 - 1) * 100, 1),
        # Paired: each wire request against the bare run of the same text just before it.
        "overhead_paired_pct": round((statistics.median(w / b for w, b in zip(wire_ms, bare_ms)) - 1) * 100, 1),
        "overhead_mean_pct": round((statistics.fmean(wire_ms) / statistics.fmean(bare_ms) - 1) * 100, 1),
        "wire_batch1_per_s": round(1000 / statistics.fmean(wire_ms), 1),
        "wire_batch1_short_per_s": round(
            1000 / statistics.fmean(ms for ms, text in zip(wire_ms, texts * args.rounds) if text in short), 1),
    }


def bulk_throughput(args, variant: str, texts: list[str]) -> dict[str, Any]:
    """Figure 2: `decide < bulk.jsonl > out`, timed from the ready line to the last answer."""
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as fh:
        for i in range(args.bulk):
            fh.write(json.dumps({"id": i, "text": texts[i % len(texts)]}, ensure_ascii=False).encode() + b"\n")
        path = fh.name
    try:
        with open(path, "rb") as stdin:
            proc = subprocess.Popen([*decide_command(args), "--model", str(args.model), "--variant", variant,
                                     "--ready", "--quiet"], cwd=REPO, stdin=stdin, stdout=subprocess.PIPE)
            json.loads(proc.stdout.readline())
            start, start_cpu = time.perf_counter(), process_cpu_s(proc.pid)
            answered = sum(1 for _ in proc.stdout)
            elapsed = time.perf_counter() - start
            cpu = process_cpu_s(proc.pid) - start_cpu  # before wait(): the zombie still has its times
            proc.wait(timeout=60)
    finally:
        os.unlink(path)
    assert answered == args.bulk, f"{answered} answers for {args.bulk} lines"
    return {"lines": args.bulk, "seconds": round(elapsed, 3), "per_s": round(args.bulk / elapsed, 1),
            "server_cpu_ms_per_line": round(cpu * 1000 / args.bulk, 3)}


def bucket_gain(args, variant: str, threads: int, texts: list[str]) -> dict[str, Any]:
    """Figure 3: short texts through the engine with buckets vs padded to FIXED_PADDING tokens."""
    from runtime.engine.engine import Engine, SessionSettings

    engine = Engine(load_package(args.model), variant, SessionSettings(threads=threads))
    engine.warm_up()
    items = [e for e in engine.encoder.tokenize(texts) if len(e.ids) <= SHORT_TOKENS]
    fixed = min(FIXED_PADDING, engine.encoder.max_length)
    result: dict[str, Any] = {"short_texts": len(items), "fixed_padding": fixed}
    for batch in (1, 32):
        chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
        bucketed, padded = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for chunk in chunks:
                engine.classify_encoded(chunk)
            bucketed.append(time.perf_counter() - start)
            start = time.perf_counter()
            for chunk in chunks:
                engine.run_padded(chunk, fixed)
            padded.append(time.perf_counter() - start)
        b, p = statistics.median(bucketed), statistics.median(padded)
        result[f"batch{batch}"] = {"buckets_per_s": round(len(items) / b, 1),
                                   "fixed_per_s": round(len(items) / p, 1), "speedup": round(p / b, 2)}
    return result


def engine_ceiling(args, variant: str, threads: int, texts: list[str]) -> dict[str, Any]:
    """Context for figure 2: the same texts through the engine in-process, one at a time vs all in
    one call: the most batching can give with this model and text mix, without any protocol."""
    from runtime.engine.engine import Engine, SessionSettings

    # As decide builds it: one worker per thread (runtime/cli.py), so batches of one call overlap.
    engine = Engine(load_package(args.model), variant, SessionSettings(threads=threads, workers=threads))
    engine.warm_up()
    many = texts * 8
    one_cpu = all_cpu = one_wall = all_wall = 0.0
    for _ in range(args.rounds):
        start, start_wall = time.process_time(), time.perf_counter()
        for text in many:
            engine.classify([text])
        one_cpu += time.process_time() - start
        one_wall += time.perf_counter() - start_wall
        start, start_wall = time.process_time(), time.perf_counter()
        engine.classify(many)
        all_cpu += time.process_time() - start
        all_wall += time.perf_counter() - start_wall
    n = len(many) * args.rounds
    return {"one_at_a_time_cpu_ms": round(one_cpu * 1000 / n, 3), "batched_cpu_ms": round(all_cpu * 1000 / n, 3),
            "gain": round(one_cpu / all_cpu, 2),
            # wall time is what throughput is made of: at batch 1 the second ORT thread idles more
            "one_at_a_time_wall_ms": round(one_wall * 1000 / n, 3), "batched_wall_ms": round(all_wall * 1000 / n, 3),
            "wall_gain": round(one_wall / all_wall, 2)}


def first_answer(args, variant: str, text: str) -> dict[str, Any]:
    """Figure 4: exec → first response line, fresh process each time (median of 3)."""
    times, cpu = [], []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.Popen([*decide_command(args), "--model", str(args.model), "--variant", variant, "--quiet"],
                                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        proc.stdin.write(json.dumps({"text": text}).encode() + b"\n")
        proc.stdin.close()
        proc.stdout.readline()
        times.append((time.perf_counter() - start) * 1000)
        proc.wait(timeout=60)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000)
    return {"median_ms": round(statistics.median(times), 1), "runs_ms": [round(t, 1) for t in times],
            "process_cpu_ms": round(statistics.median(cpu), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / DEFAULT_MODEL_DIR)
    parser.add_argument("--variant", default=None, help="default: what decide chooses on this CPU")
    parser.add_argument("--command", default=None, help='program to test, default "python3 -m runtime"')
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bulk", type=int, default=2000, help="lines in the piped bulk run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.model = args.model.resolve()

    variant, tier, threads = chosen_variant(args)
    golden = [g["text"] for g in read_golden(load_package(args.model))]
    report: dict[str, Any] = {"model": str(args.model), "variant": variant, "tier": tier, "threads": threads,
                              "command": decide_command(args), "texts": len(golden),
                              "load_avg_1min": round(os.getloadavg()[0], 2)}
    short = short_texts(args.model, golden)
    report["overhead"] = protocol_overhead(args, variant, threads, golden, set(short))
    report["bulk"] = bulk_throughput(args, variant, golden)
    report["bulk"]["vs_batch1"] = round(report["bulk"]["per_s"] / report["overhead"]["wire_batch1_per_s"], 2)
    report["bulk"]["cpu_vs_batch1"] = round(
        report["overhead"]["wire_server_cpu_ms"] / report["bulk"]["server_cpu_ms_per_line"], 2)
    report["bulk_short"] = bulk_throughput(args, variant, short)
    report["bulk_short"]["vs_batch1"] = round(
        report["bulk_short"]["per_s"] / report["overhead"]["wire_batch1_short_per_s"], 2)
    report["engine_ceiling"] = engine_ceiling(args, variant, threads, golden)
    report["buckets"] = bucket_gain(args, variant, threads, golden)
    report["first_answer"] = first_answer(args, variant, golden[0])
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    o, b, k, f = report["overhead"], report["bulk"], report["buckets"], report["first_answer"]
    print(f"model {args.model.name}, variant {variant}, tier {tier}, {threads} threads, "
          f"{len(golden)} golden texts, load avg {report['load_avg_1min']}")
    print(f"1. batch-1 latency p50: bare {o['bare_p50_ms']:.2f} ms, decide over pipes {o['wire_p50_ms']:.2f} ms "
          f"→ overhead {o['overhead_p50_pct']:+.1f}% (mean {o['overhead_mean_pct']:+.1f}%, "
          f"median of paired ratios {o['overhead_paired_pct']:+.1f}%; target ≤ 10%)")
    print(f"   CPU per request: bare {o['bare_cpu_ms']:.2f} ms, decide server {o['wire_server_cpu_ms']:.2f} ms "
          f"→ {o['overhead_cpu_pct']:+.1f}%")
    print(f"2. piped bulk {b['per_s']:.1f} lines/s vs batch-1 over the wire {o['wire_batch1_per_s']:.1f}/s "
          f"→ {b['vs_batch1']:.2f}× (target ≥ 3×)")
    print(f"   server CPU per line: bulk {b['server_cpu_ms_per_line']:.2f} ms vs batch-1 {o['wire_server_cpu_ms']:.2f} ms "
          f"→ {b['cpu_vs_batch1']:.2f}×")
    bs = report["bulk_short"]
    print(f"   short texts only (≤ {SHORT_TOKENS} tokens): piped bulk {bs['per_s']:.1f} lines/s vs batch-1 "
          f"{o['wire_batch1_short_per_s']:.1f}/s → {bs['vs_batch1']:.2f}×")
    c = report["engine_ceiling"]
    print(f"   engine alone, same texts: {c['one_at_a_time_cpu_ms']:.2f} CPU ms/text one at a time vs "
          f"{c['batched_cpu_ms']:.2f} batched → {c['gain']:.2f}×; wall {c['one_at_a_time_wall_ms']:.2f} vs "
          f"{c['batched_wall_ms']:.2f} ms/text → {c['wall_gain']:.2f}× (the most batching can give here)")
    for batch in (1, 32):
        row = k[f"batch{batch}"]
        print(f"3. short texts (≤ {SHORT_TOKENS} tokens, n={k['short_texts']}) batch {batch}: buckets "
              f"{row['buckets_per_s']:.1f}/s vs fixed {k['fixed_padding']} padding {row['fixed_per_s']:.1f}/s "
              f"→ {row['speedup']:.2f}× (target ≥ 3×)")
    print(f"4. exec → first answer: {f['median_ms']:.0f} ms median (runs {f['runs_ms']}); "
          f"CPU time of the whole process run {f['process_cpu_ms']:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
