"""Numeric stack choice: the legacy numpy is found, or the refusal names what to install; and the
CLI really imports the numpy the stack names (natively, with a forced baseline tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.platform.stack import (
    ENV_LEGACY_PATH,
    LEGACY_NUMPY,
    LegacyStackMissing,
    NumericStack,
    activate,
    choose_stack,
    legacy_candidates,
    numpy_version_in,
)
from runtime.platform.tiers import CpuUnsupported, Tier

REPO = Path(__file__).resolve().parent.parent
LEGACY_TIER = Tier("baseline", ("sse2", "pni"), ("fp32",), numeric_stack="legacy")
STANDARD_TIER = Tier("v2-sse4.2", ("sse4_2", "popcnt"), ("fp32",))


def numpy_tree(root: Path, version: str) -> Path:
    """A directory laid out like `pip install --target` leaves numpy (only what the chooser reads)."""
    (root / "numpy").mkdir(parents=True)
    (root / "numpy" / "__init__.py").write_text("")
    (root / f"numpy-{version}.dist-info").mkdir()
    return root


def test_standard_tier_keeps_the_installed_numpy(tmp_path):
    stack = choose_stack(STANDARD_TIER, [numpy_tree(tmp_path, "1.26.4")], "2.4.6")
    assert (stack.name, stack.path, stack.numpy_version) == ("standard", None, "2.4.6")


def test_legacy_tier_takes_the_first_directory_holding_numpy_1(tmp_path):
    newer = numpy_tree(tmp_path / "np2", "2.4.6")
    older = numpy_tree(tmp_path / "np1", "1.26.4")
    stack = choose_stack(LEGACY_TIER, [tmp_path / "empty", newer, older], "2.4.6")
    assert (stack.name, stack.path, stack.numpy_version) == ("legacy", older, "1.26.4")
    assert "below x86-64-v2" in stack.reason


def test_legacy_tier_accepts_an_installed_numpy_1():
    stack = choose_stack(LEGACY_TIER, [], "1.26.4")
    assert (stack.name, stack.path) == ("legacy", None)


def test_legacy_tier_without_numpy_1_is_refused_naming_what_to_install(tmp_path):
    with pytest.raises(LegacyStackMissing) as refused:
        choose_stack(LEGACY_TIER, [numpy_tree(tmp_path, "2.4.6")], "2.4.6")
    assert isinstance(refused.value, CpuUnsupported)  # same exit code 3
    assert LEGACY_NUMPY in str(refused.value) and ENV_LEGACY_PATH in str(refused.value)


def test_candidates_env_first_bundle_dir_only_when_frozen(tmp_path):
    assert legacy_candidates({}, frozen=False) == []
    assert legacy_candidates({ENV_LEGACY_PATH: str(tmp_path)}, frozen=False) == [tmp_path]
    frozen = legacy_candidates({ENV_LEGACY_PATH: str(tmp_path)}, frozen=True)
    assert frozen[0] == tmp_path and frozen[1].name == "legacy"


def test_numpy_version_read_without_importing(tmp_path):
    assert numpy_version_in(tmp_path) is None
    assert numpy_version_in(numpy_tree(tmp_path / "np", "1.26.4")) == "1.26.4"


def test_activate_puts_the_directory_first_and_refuses_after_numpy(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "numpy", raising=False)
    activate(NumericStack("legacy", tmp_path, "1.26.4", "test"))
    assert sys.path[0] == str(tmp_path)
    monkeypatch.setitem(sys.modules, "numpy", object())
    with pytest.raises(RuntimeError):
        activate(NumericStack("legacy", tmp_path / "other", "1.26.4", "test"))


def test_activate_drops_a_forced_openblas_core(monkeypatch):
    # OPENBLAS_CORETYPE=Haswell is SIGILL at `import numpy` on a CPU without AVX2 (the matrix runs
    # every emulated cell with it); the probe has chosen, OpenBLAS detects the CPU itself
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert activate(NumericStack("standard", None, "2.4.6", "test")) == ["OPENBLAS_CORETYPE=Haswell"]
    assert "OPENBLAS_CORETYPE" not in os.environ
    assert activate(NumericStack("standard", None, "2.4.6", "test")) == []


# ----------------------------------------------------------------------------- through the CLI

def run_cli(code: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, input=stdin,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=600, check=False)


def test_forced_baseline_tier_runs_selftest_on_numpy_1_26():
    """The same start-up path a Core 2 takes, natively: the stack's numpy is the one imported."""
    from test_matrix_legacy import legacy_numpy_dir

    code = ("import json, sys; from runtime.cli import main; code = main(['selftest', '--json', "
            "'--tier', 'baseline']); import numpy; print(json.dumps([code, numpy.__version__]))")
    done = run_cli(code, {ENV_LEGACY_PATH: str(legacy_numpy_dir())})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    code_and_version = json.loads(lines[-1])
    assert code_and_version == [0, "1.26.4"]
    report = json.loads("\n".join(lines[:-1]))
    assert report["tier"] == "baseline" and all(r["passed"] for r in report["results"])


def test_a_forced_openblas_core_never_reaches_numpy_and_the_log_says_so():
    code = ("import json, os, sys; from runtime.cli import main; code = main(['selftest', '--json']); "
            "print(json.dumps([code, os.environ.get('OPENBLAS_CORETYPE')]))")
    done = run_cli(code, {"OPENBLAS_CORETYPE": "Haswell"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, None]
    assert "ignoring OPENBLAS_CORETYPE=Haswell" in done.stderr


def test_a_refusal_after_the_stack_is_chosen_is_still_one_stderr_line(tmp_path: Path):
    """The launcher's notes (a dropped OPENBLAS_CORETYPE, the legacy stack) wait for a ready model:
    a package that fails while loading is refused in one line, as the CLI promises."""
    import shutil

    from test_factory_package import DEFAULT_PACKAGE

    broken = tmp_path / "machine-alarms"
    shutil.copytree(DEFAULT_PACKAGE, broken, ignore=shutil.ignore_patterns("tokenizer.json"))
    code = f"import sys; from runtime.cli import main; sys.exit(main(['--model', {str(broken)!r}]))"
    done = run_cli(code, {"OPENBLAS_CORETYPE": "Haswell"}, stdin="")
    assert done.returncode == 4 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "tokenizer.json" in lines[0], done.stderr


def test_forced_baseline_tier_without_legacy_numpy_exits_3_naming_it():
    done = run_cli("import sys; from runtime.cli import main; sys.exit(main(['selftest', '--tier', 'baseline']))",
                   {ENV_LEGACY_PATH: ""})
    assert done.returncode == 3
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and LEGACY_NUMPY in lines[0]


def test_info_names_the_stack():
    done = run_cli("import sys; from runtime.cli import main; sys.exit(main(['info', '--json']))", {})
    report = json.loads(done.stdout)
    assert report["numeric_stack"]["name"] == ("legacy" if report["choice"]["tier"] == "baseline" else "standard")
