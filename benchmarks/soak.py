"""Soak: many mixed requests with hostile lines over stdio and the socket; lost or duplicated
answers, RSS growth over the second half, peak RSS.

    python3 benchmarks/soak.py --model DIR [--requests 200000] [--clients 8] [--json]

Each transport gets --requests request lines: single texts, text lists, control ops, and about
one hostile line in 20 (deep nesting, invalid UTF-8, huge integers, lines of U+3000, over-long
lines, huge texts, random bytes). Every good line has a unique id; the script checks that each
connection gets exactly one answer per non-blank line, in order, and that every id comes back
once. The server's RSS is sampled as answers arrive: growth = RSS at the end vs at the half-way
point (after warm-up effects); peak = VmHWM.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = ["rain", "goal", "server", "pump", "sun", "match", "code", "snow", "team", "software", "Regen", "Tor",
         "Pumpe", "über", "Grenzwert", "la", "pluie", "le", "serveur", "雨", "weather", "today", "the", "is"]
MAX_LINE = 1 << 20
HOSTILE = [
    b"[" * 5000, b'{"a":' * 3000, b"\xc3\x28\xff", b'{"id": ' + b"9" * 5000 + b', "text": "x"}',
    "\u3000".encode(), b"\x1c", b'{"text": "\\ud800"}', b"{not json", b'{"op": "reboot"}', b'{"texts": []}',
    b'{"text": "' + b"z" * (MAX_LINE + 10) + b'"}',  # over the line limit
]


def proc_memory(pid: int) -> dict[str, float]:
    """VmRSS / VmHWM of a process in MB."""
    memory = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                memory[key] = int(value.split()[0]) / 1024
    return memory


def make_lines(count: int, prefix: str, rng: random.Random) -> tuple[list[bytes], list]:
    """Request lines and, per line, the id its answer must carry (None: an id-less error)."""
    lines, expected = [], []
    for i in range(count):
        request_id = f"{prefix}-{i}"
        roll = rng.random()
        if roll < 0.05:
            hostile = rng.choice(HOSTILE + [b"huge-text", b"random"])
            if hostile == b"huge-text":
                line = json.dumps({"id": request_id, "text": "rain " + "q" * 200_000}).encode()
                expected.append(request_id)
            elif hostile == b"random":
                line = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80))).replace(b"\n", b"")
                line = line if line.strip(b" \t\r") and not line.startswith(b"\xef\xbb\xbf") else b"#"
                expected.append(None)
            else:
                line = hostile
                expected.append(None)
            lines.append(line)
            continue
        if roll < 0.07:
            line = {"id": request_id, "op": rng.choice(["health", "stats", "info"])}
        elif roll < 0.22:
            line = {"id": request_id, "texts": [" ".join(rng.choices(WORDS, k=rng.randint(1, 12)))
                                                for _ in range(rng.randint(2, 4))]}
        else:
            line = {"id": request_id, "text": " ".join(rng.choices(WORDS, k=rng.randint(1, 20)))}
        lines.append(json.dumps(line, ensure_ascii=False).encode())
        expected.append(request_id)
    return lines, expected


class Check:
    """Compares the answers of one stream with what was expected."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answered = 0
        self.lost = 0
        self.duplicated = 0
        self.out_of_order = 0
        self.bad_json = 0

    def compare(self, expected: list, answers: list[bytes]) -> None:
        received_ids = []
        for raw in answers:
            try:
                received_ids.append(json.loads(raw).get("id"))
            except ValueError:
                received_ids.append("<bad json>")
        with self.lock:
            self.answered += len(answers)
            self.bad_json += received_ids.count("<bad json>")
            want = [i for i in expected if i is not None]
            got = [i for i in received_ids if isinstance(i, str) and i != "<bad json>"]
            counts: dict[str, int] = {}
            for i in got:
                counts[i] = counts.get(i, 0) + 1
            self.duplicated += sum(n - 1 for n in counts.values() if n > 1)
            # ids that never came back; id-less answers (errors for hostile lines) count by number
            self.lost += max(sum(1 for i in want if i not in counts), len(expected) - len(answers))
            wanted = set(want)
            if [i for i in got if i in wanted] != [i for i in want if i in counts]:
                self.out_of_order += 1

    def to_json(self) -> dict[str, int]:
        return {"answered": self.answered, "lost": self.lost, "duplicated": self.duplicated,
                "out_of_order_streams": self.out_of_order, "bad_json": self.bad_json}


class Sampler(threading.Thread):
    """Samples the server's RSS with the fraction of answers received so far."""

    def __init__(self, pid: int, progress) -> None:
        super().__init__(daemon=True)
        self.pid, self.progress = pid, progress
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.25):
            try:
                self.samples.append((self.progress(), proc_memory(self.pid)["VmRSS"]))
            except (OSError, KeyError):
                return

    def growth(self) -> dict[str, float]:
        """RSS at half-way and at the end, and the growth in between (%)."""
        mid = next((rss for fraction, rss in self.samples if fraction >= 0.5), None)
        end = self.samples[-1][1] if self.samples else None
        if mid is None or end is None:
            return {}
        return {"rss_mid_mb": round(mid, 1), "rss_end_mb": round(end, 1),
                "rss_growth_last_half_pct": round((end - mid) / mid * 100, 2)}


def soak_stdio(command: list[str], total: int, rng: random.Random) -> dict:
    lines, expected = make_lines(total, "s", rng)
    proc = subprocess.Popen([*command, "--ready", "-q"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert json.loads(proc.stdout.readline())["event"] == "ready"
    answers: list[bytes] = []
    sampler = Sampler(proc.pid, lambda: len(answers) / total)
    sampler.start()
    started = time.monotonic()

    def feed() -> None:
        try:
            for offset in range(0, total, 1000):
                proc.stdin.write(b"".join(line + b"\n" for line in lines[offset:offset + 1000]))
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # the server died: the missing answers show as lost

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    finished = threading.Event()

    def watchdog() -> None:  # a server that stops answering for 120 s ends the run (lost answers)
        seen = -1
        while not finished.wait(120):
            if len(answers) == seen:
                proc.kill()
                return
            seen = len(answers)

    threading.Thread(target=watchdog, daemon=True).start()
    while len(answers) < len(expected) and (line := proc.stdout.readline()):
        answers.append(line)
    finished.set()
    elapsed = time.monotonic() - started
    memory = proc_memory(proc.pid) if proc.poll() is None else {"VmHWM": float("nan")}
    sampler.stopped.set()
    feeder.join()
    proc.stdin.close()
    extra = proc.stdout.read()
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    check = Check()
    check.compare(expected, answers + extra.splitlines(keepends=True))
    return {"transport": "stdio", "requests": total, "hostile": expected.count(None), "seconds": round(elapsed, 1),
            "requests_per_s": round(total / elapsed), **check.to_json(), "peak_rss_mb": round(memory["VmHWM"], 1),
            **sampler.growth(), "exit_code": proc.returncode, "traceback": "Traceback" in err}


def soak_socket(command: list[str], total: int, clients: int, rng: random.Random) -> dict:
    directory = tempfile.mkdtemp(prefix="decide-soak-")
    path = os.path.join(directory, "s")
    proc = subprocess.Popen([*command, "--socket", path, "--ready", "-q"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert json.loads(proc.stdout.readline())["event"] == "ready"
    per_client = total // clients
    streams = [make_lines(per_client, f"c{c}", random.Random(rng.random())) for c in range(clients)]
    check = Check()
    done = [0]
    sampler = Sampler(proc.pid, lambda: done[0] / (per_client * clients))
    sampler.start()
    started = time.monotonic()

    def client(lines: list[bytes], expected: list) -> None:
        # Connections of 2,000 lines each: the client pipelines a connection's lines, half-closes,
        # and reads its answers until EOF while still writing (a reader thread).
        for offset in range(0, len(lines), 2000):
            chunk, want = lines[offset:offset + 2000], expected[offset:offset + 2000]
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(path)
                received = bytearray()

                def read() -> None:
                    while data := sock.recv(1 << 16):
                        received.extend(data)

                reader = threading.Thread(target=read)
                reader.start()
                sock.sendall(b"".join(line + b"\n" for line in chunk))
                sock.shutdown(socket.SHUT_WR)
                reader.join()
            answers = [bytes(line) + b"\n" for line in received.split(b"\n")[:-1]]
            check.compare(want, answers)
            done[0] += len(chunk)

    threads = [threading.Thread(target=client, args=stream) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    memory = proc_memory(proc.pid)
    sampler.stopped.set()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    return {"transport": f"socket ({clients} clients)", "requests": per_client * clients,
            "hostile": sum(e.count(None) for _, e in streams), "seconds": round(elapsed, 1),
            "requests_per_s": round(per_client * clients / elapsed), **check.to_json(),
            "peak_rss_mb": round(memory["VmHWM"], 1), **sampler.growth(), "exit_code": proc.returncode,
            "traceback": "Traceback" in err}


def huge_texts(command: list[str], socket_command: list[str], lines: int, clients: int) -> list[dict]:
    """Peak RSS when every line is a ~1 MiB text (issue 15: 128 such lines once took 7.2 GB over
    stdio, 1.9 GB on the socket): `lines` lines over stdio, then `clients` × lines/clients over
    the socket. Every answer must come back truncated."""
    text = "rain " + "q" * ((1 << 20) - 64)
    payload = [json.dumps({"id": f"h-{i}", "text": text}).encode() for i in range(lines)]
    rows = []
    proc = subprocess.Popen([*command, "-q"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, _ = proc.communicate(b"\n".join(payload) + b"\n", timeout=600)
    answers = [json.loads(line) for line in out.splitlines()]
    rows.append({"transport": "stdio, 1 MiB texts", "lines": lines, "answered_truncated":
                 sum(1 for a in answers if a.get("truncated") is True), "exit_code": proc.returncode})
    directory = tempfile.mkdtemp(prefix="decide-huge-")
    path = os.path.join(directory, "s")
    server = subprocess.Popen([*socket_command, "--socket", path, "--ready", "-q", "--max-line-bytes", str(2 << 20)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert json.loads(server.stdout.readline())["event"] == "ready"
    truncated = [0]

    def client(share: list[bytes]) -> None:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(b"".join(line + b"\n" for line in share))
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := sock.recv(1 << 16):
                data += chunk
        truncated[0] += sum(1 for line in data.split(b"\n")[:-1] if json.loads(line).get("truncated") is True)

    threads = [threading.Thread(target=client, args=(payload[c::clients],)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    peak = proc_memory(server.pid)["VmHWM"]
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)
    rows.append({"transport": f"socket ({clients} clients), 1 MiB texts", "lines": lines,
                 "answered_truncated": truncated[0], "peak_rss_mb": round(peak, 1), "exit_code": server.returncode})
    return rows


def stdio_peak_rss(command: list[str], lines: int) -> float:
    """Peak RSS (MB, VmHWM) of a stdio decide answering `lines` 1 MiB texts. Read from /proc while
    it runs: after exit, rusage's ru_maxrss would include the parent's memory from before exec."""
    text = "rain " + "q" * ((1 << 20) - 64)
    payload = b"".join(json.dumps({"id": i, "text": text}).encode() + b"\n" for i in range(lines))
    proc = subprocess.Popen([*command, "-q"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    writer = threading.Thread(target=lambda: (proc.stdin.write(payload), proc.stdin.flush()))
    writer.start()
    for _ in range(lines):
        proc.stdout.readline()
    peak = proc_memory(proc.pid)["VmHWM"]
    writer.join()
    proc.stdin.close()
    proc.wait(timeout=60)
    return round(peak, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model package (default: the embedded default model)")
    parser.add_argument("--command", default=f"{sys.executable} -m runtime", help="how to start decide")
    parser.add_argument("--requests", type=int, default=200_000, help="request lines per transport")
    parser.add_argument("--clients", type=int, default=8, help="socket clients")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--huge", type=int, default=0, metavar="N",
                        help="instead: peak RSS for N lines of 1 MiB texts over stdio and 16 socket clients")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    command = args.command.split() + (["--model", args.model] if args.model else [])
    rng = random.Random(args.seed)
    socket_command = [*command[:len(args.command.split())], "serve", *command[len(args.command.split()):]]
    if args.huge:
        rows = huge_texts(command, socket_command, args.huge, 16)
        rows[0]["peak_rss_mb"] = stdio_peak_rss(command, args.huge)
        print(json.dumps({"rows": rows, "load_average": os.getloadavg()}, indent=2) if args.json
              else "\n".join(" ".join(f"{k}={v}" for k, v in row.items()) for row in rows))
        return 0 if all(row["answered_truncated"] == args.huge for row in rows) else 1
    rows = [soak_stdio(command, args.requests, rng),
            soak_socket(socket_command, args.requests, args.clients, rng)]
    if args.json:
        print(json.dumps({"rows": rows, "load_average": os.getloadavg()}, indent=2))
    else:
        for row in rows:
            print(" ".join(f"{key}={value}" for key, value in row.items()))
        print(f"load average {os.getloadavg()[0]:.2f}")
    ok = all(r["lost"] == 0 and r["duplicated"] == 0 and r["exit_code"] == 0 and not r["traceback"]
             and r["bad_json"] == 0 and r["out_of_order_streams"] == 0 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
