"""benchmarks/compare.py's rows and the two runs that start fresh processes: exec → first answer
(cold starts) and RSS over many requests through stdin (the slow-leak run)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.contenders import process_tree_memory_kb, quiet_env, worker_command

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Entry:
    """One row of the comparison: a contender at one precision, and what became of it."""

    name: str  # e.g. "decide stdin"
    precision: str  # "fp32" or "int8"
    variant: str  # the package's variant; PyTorch: "fp32" or "int8" (its dynamic quantization)
    kind: str  # "worker" (in-process contender) or "wire" (decide over stdin/stdout)
    system: str = ""  # worker: contenders.SYSTEMS name
    command: list[str] = field(default_factory=list)  # wire: the decide program
    skipped: str = ""  # why this row has no figures
    threads: int = 0  # PyTorch rows: its intra-op threads (ORT rows share --threads)
    handle: Any = None

    @property
    def label(self) -> str:
        """Row label, e.g. "decide stdin int8-u8s8", "PyTorch eager int8 2t"."""
        if self.system == "torch":
            return f"{self.name} {self.precision} {self.threads}t"
        return f"{self.name} {self.variant if self.variant != '-' else self.precision}"


def cold_starts(entries: list[Entry], model: Path, threads: int, texts: dict[str, list[str]], texts_file: Path,
                checkpoint: Path | None, runs: int) -> dict[str, dict[str, Any]]:
    """exec → first answer for one short text, fresh process each time, systems alternating."""
    times: dict[str, list[float]] = {}
    line = json.dumps({"text": texts["short"][0]}, ensure_ascii=False).encode("utf-8") + b"\n"
    for _ in range(runs):
        for entry in (e for e in entries if not e.skipped):
            if entry.kind == "worker":
                command = worker_command(entry.system, model, entry.variant if entry.variant != "-" else "fp32",
                                         entry.threads or threads, texts_file,
                                         checkpoint if entry.system == "torch" else None, cold=True)
            else:
                command = [*entry.command, "--model", str(model), "--variant", entry.variant, "--quiet"]
            started = time.perf_counter()
            proc = subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    env=quiet_env())
            if entry.kind == "wire":
                proc.stdin.write(line)
            proc.stdin.close()
            answer = proc.stdout.readline()
            elapsed = (time.perf_counter() - started) * 1000
            proc.wait(timeout=120)
            if answer:
                times.setdefault(entry.label, []).append(elapsed)
    return {label: {"median_ms": round(statistics.median(ms), 1), "runs_ms": [round(x, 1) for x in ms]}
            for label, ms in times.items()}


def slow_leak(entry: Entry, model: Path, texts: dict[str, list[str]], requests: int) -> dict[str, Any]:
    """RSS of decide after warm-up and after `requests` lines through stdin (all texts distinct).

    Every request differs (a running number is appended) and one in a hundred is a medium text:
    the article's §6.2 leak came from caches that grow with the variety of inputs."""
    proc = subprocess.Popen([*entry.command, "--model", str(model), "--variant", entry.variant, "--ready",
                             "--quiet"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=quiet_env())
    json.loads(proc.stdout.readline())
    samples = [{"answered": 0, **process_tree_memory_kb(proc.pid)}]

    def feed() -> None:
        short, medium = texts["short"], texts["medium"]
        try:
            for i in range(requests):
                text = medium[i % len(medium)] if i % 100 == 99 else short[i % len(short)]
                proc.stdin.write(json.dumps({"id": i, "text": f"{text} ({i})"}, ensure_ascii=False).encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return

    writer = threading.Thread(target=feed, daemon=True)
    started = time.perf_counter()
    writer.start()
    checkpoints = {1000, requests // 10, requests // 2, requests}
    answered = 0
    for _ in proc.stdout:
        answered += 1
        if answered in checkpoints:
            samples.append({"answered": answered, "seconds": round(time.perf_counter() - started, 1),
                            **process_tree_memory_kb(proc.pid)})
            print(f"    {answered} answered, RSS {samples[-1]['rss_kb'] / 1024:.1f} MB", file=sys.stderr)
        if answered == requests:
            break
    writer.join()
    proc.stdin.close()
    proc.wait(timeout=60)
    after_warm_up, after_1k, last = samples[0]["rss_kb"], samples[1]["rss_kb"], samples[-1]["rss_kb"]
    return {"system": entry.label, "requests": answered, "samples": samples,
            "growth_vs_warm_up_pct": round((last / after_warm_up - 1) * 100, 2),
            "growth_vs_1k_pct": round((last / after_1k - 1) * 100, 2),
            "per_s": round(answered / (time.perf_counter() - started), 1)}


