"""Load test for the socket service: N concurrent closed-loop clients → throughput and latency vs N.

Each client holds one connection and keeps exactly one request in flight (send, wait for the
answer, send the next), like N independent apps. Latency is measured by the client (send → answer
line), so it includes the socket, batching delay and queueing. N=1 is serial batch-1 traffic;
the ratio of each row's throughput to it shows what cross-connection micro-batching buys.

    python3 benchmarks/load.py                                  # starts its own server, default model
    python3 benchmarks/load.py --clients 1,16 --seconds 20 --rounds 10      # interleaved: fair on a busy box
    python3 benchmarks/load.py --clients 1,4,16 --seconds 5 --server-args="--batch-delay-ms 0"
    python3 benchmarks/load.py --socket /run/decide.sock        # an already running server

Texts: the package's golden set (real multilingual sentences), cycled; or --texts FILE (JSON lines
with a "text" field). Stdlib only; the client is one asyncio process, or with --client c the
closed-loop client in benchmarks/loadclient.c (compiled with `cc -O2` on first use), which costs the
box almost no CPU: on a 2-core machine the Python client's own work takes CPU from the server it
measures (see the table's "cli cpu" column).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import select
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.platform.appdir import DEFAULT_MODEL as DEFAULT_MODEL_DIR
from runtime.serve.service import (
    percentile,  # the one nearest-rank percentile of the measuring code
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / DEFAULT_MODEL_DIR  # the embedded default (runtime/platform/appdir.py)


def load_texts(path: Path) -> list[str]:
    """The "text" field of every JSON line in `path`."""
    with open(path, encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh if line.strip()]
    if not texts:
        raise SystemExit(f"no texts in {path}")
    return texts


async def open_connection(where: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to `unix:PATH` or `tcp:HOST:PORT` (the server's "listen" string)."""
    kind, _, address = where.partition(":")
    if kind == "unix":
        return await asyncio.open_unix_connection(address, limit=1 << 22)
    host, _, port = address.rpartition(":")
    return await asyncio.open_connection(host.strip("[]"), int(port), limit=1 << 22)


async def request(where: str, line: dict[str, Any]) -> dict[str, Any]:
    """One request on a fresh connection (for the stats op)."""
    reader, writer = await open_connection(where)
    writer.write(json.dumps(line).encode() + b"\n")
    answer = json.loads(await reader.readline())
    writer.close()
    return answer


async def client(where: str, texts: list[str], offset: int, stop_at: float, measure_from: float,
                 latencies: list[float], errors: list[str]) -> None:
    """A closed-loop client: one request in flight until stop_at; latencies after measure_from."""
    reader, writer = await open_connection(where)
    number = offset
    try:
        while time.perf_counter() < stop_at:
            text = texts[number % len(texts)]
            sent = time.perf_counter()
            writer.write(json.dumps({"id": number, "text": text}, ensure_ascii=False).encode() + b"\n")
            answer = json.loads(await reader.readline())
            done = time.perf_counter()
            if answer.get("id") != number:
                raise RuntimeError(f"answer for id {answer.get('id')} on a connection waiting for {number}")
            if sent >= measure_from:
                if "error" in answer:
                    errors.append(answer["error"]["code"])
                else:
                    latencies.append(done - sent)
            number += 1
    finally:
        writer.close()


@dataclass
class Measurement:
    """Raw results of one or more measured slices at one client count."""

    clients: int
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    batches: Counter[int] = field(default_factory=Counter)
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    server_rss_mb: float | None = None


class CClient:
    """benchmarks/loadclient.c, built once into a private directory, with the texts it cycles."""

    def __init__(self, texts: list[str], directory: str):
        source = REPO / "benchmarks" / "loadclient.c"
        self.binary = os.path.join(directory, "loadclient")
        built = subprocess.run(["cc", "-O2", "-o", self.binary, str(source)], check=False,
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise SystemExit(f"--client c: cc could not build {source}:\n{built.stderr}")
        self.texts_file = os.path.join(directory, "texts.jsonl")
        with open(self.texts_file, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(text, ensure_ascii=False) + "\n" for text in texts)

    def run(self, where: str, clients: int, warm_s: float, seconds: float) -> dict[str, Any]:
        done = subprocess.run([self.binary, where, str(clients), str(warm_s), str(seconds), self.texts_file],
                              check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"loadclient failed: {done.stderr.strip()}")
        return json.loads(done.stdout)


async def measure_slice(where: str, texts: list[str], into: Measurement, seconds: float, warm_s: float,
                        c_client: CClient | None = None) -> None:
    """N clients for warm_s (not measured) + seconds (measured), added to `into`."""
    before = await request(where, {"id": "before", "op": "stats"})
    if c_client is not None:
        result = await asyncio.to_thread(c_client.run, where, into.clients, warm_s, seconds)
        into.latencies += [us / 1e6 for us in result["latencies_us"]]
        into.client_cpu_s += result["cpu_s"]
        into.seconds += result["seconds"]
        into.errors += result["errors"]
    else:
        measure_from = time.perf_counter() + warm_s
        stop_at = measure_from + seconds
        errors: list[str] = []
        cpu_before = time.process_time()
        await asyncio.gather(*(client(where, texts, c * 7919, stop_at, measure_from, into.latencies, errors)
                               for c in range(into.clients)))
        into.client_cpu_s += time.process_time() - cpu_before
        into.seconds += time.perf_counter() - measure_from
        into.errors += len(errors)
    after = await request(where, {"id": "after", "op": "stats"})
    into.batches.update({int(k): v - before["batch_sizes"].get(k, 0) for k, v in after["batch_sizes"].items()})
    into.server_cpu_s += after["cpu_s"] - before["cpu_s"]
    into.server_rss_mb = after.get("rss_mb")


def summarize(m: Measurement) -> dict[str, Any]:
    """One table row from the raw measurement."""
    ordered = sorted(m.latencies)
    batch_count = sum(m.batches.values())
    return {
        "clients": m.clients,
        "requests": len(ordered),
        "errors": m.errors,
        "throughput_rps": round(len(ordered) / m.seconds, 1),
        "p50_ms": round(percentile(ordered, 0.50) * 1000, 2) if ordered else None,
        "p95_ms": round(percentile(ordered, 0.95) * 1000, 2) if ordered else None,
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 2) if ordered else None,
        "mean_batch": round(sum(k * v for k, v in m.batches.items()) / batch_count, 2) if batch_count else None,
        "client_cpu_s": round(m.client_cpu_s, 2),
        # Server CPU per answered request: unlike req/s, barely moved by other processes on the box.
        "server_cpu_ms_per_request": round(m.server_cpu_s * 1000 / max(1, len(ordered)), 2),
        "server_rss_mb": m.server_rss_mb,
    }


async def run_levels(where: str, texts: list[str], levels: list[int], seconds: float, warm_s: float,
                     rounds: int, between: Callable[[], None] | None = None,
                     c_client: CClient | None = None) -> list[dict[str, Any]]:
    """Every level for `seconds`, split into `rounds` interleaved slices (1,2,…,16,1,2,…) so that
    load from other processes on a shared box hits every level alike; `between` runs before each round."""
    measurements = [Measurement(n) for n in levels]
    for _ in range(rounds):
        if between is not None:
            between()
        for m in measurements:
            await measure_slice(where, texts, m, seconds / rounds, warm_s, c_client)
    return [summarize(m) for m in measurements]


class EngineCeiling:
    """The bare engine (in this process, built as the server reports it: variant, threads,
    workers) on random batches of `batch` texts, back to back: the most the server could give at
    `batch` clients. Measured in slices between the load rounds, while the server idles."""

    def __init__(self, model: Path, info: dict[str, Any], texts: list[str], batch: int, seconds: float):
        from runtime.engine.engine import Engine, SessionSettings
        from runtime.package.load import load_package

        settings = SessionSettings(threads=info["threads"], workers=info.get("workers", 1))
        self.engine = Engine(load_package(model), info["variant"], settings)
        self.engine.warm_up()
        rng = random.Random(3)
        self.batches = [[texts[rng.randrange(len(texts))] for _ in range(batch)] for _ in range(50)]
        self.seconds = seconds
        self.texts = 0
        self.elapsed = 0.0

    def __call__(self) -> None:
        stop_at = time.perf_counter() + self.seconds
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            for batch in self.batches:
                self.engine.classify(batch)
            self.elapsed += time.perf_counter() - start
            self.texts += sum(len(batch) for batch in self.batches)

    def per_s(self) -> float:
        return self.texts / self.elapsed


def start_server(model: Path, extra: list[str], directory: str) -> tuple[subprocess.Popen, dict[str, Any]]:
    """`decide serve --socket` in a private directory; returns it and its ready event."""
    path = os.path.join(directory, "decide.sock")
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "serve", "--model", str(model), "--socket", path,
                             "--ready", "-q", *extra], cwd=REPO, stdout=subprocess.PIPE)
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else b""
    if not line:
        proc.kill()
        raise SystemExit("the server did not start (see its stderr above)")
    return proc, json.loads(line)


def format_table(rows: list[dict[str, Any]], header: str) -> str:
    """Human-readable table with the speed-up over the 1-client row."""
    base = next((r["throughput_rps"] for r in rows if r["clients"] == 1), None)
    lines = [header, (f"{'clients':>7} {'req/s':>8} {'x N=1':>6} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
                      f"{'batch':>6} {'errors':>6} {'requests':>8} {'cli cpu':>7} {'srv cpu ms/req':>14}")]
    for r in rows:
        speedup = f"{r['throughput_rps'] / base:.2f}" if base else "-"
        lines.append(f"{r['clients']:>7} {r['throughput_rps']:>8.1f} {speedup:>6} {r['p50_ms']:>7} {r['p95_ms']:>7} "
                     f"{r['p99_ms']:>7} {r['mean_batch']!s:>6} {r['errors']:>6} {r['requests']:>8} "
                     f"{r['client_cpu_s']:>7} {r['server_cpu_ms_per_request']:>14}")
    return "\n".join(lines)


def main() -> int:
    """Run every client level and print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="package for the server it starts")
    parser.add_argument("--socket", help="use a running server on this Unix socket")
    parser.add_argument("--tcp", help="use a running server on HOST:PORT")
    parser.add_argument("--server-args", default="", help="extra `decide serve` options for the server it starts")
    parser.add_argument("--clients", default="1,2,4,8,16", help="comma-separated client counts")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level")
    parser.add_argument("--warm", type=float, default=0.5, help="unmeasured seconds before each slice")
    parser.add_argument("--rounds", type=int, default=1,
                        help="split each level's time into this many interleaved slices (fairer on a busy box)")
    parser.add_argument("--texts", type=Path, help="JSON lines with a text field (default: the golden set)")
    parser.add_argument("--engine-ceiling", action="store_true",
                        help="also time the bare engine on random batches of the largest client count, "
                             "interleaved with the rounds (needs the server's model: not with --socket/--tcp)")
    parser.add_argument("--client", choices=("python", "c"), default="python",
                        help="c: the closed-loop client of benchmarks/loadclient.c (needs cc), which leaves the "
                             "CPU to the server")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    levels = [int(n) for n in args.clients.split(",") if n.strip()]
    load_before = os.getloadavg()[0]

    with contextlib.ExitStack() as stack:
        proc = None
        if args.socket or args.tcp:
            where = f"unix:{args.socket}" if args.socket else f"tcp:{args.tcp}"
            texts = load_texts(args.texts) if args.texts else None
        else:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="decide-load-"))
            proc, ready = start_server(args.model, shlex.split(args.server_args), directory)
            stack.callback(lambda: (proc.terminate(), proc.wait(timeout=60)))
            where = ready["listen"]
            texts = load_texts(args.texts or args.model / "golden.jsonl")
        if texts is None:
            raise SystemExit("--texts is required with --socket/--tcp")
        info = asyncio.run(request(where, {"id": "info", "op": "info"}))
        ceiling = None
        if args.engine_ceiling:
            if proc is None:
                raise SystemExit("--engine-ceiling needs the server this script starts (no --socket/--tcp)")
            ceiling = EngineCeiling(args.model, info, texts, max(levels), args.seconds / args.rounds)
        c_client = None
        if args.client == "c":
            c_client = CClient(texts, stack.enter_context(tempfile.TemporaryDirectory(prefix="decide-loadclient-")))
        rows = asyncio.run(run_levels(where, texts, levels, args.seconds, args.warm, args.rounds, ceiling, c_client))
    if ceiling is not None:
        for row in rows:
            if row["clients"] == max(levels):
                row["engine_ceiling_per_s"] = round(ceiling.per_s(), 1)
                row["vs_engine"] = round(row["throughput_rps"] / ceiling.per_s(), 3)

    header = (f"model {info['model']['name']} {info['model']['version']}, variant {info['variant']}, "
              f"{info['threads']} threads, server {info['server']}, {args.client} client, {len(texts)} texts cycled, "
              f"{args.seconds:g} s per level in {args.rounds} interleaved round(s), {os.cpu_count()} CPUs, load average before/after "
              f"{load_before:.2f}/{os.getloadavg()[0]:.2f} (other processes share these cores)")
    if ceiling is not None:
        header += (f"\nbare engine, random batches of {max(levels)} texts: {ceiling.per_s():.1f} texts/s; "
                   f"server at {max(levels)} clients = "
                   f"{next(r['vs_engine'] for r in rows if r['clients'] == max(levels)) * 100:.1f} % of it")
    if args.json:
        print(json.dumps({"info": info, "load_average": [load_before, os.getloadavg()[0]], "rows": rows}, indent=2))
    else:
        print(format_table(rows, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
