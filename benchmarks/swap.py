"""Live swaps under load (issue 25): socket clients stream while packages are swapped in and out.

    python3 benchmarks/swap.py                                   # 16 clients, 60 s, 20 swaps, default package
    nice -n 10 python3 benchmarks/swap.py --clients 4 --seconds 20 --model DIR    # a quick check, any package

Two good packages (A, B: copies of the package with versions `<v>-a` / `<v>-b`, re-hashed through
the factory's manifest writer and signed with a trusted key) alternate; every 5th swap is a bad
package instead, alternately damaged (a byte flipped in a file after signing: checksum) or signed
by a key the server does not trust — each with its own version, so an answer made by one would
show. The server runs `decide serve --socket … --trust-key …`; swaps are `{"op":"reload"}` on a
control connection. First --baseline seconds without swaps, then --seconds with --swaps spread
evenly. Every client keeps --window requests in flight on its own connection.

Printed: answers lost, duplicated, out of order, internal_error and other errors; the models
that answered; each swap's result (good ones must serve, bad ones must be refused); p50/p99
latency without swaps and for requests sent while a swap was under way (from the reload op to its
answer), and their ratio (issue 25: ≤ 3). Exit 1 if any must-reach figure is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]
TEXTS = ["Pumpe 3: Vibration über Grenzwert", "the rain and the wind", "le serveur", "Tor Spiel Team",
         "Unter der Hydraulikpresse steht eine Öllache", "server pump code", "雨", "the team scored a goal"]


def make_packages(source: Path, work: Path) -> dict[str, Path]:
    """Good A and B, damaged D and wrongly signed W, plus the keys; returns their directories."""
    from models import keys
    from runtime.package.load import load_package
    from runtime.package.manifest import write_manifest

    keys.keygen(work / "trusted.key")
    keys.keygen(work / "stranger.key")
    base = load_package(source).manifest.version
    made = {}
    for name, suffix, key in (("A", "a", "trusted"), ("B", "b", "trusted"), ("D", "damaged", "trusted"),
                              ("W", "wrong-key", "stranger")):
        target = work / name
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("manifest.json.minisig"))
        manifest = load_package(target).manifest
        write_manifest(target, dataclasses.replace(manifest, version=f"{base}-{suffix}"))
        keys.sign_package(target, work / f"{key}.key")
        made[name] = target
    damaged = made["D"] / load_package(made["D"]).manifest.tokenizer.file
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x20  # after signing: the signature is right, a checksum is not
    damaged.write_bytes(bytes(data))
    return made


def start_server(package: Path, work: Path, threads: int | None) -> tuple[subprocess.Popen, str]:
    socket_dir = work / "run"
    socket_dir.mkdir(mode=0o700)
    path = str(socket_dir / "decide.sock")
    command = [sys.executable, "-m", "runtime", "serve", "--model", str(package), "--socket", path, "--ready",
               "--trust-key", str(work / "trusted.pub"), "--queue-size", "1024", "-q"]
    if threads:
        command += ["--threads", str(threads)]
    with open(work / "server.log", "wb") as log:  # the server holds its own copy of the descriptor
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=log,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"server did not start: {(work / 'server.log').read_text()[-2000:]}")
    return proc, path


@dataclasses.dataclass
class Tally:
    sent: dict[str, float] = dataclasses.field(default_factory=dict)  # id → send time
    latencies: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (sent at, ms)
    answered: set[str] = dataclasses.field(default_factory=set)
    duplicated: int = 0
    out_of_order: int = 0
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    models: dict[str, int] = dataclasses.field(default_factory=dict)


async def client(number: int, path: str, window: int, until: list[float], tally: Tally) -> None:
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 22)
    order: list[str] = []
    sequence = 0

    def send() -> None:
        nonlocal sequence
        request_id = f"c{number}-{sequence}"
        text = TEXTS[(number + sequence) % len(TEXTS)]
        sequence += 1
        tally.sent[request_id] = time.perf_counter()
        order.append(request_id)
        writer.write(json.dumps({"id": request_id, "text": text}).encode() + b"\n")

    for _ in range(window):
        send()
    while order:
        line = await reader.readline()
        if not line:
            break
        answer, now = json.loads(line), time.perf_counter()
        expected = order.pop(0)
        request_id = answer.get("id")
        if request_id in tally.answered:
            tally.duplicated += 1
        elif request_id != expected:
            tally.out_of_order += 1
        if request_id in tally.sent:
            tally.answered.add(request_id)
            tally.latencies.append((tally.sent[request_id], (now - tally.sent[request_id]) * 1000))
        if "error" in answer:
            code = answer["error"]["code"]
            tally.errors[code] = tally.errors.get(code, 0) + 1
        else:
            tally.models[answer.get("model")] = tally.models.get(answer.get("model"), 0) + 1
        if time.perf_counter() < until[0]:
            send()
    writer.close()


async def control(path: str, request: dict) -> dict:
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 22)
    writer.write(json.dumps(request).encode() + b"\n")
    await writer.drain()
    answer = json.loads(await reader.readline())
    writer.close()
    return answer


async def run(args: argparse.Namespace, packages: dict[str, Path], path: str) -> dict:
    tally = Tally()
    start = time.perf_counter()
    until = [start + args.baseline + args.seconds]
    clients = [asyncio.create_task(client(n, path, args.window, until, tally)) for n in range(args.clients)]
    await asyncio.sleep(args.baseline)
    swap_phase = time.perf_counter()
    windows, results = [], []
    good = ["B", "A"]
    for index in range(1, args.swaps + 1):
        slot = swap_phase + (index - 0.5) * args.seconds / args.swaps
        await asyncio.sleep(max(0.0, slot - time.perf_counter()))
        name = ("D" if (index // 5) % 2 else "W") if index % 5 == 0 else good[(index - 1 - index // 5) % 2]
        began = time.perf_counter()
        answer = await control(path, {"id": index, "op": "reload", "model": str(packages[name])})
        ended = time.perf_counter()
        windows.append((began, ended))
        ok = answer.get("status") == "ok"
        results.append({"swap": index, "package": name, "ok": ok, "expected": name in "AB",
                        "s": round(ended - began, 2), "detail": answer.get("serving") or answer["error"]["message"][:160]})
    await asyncio.gather(*clients)
    stats = await control(path, {"op": "stats"})
    return {"tally": tally, "baseline_until": swap_phase, "windows": windows, "results": results, "stats": stats}


def report(args: argparse.Namespace, outcome: dict, packages: dict[str, Path]) -> tuple[dict, bool]:
    from runtime.package.load import load_package
    from runtime.platform.appdir import DEFAULT_MODEL
    from runtime.serve.service import percentile  # the server's own nearest-rank percentile

    tally: Tally = outcome["tally"]
    versions = {name: f"{load_package(p).manifest.name}@{load_package(p).manifest.version}"
                for name, p in packages.items()}
    baseline = sorted(ms for sent, ms in tally.latencies if sent < outcome["baseline_until"])
    during = sorted(ms for sent, ms in tally.latencies if any(a <= sent <= b for a, b in outcome["windows"]))
    p99_base, p99_swap = percentile(baseline, 0.99), percentile(during, 0.99)
    ratio = round(p99_swap / p99_base, 2) if p99_base and p99_swap else None
    lost = len(tally.sent) - len(tally.answered)
    figures = {
        "clients": args.clients, "seconds": args.seconds, "baseline_s": args.baseline, "package": str(args.model or DEFAULT_MODEL),
        "requests": len(tally.sent), "answered": len(tally.answered), "lost": lost, "duplicated": tally.duplicated,
        "out_of_order": tally.out_of_order, "errors": tally.errors, "models": tally.models,
        "bad_served": sum(n for model, n in tally.models.items() if model in (versions["D"], versions["W"])),
        "unknown_models": sorted(m for m in tally.models if m not in (versions["A"], versions["B"])),
        "swaps": outcome["results"],
        "swaps_as_expected": sum(r["ok"] == r["expected"] for r in outcome["results"]),
        "latency_ms": {"baseline_p50": percentile(baseline, 0.5), "baseline_p99": p99_base,
                       "during_swaps_p50": percentile(during, 0.5), "during_swaps_p99": p99_swap,
                       "during_swaps_requests": len(during), "p99_ratio": ratio},
        "server_swap_stats": outcome["stats"].get("swap"), "cpu": cpu_name(), "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    passed = (lost == 0 and tally.duplicated == 0 and tally.out_of_order == 0 and not tally.errors
              and not figures["unknown_models"] and figures["swaps_as_expected"] == len(outcome["results"])
              and ratio is not None and ratio <= 3.0)
    return figures, passed


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0, help="the swap phase")
    parser.add_argument("--baseline", type=float, default=15.0, help="seconds without swaps first")
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--window", type=int, default=2, help="requests in flight per client")
    parser.add_argument("--model", type=Path, default=None,
                        help="the package to make A, B, D and W from (default: the default package)")
    parser.add_argument("--threads", type=int, default=None, help="--threads for the server")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from runtime.platform.appdir import DEFAULT_MODEL

    with tempfile.TemporaryDirectory(prefix="decide-swap-") as folder:
        work = Path(folder)
        packages = make_packages(args.model or REPO / DEFAULT_MODEL, work)
        proc, path = start_server(packages["A"], work, args.threads)
        try:
            outcome = asyncio.run(run(args, packages, path))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        figures, passed = report(args, outcome, packages)
        figures["server_log_tail"] = (work / "server.log").read_text(errors="replace").splitlines()[-5:]
    if args.json:
        print(json.dumps(figures, indent=1, ensure_ascii=False))
    else:
        for key, value in figures.items():
            if key == "swaps":
                for row in value:
                    print(f"  swap {row['swap']:>2} {row['package']}: {'served' if row['ok'] else 'refused'} "
                          f"({'as expected' if row['ok'] == row['expected'] else 'WRONG'}) in {row['s']} s: {row['detail']}")
            else:
                print(f"{key}: {value}")
        print("MUST-REACH:", "met" if passed else "MISSED")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
