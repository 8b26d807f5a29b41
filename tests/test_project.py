"""The checkout as a Python project: the `decide` console script, and imports without sys.path edits."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT = "decide-classifier"


def python_sources() -> list[Path]:
    """Every Python file of the project, as git lists it: a walk of the file system would also read
    a `.venv` inside the checkout, whose packages hold sources in other encodings (big5, latin-1)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard", "*.py"], capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.decode(errors='replace').strip()}): cannot list project files")
    return [REPO / name for name in sorted(set(listed.stdout.decode("utf-8").split("\0"))) if name
            and (REPO / name).is_file()]


def test_the_decide_console_script_is_the_cli() -> None:
    try:
        distribution = metadata.distribution(PROJECT)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{PROJECT} is not installed here: python3 -m pip install -e '.[dev]'")
    (script,) = [e for e in distribution.entry_points if e.group == "console_scripts" and e.name == "decide"]
    assert script.value == "runtime.cli:main"
    from runtime import cli

    assert script.load() is cli.main
    done = subprocess.run([sys.executable, "-c", "from runtime.cli import main; raise SystemExit(main(['--help']))"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "usage" in done.stdout.lower()


def test_only_the_legacy_stack_edits_sys_path() -> None:
    """Tests and tools import the installed packages; runtime/platform/stack.py's insert is the feature that
    puts numpy 1.26 first for CPUs below x86-64-v2."""
    editing = sorted(str(p.relative_to(REPO)) for p in python_sources()
                     if re.search(r"^\s*sys\.path\.(insert|append)\(", p.read_text(encoding="utf-8"), re.MULTILINE))
    assert editing == ["runtime/platform/stack.py"]


def test_no_module_outside_tests_imports_from_tests() -> None:
    importing = sorted(str(p.relative_to(REPO)) for p in python_sources()
                       if p.relative_to(REPO).parts[0] != "tests"
                       and re.search(r"^\s*(from|import) tests\b|/ \"tests\"", p.read_text(encoding="utf-8"), re.MULTILINE))
    assert importing == []


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """The README promises `.ci/run` runs its test command (lint, then pytest): the two lines must
    not drift apart."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"^    (python3 -m pip install -e '\.\[dev\]' .*)$", readme, re.MULTILINE)
    ci_lines = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith("#")]
    assert ci_lines[-1] == command
    assert "python3 -m ruff check ." in command.split(" && ")
    pins = (REPO / "requirements-dev.txt").read_text(encoding="utf-8")
    assert re.search(r"^ruff==\d+\.\d+\.\d+\b", pins, re.MULTILINE)
