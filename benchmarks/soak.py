"""Soak: many mixed requests with hostile lines over stdio and the socket; lost or duplicated
answers, RSS growth over the second half, peak RSS.

    python3 benchmarks/soak.py --model DIR [--requests 200000] [--clients 8] [--json]
    python3 benchmarks/soak.py --slow [--clients 50 --per-client 2000 --pause 10 --hogs 2] [--json]

--slow (issue 23): the engine artificially slowed (benchmarks/slow_engine.py: a sleep per call
and per text) with CPU hogs beside it, `--idle-timeout 2`; every client pipelines its requests
on one connection (a writer thread streams them in small writes), and every fifth client stops
reading its answers for --pause seconds after 300. Every request must be answered, in order, with
its id, none `busy`; the server's peak RSS (VmHWM) is printed with the load average.

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

from benchmarks import slow_engine

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


def make_lines(count: int, prefix: str, rng: random.Random, hostile: float = 0.05,
               ops: float = 0.02) -> tuple[list[bytes], list]:
    """Request lines and, per line, the id its answer must carry (None: an id-less error);
    `hostile` and `ops` are the shares of hostile lines and control ops."""
    lines, expected = [], []
    for i in range(count):
        request_id = f"{prefix}-{i}"
        roll = rng.random()
        if roll < hostile:
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
        if roll < hostile + ops:
            line = {"id": request_id, "op": rng.choice(["health", "stats", "info"])}
        elif roll < hostile + ops + 0.15:
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

                def read(sock: socket.socket = sock, received: bytearray = received) -> None:
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


class PipeliningClient(threading.Thread):
    """One connection: a writer thread streams the lines in small writes and half-closes; this
    thread reads every answer until EOF, optionally not reading for `pause_s` after 300 answers."""

    def __init__(self, path: str, lines: list[bytes], pause_s: float) -> None:
        super().__init__(daemon=True)
        self.path, self.lines, self.pause_s = path, lines, pause_s
        self.answers: list[bytes] = []
        self.error: str | None = None

    def run(self) -> None:
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(self.path)
                if self.pause_s:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # its answers back up fast
                writer = threading.Thread(target=self._feed, args=(sock,), daemon=True)
                writer.start()
                self._read(sock)
                writer.join()
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def _feed(self, sock: socket.socket) -> None:
        try:
            for offset in range(0, len(self.lines), 25):
                sock.sendall(b"".join(line + b"\n" for line in self.lines[offset:offset + 25]))
            sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self.error = f"writing: {type(exc).__name__}: {exc}"

    def _read(self, sock: socket.socket) -> None:
        buffer, paused = b"", not self.pause_s
        while True:
            if not paused and len(self.answers) >= 300:
                paused = True
                time.sleep(self.pause_s)  # longer than --idle-timeout: decide must wait, not close
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            self.answers.extend(line + b"\n" for line in complete)


def start_hogs(count: int) -> list[subprocess.Popen]:
    """Processes that burn a core each (the loaded edge box the issue was found on)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def soak_slow(model: str | None, clients: int, per_client: int, pause_s: float, hogs: int,
              slowdown: tuple[float, float], rng: random.Random) -> dict:
    """The issue-23 soak (module docstring): every request answered in order, none busy."""
    directory = tempfile.mkdtemp(prefix="decide-soak-slow-")
    path = os.path.join(directory, "s")
    command = [*slow_engine.command(*slowdown), "serve", *(["--model", model] if model else []),
               "--socket", path, "--ready", "-q", "--idle-timeout", "2"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert json.loads(proc.stdout.readline())["event"] == "ready"
    burners = start_hogs(hogs)
    streams = [make_lines(per_client, f"c{c}", random.Random(rng.random()), hostile=0.0, ops=0.01)
               for c in range(clients)]
    workers = [PipeliningClient(path, lines, pause_s if c % 5 == 0 else 0.0) for c, (lines, _) in enumerate(streams)]
    total = clients * per_client
    sampler = Sampler(proc.pid, lambda: sum(len(w.answers) for w in workers) / total)
    sampler.start()
    started = time.monotonic()
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    elapsed = time.monotonic() - started
    check = Check()
    for worker, (_, expected) in zip(workers, streams):
        check.compare(expected, worker.answers)
    busy = sum(b'"code": "busy"' in answer for worker in workers for answer in worker.answers)
    memory = proc_memory(proc.pid)
    sampler.stopped.set()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    return {"transport": f"socket, slowed engine {slowdown[0]:g} ms/call + {slowdown[1]:g} ms/text, {hogs} CPU hogs",
            "clients": clients, "requests": total, "paused_clients": len(range(0, clients, 5)),
            "pause_s": pause_s, "seconds": round(elapsed, 1), **check.to_json(), "busy": busy,
            "client_errors": [w.error for w in workers if w.error], "peak_rss_mb": round(memory["VmHWM"], 1),
            **sampler.growth(), "exit_code": proc.returncode, "traceback": "Traceback" in err,
            "server_log": err.strip().splitlines()[-5:]}


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
    parser.add_argument("--clients", type=int, default=None, help="socket clients (default 8; 50 with --slow)")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--huge", type=int, default=0, metavar="N",
                        help="instead: peak RSS for N lines of 1 MiB texts over stdio and 16 socket clients")
    parser.add_argument("--slow", action="store_true",
                        help="instead: the issue-23 soak (slowed engine, CPU hogs, pipelining and pausing clients)")
    parser.add_argument("--per-client", type=int, default=2000, help="--slow: pipelined requests per client")
    parser.add_argument("--pause", type=float, default=10.0, help="--slow: seconds every fifth client stops reading")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="--slow: CPU-burning processes beside it")
    parser.add_argument("--slowdown", default="20,0.5", metavar="MS_PER_CALL,MS_PER_TEXT",
                        help="--slow: the engine's extra sleep (default 20,0.5)")
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
    if args.slow:
        per_call, per_text = (float(x) for x in args.slowdown.split(","))
        rows = [soak_slow(args.model, args.clients or 50, args.per_client, args.pause, args.hogs,
                          (per_call, per_text), rng)]
    else:
        rows = [soak_stdio(command, args.requests, rng),
                soak_socket(socket_command, args.requests, args.clients or 8, rng)]
    if args.json:
        print(json.dumps({"rows": rows, "load_average": os.getloadavg()}, indent=2))
    else:
        for row in rows:
            print(" ".join(f"{key}={value}" for key, value in row.items()))
        print(f"load average {os.getloadavg()[0]:.2f}")
    ok = all(r["lost"] == 0 and r["duplicated"] == 0 and r["exit_code"] == 0 and not r["traceback"]
             and r["bad_json"] == 0 and r["out_of_order_streams"] == 0 and not r.get("busy")
             and not r.get("client_errors") for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
