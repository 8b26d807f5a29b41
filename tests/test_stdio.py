"""The stdio transport on a real subprocess: EOF, read-ahead order, SIGTERM/SIGINT, EPIPE,
interactive flushing, stdout purity, UTF-8 under a C locale; plus the line splitter."""

import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fixtures.child import after_shell

from runtime.protocol import LineTooLong
from runtime.serve.framing import split_lines

REPO = Path(__file__).resolve().parent.parent


def start(model: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", "--model", str(model), *args],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def read_line(proc: subprocess.Popen, timeout: float = 30.0) -> bytes:
    """One stdout line, failing (not hanging) if the server does not flush it."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no response line within the timeout (not flushed?)"
    return proc.stdout.readline()


def test_split_lines_across_chunk_boundaries():
    chunks = [b'{"a"', b": 1}\n{", b'"b": 2}\r\n\n', b"tail"]
    assert list(split_lines(iter(chunks), max_line_bytes=100)) == [b'{"a": 1}', b'{"b": 2}', b"", b"tail"]


def test_split_lines_reports_overlong_lines_without_keeping_them():
    chunks = [b"short\n", b"x" * 30, b"x" * 30 + b"\nok\n", b"y" * 50]
    assert list(split_lines(iter(chunks), max_line_bytes=40)) == [
        b"short", LineTooLong(60), b"ok", LineTooLong(50)]


def test_eof_answers_everything_and_exits_0(tiny_package_dir):
    proc = start(tiny_package_dir)
    lines = [b'{"id": 1, "text": "rain"}', b'{"id": 2, "text": "goal"}', b'{"id": 3, "text": "server"}']
    out, err = proc.communicate(b"\n".join(lines), timeout=60)  # last line without newline
    assert proc.returncode == 0, err
    responses = [json.loads(line) for line in out.decode("utf-8").splitlines()]
    assert [(r["id"], r["label"]) for r in responses] == [(1, "weather"), (2, "sports"), (3, "tech")]


def test_bulk_input_is_batched_in_order_with_ids(tiny_package_dir):
    words = ["rain", "goal", "server", "{broken", "sun and snow"]
    lines = []
    for i in range(600):
        word = words[i % len(words)]
        lines.append(word.encode() if word.startswith("{") else json.dumps({"id": i, "text": word}).encode())
    lines.append(b'{"id": "stats", "op": "stats"}')
    proc = start(tiny_package_dir)
    out, err = proc.communicate(b"\n".join(lines) + b"\n", timeout=120)
    assert proc.returncode == 0, err
    responses = [json.loads(line) for line in out.splitlines()]
    assert len(responses) == len(lines)
    for i, response in enumerate(responses[:-1]):
        if i % 5 == 3:
            assert response == {"id": None, "error": response["error"]} and response["error"]["code"] == "invalid_json"
        else:
            assert response["id"] == i
            assert response["label"] == ["weather", "sports", "tech", None, "weather"][i % 5]
    stats = responses[-1]
    assert stats["texts"] == 480
    assert stats["engine_calls"] < 240, "read-ahead should answer many lines per engine call"


def test_interactive_lines_are_answered_one_by_one(tiny_package_dir):
    proc = start(tiny_package_dir, "--ready")
    try:
        ready = json.loads(read_line(proc))
        assert ready["event"] == "ready" and ready["model"]["name"] == "tiny-keywords"
        assert ready["limits"]["max_line_bytes"] == 1 << 20
        for i, word in enumerate(["rain", "goal", "server"]):
            proc.stdin.write(json.dumps({"id": i, "text": word}).encode() + b"\n")
            proc.stdin.flush()
            assert json.loads(read_line(proc))["id"] == i  # answered before the next line is sent
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_stdin_and_stdout_may_be_a_socket_pair(tiny_package_dir):
    # The C client (clients/c) gives the child a socket pair, not a pipe: EPIPE instead of SIGPIPE.
    import socket

    ours, theirs = socket.socketpair()
    with ours:
        proc = subprocess.Popen([sys.executable, "-m", "runtime", "--model", str(tiny_package_dir), "--ready"],
                                cwd=REPO, stdin=theirs, stdout=theirs, stderr=subprocess.PIPE)
        theirs.close()
        ours.settimeout(30)
        lines = ours.makefile("rb")
        assert json.loads(lines.readline())["event"] == "ready"
        for i, word in enumerate(["rain", "goal"]):
            ours.sendall(json.dumps({"id": i, "text": word}).encode() + b"\n")
            assert json.loads(lines.readline())["id"] == i
        ours.shutdown(socket.SHUT_WR)  # end of input on a socket
        assert lines.readline() == b""
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_and_exits_0(tiny_package_dir, signum):
    proc = start(tiny_package_dir, "--ready")
    read_line(proc)
    proc.stdin.write(b'{"id": 1, "text": "rain"}\n')
    proc.stdin.flush()
    assert json.loads(read_line(proc))["label"] == "weather"
    proc.send_signal(signum)
    proc.wait(timeout=30)  # stdin still open: the signal alone must end it
    err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_reader_closing_stdout_exits_quietly(tiny_package_dir):
    proc = start(tiny_package_dir, "--ready")
    read_line(proc)
    proc.stdout.close()  # the reader goes away
    try:
        for i in range(200):
            proc.stdin.write(json.dumps({"id": i, "text": "rain"}).encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the server may already have left
    proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_overlong_line_is_an_error_and_serving_continues(tiny_package_dir):
    proc = start(tiny_package_dir, "--max-line-bytes", "200")
    big = json.dumps({"id": "big", "text": "rain " * 1000}).encode()
    out, err = proc.communicate(big + b"\n" + b'{"id": "after", "text": "goal"}\n', timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err, err
    first, second = [json.loads(line) for line in out.splitlines()]
    assert first["error"]["code"] == "line_too_long"
    assert second["id"] == "after" and second["label"] == "sports"


def test_utf8_regardless_of_locale(tiny_package_dir):
    proc = start(tiny_package_dir, env={"LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "",
                                        "PYTHONUTF8": "0"})
    request = '{"id": "雨-1", "text": "雨"}\n{"id": "latin", "text": "\xff"}\n'.encode()
    out, err = proc.communicate(request + b'{"id": 2, "text": "\xc3"}\n', timeout=60)
    lines = out.splitlines()
    assert proc.returncode == 0, err
    first = json.loads(lines[0].decode("utf-8"))
    assert first["id"] == "雨-1" and first["label"] == "weather"
    assert "雨".encode() in lines[0]  # raw UTF-8 on the wire, not \u escapes
    assert json.loads(lines[2])["error"]["code"] == "invalid_utf8"


def test_stray_prints_cannot_reach_the_wire():
    code = ("import os; from runtime.serve.stdio import protect_stdout; from runtime.serve.framing import write_all; w = protect_stdout(); "
            "print('stray print'); os.write(1, b'stray fd write\\n'); write_all(w, b'wire\\n')")
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"wire\n"
    assert b"stray print" in out.stderr and b"stray fd write" in out.stderr


def test_every_error_code_on_the_wire_then_the_next_line_is_answered(tiny_package_dir):
    bad = {
        "invalid_json": b"{nope",
        "invalid_utf8": b'{"text": "\xc3\x28"}',
        "invalid_request": b'{"id": 1, "text": 42}',
        "missing_text": b'{"id": 1}',
        "empty_text": b'{"id": 1, "text": ""}',
        "line_too_long": b'{"text": "' + b"rain " * 100 + b'"}',
        "too_many_texts": b'{"texts": ["a", "b", "c"]}',
        "unknown_op": b'{"op": "shutdown"}',
    }
    lines = []
    for code, line in bad.items():
        lines += [line, json.dumps({"id": f"after-{code}", "text": "goal"}).encode()]
    proc = start(tiny_package_dir, "--max-line-bytes", "300", "--max-texts", "2")
    out, err = proc.communicate(b"\n".join(lines) + b"\n", timeout=60)
    assert proc.returncode == 0, err
    responses = [json.loads(line) for line in out.splitlines()]
    assert len(responses) == 2 * len(bad)
    for (code, _), error, ok in zip(bad.items(), responses[::2], responses[1::2]):
        assert error["error"]["code"] == code
        assert ok["id"] == f"after-{code}" and ok["label"] == "sports"


def test_sigterm_during_bulk_leaves_complete_lines_in_order(tiny_package_dir):
    proc = start(tiny_package_dir, "--ready")
    read_line(proc)
    lines = b"".join(json.dumps({"id": i, "text": "rain goal server " * 3}).encode() + b"\n" for i in range(3000))

    def feed() -> None:  # a thread: the pipes are smaller than the input and the output
        try:
            proc.stdin.write(lines)
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # the server stopped reading, as asked

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    first = read_line(proc)  # serving is under way
    proc.send_signal(signal.SIGTERM)  # stdin stays open: only the signal can end it
    out = first + proc.stdout.read()
    proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    responses = [json.loads(line) for line in out.splitlines()]  # every line is whole JSON
    assert [r["id"] for r in responses] == list(range(len(responses)))  # a prefix, in order
    assert len(responses) < 3000 and b"Traceback" not in err


def test_closed_stdin_is_end_of_input(tiny_package_dir):
    proc = subprocess.Popen(after_shell("exec 0<&-", [sys.executable, "-m", "runtime", "--model", str(tiny_package_dir),
                                                      "--ready"]),
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert [json.loads(line)["event"] for line in out.splitlines()] == ["ready"]


def test_signal_answers_every_line_already_read(tiny_package_dir):
    proc = start(tiny_package_dir, "--ready")
    read_line(proc)
    # 600 lines (> one 256-line service call) in one write that fits the pipe: the server reads
    # them all before answering the first call, so all of them count as already read.
    lines = b"".join(json.dumps({"id": i, "text": "rain"}).encode() + b"\n" for i in range(600))
    assert len(lines) < 60_000
    proc.stdin.write(lines)
    proc.stdin.flush()
    first = read_line(proc)  # the first call is answered: the rest waits in the server
    proc.send_signal(signal.SIGTERM)  # stdin stays open: only the signal ends it
    out = first + proc.stdout.read()
    proc.wait(timeout=60)
    assert proc.returncode == 0
    assert [json.loads(line)["id"] for line in out.splitlines()] == list(range(600))


# -- hostile input and output failures (issue 15) ------------------------------------------------


def rss_peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("hostile, code, words", [
    (b"[" * 5000, "invalid_json", "nested too deeply"),
    (b'{"a":' * 3000, "invalid_json", "nested too deeply"),
    (b'{"id": ' + b"7" * 5000 + b', "text": "rain"}', "invalid_json", "5000 digits is too large"),
    ("\u3000".encode(), "invalid_json", ""),
    (b"\x1c", "invalid_json", ""),
    (b"\x0b\x0c", "invalid_json", ""),
])
def test_a_line_that_breaks_the_parser_is_answered_and_nothing_read_is_lost(tiny_package_dir, hostile, code, words):
    lines = [b'{"id": 1, "text": "rain"}', hostile, b'{"id": 3, "text": "goal"}']
    proc = start(tiny_package_dir)
    out, err = proc.communicate(b"\n".join(lines) + b"\n", timeout=60)  # one read: all in one batch
    assert proc.returncode == 0 and b"Traceback" not in err, err
    first, error, last = [json.loads(line) for line in out.splitlines()]
    assert (first["id"], first["label"], last["id"], last["label"]) == (1, "weather", 3, "sports")
    assert error["error"]["code"] == code and words in error["error"]["message"]
    assert "set_int_max_str_digits" not in error["error"]["message"]


def test_huge_texts_are_cut_before_tokenizing_and_memory_stays_bounded(tiny_package_dir):
    # 96 texts of 1.5 MiB each (a word the model knows first): uncut, tokenizing them took ~56 MB
    # per MiB of text; cut to the model's budget they cost nothing, and read-ahead holds ≤ 4 MiB.
    proc = start(tiny_package_dir, "--ready", "--max-line-bytes", str(2 << 20))
    read_line(proc)
    text = "rain " + "x" * (3 << 19)
    payload = b"".join(json.dumps({"id": i, "text": text}).encode() + b"\n" for i in range(96))
    out = []

    def collect() -> None:
        for _ in range(96):
            out.append(json.loads(proc.stdout.readline()))

    reader = threading.Thread(target=collect)
    reader.start()
    proc.stdin.write(payload)
    proc.stdin.flush()
    reader.join(timeout=120)
    peak = rss_peak_mb(proc.pid)
    proc.stdin.close()
    proc.wait(timeout=60)
    # one readable word in megabytes of an unknown one: the model leans to weather, and abstains
    assert [(r["id"], r["leaning"], r["reason"], r["truncated"]) for r in out] == [
        (i, "weather", "unreadable", True) for i in range(96)]
    assert peak < 400, f"peak RSS {peak:.0f} MB for 144 MiB of input"


def test_non_blocking_stdout_gets_whole_lines(tiny_package_dir):
    # Node/Java parents hand down O_NONBLOCK pipes: a full pipe then says EAGAIN instead of waiting.
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    lines = b"".join(json.dumps({"id": i, "texts": ["rain", "goal", "server"]}).encode() + b"\n" for i in range(3000))
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "--model", str(tiny_package_dir)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=write_fd, stderr=subprocess.PIPE)
    os.close(write_fd)
    feeder = threading.Thread(target=lambda: (proc.stdin.write(lines), proc.stdin.close()))
    feeder.start()
    import time
    time.sleep(2.0)  # not reading: the pipe fills and the server sees EAGAIN
    data = b""
    while chunk := os.read(read_fd, 1 << 16):
        data += chunk
    os.close(read_fd)
    feeder.join(timeout=60)
    proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == 0 and b"Traceback" not in err, err
    answers = [json.loads(line) for line in data.splitlines()]  # every line whole
    assert [a["id"] for a in answers] == list(range(3000))


def test_full_disk_on_stdout_exits_6_with_one_line(tiny_package_dir):
    with open("/dev/full", "wb") as full:
        result = subprocess.run([sys.executable, "-m", "runtime", "--model", str(tiny_package_dir), "-q"],
                                check=False, cwd=REPO, input=b'{"id": 1, "text": "rain"}\n', stdout=full,
                                stderr=subprocess.PIPE, timeout=60)
    assert result.returncode == 6
    assert result.stderr.decode().splitlines() == ["decide: cannot write answers to stdout: No space left on device"]


def test_closed_stdout_exits_6_with_one_line(tiny_package_dir):
    result = subprocess.run(after_shell("exec 1>&-", [sys.executable, "-m", "runtime", "--model", str(tiny_package_dir),
                                                      "-q"]),
                            check=False, cwd=REPO, input=b'{"id": 1, "text": "rain"}\n', stderr=subprocess.PIPE,
                            timeout=60)
    assert result.returncode == 6
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and "stdout is closed" in lines[0]


def test_sigterm_works_while_stdin_streams_bytes_without_a_newline(tiny_package_dir):
    proc = start(tiny_package_dir, "--ready")
    read_line(proc)
    proc.stdin.write(b'{"id": 1, "text": "rain"}\n')
    proc.stdin.flush()
    assert json.loads(read_line(proc))["id"] == 1
    stop = threading.Event()

    def flood() -> None:
        try:
            while not stop.is_set():
                proc.stdin.write(b"x" * 65536)
        except (BrokenPipeError, ValueError):
            pass

    feeder = threading.Thread(target=flood, daemon=True)
    feeder.start()
    import time
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    finally:
        stop.set()
    assert proc.returncode == 0
    assert b"Traceback" not in proc.stderr.read()
