"""Every signal a service manager or a terminal sends, under load, to both transports: each does
what runtime/serve/signals.py's table says, and no answer is lost for a line decide read before it
(issue 23: SIGHUP and SIGUSR1 killed both transports mid-stream)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runtime.serve.signals import RULES, STOP

REPO = Path(__file__).resolve().parent.parent
SIGNALS = ["SIGHUP", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGINT", "SIGTERM", "SIGQUIT"]
LOGGED = {"SIGHUP": "SIGHUP: reloading ", "SIGUSR1": "SIGUSR1 received: stats {"}


def is_stop(name: str) -> bool:
    return RULES[getattr(signal, name)].action == STOP


def lines(prefix: str, count: int) -> bytes:
    """`count` request lines in one block small enough for one read (< 60 KB)."""
    block = b"".join(json.dumps({"id": f"{prefix}{i}", "text": "rain goal"}).encode() + b"\n" for i in range(count))
    assert len(block) < 60_000
    return block


def read_first(stream) -> bytes:
    line = stream.readline()
    assert line, "no answer at all"
    return line


@pytest.mark.parametrize("name", SIGNALS)
def test_stdio_under_load(tiny_package_dir, name):
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "--model", str(tiny_package_dir), "--ready",
                             "--max-batch", "1"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert json.loads(read_first(proc.stdout))["event"] == "ready"
    # one write the server reads whole before it answers the first batch: all 600 count as read
    proc.stdin.write(lines("s", 600))
    proc.stdin.flush()
    first = read_first(proc.stdout)  # answering is under way
    proc.send_signal(getattr(signal, name))
    if not is_stop(name):
        time.sleep(0.3)
        proc.stdin.write(lines("after", 50))  # still serving: more lines are read and answered
        proc.stdin.close()
    out = first + proc.stdout.read()
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    ids = [json.loads(line)["id"] for line in out.splitlines()]
    expected = [f"s{i}" for i in range(600)] + ([] if is_stop(name) else [f"after{i}" for i in range(50)])
    assert ids == expected, (name, len(ids), err[-500:])
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    if name in LOGGED:
        assert LOGGED[name] in err, err


@pytest.fixture
def socket_path(tmp_path) -> Path:
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    return directory / "s"


def start_socket_server(model: Path, path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "serve", "--model", str(model), "--socket", str(path),
                             "--ready", "--max-batch", "1"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert json.loads(read_first(proc.stdout))["event"] == "ready"
    return proc


class Client(threading.Thread):
    """Sends 300 lines in one write, reads every answer until the server ends the connection."""

    def __init__(self, path: Path, number: int):
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(60)
        self.sock.connect(str(path))
        self.number = number
        self.first = threading.Event()
        self.answers: list[dict] = []

    def run(self) -> None:
        self.sock.sendall(lines(f"c{self.number}-", 300))
        data = b""
        while chunk := self.sock.recv(1 << 16):
            data += chunk
            self.first.set()
        self.answers = [json.loads(line) for line in data.splitlines()]


@pytest.mark.parametrize("name", SIGNALS)
def test_socket_under_load(tiny_package_dir, socket_path, name):
    proc = start_socket_server(tiny_package_dir, socket_path)
    clients = [Client(socket_path, n) for n in range(4)]
    for client in clients:
        client.start()
    for client in clients:
        assert client.first.wait(60), "no answer at all"
    proc.send_signal(getattr(signal, name))
    if not is_stop(name):
        time.sleep(0.3)
        assert proc.poll() is None, f"{name} ended the server"
        for client in clients:
            client.sock.shutdown(socket.SHUT_WR)  # done sending: the server answers all, then EOF
    for client in clients:
        client.join(timeout=120)
        assert [a["id"] for a in client.answers] == [f"c{client.number}-{i}" for i in range(300)], name
        assert all("error" not in a for a in client.answers)
        client.sock.close()
    if not is_stop(name):
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    assert not socket_path.exists(), "the socket file is removed on exit"
    if name in LOGGED:
        assert LOGGED[name] in err, err
    if name == "SIGUSR1":
        stats = json.loads(err.split("SIGUSR1 received: stats ", 1)[1].splitlines()[0])
        assert stats["op"] == "stats" and stats["requests"] > 0 and "busy" in stats


def test_a_signal_while_the_model_loads_does_not_end_the_process(tiny_package_dir):
    code = ("import sys, time; from runtime import cli; original = cli.load_engine\n"
            "def slow(*a, **k):\n    time.sleep(2.0)\n    return original(*a, **k)\n"
            "cli.load_engine = slow; sys.exit(cli.main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "--model", str(tiny_package_dir), "--ready"], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)  # inside the 2 s load
    for name in ("SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM"):
        os.kill(proc.pid, getattr(signal, name))
    out, err = proc.communicate(b'{"id": 1, "text": "rain"}\n', timeout=60)
    assert proc.returncode == 0, err.decode()
    assert [json.loads(line).get("id") for line in out.splitlines()] == [None, 1]  # the ready event, the answer
