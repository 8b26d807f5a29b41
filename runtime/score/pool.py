"""Who classifies `decide score`'s windows: threads of this process, or worker processes.

A window (up to ~1,000 texts) is one `Classifier.classify` call: the engine tokenizes it, groups
the texts into length-bucketed batches (runtime/engine/batching.py) and returns the answers in input
order, so order is restored inside the window; the caller takes windows back in the order it
submitted them. Per process, `workers` threads each run one window at a time through one shared
ORT session with `threads` intra-op threads (1 by default): in bulk, concurrent single-thread
calls keep the cores busier than one call with several threads (no idle tail at the end of
every window, no intra-op synchronisation on short texts).

`plan` chooses processes × workers × threads from the usable cores: one process keeps up to
PROCESS_CORES cores busy; beyond that its own Python work (parsing input, building answers and
rows, under one GIL) would become the limit, so more cores get more processes, each with its own
copy of the model (139 MB RSS for the default package with 1 thread, measured). Worker processes
are spawned (not forked: the reader thread may hold locks), ignore SIGINT (the parent handles
Ctrl-C) and die with their parent (PR_SET_PDEATHSIG), so a SIGKILLed run leaves no orphans.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from runtime.engine.classifier import Answer, Classifier
from runtime.platform.cgroup import cpu_budget
from runtime.protocol import INTERNAL_ERROR

PROCESS_CORES = 4
MAX_ERROR_CHARS = 300
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Plan:
    """How a run uses the machine."""

    processes: int
    workers: int  # windows classified at once per process (threads)
    threads: int  # ORT intra-op threads per call

    def describe(self) -> str:
        """e.g. "1 process × 2 workers × 1 ORT thread"."""
        return (f"{self.processes} process{'es' if self.processes > 1 else ''} × {self.workers} worker"
                f"{'s' if self.workers > 1 else ''} × {self.threads} ORT thread{'s' if self.threads > 1 else ''}")


def scoring_cores() -> int:
    """Cores this run may use: the smaller of affinity and the cgroup CPU quota (runtime/platform/cgroup.py),
    as for every other command."""
    return cpu_budget().cores


def plan(cores: int, processes: int | None = None, workers: int | None = None, threads: int | None = None,
         threads_max: int = 0) -> Plan:
    """processes × workers × threads for `cores` usable cores (flags override; threads_max: the
    tier's cap on cores, 0 = none)."""
    cores = max(1, min(cores, threads_max) if threads_max else cores)
    processes = processes or max(1, cores // PROCESS_CORES)
    workers = workers or max(1, cores // processes)
    return Plan(processes, workers, threads or 1)


def answers_or_errors(classifier: Classifier, texts: list[str]) -> list[Answer | str]:
    """One answer per text; if the model fails on the window, each text alone, so that only the
    text that breaks it gets an error ("internal_error: …") and the run goes on."""
    try:
        return classifier.classify(texts)
    except Exception:  # noqa: BLE001 — isolate the failing text below
        results: list[Answer | str] = []
        for text in texts:
            try:
                results.append(classifier.classify([text])[0])
            except Exception as exc:  # noqa: BLE001 — one error row, never a crash
                results.append(f"{INTERNAL_ERROR}: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
        return results


class LocalPool:
    """`workers` threads of this process sharing one Classifier."""

    def __init__(self, classifier: Classifier, workers: int):
        self.classifier = classifier
        self.max_text_chars = classifier.max_text_chars
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="score-window")

    def submit(self, texts: list[str]) -> Future:
        """Classify one window (a Future of answers_or_errors)."""
        return self._executor.submit(answers_or_errors, self.classifier, texts)

    def close(self) -> None:
        """Wait for running windows, stop the threads."""
        self._executor.shutdown(wait=True, cancel_futures=True)


class WorkerFailed(Exception):
    """A worker process could not load the model: the exit code and the one-line message."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        self.code, self.message = code, message


_worker: dict[str, Any] = {}


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the parent dies (also when it is SIGKILLed)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def failure(exc: Exception) -> tuple[int, str]:
    """The CLI's exit code and one-line message for an exception from Classifier.load."""
    from runtime.exits import EXIT_CPU_UNSUPPORTED, EXIT_INTERNAL, EXIT_PACKAGE, EXIT_USAGE
    from runtime.package.load import PackageError
    from runtime.platform.tiers import CpuUnsupported, NoUsableVariant, OverrideError

    if isinstance(exc, (PackageError, NoUsableVariant)):
        return EXIT_PACKAGE, f"model package error: {exc}"
    if isinstance(exc, CpuUnsupported):
        return EXIT_CPU_UNSUPPORTED, str(exc)
    if isinstance(exc, (OverrideError, ValueError)):
        return EXIT_USAGE, str(exc)
    return EXIT_INTERNAL, f"internal error in a worker process (a bug in decide): {type(exc).__name__}: {exc}"


def _init_worker(parent: int, load: dict[str, Any]) -> None:
    """Worker process start: load the Classifier; remember a failure instead of printing a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    try:
        _worker["classifier"] = Classifier.load(**load)
    except Exception as exc:  # noqa: BLE001 — reported by the parent as one line and an exit code
        _worker["error"] = failure(exc)


def _worker_classify(texts: list[str]) -> list[Answer | str]:
    if "error" in _worker:
        raise WorkerFailed(*_worker["error"])
    return answers_or_errors(_worker["classifier"], texts)


def _worker_ready() -> int:
    if "error" in _worker:
        raise WorkerFailed(*_worker["error"])
    return _worker["classifier"].max_text_chars


class ProcessPool:
    """`processes` spawned worker processes, each with its own Classifier (`load`: its
    Classifier.load keyword arguments, the same tier and variant as the parent chose)."""

    def __init__(self, processes: int, load: dict[str, Any]):
        self._executor = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(os.getpid(), load))
        self.processes = processes
        self.max_text_chars = 0  # known once the workers are ready

    def wait_ready(self) -> None:
        """Block until the workers have loaded the model; WorkerFailed if one could not."""
        for future in [self._executor.submit(_worker_ready) for _ in range(self.processes)]:
            self.max_text_chars = future.result()

    def submit(self, texts: list[str]) -> Future:
        """Classify one window in some worker process."""
        return self._executor.submit(_worker_classify, texts)

    def close(self) -> None:
        """Stop the worker processes."""
        self._executor.shutdown(wait=True, cancel_futures=True)
