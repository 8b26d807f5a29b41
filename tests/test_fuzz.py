"""Fuzzing the protocol with hypothesis: random bytes, random JSON of random depth and types, giant
numbers and strings, deep nesting, invalid UTF-8, lone surrogates, control characters and Unicode
whitespace, interleaved with good lines — in-process through the Service, and end to end over
stdio and the socket. Every non-blank line gets exactly one valid JSON answer, in order; good lines
are answered correctly; the processes exit 0 without a traceback.

Deterministic in CI (derandomize). A longer, random run:
    DECIDE_FUZZ_EXAMPLES=3000 DECIDE_FUZZ_RANDOM=1 python3 -m pytest tests/test_fuzz.py -q
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.engine.engine import Engine
from runtime.package.load import load_package
from runtime.protocol import ERROR_CODES, Limits, parse_line
from runtime.serve.service import Service

REPO = Path(__file__).resolve().parent.parent
MAX_LINE = 4096
MAX_TEXTS = 8
WORDS = {"rain": "weather", "goal": "sports", "server": "tech", "der Regen und die Sonne": "weather",
         "le serveur": "tech", "雨": "weather"}
EXAMPLES = int(os.environ.get("DECIDE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=not os.environ.get("DECIDE_FUZZ_RANDOM"), deadline=None,
                database=None, suppress_health_check=list(HealthCheck))
UNICODE_WHITESPACE = [chr(c) for c in range(0x110000) if chr(c).isspace() and chr(c) != "\n"]

# -- strategies ----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
request_like = st.fixed_dictionaries({}, optional={
    "id": json_values, "text": st.one_of(st.text(), json_values), "op": st.one_of(
        st.sampled_from(["health", "info", "stats", "reboot"]), json_values),
    "texts": st.one_of(st.lists(st.text(max_size=40), max_size=MAX_TEXTS + 2), json_values)})
giant_numbers = st.sampled_from([
    "1" * 5000, "-" + "9" * 4301, "1e999999", "-1e-999999", "0." + "3" * 5000, "1" * 4300])
deep = st.builds(lambda n, opener: opener * n, st.integers(10, 6000), st.sampled_from(["[", '{"a":', "[{\"b\":"]))
surrogates = st.sampled_from(['{"id": 1, "text": "\\ud800"}', '{"id": "\\udfff", "text": "x"}',
                              '{"texts": ["ok", "\\ud83d"]}'])


def as_line(value: object) -> bytes:
    """JSON text of a value, either ASCII-escaped or raw UTF-8 (surrogates escaped)."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


hostile_lines = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"\xc3\x28", b"\xed\xa0\x80", b"\xff\xfe", b'{"text": "\xe9"}', b"\xef\xbb\xbf",
                     b"\xef\xbb\xbf{}", b"\r", b"\x00", b"\x1c", "\u3000".encode(), "\u2028".encode()]),
    json_values.map(as_line),
    request_like.map(as_line),
    giant_numbers.map(lambda n: f'{{"id": {n}, "text": "rain"}}'.encode()),
    giant_numbers.map(str.encode),
    deep.map(str.encode),
    surrogates.map(str.encode),
    st.text(alphabet=st.characters(max_codepoint=0x1F), max_size=20).map(str.encode),
    st.text(alphabet=st.sampled_from(UNICODE_WHITESPACE), max_size=6).map(str.encode),
    st.integers(MAX_LINE - 20, MAX_LINE * 3).map(lambda n: b'{"text": "' + b"a" * n + b'"}'),
    st.text(max_size=60).map(str.encode),
).map(lambda line: line.replace(b"\n", b""))


@st.composite
def line_batches(draw: st.DrawFn) -> list[tuple[bytes, str | None]]:
    """(line, expected label for good lines / None for hostile ones)."""
    items = []
    for index in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            word = draw(st.sampled_from(sorted(WORDS)))
            items.append((json.dumps({"id": f"good-{index}", "text": word}).encode(), WORDS[word]))
        else:
            items.append((draw(hostile_lines), None))
    return items


# -- the oracle ----------------------------------------------------------------------------------


def is_blank(line: bytes) -> bool:
    """Written independently of runtime.protocol: the README's rule for lines that get no answer."""
    if len(line) > MAX_LINE:
        return False
    line = line[:-1] if line.endswith(b"\r") else line
    line = line[3:] if line.startswith(b"\xef\xbb\xbf") else line
    return line.strip(b" \t\r") == b""


def check_answers(items: list[tuple[bytes, str | None]], answers: list[bytes]) -> None:
    expected = [(line, label) for line, label in items if not is_blank(line)]
    assert len(answers) == len(expected), (len(answers), len(expected), [line[:80] for line, _ in items])
    for (line, label), raw in zip(expected, answers):
        answer = json.loads(raw)
        assert isinstance(answer, dict) and "id" in answer, raw
        if label is not None:
            assert answer["id"] == json.loads(line)["id"] and answer["label"] == label, answer
        elif "error" in answer:
            assert answer["error"]["code"] in ERROR_CODES and isinstance(answer["error"]["message"], str)
            assert answer["error"]["code"] != "internal_error", (line[:200], answer)
        else:
            assert "label" in answer or "results" in answer or answer.get("op") in ("health", "info", "stats")


# -- in process ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def service(tiny_package_dir) -> Service:
    engine = Engine(load_package(tiny_package_dir), "fp32")
    engine.warm_up()
    return Service(engine, Limits(max_line_bytes=MAX_LINE, max_texts=MAX_TEXTS))


@FUZZ
@given(items=line_batches())
def test_service_answers_every_non_blank_line_once(service, items):
    check_answers(items, service.answer_lines([line for line, _ in items]))


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(st.text(alphabet=st.sampled_from([*UNICODE_WHITESPACE, "\ufeff"]), max_size=8))
def test_a_line_is_blank_only_if_it_is_json_whitespace(text):
    blank = parse_line(text.encode("utf-8")) is None
    assert blank == (set(text.removeprefix("\ufeff")) <= set(" \t\r"))


# -- end to end ----------------------------------------------------------------------------------


class Stdio:
    def __init__(self, model: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime", "--model", str(model), "--ready", "-q", "--max-line-bytes",
             str(MAX_LINE), "--max-texts", str(MAX_TEXTS)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.buffer = b""  # our own: select() cannot see what a buffered reader already holds
        assert json.loads(self.read_line())["event"] == "ready"
        self.sentinels = 0

    def read_line(self, timeout: float = 30.0) -> bytes:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, "an answer is missing (no line within the timeout)"
            chunk = os.read(fd, 1 << 16)
            assert chunk, f"EOF after a cut line: {self.buffer[:200]!r}"
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"

    def exchange(self, lines: list[bytes]) -> list[bytes]:
        """Send the lines and a sentinel; every answer up to the sentinel's (so a missing or an
        extra answer shows)."""
        self.sentinels += 1
        sentinel = f"sentinel-{self.sentinels}"
        payload = b"".join(line + b"\n" for line in lines) + json.dumps({"id": sentinel, "op": "health"}).encode()
        self.proc.stdin.write(payload + b"\n")
        self.proc.stdin.flush()
        answers = []
        while True:
            line = self.read_line()
            if json.loads(line).get("id") == sentinel:
                return answers
            answers.append(line)

    def stop(self) -> tuple[int, str]:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        return self.proc.returncode, self.proc.stderr.read().decode()


@pytest.fixture(scope="module")
def stdio_server(tiny_package_dir):
    server = Stdio(tiny_package_dir)
    yield server
    code, err = server.stop()
    assert code == 0 and "Traceback" not in err, err


@FUZZ
@given(items=line_batches())
def test_stdio_answers_every_non_blank_line_once(stdio_server, items):
    check_answers(items, stdio_server.exchange([line for line, _ in items]))


@pytest.fixture(scope="module")
def socket_server(tiny_package_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "s"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", "serve", "--model", str(tiny_package_dir), "--socket", str(path), "-q",
         "--ready", "--max-line-bytes", str(MAX_LINE), "--max-texts", str(MAX_TEXTS)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    assert ready and json.loads(proc.stdout.readline())["event"] == "ready"
    yield path
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0 and "Traceback" not in err, err


def socket_exchange(path: Path, lines: list[bytes]) -> list[bytes]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(b"".join(line + b"\n" for line in lines))
        sock.shutdown(socket.SHUT_WR)
        data = b""
        deadline = time.monotonic() + 30
        while chunk := sock.recv(1 << 16):
            data += chunk
            assert time.monotonic() < deadline
    assert not data or data.endswith(b"\n"), "a cut answer line"
    return [line + b"\n" for line in data.split(b"\n")[:-1]]  # not splitlines: U+2028 is data


@FUZZ
@given(items=line_batches())
def test_socket_answers_every_non_blank_line_once(socket_server, items):
    check_answers(items, socket_exchange(socket_server, [line for line, _ in items]))
