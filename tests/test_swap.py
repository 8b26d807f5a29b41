"""Live model swaps (issue 25) on real `decide serve` processes: reload and rollback over the Unix
socket while a client streams (no answer lost, each names its model), who may swap, a refused
package keeps the old one serving and shows in stats/info, SIGHUP on both transports, --watch with
a half-copied package that is not tried until it is complete; and the watcher's rules unit-tested."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fixtures import tiny_package

from runtime.package.watch import PackageWatcher

REPO = Path(__file__).resolve().parent.parent
A, B = "tiny-keywords@0.0.1", "tiny-keywords@0.0.2"


@pytest.fixture(scope="module")
def package_b(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("b") / "b", version="0.0.2")


def start(*args: str, stdin: bool = False) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "serve", "--ready", *args], cwd=REPO,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert json.loads(proc.stdout.readline())["event"] == "ready", proc.stderr.read()
    return proc


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    return err


def ask(path: Path, *requests: dict) -> list[dict]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(str(path))
        sock.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


@pytest.fixture
def served(tiny_package_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    proc = start("--model", str(tiny_package_dir), "--socket", str(run / "s"))
    yield proc, run / "s"
    stop(proc)


def stream(path: Path, seconds: float, answers: list[dict]) -> None:
    """One client sending 'rain' requests back to back (window 4) for `seconds`."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        reader = sock.makefile("rb")
        sent, deadline = 0, time.monotonic() + seconds
        for _ in range(4):
            sock.sendall(json.dumps({"id": sent, "text": "rain"}).encode() + b"\n")
            sent += 1
        while len(answers) < sent:
            answers.append(json.loads(reader.readline()))
            if time.monotonic() < deadline:
                sock.sendall(json.dumps({"id": sent, "text": "rain"}).encode() + b"\n")
                sent += 1


def test_reload_and_rollback_while_a_client_streams(served, tiny_package_dir, package_b):
    _, path = served
    answers: list[dict] = []
    client = threading.Thread(target=stream, args=(path, 3.0, answers))
    client.start()
    time.sleep(0.5)
    (reloaded,) = ask(path, {"id": "r", "op": "reload", "model": str(package_b)})
    assert reloaded["status"] == "ok" and reloaded["serving"] == B and reloaded["previous"] == A, reloaded
    time.sleep(0.5)
    (rolled,) = ask(path, {"id": "b", "op": "rollback"})
    assert rolled["serving"] == A and rolled["previous"] == B, rolled
    time.sleep(0.5)
    (again,) = ask(path, {"op": "rollback"})  # a second rollback undoes the first
    assert again["serving"] == B
    client.join(timeout=60)
    assert [a["id"] for a in answers] == list(range(len(answers))) and len(answers) > 20
    assert all(a["label"] == "weather" for a in answers)
    models = [a["model"] for a in answers]
    assert set(models) == {A, B} and models[0] == A and models[-1] == B, models  # A, then B, A, B in turn
    (info,) = ask(path, {"op": "info"})
    assert info["model"]["version"] == "0.0.2" and info["model"]["path"] == str(package_b)
    assert info["swap"]["serving"]["model"] == B and info["swap"]["previous"]["model"] == A
    assert info["swap"]["reloads"] == 1 and info["swap"]["rollbacks"] == 2


def test_a_refused_package_keeps_the_old_model_and_shows_in_stats(served, package_b, tmp_path):
    _, path = served
    damaged = tmp_path / "damaged"
    shutil.copytree(package_b, damaged)
    with open(damaged / "int8-u8u8.onnx", "r+b") as fh:
        fh.seek(40)
        fh.write(b"\xff")
    answers = ask(path, {"id": 1, "op": "reload", "model": str(damaged)}, {"id": 2, "text": "goal"},
                  {"id": 3, "op": "reload", "model": "relative/dir"})
    (info,) = ask(path, {"op": "info"})
    assert "checksum mismatch" in info["swap"]["last_failure"]["error"] and info["model"]["version"] == "0.0.1"
    answers += ask(path, {"id": 4, "op": "rollback"})  # after the reload failed: nothing to return to
    assert answers[0]["error"]["code"] == "swap_failed" and "checksum mismatch" in answers[0]["error"]["message"]
    assert "still serving " + A in answers[0]["error"]["message"]
    assert answers[1]["model"] == A and answers[1]["label"] == "sports"
    assert answers[2]["error"]["code"] == "invalid_request"
    assert answers[3]["error"]["code"] == "swap_failed" and "no previous model" in answers[3]["error"]["message"]
    (stats,) = ask(path, {"op": "stats"})
    assert stats["swap"]["failed"] == 2 and stats["swap"]["last_failure"]["op"] == "rollback"


def test_swaps_are_refused_over_tcp(tiny_package_dir, package_b):
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "serve", "--ready", "--model", str(tiny_package_dir),
                             "--tcp", "127.0.0.1:0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    host, _, port = json.loads(proc.stdout.readline())["listen"].removeprefix("tcp:").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(json.dumps({"id": 1, "op": "reload", "model": str(package_b)}).encode() + b"\n"
                         + b'{"id": 2, "op": "rollback"}\n{"id": 3, "text": "rain"}\n')
            sock.shutdown(socket.SHUT_WR)
            answers = [json.loads(line) for line in sock.makefile("rb")]
    finally:
        stop(proc)
    assert [a.get("error", {}).get("code") for a in answers] == ["forbidden", "forbidden", None]
    assert "TCP peer cannot prove its uid" in answers[0]["error"]["message"] and answers[2]["model"] == A


def test_decide_reload_and_rollback_commands(served, package_b, tiny_package_dir):
    _, path = served
    run = [sys.executable, "-m", "runtime"]
    done = subprocess.run([*run, "reload", "--socket", str(path), "--model", str(package_b)], check=False, cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0 and json.loads(done.stdout)["serving"] == B, done.stderr
    done = subprocess.run([*run, "reload", "--socket", str(path), "--model", str(package_b / "nothing")],
                          check=False, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 4 and len(done.stderr.splitlines()) == 1 and "manifest.json missing" in done.stderr
    done = subprocess.run([*run, "rollback", "--socket", str(path)], check=False, cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0 and json.loads(done.stdout)["serving"] == A
    done = subprocess.run([*run, "rollback", "--socket", str(path.parent / "none")], check=False, cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1


def test_sighup_reloads_the_served_directory_on_stdio(tiny_package_dir, tmp_path, package_b):
    current = tmp_path / "current"
    current.symlink_to(tiny_package_dir)
    proc = start("--model", str(current), stdin=True)
    proc.stdin.write(b'{"id": 1, "text": "rain"}\n')
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["model"] == A
    current.unlink()
    current.symlink_to(package_b)  # re-point, then SIGHUP: the usual way to roll out with a symlink
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    model = A
    while model == A and time.monotonic() < deadline:
        time.sleep(0.2)
        proc.stdin.write(b'{"id": 2, "text": "rain"}\n')
        proc.stdin.flush()
        model = json.loads(proc.stdout.readline())["model"]
    assert model == B
    proc.stdin.write(b'{"id": 3, "op": "reload"}\n')
    proc.stdin.close()
    assert json.loads(proc.stdout.readline())["error"]["code"] == "forbidden"
    assert "reload (SIGHUP): now serving " + B in stop(proc)


def test_watch_serves_a_new_package_once_it_is_complete(tiny_package_dir, tmp_path, package_b):
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    proc = start("--model", str(tiny_package_dir), "--socket", str(run / "s"), "--watch", str(incoming),
                 "--watch-interval", "0.2")
    try:
        half = incoming / "v2"
        shutil.copytree(package_b, half)
        with open(half / "fp32.data", "r+b") as fh:  # half-copied: shorter than the manifest says
            fh.truncate(10)
        time.sleep(1.5)
        assert ask(run / "s", {"id": 1, "text": "rain"})[0]["model"] == A
        shutil.copy(package_b / "fp32.data", half / "fp32.data")  # the copy completes
        deadline, model = time.monotonic() + 30, A
        while model == A and time.monotonic() < deadline:
            time.sleep(0.2)
            model = ask(run / "s", {"id": 2, "text": "rain"})[0]["model"]
        assert model == B
        (stats,) = ask(run / "s", {"op": "stats"})
        assert stats["swap"]["reloads"] == 1 and stats["swap"]["failed"] == 0  # never tried half-copied
    finally:
        err = stop(proc)
    assert "is not complete yet" in err and err.count("is not complete yet") == 1, err


def test_watcher_rules(tmp_path, tiny_package_dir, package_b):
    incoming = tmp_path / "in"
    incoming.mkdir()
    shutil.copytree(tiny_package_dir, incoming / "old")
    watcher = PackageWatcher(incoming)
    assert watcher.poll() is None  # what is there at start is known, not loaded
    shutil.copytree(package_b, incoming / "new")
    assert watcher.poll() is None  # new: wait one look for it to settle
    assert watcher.poll() == incoming / "new"
    assert watcher.poll() is None  # tried: not again until it changes
    (incoming / "new" / "README").write_text("changed")
    watcher.poll()
    assert watcher.poll() == incoming / "new"
    (incoming / "new" / "stray.bin").write_bytes(b"x")  # an unlisted file: not complete
    assert watcher.poll() is None and watcher.poll() is None
