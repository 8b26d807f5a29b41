"""decide run as a new user runs it, under strace, for long enough for an upload attempt (issue 33).

Each scenario starts decide with `CI` and ORT_DISABLE_TELEMETRY removed from its environment (CI
sets the first, which hides onnxruntime's telemetry; decide's own test process sets the second),
HOME and the working directory empty and read-only, and keeps it serving for SERVE_S seconds.
`run_all` runs the scenarios at once (the wait is the cost, not the CPU) and returns, per
scenario, the attempts to use the network or write outside what the scenario allows.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from syscall_trace import traced, violations

SERVE_S = 65.0  # onnxruntime 1.32 starts its upload ~40 s after import
REQUEST_EVERY_S = 5.0
HIDDEN_VARIABLES = ("CI", "ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED")


@dataclass
class Scenario:
    """One traced run: how to start it and drive it, where it may write."""

    name: str
    argv: list[str]  # decide's command (without strace)
    drive: Callable[[subprocess.Popen, Scenario], None]
    allowed: list[Path] = field(default_factory=list)
    outcome: str = ""  # what the driver saw (for the assertion message)
    sent: int = 0  # requests the driver sent
    served: int = 0  # right answers it got back


def user_environment(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A user's environment: no CI, no telemetry variable, an empty HOME."""
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN_VARIABLES}
    env.update({"HOME": str(home), **(extra or {})})
    return env


def drive_stdio(proc: subprocess.Popen, scenario: Scenario) -> None:
    """A request every REQUEST_EVERY_S seconds for SERVE_S seconds, each answer read, then EOF."""
    deadline = time.monotonic() + SERVE_S
    number = 0
    while time.monotonic() < deadline:
        proc.stdin.write(json.dumps({"id": number, "text": "Emergency stop pressed at station 7"}).encode() + b"\n")
        proc.stdin.flush()
        scenario.sent += 1
        answer = json.loads(proc.stdout.readline())
        scenario.served += answer.get("id") == number and "error" not in answer
        number += 1
        time.sleep(REQUEST_EVERY_S)
    proc.stdin.close()


def drive_socket(proc: subprocess.Popen, scenario: Scenario) -> None:
    """Once ready: a connection and a request every REQUEST_EVERY_S seconds, then SIGTERM."""
    ready = json.loads(proc.stdout.readline())
    where = ready["listen"].partition(":")[2]
    deadline = time.monotonic() + SERVE_S
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(60)
            sock.connect(where)
            sock.sendall(b'{"id": 1, "text": "Gearbox of mixer M2 is too hot to touch"}\n')
            scenario.sent += 1
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := sock.recv(1 << 16):
                data += chunk
        scenario.served += "label" in json.loads(data)
        time.sleep(REQUEST_EVERY_S)
    os.kill(tracee(proc), signal.SIGTERM)  # decide itself: a signal to strace would only detach it


def tracee(proc: subprocess.Popen) -> int:
    """The pid of the program strace (`proc`) started: its only child."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def drive_to_end(proc: subprocess.Popen, scenario: Scenario) -> None:
    """A command that ends by itself (decide score): wait for it."""
    proc.wait(timeout=SERVE_S * 4)


def run_all(strace: str, scenarios: list[Scenario], home: Path, work: Path, logs: Path,
            pycache_roots: tuple[Path, ...] = (), extra_env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Run every scenario at once under strace; {name: violations}. Asserts each one served."""
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    for directory in (home, work):
        directory.chmod(0o555)  # read-only (root still may write: the trace is the real check)
    env = user_environment(home, extra_env)
    procs: dict[str, subprocess.Popen] = {}
    threads: list[threading.Thread] = []
    errors: dict[str, BaseException] = {}

    def drive(scenario: Scenario) -> None:
        try:
            scenario.drive(procs[scenario.name], scenario)
            procs[scenario.name].wait(timeout=120)
        except BaseException as exc:  # noqa: BLE001 — reported below, after every process is reaped
            errors[scenario.name] = exc

    started = time.monotonic()
    for scenario in scenarios:
        procs[scenario.name] = subprocess.Popen(
            traced(strace, scenario.argv, logs / f"{scenario.name}.log"), cwd=work, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        threads.append(threading.Thread(target=drive, args=(scenario,), daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join(timeout=SERVE_S * 5)
    for name, proc in procs.items():
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read().decode("utf-8", "replace")
        proc.wait()
        scenario = next(s for s in scenarios if s.name == name)
        scenario.outcome = f"exit {proc.returncode}, {time.monotonic() - started:.0f} s, stderr: {stderr[-600:]}"
    for directory in (home, work):
        directory.chmod(0o755)
    assert not errors, {name: repr(exc) for name, exc in errors.items()}
    return {s.name: violations(logs / f"{s.name}.log", work, tuple(s.allowed), pycache_roots) for s in scenarios}
