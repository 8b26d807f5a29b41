"""The client libraries (clients/, issue 37): one conformance suite, run through every client.

Each client has a harness in its own language (tests/clients/): it reads TAB-separated commands
on stdin and answers each with one JSON line (the command language: tests/clients/harness.py).
This module builds each harness, then plays the same scenarios through it against the runtime from
source (`python -m runtime` in this checkout, the default model), its socket service, and the
misbehaving children of tests/clients/fake_decide.py. Every scenario has a hard deadline: a
harness that does not answer in time is killed and the scenario fails with the command it was on.

The scenarios that use the real child share one (`main`) per harness, started once: the 2,000
pipelined texts, classify_many, a very long text, an abstention, error answers, 8 threads, the
child killed mid-stream (this suite SIGKILLs it while the requests are in flight) and close. They
run a second time with the frozen binary as the child (heavy: the zip the bundle tests built).

A missing toolchain (gcc, javac, node; Mono's mcs, which this module installs with apt-get when
it runs as root) skips that client's tests with the reason; under DECIDE_STRICT=1 (CI) the skip
is a failure.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from zips import MODEL_DIR, zip_of_this_tree

from bundle_spec import matrix

REPO = Path(__file__).resolve().parent.parent
CLIENTS = REPO / "clients"
HARNESSES = REPO / "tests" / "clients"
FAKE = [sys.executable, str(HARNESSES / "fake_decide.py")]
DECIDE = [sys.executable, "-m", "runtime", "-q"]  # run with cwd = this checkout: its own runtime
LANGS = ("python", "c", "java", "csharp", "node")
MONO_PACKAGES = ("mono-mcs", "mono-runtime")
MAIN_START_S = 90.0  # ready timeout and deadline for the shared real child
KILL_AFTER_S = 0.3  # after the harness says its requests are in flight (10,000 of them)
HARNESS_EXIT_S = 30.0

# Texts the default model answers with a wide margin (checked against a direct run below), so the
# label shows which request an answer belongs to. Non-ASCII on purpose.
TEXTS = (
    "Spindle motor on lathe 3 is at 92 °C and still rising",
    "Unter der Hydraulikpresse steht eine Öllache, bitte schnell kommen",
    "La cinta transportadora hace un ruido de golpeteo muy fuerte desde esta mañana",
    "Il sensore di livello segna 250% ma il serbatoio è vuoto",
    "ПЛК участка упаковки не отвечает, SCADA показывает нет связи",
    "安全光幕被遮挡，机器人单元急停",
    "Bottles fallen over at the labeller infeed, line stopped",
    "What's for lunch in the canteen today?",
)
LUNCH = TEXTS[-1]  # out_of_scope for the default model
LONG_SENTENCE = "Pump P3 is leaking oil. "  # × 30,000 = 720,000 characters; × 50,000 > 1 MiB
# Echoed back by the fake child: the round trip of every kind of character through a client's JSON.
ECHO_TEXTS = ("plain", "Öllache °C", "квадрат", "急停", "emoji 🔧 and 𝄞", 'quote " backslash \\ tab\t end',
              "control \x01 character", "\u00e9\u0301 combining", "\u2028 line separator")


def pattern(count: int) -> list[str]:
    """`count` texts cycling through TEXTS in a scrambled order (a shifted answer shows)."""
    return [TEXTS[(i * 5 + i // len(TEXTS)) % len(TEXTS)] for i in range(count)]


@dataclass
class Context:
    """Files and expectations shared by every harness."""

    files: dict[str, Path]
    expected: dict[str, list[Any]]
    reference: dict[str, Any]  # text → label from a direct run of the runtime
    long_label: str
    socket_path: str
    busy_path: str


@dataclass(frozen=True)
class Scenario:
    """Harness commands, what their answers must show, the deadline for all of them."""

    name: str
    commands: Callable[[Context], list[list[str]]]
    check: Callable[[list[dict[str, Any]], Context], None]
    deadline_s: float
    uses_main: bool = False
    ends_main: bool = False


@dataclass
class Outcome:
    """A scenario's answer lines, or why it has none (a missed deadline, a harness that died)."""

    outputs: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None


def skip_loudly(reason: str) -> None:
    """Skip with the reason in the summary; under DECIDE_STRICT=1 (CI) fail instead."""
    if os.environ.get("DECIDE_STRICT") == "1":
        pytest.fail(f"DECIDE_STRICT=1: a client's toolchain may not be missing; it would have skipped: {reason}")
    pytest.skip(reason)


# -- the scenarios --------------------------------------------------------------------------------


def errors(output: dict[str, Any]) -> str:
    return f"{output.get('error_code')}: {output.get('error_message')}" if "error_code" in output else ""


def ok(output: dict[str, Any]) -> dict[str, Any]:
    assert "error_code" not in output, f"{output['cmd']} failed: {errors(output)}"
    return output


def check_labels(name: str) -> Callable[[list[dict[str, Any]], Context], None]:
    def check(outputs: list[dict[str, Any]], ctx: Context) -> None:
        labels = ok(outputs[-1])["labels"]
        wrong = [i for i, (got, want) in enumerate(zip(labels, ctx.expected[name])) if got != want]
        assert len(labels) == len(ctx.expected[name]), f"{len(labels)} answers for {len(ctx.expected[name])} texts"
        assert not wrong, (f"{len(wrong)} answers do not belong to their texts, first at #{wrong[0]}: "
                           f"{labels[wrong[0]]!r}, expected {ctx.expected[name][wrong[0]]!r}")
    return check


def check_long_text(outputs: list[dict[str, Any]], ctx: Context) -> None:
    long, too_long, after = outputs
    assert ok(long)["truncated"] is True and long["label"] == ctx.long_label
    assert too_long.get("error_code") == "line_too_long", too_long
    assert ok(after)["label"] == ctx.reference[TEXTS[0]], "the answer after an id-less error went astray"


def check_abstention(outputs: list[dict[str, Any]], _ctx: Context) -> None:
    (answer,) = outputs
    assert ok(answer)["abstained"] is True and answer["reason"] == "out_of_scope" and answer["label"] is None
    assert isinstance(answer["leaning"], str) and 0.0 <= answer["score"] <= 1.0


def check_error_answers(outputs: list[dict[str, Any]], ctx: Context) -> None:
    empty, after = outputs
    assert empty.get("error_code") == "empty_text" and empty.get("error_message"), empty
    assert ok(after)["label"] == ctx.reference[TEXTS[1]]


def check_killed(outputs: list[dict[str, Any]], ctx: Context) -> None:
    first, killed, in_flight, after = outputs
    ok(first)
    assert killed["pids"], "no decide child of the harness was found to kill"
    labels, expected = ok(in_flight)["labels"], ctx.expected["kill"]
    failed = [label for label in labels if isinstance(label, str) and label.startswith("!")]
    assert failed, "every request was answered: the kill came too late to test requests in flight"
    assert {f.split(":")[0] for f in failed} == {"!connection_lost"}, f"requests in flight failed with {sorted(set(failed))[:3]}"
    assert "decide" in failed[0] and ("signal" in failed[0] or "code" in failed[0]), f"not a clear error: {failed[0]}"
    wrong = [i for i, (got, want) in enumerate(zip(labels, expected)) if got != want and got not in failed]
    assert not wrong, f"answers before the kill went astray, first at #{wrong[0]}"
    assert ok(after)["label"] == ctx.reference[TEXTS[2]], "the next call did not restart decide"


def check_close(outputs: list[dict[str, Any]], _ctx: Context) -> None:
    closed, after = outputs
    ok(closed)
    assert after.get("error_code") == "closed", after


def check_never_ready(outputs: list[dict[str, Any]], _ctx: Context) -> None:
    (spawn,) = outputs
    assert spawn.get("error_code") == "start_failed", spawn
    assert 1400 <= spawn["elapsed_ms"] <= 10_000, f"gave up after {spawn['elapsed_ms']} ms (ready timeout 1.5 s)"


def check_exit_at_start(outputs: list[dict[str, Any]], _ctx: Context) -> None:
    (spawn,) = outputs
    assert spawn.get("error_code") == "start_failed", spawn
    assert "model package error" in spawn["error_message"], "the child's last stderr line is not in the message"


def check_stalled(outputs: list[dict[str, Any]], _ctx: Context) -> None:
    spawn, call, close = outputs
    ok(spawn)
    assert call.get("error_code") == "timeout", call
    assert 450 <= call["elapsed_ms"] <= 5000, f"timed out after {call['elapsed_ms']} ms (timeout 0.5 s)"
    assert ok(close)["elapsed_ms"] <= 15_000


def check_late_answer(outputs: list[dict[str, Any]], _ctx: Context) -> None:
    spawn, slow, second, close = outputs
    ok(spawn)
    assert slow.get("error_code") == "timeout", slow
    assert ok(second)["label"] == "second", "a late answer was taken for the next request"
    ok(close)


def check_stderr(outputs: list[dict[str, Any]], _ctx: Context) -> None:
    spawn, many, close = outputs
    ok(spawn)
    assert ok(many)["labels"] == list(ECHO_TEXTS)
    ok(close)


def check_socket(outputs: list[dict[str, Any]], ctx: Context) -> None:
    connect, many, threads, close = outputs
    ok(connect)
    check_labels("many")([many], ctx)
    check_labels("threads_socket")([threads], ctx)
    ok(close)


def check_busy(outputs: list[dict[str, Any]], _ctx: Context) -> None:
    connect, first, again, close = outputs
    ok(connect)
    assert first.get("error_code") == "busy" and again.get("error_code") == "busy", (first, again)
    ok(close)


def one(name: str, text: str, repeat: int = 1) -> list[str]:
    return ["one", name, str(repeat), text]


SCENARIOS = (
    Scenario("pipelined_2000", lambda c: [["async", "main", str(c.files["pipelined"])]],
             check_labels("pipelined"), 60, uses_main=True),
    Scenario("classify_many", lambda c: [["many", "main", str(c.files["many"])]], check_labels("many"), 60,
             uses_main=True),
    Scenario("long_text", lambda c: [one("main", LONG_SENTENCE, 30_000), one("main", LONG_SENTENCE, 50_000),
                                     one("main", TEXTS[0])], check_long_text, 30, uses_main=True),
    Scenario("abstention", lambda c: [one("main", LUNCH)], check_abstention, 20, uses_main=True),
    Scenario("error_answers", lambda c: [one("main", "   "), one("main", TEXTS[1])], check_error_answers, 20,
             uses_main=True),
    Scenario("threads_8", lambda c: [["threads", "main", "8", "25", str(c.files["pipelined"])]],
             check_labels("threads"), 60, uses_main=True),
    Scenario("child_killed", lambda c: [one("main", TEXTS[0]), ["async", "main", str(c.files["kill"]), "inflight"],
                                        one("main", TEXTS[2])], check_killed, 90, uses_main=True),
    Scenario("close", lambda c: [["close", "main"], one("main", TEXTS[0])], check_close, 30,
             uses_main=True, ends_main=True),
    Scenario("never_ready", lambda c: [["spawn", "slow", "1.5", "5", *FAKE, "never-ready"]], check_never_ready, 20),
    Scenario("exit_at_start", lambda c: [["spawn", "bad", "30", "5", *FAKE, "exit-at-start"]], check_exit_at_start,
             30),
    Scenario("stalled_engine", lambda c: [["spawn", "stuck", "30", "0.5", *FAKE, "stall"], one("stuck", "hello"),
                                          ["close", "stuck"]], check_stalled, 40),
    Scenario("late_answer", lambda c: [["spawn", "echo", "30", "1", *FAKE, "echo"], one("echo", "slow first"),
                                       one("echo", "second"), ["close", "echo"]], check_late_answer, 40),
    Scenario("stderr_drained", lambda c: [["spawn", "noisy", "30", "10", *FAKE, "stderr-flood"],
                                          ["many", "noisy", str(c.files["echo"])], ["close", "noisy"]],
             check_stderr, 60),
    Scenario("socket", lambda c: [["connect", "sock", "30", c.socket_path], ["many", "sock", str(c.files["many"])],
                                  ["threads", "sock", "8", "10", str(c.files["pipelined"])], ["close", "sock"]],
             check_socket, 60),
    Scenario("busy", lambda c: [["connect", "busy", "10", c.busy_path], one("busy", TEXTS[0]), one("busy", TEXTS[0]),
                                ["close", "busy"]], check_busy, 30),
)


# -- running a harness ----------------------------------------------------------------------------


def decide_children(pid: int) -> list[int]:
    """The children of `pid` (a harness starts no process but its decide children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")[:1]
        except OSError:
            continue  # gone meanwhile
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and cmdline != [b""]:  # (a zombie has no cmdline)
            found.append(int(entry.name))
    return found


class Harness:
    """One harness process: a command goes in, its answer line comes back (or the deadline passes)."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path):
        self.log = log
        with log.open("ab") as stderr:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                            cwd=REPO, env=env)
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def call(self, fields: list[str], deadline: float, outputs: list[dict[str, Any]]) -> str | None:
        """Send one command and add its answer to outputs; the failure, or None."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write("\t".join(fields).encode("utf-8") + b"\n")
            self.process.stdin.flush()
        except OSError:
            return f"the harness is gone before {fields[0]!r}{self.stderr_tail()}"
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return f"no answer to {fields[0]!r} before the scenario's deadline"
            if not line:
                return f"the harness exited ({self.process.wait()}) during {fields[0]!r}{self.stderr_tail()}"
            message = json.loads(line)
            if message.get("event") == "inflight":  # the child-killed scenario: kill it now
                time.sleep(KILL_AFTER_S)
                pids = decide_children(self.process.pid)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                outputs.append({"cmd": "kill", "pids": pids})
                continue
            outputs.append(message)
            return None

    def stderr_tail(self) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace").strip()
        return f"; its stderr ends: {text[-1500:]}" if text else ""

    def finish(self) -> str | None:
        """EOF: the harness closes its clients and exits 0; killed if it takes too long."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.close()
            code = self.process.wait(HARNESS_EXIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return f"the harness did not exit within {HARNESS_EXIT_S:g} s of EOF (close hangs?)"
        return None if code == 0 else f"the harness exited with code {code} at EOF{self.stderr_tail()}"

    def kill(self) -> None:
        for pid in decide_children(self.process.pid):
            os.kill(pid, signal.SIGKILL)
        self.process.kill()
        self.process.wait()


def play(command: list[str], env: dict[str, str], ctx: Context, log: Path, decide: list[str],
         scenarios: tuple[Scenario, ...]) -> dict[str, Outcome]:
    """The scenarios through one client's harness, `decide` the shared child's command; a fresh
    harness after one missed its deadline."""
    outcomes: dict[str, Outcome] = {}
    harness: Harness | None = None
    has_main = False
    for scenario in scenarios:
        outcome = outcomes[scenario.name] = Outcome()
        if harness is None:
            harness, has_main = Harness(command, env, log), False
        if scenario.uses_main and not has_main:
            started: list[dict[str, Any]] = []
            spawn = ["spawn", "main", str(MAIN_START_S), "60", *decide]
            failure = harness.call(spawn, time.monotonic() + MAIN_START_S + 10, started)
            if failure is None and "error_code" in started[0]:
                failure = errors(started[0])
            if failure is not None:
                outcome.failure = f"the shared decide child did not start: {failure}"
                harness.kill()
                harness = None
                continue
            has_main = True
        deadline = time.monotonic() + scenario.deadline_s
        for fields in scenario.commands(ctx):
            outcome.failure = harness.call(fields, deadline, outcome.outputs)
            if outcome.failure is not None:
                outcome.failure += f" ({scenario.deadline_s:g} s for the scenario)"
                harness.kill()
                harness = None
                break
        has_main = has_main and not scenario.ends_main
    if harness is not None and (failure := harness.finish()) is not None:
        last = outcomes[scenarios[-1].name]
        last.failure = last.failure or failure
    return outcomes


# -- building each harness ------------------------------------------------------------------------


def build(lang: str, out: Path) -> tuple[list[str], dict[str, str]]:
    """Compile the client and its harness; (the harness command, its environment) or skip."""
    env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1"}
    if lang == "python":
        return [sys.executable, str(HARNESSES / "harness.py")], {**env, "PYTHONPATH": str(CLIENTS / "python")}
    if lang == "c":
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            skip_loudly("no C compiler (gcc or cc) on PATH")
        command = [cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1", "-g", "-pthread",
                   "-o", str(out / "harness"), str(CLIENTS / "c" / "decide_client.c"), str(HARNESSES / "harness.c"),
                   f"-I{CLIENTS / 'c'}"]
        # With the sanitizers where the compiler has them: a memory error, undefined behaviour or a leak
        # (at exit) ends the harness with an error, which fails the close scenario.
        sanitized = [*command, "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
        if subprocess.run(sanitized, capture_output=True, check=False, timeout=300).returncode != 0:
            compile_or_fail(command)
        return [str(out / "harness")], env
    if lang == "java":
        if shutil.which("javac") is None or shutil.which("java") is None:
            skip_loudly("no javac/java on PATH (a JDK, 9 or newer to compile for Java 8)")
        compile_or_fail(["javac", "--release", "8", "-Xlint:all", "-Xlint:-options", "-Werror", "-d", str(out),
                         str(CLIENTS / "java" / "DecideClient.java"), str(HARNESSES / "Harness.java")])
        return ["java", "-cp", str(out), "Harness"], env
    if lang == "csharp":
        mono_reason = ensure_mono()
        if mono_reason is not None:
            skip_loudly(mono_reason)
        compile_or_fail(["mcs", "-warnaserror+", "-out:" + str(out / "harness.exe"),
                         str(CLIENTS / "csharp" / "DecideClient.cs"), str(HARNESSES / "Harness.cs")])
        return ["mono", str(out / "harness.exe")], env
    if lang == "node":
        node = shutil.which("node")
        if node is None:
            skip_loudly("no node on PATH (Node.js 16 or newer)")
        version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout
        if int(version.lstrip("v").split(".")[0] or 0) < 16:
            skip_loudly(f"node {version.strip()} is older than 16")
        return [node, str(HARNESSES / "harness.js"), str(CLIENTS / "node" / "decide_client.js")], env
    raise ValueError(lang)


def compile_or_fail(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


def ensure_mono() -> str | None:
    """mcs and mono on PATH, installed from the Debian registry if need be (as root); the reason why
    not, or None. CI's clean clone gets Mono here: the README's test command reaches this."""
    if shutil.which("mcs") and shutil.which("mono"):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "Mono's mcs/mono are missing and cannot be installed here (needs root and apt-get): " \
               f"apt-get install {' '.join(MONO_PACKAGES)}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *MONO_PACKAGES]
    done = subprocess.run(install, capture_output=True, text=True, env=env, check=False, timeout=900)
    if done.returncode != 0:  # a clean machine may not have the package lists yet
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, check=False, timeout=900)
        done = subprocess.run(install, capture_output=True, text=True, env=env, check=False, timeout=900)
    if done.returncode != 0 or not (shutil.which("mcs") and shutil.which("mono")):
        return f"apt-get install {' '.join(MONO_PACKAGES)} failed: {(done.stderr or done.stdout).strip()[-500:]}"
    return None


# -- fixtures -------------------------------------------------------------------------------------


def direct_labels(texts: list[str]) -> list[Any]:
    """Labels from the runtime itself (one stdin run), to compare the clients' answers with."""
    lines = "".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(texts))
    done = subprocess.run(DECIDE, input=lines.encode("utf-8"), capture_output=True, cwd=REPO, timeout=300, check=True)
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers] == list(range(len(texts))), done.stderr.decode()
    return [a["label"] for a in answers]


def start_server(socket_path: Path, *options: str) -> subprocess.Popen:
    """`decide serve --socket PATH`, returned once it says it is ready."""
    server = subprocess.Popen([*DECIDE[:3], "serve", "--socket", str(socket_path), "--ready", "-q", *options],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO)
    assert server.stdout is not None
    ready = server.stdout.readline()
    assert json.loads(ready or b"null") and socket_path.exists(), f"the socket service did not start ({server.poll()})"
    return server


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Texts, expected labels, and the two socket services (the busy one holds its only slot)."""
    root = tmp_path_factory.mktemp("clients")
    reference = dict(zip([*TEXTS, LONG_SENTENCE * 30_000], direct_labels([*TEXTS, LONG_SENTENCE * 30_000])))
    assert reference[LUNCH] is None and all(reference[t] for t in TEXTS[:-1]), reference
    lists = {"pipelined": pattern(2000), "many": pattern(500), "kill": pattern(10_000), "echo": list(ECHO_TEXTS)}
    files = {name: root / f"{name}.txt" for name in lists}
    for name, texts in lists.items():
        files[name].write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    threads_order = [lists["pipelined"][i % 2000] for i in range(8 * 25)]  # thread t, call j → line t*25+j
    expected = {name: [reference[t] for t in lists[name]] for name in ("pipelined", "many", "kill")}
    expected.update({
        "threads": [reference[t] for t in threads_order],
        "threads_socket": [reference[t] for t in lists["pipelined"][:80]]})
    sock, busy = root / "decide.sock", root / "busy.sock"
    servers = [start_server(sock), start_server(busy, "--max-connections", "1", "--idle-timeout", "0")]
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # takes the busy service's only slot
    holder.connect(str(busy))
    holder.sendall(b'{"op": "health"}\n')
    assert b'"status"' in holder.recv(4096)
    try:
        yield Context(files, expected, reference, reference[LONG_SENTENCE * 30_000], str(sock), str(busy))
    finally:
        holder.close()
        for server in servers:
            server.terminate()
            server.wait(30)


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[list[str], dict[str, str], Path]]:
    """lang → (its harness command, environment, stderr log), built once; a toolchain's skip is kept too."""
    built: dict[str, Any] = {}

    def get(lang: str) -> tuple[list[str], dict[str, str], Path]:
        if lang not in built:
            out = tmp_path_factory.mktemp(f"harness-{lang}")
            try:
                built[lang] = (*build(lang, out), out / "stderr.log")
            except (pytest.skip.Exception, pytest.fail.Exception) as exc:
                built[lang] = exc
        if isinstance(built[lang], BaseException):
            raise built[lang]
        return built[lang]
    return get


@pytest.fixture(scope="module")
def outcomes(ctx: Context, harnesses: Callable[[str], Any]) -> Callable[[str, str], dict[str, Outcome]]:
    """(lang, "source" or the frozen binary's path) → the scenarios' outcomes, played once."""
    played: dict[tuple[str, str], dict[str, Outcome]] = {}

    def get(lang: str, decide: str) -> dict[str, Outcome]:
        if (lang, decide) not in played:
            command, env, log = harnesses(lang)
            if decide == "source":
                played[lang, decide] = play(command, env, ctx, log, DECIDE, SCENARIOS)
            else:
                played[lang, decide] = play(command, env, ctx, log, [decide, "-q"], FROZEN_SCENARIOS)
        return played[lang, decide]
    return get


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
@pytest.mark.parametrize("lang", LANGS)
def test_client(lang: str, scenario: Scenario, ctx: Context, outcomes: Callable[[str, str], dict[str, Outcome]]) -> None:
    """One conformance scenario through one client, within its deadline."""
    outcome = outcomes(lang, "source")[scenario.name]
    assert outcome.failure is None, outcome.failure
    scenario.check(outcome.outputs, ctx)


FROZEN_SCENARIOS = tuple(s for s in SCENARIOS if s.uses_main)


@pytest.fixture(scope="module")
def frozen_decide() -> str:
    """The frozen x86_64 binary of this tree. CI (DECIDE_STRICT=1) has built its zip in
    tests/test_bundle.py by now (or builds it here); elsewhere only a zip `python3 build.py` left in
    dist/ is used: building one takes minutes and root."""
    if platform.machine() != "x86_64":
        pytest.skip("the frozen binary is tested on an x86_64 host")
    if os.environ.get("DECIDE_STRICT") == "1":
        zip_path = zip_of_this_tree("x86_64")
    else:
        zip_path = matrix.matching_zip(REPO / "dist", "x86_64", matrix.git_commit(), matrix.inputs_digest(MODEL_DIR))
        if zip_path is None:
            pytest.skip("no x86_64 zip of this tree in dist/ (CI builds one; or: python3 build.py)")
    return str(matrix.unpack_bundle(zip_path, "x86_64").executable)


@pytest.mark.heavy
@pytest.mark.parametrize("scenario", FROZEN_SCENARIOS, ids=[s.name for s in FROZEN_SCENARIOS])
@pytest.mark.parametrize("lang", LANGS)
def test_client_with_the_frozen_binary(lang: str, scenario: Scenario, ctx: Context, frozen_decide: str,
                                       outcomes: Callable[[str, str], dict[str, Outcome]]) -> None:
    """The scenarios of the shared child through each client, with the zip's `decide` as the child."""
    outcome = outcomes(lang, frozen_decide)[scenario.name]
    assert outcome.failure is None, outcome.failure
    scenario.check(outcome.outputs, ctx)


def test_the_python_client_is_python_3_8_and_stdlib_only() -> None:
    """Python 3.8+ (the issue): no newer syntax, and no import outside the standard library (the one
    under TYPE_CHECKING, for an annotation, is never made)."""
    tree = ast.parse((CLIENTS / "python" / "decide_client.py").read_text(encoding="utf-8"), feature_version=(3, 8))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"typing_extensions"} <= set(sys.stdlib_module_names), imported


def test_each_client_is_one_small_file() -> None:
    """The issue's limit: each client under 400 lines, one file (C: header + source)."""
    files = [CLIENTS / "python" / "decide_client.py", CLIENTS / "c" / "decide_client.h", CLIENTS / "c" / "decide_client.c",
             CLIENTS / "java" / "DecideClient.java", CLIENTS / "csharp" / "DecideClient.cs", CLIENTS / "node" / "decide_client.js"]
    sizes = {f.relative_to(REPO).as_posix(): len(f.read_text(encoding="utf-8").splitlines()) for f in files}
    assert all(n < 400 for n in sizes.values()), sizes
