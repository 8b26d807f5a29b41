"""decide score when the output's disk fails mid-run: a full file system (ENOSPC) or one turned
read-only stops the run with one stderr line and exit 6 (OUTPUT cannot be written, docs/limits.md),
nothing half-written; once the disk is fixed, --resume finishes the job with every id once.

A small tmpfs plays the disk, so these tests need root (CI runs the suite as root); they are
marked heavy, so under DECIDE_STRICT=1 a skip is a failure (tests/strict_mode.py). Without root
the read-only case still runs, with chmod instead of a remount."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_score import REPO, read_jsonl, score, texts, write_jsonl

ROOT = os.geteuid() == 0
COUNT = 20_000
PART_RECORDS = "2000"


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the test."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, options: str) -> None:
    """mount -o remount,OPTIONS; a read-only remount waits until no file is open for writing."""
    deadline = time.monotonic() + 30
    command = ["mount", "-o", f"remount,{options}", str(path)]
    while subprocess.run(command, capture_output=True, check=False).returncode != 0:
        assert time.monotonic() < deadline, f"cannot remount {path} {options}"
        time.sleep(0.01)


@pytest.fixture
def job(tiny_package_dir, tmp_path):
    """The input, the arguments for an OUTPUT under `dir`, and the answers a run on a good disk gives."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts(COUNT, seed=38))])
    reference = tmp_path / "reference.jsonl"
    assert score(str(source), "--output", str(reference), "--model", str(tiny_package_dir), "-q").returncode == 0

    def args(directory: Path) -> list[str]:
        return [str(source), "--output", str(directory / "out.jsonl"), "--model", str(tiny_package_dir),
                "--part-records", PART_RECORDS, "-q"]

    return args, reference


def assert_stopped_cleanly(done: subprocess.CompletedProcess, directory: Path, reason: str) -> None:
    """Exit 6, one stderr line naming the reason and --resume; no OUTPUT, no .tmp file, parts kept."""
    assert done.returncode == 6, done.stderr
    assert len(done.stderr.splitlines()) == 1 and reason in done.stderr and "--resume" in done.stderr, done.stderr
    assert not (directory / "out.jsonl").exists()
    work = directory / "out.jsonl.parts"
    assert not [p for p in work.iterdir() if p.name.endswith(".tmp")]
    for part in work.glob("part-*.jsonl"):  # every part that exists is whole
        first, last = (int(n) for n in part.name[5:30].split("-"))
        assert [r["id"] for r in read_jsonl(part)] == list(range(first - 1, last))


@pytest.mark.heavy
@pytest.mark.skipif(not ROOT, reason="needs root to mount a tmpfs (CI runs the suite as root)")
def test_a_full_disk_stops_the_run_and_resume_finishes_it(job, tmp_path):
    args, reference = job
    with tmpfs(tmp_path / "disk", "1m") as disk:  # room for a few parts
        done = score(*args(disk))
        assert_stopped_cleanly(done, disk, "No space left on device")
        assert 1 <= len(list((disk / "out.jsonl.parts").glob("part-*"))) < COUNT // int(PART_RECORDS)
        # Room for every part, not for joining them: the assembly fails and leaves OUTPUT alone.
        remount(disk, f"size={reference.stat().st_size * 3 // 2}")
        done = score(*args(disk), "--resume")
        assert_stopped_cleanly(done, disk, "No space left on device")
        remount(disk, "size=64m")
        done = score(*args(disk), "--resume")
        assert done.returncode == 0, done.stderr
        assert (disk / "out.jsonl").read_bytes() == reference.read_bytes()  # every id once, in order
        assert not (disk / "out.jsonl.parts").exists()


@pytest.mark.heavy
def test_an_output_directory_turning_read_only_stops_the_run_and_resume_finishes_it(job, tmp_path):
    args, reference = job
    with (tmpfs(tmp_path / "disk", "64m") if ROOT else contextlib.nullcontext(tmp_path / "disk")) as disk:
        disk.mkdir(exist_ok=True)
        work = disk / "out.jsonl.parts"
        process = subprocess.Popen([sys.executable, "-m", "runtime", "score", *args(disk)], cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None and not list(work.glob("part-*[0-9].jsonl")):
            time.sleep(0.01)
        assert process.poll() is None, "the run finished before the disk turned read-only: make the input longer"
        if ROOT:
            remount(disk, "ro")
        else:
            work.chmod(0o555)
        stderr = process.communicate(timeout=120)[1]
        done = subprocess.CompletedProcess(process.args, process.returncode, "", stderr)
        assert_stopped_cleanly(done, disk, "Read-only file system" if ROOT else "Permission denied")
        if ROOT:
            remount(disk, "rw")
        else:
            work.chmod(0o755)
        done = score(*args(disk), "--resume")
        assert done.returncode == 0, done.stderr
        assert (disk / "out.jsonl").read_bytes() == reference.read_bytes()
