"""What every build step shares: paths, target architectures, errors, progress output, `run`."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# DECIDE_BUILD_CACHE moves every cache (roots, wheels, built zips) elsewhere, e.g. to measure a
# build from nothing without touching the default cache.
DEFAULT_CACHE = Path(os.environ.get("DECIDE_BUILD_CACHE") or Path.home() / ".cache" / "decide-build")
DEFAULT_MAX_GLIBC = "2.28"  # the onnxruntime wheel's own floor; the build root has 2.31

ROOT_SUITE = "bullseye"  # Debian 11, glibc 2.31: the oldest suite debootstrap can still fetch
PYTHON_SOURCE = "python3.11"  # source package, taken from PYTHON_SOURCE_SUITE's pool
PYTHON_SOURCE_SUITE = "bookworm"
PYTHON_PREFIX = "/opt/py311"
CHROOT_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "PYTHONDONTWRITEBYTECODE": "1",
    "ORT_DISABLE_TELEMETRY": "1",  # PyInstaller imports onnxruntime in the root: no telemetry files there (issue 33)
}


@dataclass(frozen=True)
class Arch:
    """What differs between target architectures."""

    name: str  # as `uname -m` says it
    debian: str  # Debian's name for it
    triplet: str  # multiarch library directory, GNU cross-tool prefix
    wheel_platforms: tuple[str, ...]  # pip --platform tags, newest first
    # The qemu CPU model that runs the root's programs when this is not the host's arch. ARMv8.0
    # without dotprod: the oldest CPU the bundle supports, so the build cannot use more.
    emulated_cpu: str = ""

    @property
    def emulated(self) -> bool:
        """True when this arch's programs run under qemu-user here (not the host's arch)."""
        return self.name != platform.machine()


ARCHES = {
    "x86_64": Arch(
        name="x86_64",
        debian="amd64",
        triplet="x86_64-linux-gnu",
        wheel_platforms=("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                         "manylinux_2_17_x86_64", "manylinux2014_x86_64"),
    ),
    "aarch64": Arch(
        name="aarch64",
        debian="arm64",
        triplet="aarch64-linux-gnu",
        wheel_platforms=("manylinux_2_28_aarch64", "manylinux_2_27_aarch64",
                         "manylinux_2_17_aarch64", "manylinux2014_aarch64"),
        emulated_cpu="cortex-a72",
    ),
}


class BuildError(Exception):
    """A build step failed; the message says which and why."""


class Refused(Exception):
    """The build cannot run here as asked (exit code 2)."""


# ----------------------------------------------------------------------------- progress output

_STARTED = time.monotonic()
STEP_SECONDS: dict[str, float] = {}  # step title → wall seconds, for the build manifest
# step title → CPU seconds of build.py and everything it ran (user + system): on a shared machine
# the wall time says how busy it was, this says what the step costs.
STEP_CPU_SECONDS: dict[str, float] = {}
_current: list[tuple[str, float, float]] = []


def _cpu_seconds() -> float:
    """CPU time used so far by this process and its waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _close_step() -> None:
    if _current:
        name, started, cpu = _current.pop()
        STEP_SECONDS[name] = round(time.monotonic() - started, 1)
        STEP_CPU_SECONDS[name] = round(_cpu_seconds() - cpu, 1)


def step(number: int, total: int, title: str) -> None:
    """Print the header of a build step (and close the previous one's timers)."""
    _close_step()
    _current.append((title.split(":")[0], time.monotonic(), _cpu_seconds()))
    print(f"\n[{number}/{total}] {title}  (+{time.monotonic() - _STARTED:.0f}s)", flush=True)


def finish_steps() -> float:
    """Close the last step's timers; returns the seconds since the build started."""
    _close_step()
    return round(time.monotonic() - _STARTED, 1)


def note(text: str) -> None:
    """Print a line of progress inside a step."""
    print(f"      {text}", flush=True)


def run(cmd: list[str], log: Path | None = None, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> str:
    """Run a command; its output goes to `log` (or is returned); raise BuildError on failure."""
    started = time.monotonic()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"\n$ {' '.join(cmd)}\n")
            out.flush()
            result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    check=False)
        if result.returncode != 0:
            tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-25:])
            raise BuildError(f"{cmd[0]} … failed (exit {result.returncode}); end of {log}:\n{tail}")
        note(f"done in {time.monotonic() - started:.0f}s (log: {log})")
        return ""
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if result.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed (exit {result.returncode}): {result.stderr.strip()}")
    return result.stdout


def version_tuple(text: str) -> tuple[int, ...]:
    """'2.28' → (2, 28)."""
    return tuple(int(part) for part in text.split("."))
