"""How many CPUs this process may use: its affinity and its cgroup's CPU quota.

docker `--cpus`, Kubernetes CPU limits and systemd `CPUQuota=` cap CPU time with the CFS quota,
which `os.sched_getaffinity` does not show: under a 1-CPU quota on a 2-core box decide ran 2
threads and 2 workers that the kernel then throttled (issue 23). The quota is read for the
process's own cgroup (/proc/self/cgroup, located through /proc/self/mountinfo) and every
ancestor up to the hierarchy's mount (a parent's limit binds too): cgroup v2 `cpu.max`
("max 100000" = none), cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1 = none).

Stdlib only, runs before numpy/onnxruntime. Every path is taken below `root`, so tests feed a fake
tree; an unreadable or odd file means "no limit known", never an error.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

SYSTEM_ROOT = Path("/")
MAX_READ = 1 << 16  # /proc and /sys files here are a few lines


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs sizes are taken from: the smaller of affinity and the cgroup quota, and why."""

    cores: int
    source: str  # e.g. "affinity (2 CPUs)" or "cgroup v2 cpu.max 50000/100000 = 0.5 CPU → 1 (…)"
    affinity: int
    quota: float | None  # CPUs the quota allows; None = no quota found


@dataclass(frozen=True)
class Mount:
    """A cgroup hierarchy's mount: the cgroup path it shows (`root`) at `point`."""

    version: int  # 1 or 2
    root: str
    point: str
    controllers: frozenset[str]


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_READ).decode("utf-8", "replace")
    except OSError:
        return None


def affinity_cores() -> int:
    """CPUs this process may run on (cpuset/taskset aware, unlike os.cpu_count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts of a /proc/self/mountinfo text."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        controllers = frozenset(tail[2].split(",")) if tail[0] == "cgroup" else frozenset()
        mounts.append(Mount(2 if tail[0] == "cgroup2" else 1, fields[3], fields[4].replace("\\040", " "),
                            controllers))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup → {"2": path of the unified hierarchy, "cpu": path of the v1 cpu controller}."""
    paths = {}
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if not sep:
            continue
        if hierarchy == "0" and controllers == "":
            paths["2"] = path
        elif "cpu" in controllers.split(","):
            paths["cpu"] = path
    return paths


def _directories(root: Path, mount: Mount, cgroup_path: str) -> list[Path]:
    """The cgroup's directory and its ancestors up to the mount point, innermost first."""
    relative = PurePosixPath(cgroup_path)
    if mount.root != "/" and relative.is_relative_to(mount.root):
        relative = relative.relative_to(mount.root)
    steps = [part for part in relative.parts if part not in ("/", "..", ".")]
    base = root / mount.point.lstrip("/")
    return [base.joinpath(*steps[:depth]) for depth in range(len(steps), -1, -1)]


def _v2_quota(directory: Path) -> tuple[float, str] | None:
    text = _read(directory / "cpu.max")
    parts = text.split() if text else []
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return (quota / period, f"cgroup v2 cpu.max {quota}/{period}") if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> tuple[float, str] | None:
    quota_text, period_text = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        quota, period = int((quota_text or "").strip()), int((period_text or "").strip())
    except ValueError:
        return None
    return (quota / period, f"cgroup v1 cpu.cfs_quota_us/cfs_period_us {quota}/{period}") if (
        quota > 0 and period > 0) else None


def cgroup_quota(root: Path = SYSTEM_ROOT) -> tuple[float, str] | None:
    """(CPUs, description) of the tightest CFS quota on this process's cgroup or its ancestors,
    over the v1 cpu and the v2 hierarchies; None when there is none (or nothing can be read)."""
    paths = parse_proc_cgroup(_read(root / "proc/self/cgroup") or "")
    mounts = parse_mountinfo(_read(root / "proc/self/mountinfo") or "")
    if not mounts:  # no mountinfo (or a fake tree without one): the usual mount points
        mounts = [Mount(2, "/", "/sys/fs/cgroup", frozenset()), Mount(1, "/", "/sys/fs/cgroup/cpu", frozenset({"cpu"}))]
    found: list[tuple[float, str]] = []
    for mount in mounts:
        key, read = ("2", _v2_quota) if mount.version == 2 else ("cpu", _v1_quota)
        if key not in paths or (mount.version == 1 and "cpu" not in mount.controllers):
            continue
        for directory in _directories(root, mount, paths[key]):
            quota = read(directory)
            if quota is not None:
                found.append((quota[0], f"{quota[1]} in {directory.relative_to(root)}"))
    return min(found, default=None)


def quota_cores(cpus: float) -> int:
    """Whole CPUs for threads and workers: rounded to the nearest, at least 1 (0.5 → 1, 1.4 → 1,
    1.5 → 2): one thread more than the quota is throttled a little, one less leaves most of a CPU idle."""
    return max(1, math.floor(cpus + 0.5))


def cpu_budget(root: Path | None = None) -> CpuBudget:
    """The smaller of affinity and the cgroup quota, with where the number comes from."""
    affinity = affinity_cores()
    quota = cgroup_quota(SYSTEM_ROOT if root is None else root)
    if quota is None or quota_cores(quota[0]) >= affinity:
        note = "" if quota is None else f"; {quota[1]} = {quota[0]:g} CPU allows more"
        return CpuBudget(affinity, f"affinity ({affinity} CPUs{note})", affinity, None if quota is None else quota[0])
    cores = quota_cores(quota[0])
    return CpuBudget(cores, f"{quota[1]} = {quota[0]:g} CPU → {cores} (affinity: {affinity})", affinity, quota[0])
