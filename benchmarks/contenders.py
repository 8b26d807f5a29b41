"""The systems benchmarks/compare.py puts side by side, each behind the same small interface.

In-process contenders run in a worker process of their own (`python benchmarks/contenders.py
--system …`), so each has its own peak RSS and its imports do not mix: the worker loads the
system, then answers JSON-line commands on stdin (run N batches, report RSS, report outputs).
decide over stdin/stdout (`python -m runtime` or the frozen binary) is driven directly by the
orchestrator through `WireSystem`, exactly as a user's program would drive it.

Contenders (same model, same texts; ORT contenders share one thread count, PyTorch runs at its own):
    torch      transformers tokenizer + PyTorch eager, padding to the longest text of a batch; variant
               "fp32", or "int8": PyTorch's own dynamic quantization of every nn.Linear
               (torch.ao.quantization.quantize_dynamic, qint8 weights, activation scales per call)
    bare       a plain ONNX Runtime script (fastembed's way): benchmarks/protocol_overhead.BareLoop
    fixed128   the same session, every input padded to 128 tokens (the julia-1 article, §3.1)
    engine     decide's engine in-process (runtime.engine.startup: prepare + load_engine, as `decide` builds it)
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.package.load import load_package  # stdlib only

REPO = Path(__file__).resolve().parent.parent

FIXED_PADDING = 128  # the article's fixed sequence length
SYSTEMS = ("torch", "bare", "fixed128", "engine")


@dataclass(frozen=True)
class Contender:
    """An in-process system: `timed` is what gets measured, `outputs` returns probabilities per text."""

    timed: Callable[[list[str]], object]
    outputs: Callable[[list[str]], list[list[float]]]


def process_memory_kb(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process in kB, from /proc/<pid>/status."""
    wanted = {"VmRSS": "rss_kb", "VmHWM": "peak_rss_kb"}
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in wanted:
                out[wanted[key]] = int(value.split()[0])
    return out


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its waited-for children), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rpartition(")")[2].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- in-process systems

def torch_system(checkpoint: Path, variant: str, threads: int) -> Contender:
    """(a) What a transformers user writes: tokenizer(..., padding=True) → model(**batch) → softmax.

    variant "int8" is the int8 path PyTorch itself offers for CPU inference: quantize_dynamic on
    every nn.Linear (attention projections, feed-forward, head), done at load as a user would."""
    import torch
    from transformers import PreTrainedTokenizerFast

    torch.set_num_threads(threads)
    saved = torch.load(checkpoint / "model.pt", weights_only=False)  # the whole eager module
    model = saved.eval()
    if variant == "int8":
        from benchmarks.torch_model import dynamic_int8

        model = dynamic_int8(model)
    elif variant != "fp32":
        raise ValueError(f"torch variant {variant!r}: expected fp32 or int8")
    meta = json.loads((checkpoint / "meta.json").read_text(encoding="utf-8"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"),
                                        pad_token=meta["pad_token"])

    def classify(texts: list[str]) -> list[list[float]]:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=meta["max_length"],
                          return_tensors="pt", return_token_type_ids=False)
        with torch.inference_mode():
            logits = model(batch["input_ids"], batch["attention_mask"])
        return torch.softmax(logits, dim=-1).tolist()

    return Contender(classify, classify)


def bare_system(model: Path, variant: str, threads: int, fixed_length: int | None) -> Contender:
    """(b) protocol_overhead.BareLoop: its batch-1 call as is; batches padded to the longest text
    (fastembed's way). With fixed_length: (c) every input padded to that length (the article)."""
    import numpy as np

    from benchmarks.protocol_overhead import BareLoop
    from runtime.engine.engine import softmax_rows  # decide's post-processing: not what is compared

    bare = BareLoop(model, variant, threads)
    tokenizer = bare.tokenizer
    pad_id = load_package(model).manifest.pad_id
    if fixed_length is None:
        tokenizer.enable_padding(pad_id=pad_id)
    else:
        tokenizer.enable_padding(pad_id=pad_id, length=fixed_length)
        # The article's warm-up (§6.3): three runs on a zero batch of the fixed shape.
        zeros = np.zeros((1, fixed_length), dtype=np.int64)
        for _ in range(3):
            bare.session.run(["logits"], {"input_ids": zeros, "attention_mask": np.ones_like(zeros)})

    def classify(texts: list[str]) -> list[list[float]]:
        encodings = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        (logits,) = bare.session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
        return softmax_rows(logits)

    if fixed_length is not None:
        return Contender(classify, classify)

    def timed(texts: list[str]) -> object:
        if len(texts) == 1:
            return bare(texts[0])  # the same bare batch-1 loop protocol_overhead.py measures
        return classify(texts)

    return Contender(timed, classify)


def engine_system(model: Path, variant: str, threads: int) -> Contender:
    """(d) decide's own engine, built the way `decide serve` builds it (tier settings, warm-up)."""
    from runtime import cli

    args = argparse.Namespace(model=model, tier=None, variant=variant, threads=threads, workers=None, spin=False)
    engine = cli.load_engine(cli.prepare(args), args)

    def classify(texts: list[str]) -> list[list[float]]:
        return [list(c.probs) for c in engine.classify(texts)]

    return Contender(classify, classify)


def make_system(name: str, model: Path, variant: str, threads: int, checkpoint: Path | None) -> Contender:
    """Load one in-process contender by name."""
    if name == "torch":
        if checkpoint is None:
            raise ValueError("the torch contender needs --checkpoint")
        return torch_system(checkpoint, variant, threads)
    if name == "bare":
        return bare_system(model, variant, threads, None)
    if name == "fixed128":
        return bare_system(model, variant, threads, FIXED_PADDING)
    if name == "engine":
        return engine_system(model, variant, threads)
    raise ValueError(f"unknown system {name!r}")


# ----------------------------------------------------------------------------- timing, shared

def run_batches(call: Callable[[list[str]], object], texts: list[str], batch: int, seconds: float,
                min_calls: int, offset: int = 0) -> dict[str, Any]:
    """Call on consecutive batches (cycling through texts) for about `seconds`; per-call ms."""
    latencies: list[float] = []
    cpu0, start = time.process_time(), time.perf_counter()
    i = offset
    while len(latencies) < min_calls or time.perf_counter() - start < seconds:
        chunk = [texts[(i * batch + k) % len(texts)] for k in range(batch)]
        t0 = time.perf_counter()
        call(chunk)
        latencies.append((time.perf_counter() - t0) * 1000)
        i += 1
    return {"ms": latencies, "wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu0}


# ----------------------------------------------------------------------------- worker process

def serve_worker(args: argparse.Namespace) -> int:
    """Load the system, print {"ready"}, then answer one JSON command a line until EOF."""
    texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
    if args.cold:
        system = make_system(args.system, args.model, args.variant, args.threads, args.checkpoint)
        probs = system.outputs([texts["short"][0]])
        print(json.dumps({"answer": probs[0]}), flush=True)
        return 0
    started = time.perf_counter()
    system = make_system(args.system, args.model, args.variant, args.threads, args.checkpoint)
    for kind in ("short", "medium"):  # warm every text length and batch shape once
        for batch in (1, 32):
            run_batches(system.timed, texts[kind], batch, 0.0, 1)
    print(json.dumps({"ready": True, "load_s": round(time.perf_counter() - started, 3)}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "run":
            answer: dict[str, Any] = run_batches(system.timed, texts[command["set"]], command["batch"],
                                                 command["seconds"], command["min_calls"],
                                                 command.get("offset", 0))
        elif op == "outputs":
            answer = {"probs": system.outputs(texts[command["set"]])}
        elif op == "memory":
            answer = process_memory_kb()
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer), flush=True)
    return 0


class WorkerSystem:
    """The orchestrator's handle on an in-process contender running in its own worker process."""

    def __init__(self, name: str, model: Path, variant: str, threads: int, texts_file: Path,
                 checkpoint: Path | None, timeout: float = 600):
        self.command = worker_command(name, model, variant, threads, texts_file, checkpoint)
        self.proc = subprocess.Popen(self.command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=quiet_env())
        ready = self._answer(timeout)
        self.load_s = ready["load_s"]

    def _answer(self, timeout: float) -> dict[str, Any]:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise TimeoutError(f"{self.command[3:5]} did not answer in {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.command[3:5]} exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, command: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
        """Send one command, return its answer."""
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def run(self, kind: str, batch: int, seconds: float, min_calls: int, offset: int) -> dict[str, Any]:
        """Per-call latencies and CPU time of a timed segment."""
        return self.ask({"op": "run", "set": kind, "batch": batch, "seconds": seconds,
                         "min_calls": min_calls, "offset": offset})

    def outputs(self, kind: str) -> list[list[float]]:
        """Probabilities for every text of a set, in order."""
        return self.ask({"op": "outputs", "set": kind})["probs"]

    def memory(self) -> dict[str, int]:
        """Current and peak RSS of the worker."""
        return self.ask({"op": "memory"})

    def close(self) -> None:
        """End the worker (EOF on its stdin)."""
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def worker_command(name: str, model: Path, variant: str, threads: int, texts_file: Path,
                   checkpoint: Path | None, cold: bool = False) -> list[str]:
    """argv of a worker for one contender."""
    command = [sys.executable, str(Path(__file__).resolve()), "--system", name, "--model", str(model),
               "--variant", variant, "--threads", str(threads), "--texts", str(texts_file)]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    if cold:
        command.append("--cold")
    return command


def quiet_env() -> dict[str, str]:
    """Environment of every contender: the article's TOKENIZERS_PARALLELISM=false for all alike."""
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false"}


# ----------------------------------------------------------------------------- decide over pipes

class WireSystem:
    """decide serving JSON lines on stdin/stdout; a batch of n = n request lines written at once."""

    def __init__(self, command: list[str], model: Path, variant: str, texts: dict[str, list[str]],
                 timeout: float = 600):
        started = time.perf_counter()
        self.command = [*command, "--model", str(model), "--variant", variant, "--ready", "--quiet"]
        self.proc = subprocess.Popen(self.command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=quiet_env())
        self.fd, self.pending = self.proc.stdout.fileno(), b""
        ready = json.loads(self._line(timeout))
        if ready.get("event") != "ready":
            raise RuntimeError(f"decide did not report ready: {ready}")
        self.load_s = round(time.perf_counter() - started, 3)
        self.texts = texts
        self.encoded = {kind: [json.dumps({"text": t}, ensure_ascii=False).encode("utf-8") + b"\n" for t in ts]
                        for kind, ts in texts.items()}

    def _line(self, timeout: float = 120) -> bytes:
        # Own buffer over the raw fd: select() on a buffered file misses lines already read ahead.
        while b"\n" not in self.pending:
            if not select.select([self.fd], [], [], timeout)[0]:
                raise TimeoutError("decide did not answer")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise RuntimeError(f"decide exited with {self.proc.wait()}")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def _call(self, lines: list[bytes]) -> list[dict[str, Any]]:
        self.proc.stdin.write(b"".join(lines))
        self.proc.stdin.flush()
        answers = [json.loads(self._line()) for _ in lines]
        for answer in answers:
            if "probs" not in answer and "label" not in answer:
                raise RuntimeError(f"decide answered {answer}")
        return answers

    def run(self, kind: str, batch: int, seconds: float, min_calls: int, offset: int) -> dict[str, Any]:
        """Per-call latencies (client side: write n lines → n answers) and decide's CPU time."""
        lines = self.encoded[kind]
        cpu0 = process_tree_cpu_s(self.proc.pid)
        result = run_batches(self._call, lines, batch, seconds, min_calls, offset)  # type: ignore[arg-type]
        result["cpu_s"] = process_tree_cpu_s(self.proc.pid) - cpu0
        return result

    def outputs(self, kind: str) -> list[list[float]]:
        """Probabilities for every text of a set (the "scores" object is in label order)."""
        return [list(a["scores"].values()) for a in self._call(self.encoded[kind])]

    def memory(self) -> dict[str, int]:
        """RSS of decide's process tree (a frozen app may run as bootloader + child)."""
        return process_tree_memory_kb(self.proc.pid)

    def close(self) -> None:
        """EOF on decide's stdin; it answers what it read and exits."""
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            todo.extend(int(c) for c in children)
    return found


def process_tree_memory_kb(pid: int) -> dict[str, int]:
    """Summed VmRSS and VmHWM over a process tree."""
    total = {"rss_kb": 0, "peak_rss_kb": 0}
    for member in process_tree(pid):
        for key, value in process_memory_kb(member).items():
            total[key] += value
    return total


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds used by a process tree so far."""
    return sum(process_cpu_s(member) for member in process_tree(pid))


def main() -> int:
    """Worker entry point (started by benchmarks/compare.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", choices=SYSTEMS, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--texts", type=Path, required=True, help='JSON {"short": [...], "medium": [...]}')
    parser.add_argument("--checkpoint", type=Path, default=None, help="torch: folder with model.pt, meta.json")
    parser.add_argument("--cold", action="store_true", help="answer the first short text once and exit")
    return serve_worker(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
