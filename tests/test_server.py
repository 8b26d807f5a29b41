"""The socket service on a real `decide serve --socket/--tcp` subprocess, driven by concurrent clients:
answers reach the right connection with the right id and order, malformed lines get error lines,
a full queue answers busy, SIGTERM drains and removes the socket, the socket is 0600, non-loopback
TCP needs --allow-remote, stale sockets are replaced but live ones are not, sd_notify READY=1."""

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from fixtures.child import after_shell

REPO = Path(__file__).resolve().parent.parent
WORDS = {"rain": "weather", "goal": "sports", "server": "tech", "der Regen und die Sonne": "weather",
         "le serveur": "tech", "Tor Spiel Team": "sports"}


class Server:
    """A running `decide serve` subprocess and how to reach it."""

    def __init__(self, proc: subprocess.Popen, ready: dict):
        self.proc = proc
        self.ready = ready
        kind, _, where = ready["listen"].partition(":")
        if kind == "unix":
            self.family, self.address = socket.AF_UNIX, where
        else:
            host, _, port = where.rpartition(":")
            self.family, self.address = socket.AF_INET, (host.strip("[]"), int(port))

    def connect(self) -> socket.socket:
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.settimeout(60)
        sock.connect(self.address)
        return sock

    def exchange(self, lines: list[bytes]) -> list[dict]:
        """Send all lines on a fresh connection, half-close, read every answer until EOF."""
        with self.connect() as sock:
            sock.sendall(b"".join(line + b"\n" for line in lines))
            sock.shutdown(socket.SHUT_WR)
            return read_answers(sock)

    def stop(self) -> tuple[int, str]:
        """SIGTERM, wait, return (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return self.proc.returncode, self.proc.stderr.read().decode()


def read_answers(sock: socket.socket) -> list[dict]:
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def start(model: Path, *args: str, env: dict | None = None) -> Server:
    """Start the server with --ready and wait for its ready line (stdout)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", "serve", "--model", str(model), "--ready", *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
    )
    return when_ready(proc)


def when_ready(proc: subprocess.Popen) -> Server:
    """The server `proc` once its ready line (stdout) came, within 60 s; killed otherwise."""
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else b""
    if not line:
        proc.kill()
        raise AssertionError(f"server did not become ready: {proc.communicate(timeout=30)[1].decode()}")
    return Server(proc, json.loads(line))


@pytest.fixture
def socket_dir(tmp_path) -> Path:
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    return directory


@pytest.fixture
def uds_server(tiny_package_dir, socket_dir):
    # Clients here pipeline hundreds of requests at once; the queue must hold them all (no busy).
    server = start(tiny_package_dir, "--socket", str(socket_dir / "decide.sock"), "--queue-size", "2000")
    yield server
    server.stop()


def client_lines(client: int, count: int) -> tuple[list[bytes], list]:
    """A client's request lines (every 7th malformed) and the answer expected for each."""
    words = list(WORDS)
    lines, expected = [], []
    for i in range(count):
        if i % 7 == 3:
            lines.append(b'{"id": "broken", "text": ')
            expected.append(("error", "invalid_json"))
        else:
            word = words[(client + i) % len(words)]
            lines.append(json.dumps({"id": f"c{client}-{i}", "text": word}).encode())
            expected.append((f"c{client}-{i}", WORDS[word]))
    return lines, expected


def check_answers(answers: list[dict], expected: list) -> None:
    assert len(answers) == len(expected)
    for answer, (request_id, label) in zip(answers, expected):
        if request_id == "error":
            assert answer["id"] is None and answer["error"]["code"] == label
        else:
            assert (answer["id"], answer["label"]) == (request_id, label)


def run_clients(server: Server, clients: int, count: int) -> None:
    """Several clients at once, each pipelining its lines; every answer checked per connection."""
    failures: list[BaseException] = []

    def one_client(client: int) -> None:
        try:
            lines, expected = client_lines(client, count)
            check_answers(server.exchange(lines), expected)
        except BaseException as exc:  # noqa: BLE001 — reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=one_client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[0]


def stats(server: Server) -> dict:
    return server.exchange([b'{"id": "s", "op": "stats"}'])[0]


def test_uds_concurrent_clients_get_their_own_answers_in_order(uds_server, socket_dir):
    path = socket_dir / "decide.sock"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    run_clients(uds_server, clients=8, count=60)
    body = stats(uds_server)
    texts = 8 * sum(1 for i in range(60) if i % 7 != 3)
    assert body["engine"]["texts"] == texts
    assert sum(int(size) * n for size, n in body["batch_sizes"].items()) == texts
    assert max(int(size) for size in body["batch_sizes"]) > 1, "requests should share engine calls"
    assert body["errors"] == {"invalid_json": 8 * sum(1 for i in range(60) if i % 7 == 3)}
    assert body["latency_ms"]["p50"] <= body["latency_ms"]["p95"] <= body["latency_ms"]["p99"]
    assert body["queue_depth"] == 0 and body["rss_mb"] > 0 and body["cpu_s"] > 0
    code, err = uds_server.stop()
    assert code == 0, err
    assert not path.exists(), "socket file must be removed on exit"


def test_ops_and_a_connection_that_keeps_working_after_errors(uds_server):
    with uds_server.connect() as sock:
        for request, check in [
            (b'{"id": 1, "op": "health"}', lambda a: a["status"] == "ready"),
            (b"\xff\xfe", lambda a: a["error"]["code"] == "invalid_utf8"),
            (b'{"id": 2, "op": "reboot"}', lambda a: a["error"]["code"] == "unknown_op"),
            (b'{"id": 3, "texts": ["rain", "goal"]}', lambda a: [r["label"] for r in a["results"]] == ["weather", "sports"]),
            (b'{"id": 4, "op": "info"}', lambda a: a["model"]["name"] == "tiny-keywords"
                                                and a["server"]["listen"] == uds_server.ready["listen"]),
        ]:
            sock.sendall(request + b"\n")
            answer = json.loads(sock.makefile("rb").readline())  # answered before we send more
            assert check(answer), answer


def test_tcp_loopback_with_concurrent_clients(tiny_package_dir):
    server = start(tiny_package_dir, "--tcp", "127.0.0.1:0", "--queue-size", "2000")
    try:
        assert server.ready["listen"].startswith("tcp:127.0.0.1:")
        run_clients(server, clients=6, count=30)
    finally:
        code, err = server.stop()
    assert code == 0, err


def test_non_loopback_tcp_is_refused_without_allow_remote(tiny_package_dir):
    proc = subprocess.run([sys.executable, "-m", "runtime", "serve", "--model", str(tiny_package_dir),
                           "--tcp", "0.0.0.0:0"], check=False, cwd=REPO, capture_output=True, timeout=60)
    assert proc.returncode == 2
    assert b"--allow-remote" in proc.stderr


def test_allow_remote_binds_with_a_warning(tiny_package_dir):
    server = start(tiny_package_dir, "--tcp", "0.0.0.0:0", "--allow-remote")
    try:
        host, port = server.address
        assert host == "0.0.0.0"  # every interface, as asked
        server.address = ("127.0.0.1", port)
        assert server.exchange([b'{"id": 1, "text": "rain"}'])[0]["label"] == "weather"
    finally:
        code, err = server.stop()
    assert code == 0 and "no authentication" in err


def test_a_full_queue_slows_a_pipelining_client_down_instead_of_refusing_it(tiny_package_dir, socket_dir):
    # 16 clients × 300 pipelined lines through a 2-slot queue: backpressure, not busy.
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--queue-size", "2", "--max-batch", "1")
    try:
        lines = [json.dumps({"id": i, "text": "goal"}).encode() for i in range(400)]
        answers = server.exchange(lines)
        assert [a["id"] for a in answers] == list(range(400))  # one answer per line, in order
        assert all(a["label"] == "sports" for a in answers), [a for a in answers if "error" in a][:3]
        run_clients(server, clients=16, count=300)  # every answer checked, none busy
        assert "busy" not in stats(server)["errors"]
    finally:
        code, err = server.stop()
    assert code == 0 and "Traceback" not in err, err


def test_busy_only_when_the_queue_stays_full_past_the_queue_timeout(tiny_package_dir, socket_dir):
    # The model loads for 2 s: nothing leaves the 2-slot queue, so after --queue-timeout 0.3 s the
    # requests that found no room are answered busy (a real overload), in order, none dropped.
    path = socket_dir / "s"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_LOADER, "serve", "--model", str(tiny_package_dir),
                             "--socket", str(path), "--queue-size", "2", "--queue-timeout", "0.3"],
                            cwd=REPO, stderr=subprocess.PIPE)
    try:
        wait_for_path(proc, path)
        server = Server(proc, {"listen": f"unix:{path}"})
        answers = server.exchange([json.dumps({"id": i, "text": "goal"}).encode() for i in range(6)])
        assert [a["id"] for a in answers] == list(range(6))
        assert [a.get("label") for a in answers[:2]] == ["sports", "sports"]  # queued, answered once loaded
        assert {a["error"]["code"] for a in answers[2:] if "error" in a} == {"busy"}
        assert any("error" in a for a in answers[2:])
        assert "overloaded" in next(a for a in answers if "error" in a)["error"]["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read().decode()


def wait_for_path(proc: subprocess.Popen, path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():  # bound before the model loads
        assert proc.poll() is None and time.monotonic() < deadline, "server did not start listening"
        time.sleep(0.05)


def test_connection_limit_answers_busy(tiny_package_dir, socket_dir):
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--max-connections", "2")
    try:
        first, second = server.connect(), server.connect()
        third = server.connect()
        assert [a["error"]["code"] for a in read_answers(third)] == ["busy"]
        for sock in (first, second):
            sock.sendall(b'{"id": 1, "text": "rain"}\n')
            sock.shutdown(socket.SHUT_WR)
            assert read_answers(sock)[0]["label"] == "weather"
            sock.close()
        third.close()
    finally:
        server.stop()


def test_overlong_line_is_an_error_and_the_connection_continues(tiny_package_dir, socket_dir):
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--max-line-bytes", "200")
    try:
        big = json.dumps({"id": "big", "text": "rain " * 1000}).encode()
        first, second = server.exchange([big, b'{"id": "after", "text": "goal"}'])
        assert first["error"]["code"] == "line_too_long"
        assert (second["id"], second["label"]) == ("after", "sports")
    finally:
        server.stop()


def test_sigterm_drains_requests_already_read(tiny_package_dir, socket_dir):
    path = socket_dir / "s"
    server = start(tiny_package_dir, "--socket", str(path), "--max-batch", "1")
    sock = server.connect()
    sock.sendall(b"".join(json.dumps({"id": i, "text": "server"}).encode() + b"\n" for i in range(300)))
    reader = sock.makefile("rb")
    assert json.loads(reader.readline())["id"] == 0  # the server is working through them
    server.proc.send_signal(signal.SIGTERM)
    rest = [json.loads(line) for line in reader]  # until the server closes the connection
    assert [a["id"] for a in rest] == list(range(1, 300))
    assert all(a["label"] == "tech" for a in rest)
    sock.close()
    # Wait for the exit rather than server.stop(): a second SIGTERM while the process is already
    # past its drain would test the default signal action, not the drain.
    code = server.proc.wait(timeout=60)
    err = server.proc.stderr.read().decode()
    assert code == 0, err
    assert "Traceback" not in err
    assert not path.exists()


def test_client_vanishing_mid_request_does_not_disturb_others(uds_server):
    for _ in range(3):
        rude = uds_server.connect()
        rude.sendall(b"".join(json.dumps({"id": i, "text": "rain"}).encode() + b"\n" for i in range(200)))
        rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        rude.close()  # reset: answers in flight have nowhere to go
    run_clients(uds_server, clients=4, count=30)
    assert uds_server.proc.poll() is None
    code, err = uds_server.stop()
    assert code == 0 and "Traceback" not in err, err


def test_stale_socket_is_replaced_but_a_live_one_or_a_file_is_not(tiny_package_dir, socket_dir):
    path = socket_dir / "s"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a crashed server leaves behind
    server = start(tiny_package_dir, "--socket", str(path))
    try:
        assert server.exchange([b'{"id": 1, "text": "rain"}'])[0]["label"] == "weather"
        second = subprocess.run([sys.executable, "-m", "runtime", "serve", "--model", str(tiny_package_dir),
                                 "--socket", str(path)], check=False, cwd=REPO, capture_output=True, timeout=60)
        assert second.returncode == 2 and b"another server is listening" in second.stderr
        assert server.exchange([b'{"id": 2, "text": "goal"}'])[0]["label"] == "sports"  # still ours
    finally:
        server.stop()
    regular = socket_dir / "not-a-socket"
    regular.write_text("keep me")
    refused = subprocess.run([sys.executable, "-m", "runtime", "serve", "--model", str(tiny_package_dir),
                              "--socket", str(regular)], check=False, cwd=REPO, capture_output=True, timeout=60)
    assert refused.returncode == 2 and regular.read_text() == "keep me"


SLOW_LOADER = textwrap.dedent("""
    import sys, time
    from runtime import cli
    from runtime.serve import server
    original = cli.load_engine
    def slow_load_engine(*args, **kwargs):
        time.sleep(2.0)  # a big model's load time, so "loading" can be observed
        return original(*args, **kwargs)
    cli.load_engine = slow_load_engine
    sys.exit(cli.main(sys.argv[1:]))
""")


def test_health_says_loading_until_warm_and_early_requests_wait(tiny_package_dir, socket_dir, tmp_path):
    path = socket_dir / "s"
    notify_path = str(tmp_path / "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(60)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_LOADER, "serve", "--model", str(tiny_package_dir),
                             "--socket", str(path)], cwd=REPO, stderr=subprocess.PIPE,
                            env={**os.environ, "NOTIFY_SOCKET": notify_path})
    try:
        deadline = time.monotonic() + 60
        while not path.exists():  # bound before the model loads
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start listening"
            time.sleep(0.05)
        server = Server(proc, {"listen": f"unix:{path}"})
        early = server.exchange([b'{"id": "h", "op": "health"}', b'{"id": "early", "text": "rain"}',
                                 b'{"id": "h2", "op": "health"}'])
        assert early[0]["status"] == "loading"
        assert (early[1]["id"], early[1]["label"]) == ("early", "weather")  # waited for the model
        assert notify.recv(4096).startswith(b"READY=1\n")
        assert server.exchange([b'{"op": "health"}'])[0]["status"] == "ready"
        proc.send_signal(signal.SIGTERM)
        assert notify.recv(4096) == b"STOPPING=1"
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read().decode()
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("client", ["python", "c"])
def test_load_benchmark_reports_every_level(tiny_package_dir, client):
    if client == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc): the C load client of benchmarks/loadclient.c is not tested")
    out = subprocess.run([sys.executable, "benchmarks/load.py", "--model", str(tiny_package_dir), "--clients", "1,3",
                          "--seconds", "0.6", "--warm", "0.1", "--rounds", "2", "--json", "--client", client],
                         check=False, cwd=REPO, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    rows = json.loads(out.stdout)["rows"]
    assert [r["clients"] for r in rows] == [1, 3]
    for row in rows:
        assert row["requests"] > 0 and row["errors"] == 0
        assert row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
    assert rows[0]["mean_batch"] == 1.0  # one closed-loop client can only ever send batches of one


def test_a_lone_client_never_waits_for_the_batch_delay(tiny_package_dir, socket_dir):
    # With a 1 s gathering delay, a batch-1 client that paid it would need ≥ 1 s per request.
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--batch-delay-ms", "1000")
    try:
        with server.connect() as sock:
            answers = sock.makefile("rb")
            started = time.monotonic()
            for i in range(10):
                sock.sendall(json.dumps({"id": i, "text": "rain"}).encode() + b"\n")
                assert json.loads(answers.readline())["id"] == i
            assert time.monotonic() - started < 5.0, "serial requests waited for company"
        assert stats(server)["batch_sizes"] == {"1": 10}
    finally:
        server.stop()


def test_a_model_that_fails_to_load_exits_4_and_leaves_no_socket(tiny_package_dir, socket_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_package_dir, broken)
    for onnx_file in broken.glob("*.onnx"):
        with open(onnx_file, "ab") as fh:
            fh.write(b"x")  # the manifest still loads; the engine's checksum check fails after binding
    path = socket_dir / "s"
    proc = subprocess.run([sys.executable, "-m", "runtime", "serve", "--model", str(broken), "--socket", str(path)],
                          check=False, cwd=REPO, capture_output=True, timeout=60)
    assert proc.returncode == 4, proc.stderr.decode()
    assert b"model package error" in proc.stderr
    assert not path.exists()


# -- hostile clients, paths and limits (issue 15) ------------------------------------------------


def serve_refused(model: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime", "serve", "--model", str(model), *args],
                          check=False, cwd=REPO, capture_output=True, timeout=60)


def test_bad_socket_paths_are_usage_errors_with_one_clear_line(tiny_package_dir, tmp_path):
    long_path = tmp_path / ("d" * 120) / "s"
    others = tmp_path / "others"
    others.mkdir(mode=0o755)
    os.chown(others, 12345, 12345)  # the tests run as root; a directory of another user
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(theirs / "s"))
    stale.close()
    os.chown(theirs / "s", 12345, 12345)  # a stale socket file of another user
    for args, words in [
        (("--socket", ""), "--socket needs a path"),
        (("--socket", str(long_path)), "at most 107"),
        (("--socket", str(others / "s")), "belongs to uid 12345"),
        (("--socket", str(theirs / "s")), "is a socket of uid 12345; not replacing it"),
    ]:
        result = serve_refused(tiny_package_dir, *args)
        err = result.stderr.decode()
        assert result.returncode == 2, (args, err)
        assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err, (args, err)
    assert (theirs / "s").exists()


def test_idle_and_half_line_connections_are_closed_so_others_get_in(tiny_package_dir, socket_dir):
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--max-connections", "2",
                   "--idle-timeout", "1")
    try:
        silent, half = server.connect(), server.connect()
        half.sendall(b'{"id": "never finished", "te')
        started = time.monotonic()
        for sock in (silent, half):
            assert sock.recv(100) == b""  # closed by the server
        assert time.monotonic() - started < 10
        assert server.exchange([b'{"id": 1, "text": "rain"}'])[0]["label"] == "weather"
        with server.connect() as active:  # each request restarts the clock: 2.4 s in all, never idle 1 s
            for i in range(4):
                active.sendall(json.dumps({"id": i, "text": "goal"}).encode() + b"\n")
                time.sleep(0.6)
            active.shutdown(socket.SHUT_WR)
            assert [a["id"] for a in read_answers(active)] == [0, 1, 2, 3]
    finally:
        code, err = server.stop()
    assert code == 0 and "Traceback" not in err, err


def test_shutdown_does_not_wait_for_a_client_that_does_not_read(tiny_package_dir, socket_dir):
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--queue-size", "2000")
    lazy = server.connect()
    lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = json.dumps({"texts": ["rain goal server " * 20] * 8}).encode() + b"\n"
    lazy.sendall(request * 250)  # ~1 MB of answers it never reads
    time.sleep(1.0)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(timeout=60)
    assert time.monotonic() - started < 10, "shutdown waited for a client that does not read"
    assert code == 0
    assert b"Traceback" not in server.proc.stderr.read()
    lazy.close()


def test_running_out_of_file_descriptors_backs_off_without_flooding_the_log(tiny_package_dir, socket_dir):
    path = socket_dir / "s"
    proc = subprocess.Popen(after_shell("ulimit -n 60", [sys.executable, "-m", "runtime", "serve", "--model",
                                                         str(tiny_package_dir), "--socket", str(path), "--ready",
                                                         "--max-connections", "500"]),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    server = when_ready(proc)
    clients = []
    try:
        for _ in range(80):
            sock = socket.socket(socket.AF_UNIX)
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(str(path))
            clients.append(sock)
        time.sleep(3.0)  # EMFILE all along
        for sock in clients:
            sock.close()
        clients.clear()
        assert server.exchange([b'{"id": 1, "text": "rain"}'])[0]["label"] == "weather"  # accepting again
    finally:
        for sock in clients:
            sock.close()
        code, err = server.stop()
    assert code == 0 and "Traceback" not in err, err
    assert 1 <= err.count("out of file descriptors") <= 3, err


def test_deep_json_and_huge_texts_over_the_socket(tiny_package_dir, socket_dir):
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--max-line-bytes", str(2 << 20))
    try:
        huge = json.dumps({"id": "huge", "text": "goal " + "y" * (3 << 19)}).encode()
        answers = server.exchange([b'{"id": 1, "text": "rain"}', b"[" * 5000, huge, b'{"id": 3, "text": "server"}'])
        assert [a["id"] for a in answers] == [1, None, "huge", 3]
        assert answers[1]["error"]["code"] == "invalid_json"
        assert (answers[2]["leaning"], answers[2]["reason"], answers[2]["truncated"]) == ("sports", "unreadable", True)
        body = stats(server)
        assert body["peak_rss_mb"] < 400
    finally:
        code, err = server.stop()
    assert code == 0 and "Traceback" not in err, err


# -- never a silently lost answer (issue 23) -------------------------------------------------------


def start_slow(model: Path, per_call_ms: float, per_text_ms: float, *args: str) -> Server:
    """A server whose engine sleeps per call and per text (benchmarks/slow_engine.py): a fast tiny
    model behaving like a big one on a loaded box, so the queue fills and backpressure holds."""
    from benchmarks import slow_engine

    proc = subprocess.Popen([*slow_engine.command(per_call_ms, per_text_ms), "serve", "--model", str(model),
                             "--ready", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return when_ready(proc)


def pipeline(server: Server, lines: list[bytes], pause_after: int = 0, pause_s: float = 0.0,
             rcvbuf: int = 0) -> list[dict]:
    """One connection: a writer thread sends the lines in small writes (as a real client streams
    them) and half-closes; this thread reads every answer until EOF, optionally not reading for
    pause_s seconds after pause_after answers."""
    sock = server.connect()
    sock.settimeout(120)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)

    def feed() -> None:
        for offset in range(0, len(lines), 7):
            sock.sendall(b"".join(line + b"\n" for line in lines[offset:offset + 7]))
        sock.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    data, paused = b"", False
    while True:
        if pause_s and not paused and data.count(b"\n") >= pause_after:
            paused = True
            time.sleep(pause_s)  # the client stops reading: decide must wait for it, not drop it
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    writer.join(timeout=60)
    sock.close()
    return [json.loads(line) for line in data.splitlines()]


def test_a_pipelining_client_held_back_by_backpressure_is_not_closed_as_idle(tiny_package_dir, socket_dir):
    # The reader holds an incomplete line while the slow engine keeps it waiting for owed answers
    # far longer than --idle-timeout: that wait is decide's, not the client's (it was closed after
    # 2,767 of 3,000 answers).
    server = start_slow(tiny_package_dir, 20, 5, "--socket", str(socket_dir / "s"), "--idle-timeout", "1")
    try:
        lines = [json.dumps({"id": i, "text": "rain goal server"}).encode() for i in range(3000)]
        answers = pipeline(server, lines)
        assert [a["id"] for a in answers] == list(range(3000))
        assert all(a["label"] is not None or a.get("leaning") for a in answers)
    finally:
        code, err = server.stop()
    assert code == 0 and "closing a connection" not in err, err


def test_a_client_that_stops_reading_for_a_while_gets_every_answer(tiny_package_dir, socket_dir):
    # ~1.5 KB answers, a small receive buffer and a 3 s pause with --idle-timeout 1: the writer
    # waits for the client, the reader is held back, and nothing is closed.
    server = start_slow(tiny_package_dir, 2, 0.2, "--socket", str(socket_dir / "s"), "--idle-timeout", "1")
    try:
        lines = [json.dumps({"id": i, "texts": ["rain goal server"] * 8}).encode() for i in range(1500)]
        answers = pipeline(server, lines, pause_after=100, pause_s=3.0, rcvbuf=4096)
        assert [a["id"] for a in answers] == list(range(1500))
        assert all(len(a["results"]) == 8 for a in answers)
    finally:
        code, err = server.stop()
    assert code == 0 and "closing a connection" not in err, err


def test_answers_waiting_for_a_client_that_sent_everything_and_stopped_reading_are_kept(tiny_package_dir,
                                                                                       socket_dir):
    # The client keeps its connection open (no half-close), every request is answered while it
    # does not read, and it sends nothing: decide owes nothing but still holds its answers, so the
    # connection is not idle — closing it would drop them.
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--idle-timeout", "1")
    try:
        with server.connect() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"".join(json.dumps({"id": i, "texts": ["rain goal server"] * 8}).encode() + b"\n"
                                  for i in range(400)))
            time.sleep(6.0)  # all answered meanwhile, ~600 KB waiting for this client
            reader = sock.makefile("rb")
            answers = [json.loads(reader.readline()) for _ in range(400)]
        assert [a["id"] for a in answers] == list(range(400))
    finally:
        code, err = server.stop()
    assert code == 0 and "closing a connection" not in err, err


def test_pipelining_clients_under_a_slow_engine_share_the_queue_without_busy(tiny_package_dir, socket_dir):
    # 12 clients × 400 pipelined through a 4-place queue, each request waiting for a place with a
    # 3 s --queue-timeout: fair admission gives every connection its turn well within it.
    server = start_slow(tiny_package_dir, 5, 0.5, "--socket", str(socket_dir / "s"), "--queue-size", "4",
                        "--queue-timeout", "3", "--idle-timeout", "1")
    failures: list[BaseException] = []

    def client(number: int) -> None:
        try:
            lines = [json.dumps({"id": f"{number}-{i}", "text": "goal"}).encode() for i in range(400)]
            answers = pipeline(server, lines)
            assert [a["id"] for a in answers] == [f"{number}-{i}" for i in range(400)]
            assert [a for a in answers if "error" in a] == []
        except BaseException as exc:  # noqa: BLE001 — reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(12)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not failures, failures[0]
        body = stats(server)
        assert body["busy"] == {"queue_timeout": 0, "max_connections": 0, "shutting_down": 0}
        assert "busy" not in body["errors"]
    finally:
        code, err = server.stop()
    assert code == 0, err


def test_busy_answers_are_counted_by_cause(tiny_package_dir, socket_dir):
    server = start(tiny_package_dir, "--socket", str(socket_dir / "s"), "--max-connections", "1")
    try:
        with server.connect() as first:
            first.sendall(b'{"id": 1, "text": "rain"}\n')
            assert json.loads(first.makefile("rb").readline())["label"] == "weather"
            for _ in range(3):
                with server.connect() as extra:
                    assert [a["error"]["code"] for a in read_answers(extra)] == ["busy"]
            first.sendall(b'{"id": "s", "op": "stats"}\n')
            first.shutdown(socket.SHUT_WR)
            body = read_answers(first)[-1]
        assert body["busy"]["max_connections"] == 3 and body["errors"]["busy"] == 3
    finally:
        server.stop()


def test_a_burst_of_connects_fits_the_listen_backlog(tiny_package_dir, socket_dir):
    # The server is stopped (SIGSTOP) while 500 clients connect and send a request: the kernel's
    # backlog must hold them all (128 made connect fail with EAGAIN before busy could be sent).
    # After SIGCONT every client gets exactly one line: its answer or busy.
    path = socket_dir / "s"
    server = start(tiny_package_dir, "--socket", str(path), "--max-connections", "64")
    clients, refused = [], 0
    try:
        server.proc.send_signal(signal.SIGSTOP)
        for i in range(500):
            sock = socket.socket(socket.AF_UNIX)
            sock.setblocking(False)
            try:
                sock.connect(str(path))
            except BlockingIOError:
                refused += 1
                sock.close()
                continue
            sock.setblocking(True)
            sock.sendall(json.dumps({"id": i, "text": "rain"}).encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            clients.append(sock)
        server.proc.send_signal(signal.SIGCONT)
        assert refused == 0, f"{refused} of 500 connects were refused by a full backlog"
        kinds = []
        for sock in clients:
            sock.settimeout(60)
            answers = read_answers(sock)
            assert len(answers) == 1, answers
            kinds.append("busy" if "error" in answers[0] else answers[0]["label"])
        assert set(kinds) <= {"weather", "busy"} and kinds.count("weather") >= 64
    finally:
        for sock in clients:
            sock.close()
        server.proc.send_signal(signal.SIGCONT)
        code, err = server.stop()
    assert code == 0 and "Traceback" not in err, err


def test_the_slow_soak_answers_every_request_in_order(tiny_package_dir):
    # benchmarks/soak.py --slow at a small scale (the lead runs 50 × 2,000 with a 10 s pause):
    # pipelining clients, one that stops reading for longer than --idle-timeout, a slowed engine
    out = subprocess.run([sys.executable, "benchmarks/soak.py", "--slow", "--model", str(tiny_package_dir),
                          "--clients", "6", "--per-client", "400", "--pause", "3", "--hogs", "0", "--json"],
                         cwd=REPO, capture_output=True, timeout=300, check=False)
    assert out.returncode == 0, (out.stdout.decode()[-2000:], out.stderr.decode()[-2000:])
    row = json.loads(out.stdout)["rows"][0]
    assert (row["answered"], row["lost"], row["busy"], row["out_of_order_streams"]) == (2400, 0, 0, 0), row
    assert row["peak_rss_mb"] > 0
