"""Threads and workers follow the container's CPU quota (cgroup v1 and v2), not only affinity:
fake cgroup trees through the root path, `info` under a 1-CPU quota, and a real cgroup when this
machine lets us make one."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.child import after_shell

from runtime import cli
from runtime.platform import cgroup
from runtime.platform.cgroup import (
    affinity_cores,
    cgroup_quota,
    cpu_budget,
    parse_mountinfo,
    parse_proc_cgroup,
    quota_cores,
)

REPO = Path(__file__).resolve().parent.parent
V2_MOUNT = "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNT = ("35 30 0:30 {root} /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime master:11 - cgroup cgroup "
            "rw,cpu,cpuacct\n36 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")


def fake_tree(root: Path, proc_cgroup: str, mountinfo: str | None, files: dict[str, str]) -> Path:
    """A root directory holding proc/self/{cgroup,mountinfo} and the given cgroup files."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(proc_cgroup)
    if mountinfo is not None:
        (root / "proc/self/mountinfo").write_text(mountinfo)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def v2_tree(root: Path, cpu_max: str, parent_max: str = "max 100000\n") -> Path:
    return fake_tree(root, "0::/system.slice/decide.service\n", V2_MOUNT, {
        "sys/fs/cgroup/system.slice/cpu.max": parent_max,
        "sys/fs/cgroup/system.slice/decide.service/cpu.max": cpu_max,
    })


@pytest.mark.parametrize("cpus, cores", [(0.1, 1), (0.5, 1), (1.0, 1), (1.4, 1), (1.5, 2), (2.4, 2), (3.6, 4)])
def test_a_quota_rounds_to_whole_cpus_and_never_below_one(cpus, cores):
    assert quota_cores(cpus) == cores


def test_cgroup_v2_quota_of_the_process_group(tmp_path):
    quota = cgroup_quota(v2_tree(tmp_path, "50000 100000\n"))
    assert quota is not None and quota[0] == 0.5
    assert "cgroup v2 cpu.max 50000/100000" in quota[1] and "decide.service" in quota[1]


def test_cgroup_v2_limit_of_a_parent_binds_too(tmp_path):
    quota = cgroup_quota(v2_tree(tmp_path, "max 100000\n", parent_max="150000 100000\n"))
    assert quota is not None and quota[0] == 1.5
    assert quota[1].endswith("sys/fs/cgroup/system.slice")


def test_cgroup_v2_without_a_limit(tmp_path):
    assert cgroup_quota(v2_tree(tmp_path, "max 100000\n")) is None


def test_cgroup_v1_quota_inside_a_container(tmp_path):
    # docker without a cgroup namespace: /proc/self/cgroup shows the host path, which is the
    # mount's root, so the container's own group is the mount point itself
    root = fake_tree(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
                     V1_MOUNT.format(root="/docker/abc"),
                     {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "100000\n",
                      "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cgroup_quota(root) == (1.0, ("cgroup v1 cpu.cfs_quota_us/cfs_period_us 100000/100000 in "
                                       "sys/fs/cgroup/cpu,cpuacct"))


def test_cgroup_v1_without_a_quota_and_unreadable_files(tmp_path):
    root = fake_tree(tmp_path, "4:cpu,cpuacct:/\n", V1_MOUNT.format(root="/"),
                     {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                      "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cgroup_quota(root) is None
    (root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us").write_text("garbage\n")
    assert cgroup_quota(root) is None
    assert cgroup_quota(tmp_path / "nothing-here") is None


def test_without_mountinfo_the_usual_mount_points_are_read(tmp_path):
    root = fake_tree(tmp_path, "0::/app\n", None, {"sys/fs/cgroup/app/cpu.max": "200000 100000\n"})
    assert cgroup_quota(root)[0] == 2.0


def test_the_budget_is_the_smaller_of_affinity_and_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroup, "affinity_cores", lambda: 2)
    budget = cpu_budget(v2_tree(tmp_path / "half", "50000 100000\n"))
    assert (budget.cores, budget.affinity, budget.quota) == (1, 2, 0.5)
    assert budget.source.startswith("cgroup v2 cpu.max 50000/100000") and "0.5 CPU → 1" in budget.source
    loose = cpu_budget(v2_tree(tmp_path / "loose", "400000 100000\n"))
    assert (loose.cores, loose.quota) == (2, 4.0) and loose.source.startswith("affinity (2 CPUs")


def test_parsers_pick_the_cgroup_mounts_and_paths():
    mounts = parse_mountinfo(V2_MOUNT + V1_MOUNT.format(root="/") + "40 30 0:5 / /proc rw - proc proc rw\n")
    assert [(m.version, m.point, "cpu" in m.controllers) for m in mounts] == [
        (2, "/sys/fs/cgroup", False), (1, "/sys/fs/cgroup/cpu,cpuacct", True), (1, "/sys/fs/cgroup/memory", False)]
    assert parse_proc_cgroup("4:cpu,cpuacct:/a\n0::/b\n3:cpuset:/c\n") == {"cpu": "/a", "2": "/b"}


def test_info_shows_one_thread_and_one_worker_under_a_one_cpu_quota(tmp_path, monkeypatch, capsys,
                                                                    tiny_package_dir):
    if affinity_cores() < 2:
        pytest.skip("needs at least 2 usable cores to show the quota making a difference")
    monkeypatch.setattr(cgroup, "SYSTEM_ROOT", v2_tree(tmp_path, "100000 100000\n"))
    assert cli.main(["info", "--json", "--model", str(tiny_package_dir)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["threads"], report["workers"], report["cpu"]["usable_cores"]) == (1, 1, 1)
    assert report["cpu"]["cores_source"].startswith("cgroup v2 cpu.max 100000/100000")
    monkeypatch.setattr(cgroup, "SYSTEM_ROOT", v2_tree(tmp_path / "none", "max 100000\n"))
    assert cli.main(["info", "--json", "--model", str(tiny_package_dir)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["threads"] == report["workers"] == report["cpu"]["usable_cores"] == affinity_cores()


def real_v1_cpu_cgroup() -> Path | None:
    """A fresh cgroup v1 cpu group we may write a quota into (as root), or None."""
    base = Path("/sys/fs/cgroup/cpu")
    if not (base / "cpu.cfs_quota_us").exists() or not os.access(base, os.W_OK):
        return None
    group = base / f"decide-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")
    except OSError:
        return None
    return group


def test_a_real_one_cpu_cgroup_gives_one_thread_and_one_worker(tiny_package_dir):
    if affinity_cores() < 2:
        pytest.skip("needs at least 2 usable cores to show the quota making a difference")
    group = real_v1_cpu_cgroup()
    if group is None:
        pytest.skip("no writable cgroup v1 cpu hierarchy here (needs root); the fake trees above cover the logic")
    try:
        join = f"echo $$ > {shlex.quote(str(group / 'cgroup.procs'))}"  # sh's pid is decide's after exec
        result = subprocess.run(after_shell(join, [sys.executable, "-m", "runtime", "info", "--json", "--model",
                                                   str(tiny_package_dir)]),
                                cwd=REPO, capture_output=True, timeout=60, check=False)
        report = json.loads(result.stdout)
        assert (report["threads"], report["workers"]) == (1, 1), report["cpu"]
        assert "cgroup v1" in report["cpu"]["cores_source"], report["cpu"]
    finally:
        group.rmdir()
