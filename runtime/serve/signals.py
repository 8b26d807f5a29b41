"""What each signal a service manager or a terminal sends means to decide: one table, both transports.

Issue 23: SIGHUP and SIGUSR1 kept their default action (terminate) and killed both transports
mid-stream. Now every such signal either has a meaning below or is ignored, and none loses an
answer for a line already read:

    signal                    while serving (stdio and socket)
    TERM, INT (Ctrl-C),       stop: read no more, answer and write every line already read,
    QUIT (Ctrl-\\)             exit 0 (QUIT: no core dump)
    HUP                       reload the model: the package directory served now is checked,
                              warmed and self-tested in the background (runtime/serve/swap.py) while
                              the old model answers; the next batch after it passed uses it
    USR1                      log one line: the stats op's answer; serving goes on
    USR2, PIPE, ALRM, WINCH   ignored (a reader that left shows as EPIPE, answered by exiting 0)
    TSTP, TTIN, TTOU          job control as usual: the process stops, SIGCONT resumes it, and
                              nothing is lost meanwhile (the kernel holds the pipes and sockets)

Before serving starts (model loading), TERM/INT/QUIT end the process (exit 130, nothing was read
yet) and the others are ignored; after serving ends everything in the table is ignored.
Stdlib only: installed before numpy/onnxruntime are imported.
"""

from __future__ import annotations

import json
import logging
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("decide")

STOP, RELOAD, REPORT, IGNORE, DEFAULT = "stop", "reload", "report", "ignore", "default"


@dataclass(frozen=True)
class Rule:
    """What some signals mean while serving."""

    names: tuple[str, ...]
    action: str  # STOP, RELOAD, REPORT, IGNORE or DEFAULT (the kernel's own action)
    meaning: str


TABLE = (
    Rule(("SIGTERM", "SIGINT", "SIGQUIT"), STOP, "stop: answer every line already read, exit 0 (no core dump)"),
    Rule(("SIGHUP",), RELOAD, "reload the model in the background (runtime/serve/swap.py), serving goes on"),
    Rule(("SIGUSR1",), REPORT, "log one stats line, serving goes on"),
    Rule(("SIGUSR2", "SIGPIPE", "SIGALRM", "SIGWINCH"), IGNORE, "ignored (a reader that left shows as EPIPE)"),
    Rule(("SIGTSTP", "SIGTTIN", "SIGTTOU"), DEFAULT, "job control: stopped until SIGCONT; nothing is lost"),
)
RULES = {getattr(signal, name): rule for rule in TABLE for name in rule.names if hasattr(signal, name)}
NAMES = {number: signal.Signals(number).name for number in RULES}


def reload_model(stats: Callable[[], dict[str, Any]]) -> None:
    """SIGHUP for a transport without a swapper: one log line, nothing changes (both transports
    pass their own `reload`, runtime/serve/swap.py, called between batches, never inside one)."""
    del stats
    log.info("SIGHUP received: this service cannot reload its model; serving goes on with the loaded one")


def report_stats(stats: Callable[[], dict[str, Any]]) -> None:
    """SIGUSR1: the stats op's answer as one log line."""
    log.info("SIGUSR1 received: stats %s", json.dumps(stats(), separators=(",", ":"), sort_keys=True))


@dataclass
class Actions:
    """What a transport does for each action: `stop(signal name)` must be safe to call from a
    signal handler (set a flag); reload and report run from the transport's own loop."""

    stop: Callable[[str], None]
    stats: Callable[[], dict[str, Any]]
    reload: Callable[[Callable[[], dict[str, Any]]], None] = reload_model
    report: Callable[[Callable[[], dict[str, Any]]], None] = report_stats

    def run(self, signum: int) -> None:
        """Act on a signal (from the transport's loop, or directly for stop)."""
        rule = RULES[signum]
        if rule.action == STOP:
            self.stop(NAMES[signum])
        elif rule.action == RELOAD:
            self.reload(self.stats)
        elif rule.action == REPORT:
            self.report(self.stats)


class Inbox:
    """Signals caught by a plain `signal.signal` handler (stdio) and acted on by the transport's
    loop between batches: a stop is flagged at once, reload and report wait for `dispatch`."""

    def __init__(self, actions: Actions):
        self.actions = actions
        self.pending: deque[int] = deque()

    def catch(self, signum: int, _frame: object) -> None:
        """The signal handler (runs in the main thread between two bytecodes)."""
        if RULES[signum].action == STOP:
            self.actions.run(signum)
        else:
            self.pending.append(signum)

    def dispatch(self) -> None:
        """Act on the reload/report signals caught since the last call."""
        while self.pending:
            self.actions.run(self.pending.popleft())

    def install(self) -> None:
        """Take over every signal in the table (see the module docstring)."""
        for signum, rule in RULES.items():
            if rule.action == IGNORE:
                signal.signal(signum, signal.SIG_IGN)
            elif rule.action != DEFAULT:
                signal.signal(signum, self.catch)


def handled() -> list[tuple[int, str]]:
    """(signal, action) of every signal a transport acts on (stop, reload, report)."""
    return [(signum, rule.action) for signum, rule in RULES.items() if rule.action not in (IGNORE, DEFAULT)]


def ignore_the_ignored() -> None:
    """SIG_IGN for the signals the table ignores (the asyncio transport handles the others)."""
    for signum, rule in RULES.items():
        if rule.action == IGNORE:
            signal.signal(signum, signal.SIG_IGN)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(NAMES[signum])


def before_serving() -> None:
    """While the model loads: a stop signal ends the process (KeyboardInterrupt → exit 130;
    nothing has been read), every other signal of the table is ignored with a log line."""
    for signum, rule in RULES.items():
        if rule.action == STOP:
            signal.signal(signum, _interrupt)
        elif rule.action in (RELOAD, REPORT):
            signal.signal(signum, _ignored_while_loading)
        elif rule.action == IGNORE:
            signal.signal(signum, signal.SIG_IGN)


def _ignored_while_loading(signum: int, _frame: object) -> None:
    log.info("%s received before serving started: ignored", NAMES[signum])


def after_serving() -> None:
    """Serving is over and every answer written: nothing in the table may end the exit path now."""
    for signum, rule in RULES.items():
        if rule.action != DEFAULT:
            signal.signal(signum, signal.SIG_IGN)
